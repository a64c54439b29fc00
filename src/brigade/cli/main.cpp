// `brigade`: the command-line front-end. Subcommands: prepare, train, generate, eval, export, ablate, bench,
// calibrate, plan.
// Every error ends in one line "brigade: error: ..." on stderr and a non-zero exit.
#include <omp.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "brigade/cli/ablate.h"
#include "brigade/cli/bench.h"
#include "brigade/cli/plan.h"
#include "brigade/cli/supervise.h"
#include "brigade/core/error.h"
#include "brigade/data/text/prepare.h"
#include "brigade/data/text/text_tokenizer.h"
#include "brigade/data/text/tokenizer.h"
#include "brigade/dist/process_group.h"
#include "brigade/models/gpt/gpt.h"
#include "brigade/train/checkpoint.h"
#include "brigade/train/config.h"
#include "brigade/train/finetune.h"
#include "brigade/train/generate.h"
#include "brigade/train/memory_plan.h"
#include "brigade/train/registry.h"
#include "brigade/train/tasks.h"
#include "brigade/train/trainer.h"

namespace fs = std::filesystem;
using namespace brigade;

namespace {

int cmd_prepare(const std::string& recipe_path, const std::vector<std::string>& sets) {
  train::Recipe r = train::load_recipe(recipe_path, sets);
  BRIGADE_CHECK(train::model_entry(r.model.type).data == train::DataKind::Text, ConfigError,
                "{}: model.type = \"{}\" trains on data.corpus = \"{}\", which needs no preparation (`brigade "
                "prepare` builds the tokenizer and token files of the text models: {})",
                recipe_path, r.model.type, r.data.corpus, [] {
                  std::string s;
                  for (const auto& e : train::model_registry())
                    if (e.data == train::DataKind::Text) s += fmt::format("{}{}", s.empty() ? "" : ", ", e.type);
                  return s;
                }());
  BRIGADE_CHECK(r.data.format == "text", ConfigError,
                "{}: data.format = \"{}\" samples are read as they are (encoded when training starts); `brigade "
                "prepare` builds token files of a text corpus",
                recipe_path, r.data.format);
  data::prepare(train::prepare_options(r),
                [](const data::PrepareProgress& p) { fmt::print(stderr, "prepare: {}\n", p.message); });
  return 0;
}

int cmd_train(const std::string& recipe_path, const std::vector<std::string>& sets, train::TrainOptions o, bool dry_run,
              bool json, bool resume_if_any) {
  train::Recipe r = train::load_recipe(recipe_path, sets);
  BRIGADE_CHECK(!(resume_if_any && o.resume), ConfigError, "--resume-if-any and --resume: give one of them");
  if (resume_if_any) o.resume = train::checkpoint_exists((fs::path(r.run.out_dir) / "checkpoint").string());
  BRIGADE_CHECK(!json || dry_run, ConfigError, "--json goes with --dry-run (the prediction as JSON); remove it");
  if (dry_run) {  // the plan's memory per category, without training or reading data (memory_plan.h)
    BRIGADE_CHECK(!r.parallel.deterministic, ConfigError,
                  "{}: --dry-run does not model parallel.deterministic = true yet (per-atom activations and the "
                  "summation tree's log2(atoms per rank) + 1 extra gradient buffers); predict the run without the "
                  "mode, or measure it with `brigade bench`",
                  r.path);
    // tensor / pipeline parallel under mpirun: every rank of the mesh measured (bench.h); on one
    // process the data-parallel prediction, which says that it leaves tp / pp out
    const bool mesh = (r.parallel.tp > 1 || r.parallel.pp > 1) && dist::ProcessGroup::world()->size() > 1;
    nlohmann::json j;
    if (json) j = mesh ? cli::mesh_dry_run_json(r) : train::dry_run_json(r);
    const std::string report = json ? j.dump() + "\n" : mesh ? cli::mesh_dry_run_report(r) : train::dry_run_report(r);
    if (dist::Env::world_rank() == 0) fmt::print("{}", report);
    return 0;
  }
  const train::TrainResult res = train::train(r, o);
  if (res.interrupted) return 130;             // the conventional exit status after SIGINT
  if (dist::Env::world_rank() != 0) return 0;  // rank 0 reports for the job
  fmt::print("{}\n", res.evaluated ? res.final_line : std::string("no evaluation was run"));
  if (res.early_stopped)
    fmt::print("early stop at step {}: best val loss {:.4f} at step {} (kept in {})\n", res.steps, res.best_val_loss,
               res.best_step, res.best_dir);
  fmt::print("{} steps in {:.0f}s ({:.0f} {} median) | checkpoint {}\n", res.steps, res.seconds, res.items_per_s,
             train::item_rate_unit(res.item), res.checkpoint_dir);
  if (!res.sample.empty()) fmt::print("sample:\n{}\n", res.sample);
  return 0;
}

int cmd_generate(const std::string& ckpt, const std::string& prompt, const train::SampleOptions& so, int threads,
                 const std::string& adapter) {
  if (threads > 0) omp_set_num_threads(threads);
  const std::string dir = train::open_checkpoint(ckpt);  // repairs a save interrupted between its renames
  train::Recipe r = train::checkpoint_recipe(dir);
  BRIGADE_CHECK(train::model_entry(r.model.type).caps.sample, ConfigError,
                "--ckpt {}: a model.type = \"{}\" checkpoint does not generate text; `brigade generate` samples from "
                "{}; evaluate this one with `brigade eval --ckpt {}`",
                ckpt, r.model.type, train::model_types_with(&train::Capabilities::sample), ckpt);
  // The model as the run built it (a LoRA run's adapters included), then the checkpoint's weights.
  const std::unique_ptr<train::Task> task = train::make_task(r, /*init_weights=*/false);
  train::load_state((fs::path(dir) / "model.safetensors").string(), task->state_dict());
  auto& model = dynamic_cast<models::CausalLM&>(task->model());
  if (!adapter.empty()) fmt::print(stderr, "{}\n", train::attach_peft_adapter(model, adapter));
  model.train(false);
  const std::unique_ptr<data::TextTokenizer> tok = data::load_text_tokenizer(dir);
  fmt::print("{}\n", train::generate_text(model, *tok, prompt, so));
  return 0;
}

int cmd_eval(const std::string& ckpt, int threads, bool json, const std::string& data_file) {
  if (!data_file.empty()) {  // a language model's loss on a file of the user's
    if (threads > 0) omp_set_num_threads(threads);
    const train::TextEval e = train::evaluate_on_file(ckpt, data_file);
    if (json)
      fmt::print("{}\n", nlohmann::json{{"loss", e.loss},
                                        {"perplexity", e.perplexity},
                                        {"tokens", e.tokens},
                                        {"windows", e.windows},
                                        {"data", data_file}}
                             .dump());
    else
      fmt::print("loss {:.4f} | perplexity {:.2f} | {} tokens scored in {} windows of {}\n", e.loss, e.perplexity,
                 e.tokens, e.windows, data_file);
    return 0;
  }
  const train::EvalReport ev = train::evaluate_checkpoint(ckpt, threads);
  if (json) {  // the fields the run's own evaluation writes to metrics.jsonl
    nlohmann::json j = ev.fields;
    j["model"] = ev.model_type;
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("{}\n", ev.line);
  }
  return 0;
}

// Under mpirun: every rank's error names its rank, and one failing rank ends the
// whole job (MPI_Abort) instead of leaving the others waiting in a collective.
int finish(int code, const std::string& message) {
  if (!message.empty()) {
    std::fflush(stdout);
    if (isatty(fileno(stderr))) fmt::print(stderr, "\n");  // end a live progress line first
    if (dist::Env::world_size() > 1)
      fmt::print(stderr, "brigade: error: [rank {} of {}] {}\n", dist::Env::world_rank(), dist::Env::world_size(),
                 message);
    else
      fmt::print(stderr, "brigade: error: {}\n", message);
    std::fflush(stderr);
    if (dist::Env::world_size() > 1) dist::Env::abort(code);
  }
  dist::Env::finalize();
  return code;
}

int run(int argc, char** argv);

}  // namespace

