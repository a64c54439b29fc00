// Masked-language-model pre-training for model.type = "bert"; see mlm.h.
#include "brigade/train/mlm.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"
#include "brigade/data/ext_mlm.h"
#include "brigade/data/prepare.h"
#include "brigade/data/sampler.h"
#include "brigade/data/token_file.h"
#include "brigade/data/tokenizer.h"
#include "brigade/dist/process_group.h"
#include "brigade/optim/schedule.h"
#include "brigade/parallel/data_parallel.h"
#include "brigade/train/checkpoint.h"
#include "brigade/train/run_metrics.h"

namespace fs = std::filesystem;

namespace brigade::train {
namespace {

// Seeds of the masking generators: training step s uses splitmix64(splitmix64(seed ^ kTrainMask)
// + s); evaluation batch i uses splitmix64(kEvalMask + i) whatever the run's seed.
constexpr uint64_t kTrainMask = 0x6d6c6d2d74726e01ull;  // "mlm-trn"
constexpr uint64_t kEvalMask = 0x6d6c6d2d65766101ull;   // "mlm-eva"

const std::vector<int64_t>& special_ids() {
  static const std::vector<int64_t> ids{data::Tokenizer::kUnkId, data::Tokenizer::kBosId, data::Tokenizer::kEosId};
  return ids;
}


// Checks shared by training and evaluation.
void check_mlm_recipe(const Recipe& r, const std::string& where) {
  BRIGADE_CHECK(r.model.type == "bert", ConfigError, "{}: model.type = \"{}\" is not \"bert\" (masked-LM training)",
                where, r.model.type);
  BRIGADE_CHECK(r.train.seq_len <= r.model.block_size, ConfigError,
                "{}: train.seq_len = {} exceeds model.block_size = {} (BERT's position table); lower seq_len or "
                "raise block_size",
                where, r.train.seq_len, r.model.block_size);
}

// val.bin (and its vocabulary) of the recipe's data.dir.
data::TokenDataset open_split(const Recipe& r, const char* file, const std::string& where) {
  data::TokenDataset ds((fs::path(r.data.dir) / file).string());
  BRIGADE_CHECK(ds.vocab_size() == r.model.vocab_size, ConfigError,
                "{}: token file {} has vocab {} but model.vocab_size is {}; set model.vocab_size = {} or point "
                "data.dir at data prepared for {} (`brigade prepare`)",
                where, ds.path(), ds.vocab_size(), r.model.vocab_size, ds.vocab_size(), r.model.vocab_size);
  BRIGADE_CHECK(ds.size() >= r.train.seq_len + 1, DataError,
                "{}: {} holds {} tokens, fewer than train.seq_len + 1 = {}; lower train.seq_len or raise "
                "data.val_fraction and run `brigade prepare` again",
                where, ds.path(), ds.size(), r.train.seq_len + 1);
  return ds;
}

// One forward: mean cross-entropy over the labelled positions (BERT::mlm_loss: the prediction
// head runs on those rows only) and, from the same logits, the argmax hits.
struct Scored {
  Tensor loss;  // 0-d, recorded
  int64_t correct = 0, masked = 0;
};
Scored score(const models::BERT& model, const data::MlmBatch& b) {
  const int64_t V = model.config().vocab_size;
  const models::BERT::MaskedLogits m = model.masked_logits(b.inputs, b.labels);  // (M, V), (M)
  Scored s;
  s.masked = m.labels.numel();
  if (s.masked == 0) {  // nothing masked in this batch: the loss is defined by the full logits
    s.loss = model.mlm_loss(b.inputs, b.labels);
    return s;
  }
  s.loss = fn::cross_entropy(m.logits, m.labels, -100);  // 0-d
  const Tensor lg = m.logits.detach().contiguous();
  const float* p = lg.data<float>();
  const int64_t* y = m.labels.data<int64_t>();
  for (int64_t i = 0; i < s.masked; ++i) {
    const float* row = p + i * V;
    s.correct += int64_t(std::max_element(row, row + V) - row) == y[i] ? 1 : 0;
  }
  return s;
}

// Evaluation batch i of n: the sampler's fixed windows of val.bin, masked from a generator that
// depends on i only.
data::MlmBatch eval_batch(const Recipe& r, const data::BatchSampler& val, int64_t i, int64_t n) {
  Tensor x, y;
  val.get_eval_batch(i, n, x, y);  // (B, T) I64; y unused
  Generator g(data::splitmix64(kEvalMask + uint64_t(i)));
  return data::mask_tokens(x, r.model.vocab_size + 1, mlm_mask_id(r.model), special_ids(), r.data.mlm_probability, g);
}

int64_t eval_batch_count(const Recipe& r) { return std::max<int64_t>(1, r.train.eval_batches); }

MlmEval evaluate(models::BERT& model, const Recipe& r, const data::BatchSampler& val) {
  const bool was_training = model.is_training();
  model.train(false);
  autograd::NoGradGuard no_grad;
  MlmEval ev;
  double loss_sum = 0.0;
  const int64_t n = eval_batch_count(r);
  for (int64_t i = 0; i < n; ++i) {
    const Scored s = score(model, eval_batch(r, val, i, n));
    if (s.masked == 0) continue;
    loss_sum += s.loss.item() * double(s.masked);
    ev.correct += s.correct;
    ev.masked_tokens += s.masked;
  }
  BRIGADE_CHECK(ev.masked_tokens > 0, DataError,
                "evaluation chose no position to mask ({} batches of {} x {} tokens); raise train.eval_batches or "
                "data.mlm_probability",
                n, r.train.batch_size, r.train.seq_len);
  ev.loss = loss_sum / double(ev.masked_tokens);
  ev.accuracy = double(ev.correct) / double(ev.masked_tokens);
  model.train(was_training);
  return ev;
}

// Unigram baselines of train.bin on the evaluation's masked positions: add-one smoothed
// probabilities over the maskable ids, and the accuracy of always answering the most frequent one.
void unigram_baselines(const Recipe& r, const data::TokenDataset& train_ds, const data::BatchSampler& val,
                       MlmResult& res) {
  const int64_t V = r.model.vocab_size;
  std::vector<int64_t> count(size_t(V), 0);
  for (int64_t i = 0; i < train_ds.size(); ++i) ++count[size_t(train_ds[i])];
  for (int64_t id : special_ids()) count[size_t(id)] = 0;
  int64_t total = 0, top = 3;
  for (int64_t id = 0; id < V; ++id) {
    total += count[size_t(id)];
    if (count[size_t(id)] > count[size_t(top)]) top = id;
  }
  const int64_t n = eval_batch_count(r);
  double nll = 0.0;
  int64_t hits = 0, masked = 0;
  for (int64_t i = 0; i < n; ++i) {
    const data::MlmBatch b = eval_batch(r, val, i, n);
    for (int64_t y : b.labels.to_vector_i64()) {
      if (y == -100) continue;
      ++masked;
      hits += y == top ? 1 : 0;
      const int64_t c = y < V ? count[size_t(y)] : 0;
      nll -= std::log(double(c + 1) / double(total + V));
    }
  }
  res.unigram_loss = masked ? nll / double(masked) : 0.0;
  res.unigram_accuracy = masked ? double(hits) / double(masked) : 0.0;
}

std::string eval_line(const MlmEval& ev) {
  return fmt::format("val MLM loss {:.6f} | masked accuracy {:.2f}% ({}/{} masked tokens)", ev.loss,
                     100.0 * ev.accuracy, ev.correct, ev.masked_tokens);
}

std::string file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

models::BERTConfig bert_config(const ModelConfig& m) {
  models::BERTConfig c;
  c.vocab_size = m.vocab_size + 1;  // + [MASK]
  c.max_position_embeddings = m.block_size;
  c.hidden_size = m.n_embd;
  c.num_hidden_layers = m.n_layer;
  c.num_attention_heads = m.n_head;
  c.intermediate_size = m.intermediate_size > 0 ? m.intermediate_size : 4 * m.n_embd;
  c.layer_norm_eps = m.layer_norm_eps;
  c.hidden_dropout = m.dropout;
  c.initializer_range = m.init_std;
  return c;
}

MlmResult run_mlm(const Recipe& r, const TrainOptions& opts) {
  const std::string where = "recipe " + (r.path.empty() ? std::string("(defaults)") : r.path);
  check_mlm_recipe(r, where);
  BRIGADE_CHECK(r.parallel.dp == 1 && dist::Env::world_size() == 1, ConfigError,
                "{}: model.type = \"bert\" trains on one process for now (processes: {}); run without mpirun", where,
                dist::Env::world_size());
  BRIGADE_CHECK(!opts.resume, ConfigError,
                "--resume is not supported for model.type = \"bert\" yet; start the run again without it");
  BRIGADE_CHECK(!opts.dry_run, ConfigError,
                "--dry-run predicts the language models' memory; model.type = \"bert\" has no prediction yet");
  BRIGADE_CHECK(r.train.accumulation == 1 && r.train.accumulation_mode == "static", ConfigError,
                "{}: train.accumulation = {} (mode \"{}\"): model.type = \"bert\" steps once per batch; set "
                "train.accumulation = 1 and raise train.batch_size instead",
                where, r.train.accumulation, r.train.accumulation_mode);
  if (r.run.threads > 0) omp_set_num_threads(r.run.threads);
  const bool tty = isatty(fileno(stderr)) && !opts.quiet;
  auto say = [&](const std::string& s) {
    if (!opts.quiet) fmt::print(stderr, "{}\n", s);
  };

  // data: prepared on first use, as the GPT trainer does; afterwards `brigade prepare` owns it
  const fs::path data_dir(r.data.dir);
  if (!fs::exists(data_dir / data::kMetaFile))
    data::prepare(prepare_options(r), [&](const data::PrepareProgress& p) { say("prepare: " + p.message); });
  const data::TokenDataset train_ds = open_split(r, data::kTrainFile, where);
  const data::TokenDataset val_ds = open_split(r, data::kValFile, where);
  const int64_t B = r.train.batch_size, T = r.train.seq_len;
  const data::BatchSampler sampler(train_ds, B, T, r.run.seed);
  const data::BatchSampler val_sampler(val_ds, B, T, r.run.seed);

  models::BERT model(bert_config(r.model));
  {
    Generator init(r.run.seed);
    model.init_weights(init);
    model.dropout_generator().manual_seed(r.run.seed + 1);
  }
  model.train(true);

  const std::shared_ptr<dist::ProcessGroup> world = dist::ProcessGroup::world();
  std::vector<parallel::ParamUnit> units{{"model", model.named_parameters(), nullptr}};
  parallel::DataParallel dp(std::move(units), world, parallel::DataParallelOptions{});
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(r.optim, dp.optimizer_params(), dp);
  const amp::Policy policy = precision_policy(r.precision);  // O0 (validated)
  amp::LossScaler scaler(loss_scaler_options(r.precision));

  const optim::Schedule sched = make_schedule(r);
  const int64_t last_step = opts.stop_at > 0 ? std::min(opts.stop_at, r.train.steps) : r.train.steps;

  MlmResult res;
  res.parameters = model.num_parameters();
  res.initial_loss = std::log(double(model.config().vocab_size));
  res.final_eval.loss = -1.0;
  unigram_baselines(r, train_ds, val_sampler, res);

  const fs::path out_dir(r.run.out_dir);
  fs::create_directories(out_dir);
  const fs::path metrics_path = out_dir / "metrics.jsonl";
  std::ofstream metrics(metrics_path, std::ios::trunc);
  BRIGADE_CHECK(metrics.good(), IoError, "cannot write {}; check run.out_dir", metrics_path.string());
  say(fmt::format("mlm: bert ({} parameters, vocab {} + [MASK] = id {}) on {} ({} train / {} val tokens), {} steps "
                  "of {} x {} tokens, {:.0f}% masked",
                  res.parameters, r.model.vocab_size, mlm_mask_id(r.model), r.data.dir, train_ds.size(),
                  val_ds.size(), r.train.steps, B, T, 100.0 * r.data.mlm_probability));
  say(fmt::format("baselines on the val masked positions: uniform loss ln({}) = {:.4f}; unigram loss {:.4f}, "
                  "most-frequent-token accuracy {:.2f}%",
                  model.config().vocab_size, res.initial_loss, res.unigram_loss, 100.0 * res.unigram_accuracy));

  using Clock = std::chrono::steady_clock;
  const auto t_start = Clock::now();
  std::vector<double> speeds;
  const StopSignalGuard stop_guard;  // Ctrl-C / SIGTERM: finish the step, checkpoint, exit 130
  const uint64_t train_mask_seed = data::splitmix64(r.run.seed ^ kTrainMask);
  Tensor x, y;  // (B, T) I64
  int64_t step = 0;
  while (step < last_step) {
    const auto t0 = Clock::now();
    sampler.get_batch(step, x, y);
    Generator mask_gen(data::splitmix64(train_mask_seed + uint64_t(step)));
    const data::MlmBatch b =
        data::mask_tokens(x, r.model.vocab_size + 1, mlm_mask_id(r.model), special_ids(), r.data.mlm_probability,
                          mask_gen);
    const double lr = sched.lr_at(step);
    dp.begin_step();
    dp.begin_micro_step(0);
    const Scored s = score(model, b);
    BRIGADE_CHECK(s.masked > 0, DataError,
                  "step {}: no position of the batch was chosen for masking; raise train.batch_size, train.seq_len "
                  "or data.mlm_probability",
                  step);
    autograd::backward(s.loss);
    const double loss_v = s.loss.item();
    dp.finish_gradients();
    const GradientStep gs = apply_gradients(dp, *opt, scaler, policy, r.train, lr, *world);
    ++step;
    BRIGADE_CHECK(std::isfinite(loss_v), ValueError,
                  "training diverged at step {} (loss {}); lower optim.lr or raise schedule.warmup_steps", step,
                  loss_v);
    res.last_loss = loss_v;
    const double acc = double(s.correct) / double(s.masked);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    const double tok_s = double(B * T) / dt;
    const bool log_now = step % r.train.log_every == 0 || step == last_step;
    if (log_now) {
      speeds.push_back(tok_s);
      nlohmann::json j{{"step", step}, {"loss", loss_v}, {"train_accuracy", acc}, {"lr", lr}, {"tokens_per_s", tok_s}};
      if (!gs.skipped) j["grad_norm"] = gs.grad_norm;
      metrics << j.dump() << '\n';
      metrics.flush();
    }
    if (!opts.quiet) {
      const double elapsed = std::chrono::duration<double>(Clock::now() - t_start).count();
      const double eta = elapsed / double(step) * double(last_step - step);
      const std::string line =
          fmt::format("step {:>5}/{} | loss {:.4f} | masked acc {:5.2f}% | lr {:.2e} | {:.0f} tok/s | ETA {}", step,
                      last_step, loss_v, 100.0 * acc, lr, tok_s, fmt_duration(eta));
      if (tty)
        fmt::print(stderr, "\r{}\033[K", line);
      else if (log_now)
        fmt::print(stderr, "{}\n", line);
    }
    if (stop_requested() && step < last_step) {
      res.interrupted = true;
      break;
    }
    const bool final_eval = step == last_step;
    if (final_eval || (r.train.eval_every > 0 && step % r.train.eval_every == 0)) {
      const MlmEval ev = evaluate(model, r, val_sampler);
      metrics << nlohmann::json{{"step", step}, {"val_loss", ev.loss}, {"mlm_accuracy", ev.accuracy},
                                {"masked_tokens", ev.masked_tokens}}
                     .dump()
              << '\n';
      metrics.flush();
      if (tty) fmt::print(stderr, "\n");
      say(fmt::format("eval step {}: {}", step, eval_line(ev)));
      res.final_eval = ev;  // the last evaluation; the final one once step == last_step
    }
  }
  if (tty && res.interrupted) fmt::print(stderr, "\n");
  res.steps = step;
  res.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  if (!speeds.empty()) {
    std::vector<double> sp = speeds;
    std::nth_element(sp.begin(), sp.begin() + long(sp.size() / 2), sp.end());
    res.tokens_per_s = sp[sp.size() / 2];
  }

  // checkpoint: parameters by Hugging Face name, optimizer state, state.json, recipe.toml, tokenizer
  const std::string ckpt_dir = (out_dir / "checkpoint").string();
  TrainState state;
  state.step = step;
  state.tokens_seen = step * B * T;
  state.rng_state = model.dropout_generator().state();
  state.last_val_loss = res.final_eval.loss;
  state.optimizer_steps = step - scaler.skipped();
  const std::string tmp = begin_checkpoint(ckpt_dir);
  write_checkpoint_files(tmp, model.named_parameters(), opt.get(), state, r,
                         (data_dir / data::kTokenizerFile).string());
  commit_checkpoint(ckpt_dir);
  res.checkpoint_dir = ckpt_dir;
  if (res.interrupted)
    say(fmt::format("interrupted at step {}: checkpoint saved in {} (no final evaluation; --resume is not supported "
                    "for bert)",
                    step, ckpt_dir));
  metrics.close();
  write_run_plot(metrics_path.string(), (out_dir / "loss.svg").string(),
                 r.run.name + " (bert masked-LM, " + r.data.corpus + ")", say);
  return res;
}

MlmEval evaluate_mlm_checkpoint(const std::string& ckpt_dir, int threads) {
  const Recipe r = eval_checkpoint_recipe(ckpt_dir, "runs/bert-kjv/checkpoint", threads);
  const std::string where = "--ckpt " + ckpt_dir;
  BRIGADE_CHECK(r.model.type == "bert", CheckpointError,
                "{}: a model.type = \"{}\" checkpoint, not a bert (masked-LM) one", where, r.model.type);
  check_mlm_recipe(r, where);
  // The val numbers only mean something on data encoded with the checkpoint's own tokenizer.
  const fs::path data_tok = fs::path(r.data.dir) / data::kTokenizerFile;
  const fs::path ckpt_tok = fs::path(ckpt_dir) / data::kTokenizerFile;
  BRIGADE_CHECK(fs::exists(data_tok), CheckpointError,
                "{}: the run's data.dir \"{}\" has no {} (relative paths are taken from the current directory); run "
                "`brigade eval` from the directory the run was started in, or `brigade prepare` the run's recipe",
                where, r.data.dir, data::kTokenizerFile);
  BRIGADE_CHECK(fs::exists(ckpt_tok) && file_bytes(ckpt_tok) == file_bytes(data_tok), CheckpointError,
                "{}: {} differs from the checkpoint's tokenizer.model, so val.bin was encoded with another "
                "vocabulary; prepare the run's data again (`brigade prepare` with its recipe.toml)",
                where, data_tok.string());
  models::BERT model(bert_config(r.model));
  load_model_weights((fs::path(ckpt_dir) / "model.safetensors").string(), model);
  const data::TokenDataset val_ds = open_split(r, data::kValFile, where);
  const data::BatchSampler val_sampler(val_ds, r.train.batch_size, r.train.seq_len, r.run.seed);
  return evaluate(model, r, val_sampler);
}

int train_bert_cli(const Recipe& r, const TrainOptions& opts) {
  const MlmResult res = run_mlm(r, opts);
  if (res.interrupted) return 130;  // the conventional exit status after SIGINT
  fmt::print("final {} | {} steps in {:.0f}s ({:.0f} tok/s median) | checkpoint {}\n", eval_line(res.final_eval),
             res.steps, res.seconds, res.tokens_per_s, res.checkpoint_dir);
  fmt::print("baselines: uniform loss {:.4f} | unigram loss {:.4f} | most-frequent-token accuracy {:.2f}%\n",
             res.initial_loss, res.unigram_loss, 100.0 * res.unigram_accuracy);
  return 0;
}

int eval_bert_cli(const std::string& ckpt_dir, int threads) {
  fmt::print("{}\n", eval_line(evaluate_mlm_checkpoint(ckpt_dir, threads)));
  return 0;
}

}  // namespace brigade::train