int main(int argc, char** argv) {
  dist::Env::init(&argc, &argv);
  return run(argc, argv);
}

namespace {

int run(int argc, char** argv) {
  CLI::App app{"Brigade: train language and vision models on the CPU, with every optimization measured"};
  app.require_subcommand(1);
  std::string recipe, ckpt, prompt;
  std::vector<std::string> sets;
  train::TrainOptions topts;
  bool no_sample = false, dry_run = false, json = false;
  train::SampleOptions so;
  int threads = 0;

  auto* prep = app.add_subcommand("prepare", "Build the tokenizer and token files for a recipe's corpus");
  prep->add_option("recipe", recipe, "Recipe TOML file")->required();
  prep->add_option("--set", sets, "Override a recipe key: section.key=value (repeatable)");

  auto* tr = app.add_subcommand("train", "Train a recipe (prepares its data first if needed)");
  tr->add_option("recipe", recipe, "Recipe TOML file")->required();
  tr->add_option("--set", sets, "Override a recipe key: section.key=value (repeatable)");
  tr->add_flag("--resume", topts.resume, "Continue from <run.out_dir>/checkpoint");
  bool resume_if_any = false;
  int max_restarts = 0;
  tr->add_flag("--resume-if-any", resume_if_any,
               "Continue from <run.out_dir>/checkpoint when there is one, else start (for a launcher loop)");
  tr->add_option("--max-restarts", max_restarts,
                 "Restart training from the latest checkpoint up to N times after the process is killed (one "
                 "process; not under mpirun)");
  tr->add_option("--stop-at", topts.stop_at, "Stop and checkpoint at this step (the schedule still spans train.steps)");
  tr->add_flag("--quiet", topts.quiet, "No progress output");
  tr->add_flag("--no-sample", no_sample, "Skip the text sample at the end");
  tr->add_flag("--dry-run", dry_run,
               "Print the predicted memory per category (params, grads, optimizer, activations, workspace) and "
               "exit without training");
  tr->add_flag("--json", json, "With --dry-run: print the prediction as one JSON line");
  std::string train_plan, train_calibration;
  tr->add_option("--plan", train_plan,
                 "auto: train with the plan `brigade plan` ranks first (from the recipe's calibration), launching "
                 "itself under mpirun when the plan has several ranks");
  tr->add_option("--calibration", train_calibration, "With --plan auto: the calibration file (default: the recipe's)");

  auto* gen = app.add_subcommand("generate", "Sample text from a checkpoint");
  gen->add_option("--ckpt", ckpt, "Checkpoint directory (e.g. runs/gpt-kjv/checkpoint)")->required();
  gen->add_option("--prompt", prompt, "Text to continue");
  gen->add_option("--tokens", so.tokens, "Number of tokens to generate")->capture_default_str();
  gen->add_option("--temperature", so.temperature, "Sampling temperature (> 0)")->capture_default_str();
  gen->add_option("--top-k", so.top_k, "Sample among the k most likely tokens (0 = all)")->capture_default_str();
  gen->add_option("--seed", so.seed, "Sampling seed")->capture_default_str();
  gen->add_option("--threads", threads, "OpenMP threads (0 = all cores)");
  std::string gen_adapter;
  bool greedy = false;
  gen->add_option("--adapter", gen_adapter,
                  "A PEFT LoRA folder (adapter_config.json + adapter_model.safetensors) "
                  "to apply to the checkpoint's model first");
  gen->add_flag("--greedy", greedy, "Greedy decoding: the most likely token each step (= --top-k 1)");

  auto* ev = app.add_subcommand("eval",
                                "Evaluate a checkpoint as its run's final evaluation: a language model's val "
                                "loss, bert's masked-LM loss and accuracy, an image classifier's Fashion-MNIST "
                                "test accuracy, clip's zero-shot accuracy");
  ev->add_option("--ckpt", ckpt, "Checkpoint directory (e.g. runs/vit-fashion/checkpoint)")->required();
  ev->add_option("--threads", threads, "OpenMP threads (0 = the recipe's run.threads)");
  ev->add_flag("--json", json, "Print the evaluation's metrics.jsonl fields as one JSON line");
  std::string eval_data;
  ev->add_option("--data", eval_data,
                 "A language model's loss and perplexity on this file instead: text (encoded "
                 "with the checkpoint's tokenizer) or a prepared .bin token file");

  cli::AblateOptions aopts;
  std::string export_out, export_dtype = "f32", export_format = "hf";
  bool export_adapter = false;
  auto* ex = app.add_subcommand("export",
                                "Write a gpt or llama checkpoint as a Hugging Face model directory "
                                "(LoRA adapters merged), or a LoRA run's adapters as PEFT files");
  ex->add_option("--ckpt", ckpt, "Checkpoint directory (e.g. runs/gpt-kjv/checkpoint)")->required();
  ex->add_option("--out", export_out, "Output directory (replaced atomically)")->required();
  ex->add_option("--dtype", export_dtype, "Weight dtype: f32, bf16 or f16")->capture_default_str();
  ex->add_option("--format", export_format, "hf (a Hugging Face directory) or gguf (one GGUF v3 file for llama.cpp)")
      ->capture_default_str();
  ex->add_flag("--adapter", export_adapter,
               "Only the LoRA adapters, as PEFT's adapter_model.safetensors + "
               "adapter_config.json");

  auto* abl = app.add_subcommand("ablate",
                                 "Run a recipe under each combination of --vary values, or a --ladder of "
                                 "techniques, and compare tokens/s, peak memory and loss (table + loss-curve plot)");
  abl->add_option("recipe", recipe, "Recipe TOML file")->required();
  auto* vary = abl->add_option("--vary", aopts.vary, "section.key=v1,v2,... (repeatable; every combination runs)")
                   ->allow_extra_args(false);  // one value per --vary, so the recipe may follow it
  auto* ladder = abl->add_option("--ladder", aopts.ladder,
                                 "Techniques added in turn, then each left out, beside the planner's prediction: "
                                 "\"NAME=section.key=value[,key=value];NAME=...\" or \"default\"")
                     ->excludes(vary);
  abl->add_option("--ladder-file", aopts.ladder_file,
                  "The ladder as TOML: [[technique]] tables of a name and its overrides")
      ->excludes(vary)
      ->excludes(ladder);
  abl->add_option("--target-loss", aopts.target_loss,
                  "--ladder: report the seconds of training to this train loss (default: the baseline's final)");
  abl->add_option("--predictor", aopts.predictor,
                  "--ladder: the prediction command, run as CMD RECIPE --predict --set ... (default: brigade plan)");
  abl->add_option("--steps", aopts.steps, "Steps per variant (train --stop-at)")->capture_default_str();
  abl->add_option("--out", aopts.out_dir, "Report folder (default: <run.out_dir's parent>/<run.name>-ablate)");
  abl->add_option("--set", sets, "Override a recipe key for every variant: section.key=value (repeatable)")
      ->allow_extra_args(false);
  abl->add_flag("--quiet", aopts.quiet, "No per-variant progress lines");

  cli::BenchOptions bopts;
  auto* bench = app.add_subcommand("bench",
                                   "Time training steps of a recipe's model on random ids (no data) and "
                                   "print one JSON line: tokens/s, GFLOP/s, MFU, GEMM peaks, peak RSS");
  bench->add_option("recipe", recipe, "Recipe TOML file")->required();
  bench->add_option("--set", sets, "Override a recipe key: section.key=value (repeatable)");
  bench->add_option("--steps", bopts.steps, "Timed steps")->capture_default_str();
  bench->add_option("--warmup", bopts.warmup, "Untimed steps first")->capture_default_str();

  cli::CalibrateOptions copts;
  std::vector<std::string> cal_levels, cal_recompute;
  auto* cal = app.add_subcommand("calibrate",
                                 "Measure this machine for a recipe's model (compute per precision, recompute and "
                                 "micro-batch size; GEMM peaks; pipeline stages; data- and tensor-parallel steps in "
                                 "lockstep and the interconnect under mpirun) for `brigade plan`");
  cal->add_option("recipe", recipe, "Recipe TOML file")->required();
  cal->add_option("--set", sets, "Override a recipe key: section.key=value (repeatable)")->allow_extra_args(false);
  cal->add_option("--out", copts.out, "Calibration file (default: <run.out_dir's parent>/<run.name>-calibration.json)");
  cal->add_option("--ranks", copts.ranks, "Launches to measure, comma-separated (1 = this process; more under mpirun)")
      ->delimiter(',')
      ->capture_default_str();
  cal->add_option("--levels", copts.levels, "Precision levels (bf16), comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  cal->add_option("--recompute", copts.recompute, "Recompute modes, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  cal->add_option("--rows", copts.rows,
                  "Micro-batch rows, comma-separated (default: powers of two up to the global batch)")
      ->delimiter(',');
  cal->add_option("--steps", copts.steps, "Timed steps per point")->capture_default_str();
  cal->add_option("--warmup", copts.warmup, "Untimed steps per point")->capture_default_str();
  auto* cal_ranks = cal->get_option("--ranks");
  cal->add_option("--proxy-layers", copts.proxy_layers,
                  "A,B: measure the model with A and B blocks at its full width and extrapolate to model.n_layer "
                  "(for a model too large to build here; one process, with --ranks 1)")
      ->delimiter(',');
  cal->add_option("--child-out", copts.child_out, "Internal: a launch under mpirun writes its points here")->group("");

  cli::PlanCommandOptions popts;
  auto* pl = app.add_subcommand("plan",
                                "Predict the step time and memory of every parallel, precision and memory plan of a "
                                "recipe on this machine (or a described cluster) and print the best");
  pl->add_option("recipe", recipe, "Recipe TOML file")->required();
  pl->add_option("--set", sets, "Override a recipe key: section.key=value (repeatable)")->allow_extra_args(false);
  pl->add_option("--calibration", popts.calibration,
                 "Calibration file (default: the recipe's, from `brigade calibrate`)");
  pl->add_option("--cluster", popts.cluster, "A cluster described in TOML (docs/planning.md); default: this machine");
  pl->add_flag("--json", popts.json, "One JSON object per plan (feasible first, best first), then the rejected ones");
  pl->add_flag("--predict", popts.predict, "Only the recipe's own plan, as one JSON object");
  pl->add_option("--apply", popts.apply, "Write the best plan's recipe (every key) to this file");
  pl->add_option("--top", popts.top, "Plans in the table")->capture_default_str();
  pl->add_option("--max-ranks", popts.max_ranks, "Consider at most this many ranks (0 = the whole cluster)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (argc == 1) {
      fmt::print(stderr, "{}", app.help());
      return 2;
    }
    const std::string first = argv[1];
    if (app.get_subcommands().empty() && !first.empty() && first[0] != '-') {  // not a command at all
      std::string names;
      for (const CLI::App* c : app.get_subcommands({})) names += (names.empty() ? "" : ", ") + c->get_name();
      fmt::print(stderr, "brigade: error: unknown command '{}'; the commands are {} (see `brigade --help`)\n", first,
                 names);
      return 2;
    }
    const std::string sub = app.get_subcommands().empty() ? "" : " " + app.get_subcommands()[0]->get_name();
    fmt::print(stderr, "brigade: error: {} (see `brigade{} --help`)\n", e.what(), sub);
    return 2;
  }
  try {
    if (prep->parsed()) return finish(cmd_prepare(recipe, sets), "");
    if (tr->parsed()) {
      topts.sample = !no_sample;
      if (!train_plan.empty()) {
        BRIGADE_CHECK(train_plan == "auto", ConfigError, "--plan {}: the only value is auto", train_plan);
        BRIGADE_CHECK(!dry_run && max_restarts == 0, ConfigError,
                      "--plan auto goes without --dry-run and --max-restarts (`brigade plan` predicts without "
                      "training)");
        std::vector<std::string> plan_sets;
        const int rc = cli::plan_for_training(recipe, sets, train_calibration, argc, argv, plan_sets);
        if (rc >= 0) return finish(rc, "");  // the plan ran under mpirun as a child
        sets.insert(sets.end(), plan_sets.begin(), plan_sets.end());
      }
      if (max_restarts == 0 || dry_run) return finish(cmd_train(recipe, sets, topts, dry_run, json, resume_if_any), "");
      const train::Recipe r = train::load_recipe(recipe, sets);
      return cli::supervise(max_restarts, (fs::path(r.run.out_dir) / "checkpoint").string(),
                            topts.resume || resume_if_any, [&](bool resume) {
                              train::TrainOptions o = topts;
                              o.resume = resume;
                              // the child reports its own errors, as an unsupervised run does
                              try {
                                return finish(cmd_train(recipe, sets, o, false, json, false), "");
                              } catch (const brigade::Error& e) {
                                return finish(1, e.what());
                              } catch (const std::bad_alloc&) {
                                return finish(1,
                                              "out of memory; reduce train.batch_size, train.seq_len or the "
                                              "model size");
                              } catch (const std::exception& e) {
                                return finish(3, fmt::format("internal error: {} (please report this)", e.what()));
                              }
                            });
    }
    if (gen->parsed()) {
      if (greedy) so.top_k = 1;
      return finish(cmd_generate(ckpt, prompt, so, threads, gen_adapter), "");
    }
    if (ev->parsed()) return finish(cmd_eval(ckpt, threads, json, eval_data), "");
    if (ex->parsed()) {
      const DType dt = dtype_from_name(export_dtype);
      BRIGADE_CHECK(is_floating(dt), ConfigError, "--dtype {}: weights are f32, bf16 or f16", export_dtype);
      fmt::print("{}\n", train::export_checkpoint(ckpt, export_out, dt, export_adapter, export_format));
      return finish(0, "");
    }
    if (bench->parsed()) {
      const train::Recipe r = train::load_recipe(recipe, sets);
      const cli::BenchResult b = cli::run_bench(r, bopts);
      if (dist::Env::world_rank() == 0) fmt::print("{}\n", cli::bench_json(r, b));  // one line for the job
      return finish(0, "");
    }
    if (cal->parsed()) {
      copts.recipe = recipe;
      copts.sets = sets;
      // proxies measure one process: the default --ranks 1,2 becomes 1; an explicit one is checked
      if (!copts.proxy_layers.empty() && cal_ranks->count() == 0) copts.ranks = {1};
      return finish(cli::run_calibrate(copts), "");
    }
    if (pl->parsed()) {
      popts.recipe = recipe;
      popts.sets = sets;
      return finish(cli::run_plan(popts), "");
    }
    if (abl->parsed()) {
      aopts.recipe = recipe;
      aopts.sets = sets;
      return finish(cli::run_ablation(aopts), "");
    }
  } catch (const brigade::Error& e) {
    return finish(1, e.what());
  } catch (const std::bad_alloc&) {
    return finish(1, "out of memory; reduce train.batch_size, train.seq_len or the model size");
  } catch (const std::exception& e) {
    return finish(3, fmt::format("internal error: {} (please report this)", e.what()));
  }
  return finish(0, "");
}

}  // namespace
