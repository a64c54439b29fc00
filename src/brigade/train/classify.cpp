// Image classification from a recipe; see classify.h.
#include "brigade/train/classify.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "brigade/amp/loss_scaler.h"
#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/data/ext_fashion_mnist.h"
#include "brigade/dist/process_group.h"
#include "brigade/models/resnet/resnet.h"
#include "brigade/models/swin/swin.h"
#include "brigade/models/vit/vit.h"
#include "brigade/optim/schedule.h"
#include "brigade/parallel/data_parallel.h"
#include "brigade/train/checkpoint.h"
#include "brigade/train/run_metrics.h"

namespace fs = std::filesystem;

namespace brigade::train {
namespace {

// Test-set evaluation runs in chunks of this many images (independent of train.batch_size, so
// `brigade eval` reproduces the training run's final numbers exactly).
constexpr int64_t kEvalChunk = 500;

// The recipe's classifier behind one small interface.
struct Classifier {
  std::shared_ptr<models::ViT> vit;
  std::shared_ptr<models::ResNet> resnet;
  std::shared_ptr<models::Swin> swin;
  nn::Module& module() {
    if (vit) return *vit;
    if (swin) return *swin;
    return *resnet;
  }
  Tensor forward(const Tensor& x) const {
    return vit ? vit->forward(x) : swin ? swin->forward(x) : resnet->forward(x);
  }
  Tensor loss(const Tensor& x, const Tensor& y) const {
    return vit ? vit->loss(x, y) : swin ? swin->loss(x, y) : resnet->loss(x, y);
  }
  // Parameters, then (ResNet) BatchNorm buffers: what the checkpoint stores.
  nn::NamedTensors state_dict() const {
    return vit ? vit->named_parameters() : swin ? swin->named_parameters() : resnet->state_dict();
  }
};

models::ViTConfig vit_config(const ModelConfig& m) {
  models::ViTConfig c;
  c.image_size = m.image_size;
  c.patch_size = m.patch_size;
  c.num_channels = m.in_channels;
  c.hidden_size = m.n_embd;
  c.num_hidden_layers = m.n_layer;
  c.num_attention_heads = m.n_head;
  c.intermediate_size = m.intermediate_size > 0 ? m.intermediate_size : 4 * m.n_embd;
  c.num_labels = m.num_classes;
  c.layer_norm_eps = m.layer_norm_eps;
  c.hidden_dropout = m.dropout;
  c.initializer_range = m.init_std;
  return c;
}

models::SwinConfig swin_config(const ModelConfig& m) {
  models::SwinConfig c;
  c.image_size = m.image_size;
  c.patch_size = m.patch_size;
  c.num_channels = m.in_channels;
  c.embed_dim = m.n_embd;
  c.depths = swin_depths(m);
  c.num_heads.clear();
  for (size_t i = 0; i < c.depths.size(); ++i) c.num_heads.push_back(m.n_head << i);
  c.window_size = m.window_size;
  c.mlp_ratio = m.mlp_ratio;
  c.num_labels = m.num_classes;
  c.layer_norm_eps = m.layer_norm_eps;
  c.initializer_range = m.init_std;
  return c;
}

Classifier make_classifier(const ModelConfig& m) {
  Classifier c;
  if (m.type == "vit") {
    c.vit = std::make_shared<models::ViT>(vit_config(m));
  } else if (m.type == "swin") {
    c.swin = std::make_shared<models::Swin>(swin_config(m));
  } else {
    models::ResNetConfig rc = m.type == "resnet50" ? models::resnet50_config(m.num_classes, m.in_channels, true)
                                                   : models::resnet18_config(m.num_classes, m.in_channels, true);
    rc.width = m.width;
    c.resnet = std::make_shared<models::ResNet>(rc);
  }
  return c;
}

// Loss and accuracy on the first `limit` images of `set` (eval mode, no autograd, fp32).
EvalResult evaluate(Classifier& model, const data::FashionMnist& set, int64_t limit) {
  const int64_t n = std::min(limit, set.size());
  const bool was_training = model.module().is_training();
  model.module().train(false);
  autograd::NoGradGuard no_grad;
  EvalResult res;
  double loss_sum = 0;
  for (int64_t lo = 0; lo < n; lo += kEvalChunk) {
    const int64_t hi = std::min(n, lo + kEvalChunk);
    std::vector<int64_t> idx(size_t(hi - lo));
    for (int64_t i = lo; i < hi; ++i) idx[size_t(i - lo)] = i;
    const data::FashionMnist::Batch b = set.batch(idx);
    const Tensor logits = model.forward(b.images).contiguous();  // (N, classes)
    loss_sum += fn::cross_entropy(logits, b.labels).item() * double(hi - lo);
    const Tensor lf = logits.dtype() == DType::F32 ? logits : logits.to(DType::F32).contiguous();
    const float* p = lf.data<float>();
    const int64_t* y = b.labels.data<int64_t>();
    const int64_t k = lf.shape()[1];
    for (int64_t i = 0; i < hi - lo; ++i) {
      const float* row = p + i * k;
      const int64_t pred = int64_t(std::max_element(row, row + k) - row);
      res.correct += pred == y[i] ? 1 : 0;
    }
  }
  res.total = n;
  res.loss = n > 0 ? loss_sum / double(n) : 0.0;
  res.accuracy = n > 0 ? double(res.correct) / double(n) : 0.0;
  model.module().train(was_training);
  return res;
}

// Removes the evaluation record ({"step": step, "accuracy": ...}) of `step` from metrics.jsonl.
void drop_eval_record(const fs::path& p, int64_t step) {
  std::ifstream in(p);
  if (!in) return;
  std::vector<std::string> keep;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.value("step", int64_t(-1)) == step && j.contains("accuracy")) continue;
    keep.push_back(line);
  }
  in.close();
  std::ofstream out(p, std::ios::trunc);
  for (const std::string& l : keep) out << l << '\n';
}

void load_state_dict(const std::string& path, Classifier& model) {
  ckpt::SafetensorsReader r(path);
  std::set<std::string> expected;
  for (auto& [name, t] : model.state_dict()) {
    expected.insert(name);
    BRIGADE_CHECK(r.contains(name), CheckpointError,
                  "{}: tensor '{}' is missing; the checkpoint was written for a different model config", path, name);
    Tensor v = r.get(name);
    BRIGADE_CHECK(v.shape() == t.shape(), CheckpointError,
                  "{}: tensor '{}' has shape {} but the model expects {}; check model.* in the recipe", path, name,
                  shape_str(v.shape()), shape_str(t.shape()));
    t.copy_(v);
  }
  for (const std::string& name : r.names())
    BRIGADE_CHECK(expected.count(name), CheckpointError, "{}: unexpected tensor '{}' (not in this model's state)",
                  path, name);
}

}  // namespace

bool is_vision_model(const std::string& type) {
  return type == "vit" || type == "resnet18" || type == "resnet50" || type == "swin";
}

std::string fashion_mnist_dir(const Recipe& r) {
  return r.data.dir == DataConfig{}.dir ? std::string(data::kFashionMnistDir) : r.data.dir;
}

ClassifyResult run_classification(const Recipe& r, const TrainOptions& opts) {
  BRIGADE_CHECK(is_vision_model(r.model.type), ConfigError,
                "model.type = \"{}\" is not an image classifier (vit, resnet18, resnet50, swin)", r.model.type);
  BRIGADE_CHECK(r.parallel.dp == 1 && dist::Env::world_size() == 1, ConfigError,
                "recipe {}: parallel.dp = {} (processes: {}): the image classifiers train on one process for now; "
                "set parallel.dp = 1 and run without mpirun",
                r.path, r.parallel.dp, dist::Env::world_size());
  BRIGADE_CHECK(!opts.dry_run, ConfigError, "--dry-run predicts the language models' memory; model.type = \"{}\" has "
                "no prediction yet", r.model.type);
  if (r.run.threads > 0) omp_set_num_threads(r.run.threads);
  const bool tty = isatty(fileno(stderr)) && !opts.quiet;

  const std::string dir = fashion_mnist_dir(r);
  const data::FashionMnist train_set(dir, data::FashionMnist::Split::Train);
  const data::FashionMnist test_set(dir, data::FashionMnist::Split::Test);

  Classifier model = make_classifier(r.model);
  {
    Generator init(r.run.seed);
    if (model.vit) {
      model.vit->init_weights(init);
      model.vit->dropout_generator().manual_seed(r.run.seed + 1);
    } else if (model.swin) {
      model.swin->init_weights(init);
    } else {
      model.resnet->init_weights(init);
    }
  }
  model.module().train(true);

  parallel::DataParallelOptions dpo;
  const std::shared_ptr<dist::ProcessGroup> world = dist::ProcessGroup::world();
  std::vector<parallel::ParamUnit> units{{"model", model.module().named_parameters(), nullptr}};
  parallel::DataParallel dp(std::move(units), world, dpo);
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(r.optim, dp.optimizer_params(), dp);
  const amp::Policy policy = precision_policy(r.precision);
  amp::LossScaler scaler(loss_scaler_options(r.precision));
  if (policy.level == amp::Level::O3) round_state_to_low(dp, *opt, policy.low);

  const optim::Schedule sched = make_schedule(r);

  const int64_t B = r.train.batch_size;
  BRIGADE_CHECK(B <= train_set.size(), ConfigError, "train.batch_size = {} exceeds the {} training images", B,
                train_set.size());
  const data::ShuffledBatchSampler sampler(train_set.size(), B, r.run.seed, /*drop_last=*/true);
  const int64_t per_epoch = sampler.batches_per_epoch();
  const int64_t last_step = opts.stop_at > 0 ? std::min(opts.stop_at, r.train.steps) : r.train.steps;

  const fs::path out_dir(r.run.out_dir);
  fs::create_directories(out_dir);
  const fs::path metrics_path = out_dir / "metrics.jsonl";
  const std::string ckpt_dir = (out_dir / "checkpoint").string();
  int64_t step = 0;
  if (opts.resume) {  // the model, its buffers, the optimizer, dropout and loss-scaler state, the step
    BRIGADE_CHECK(checkpoint_exists(ckpt_dir), CheckpointError,
                  "--resume: no checkpoint in {}; run without --resume to start training", ckpt_dir);
    const Recipe saved = checkpoint_recipe(ckpt_dir);
    BRIGADE_CHECK(saved.model == r.model, CheckpointError,
                  "--resume: the checkpoint in {} holds a different model (model.* in its recipe.toml differs from "
                  "this recipe's); resume with the same model settings or start a new run.out_dir",
                  ckpt_dir);
    const TrainState st = checkpoint_state(ckpt_dir);
    BRIGADE_CHECK(st.step < last_step, ConfigError,
                  "nothing to train: the checkpoint in {} is at step {} and this run ends at step {}; raise "
                  "train.steps (e.g. --set train.steps={}) or --stop-at to continue",
                  ckpt_dir, st.step, last_step, r.train.steps + st.step);
    load_state_dict((fs::path(ckpt_dir) / "model.safetensors").string(), model);
    if (model.vit && !st.rng_state.empty()) model.vit->dropout_generator().set_state(st.rng_state);
    load_optimizer_state(ckpt_dir, *opt, st.optimizer_steps >= 0 ? st.optimizer_steps : st.step);
    scaler.set_state(st.scaler_state);
    step = st.step;
    truncate_metrics(metrics_path.string(), step);
    // The whole-test-set evaluation that ended the stopped run at `step` is not one the
    // uninterrupted run makes (unless `step` is a periodic evaluation step): drop it.
    if (r.train.eval_every == 0 || step % r.train.eval_every != 0) drop_eval_record(metrics_path, step);
  }
  std::ofstream metrics(metrics_path, opts.resume ? std::ios::app : std::ios::trunc);
  BRIGADE_CHECK(metrics.good(), IoError, "cannot write {}; check run.out_dir", metrics_path.string());
  auto say = [&](const std::string& s) {
    if (!opts.quiet) fmt::print(stderr, "{}\n", s);
  };
  say(fmt::format("classify: {} ({} parameters) on Fashion-MNIST ({} train / {} test images), {} steps of {} images "
                  "({:.2f} epochs){}",
                  r.model.type, model.module().num_parameters(), train_set.size(), test_set.size(), r.train.steps, B,
                  double(r.train.steps) / double(per_epoch), r.data.augment ? ", augmented" : ""));
  if (opts.resume) say(fmt::format("resumed from {} at step {}", ckpt_dir, step));

  using Clock = std::chrono::steady_clock;
  const auto t_start = Clock::now();
  ClassifyResult res;
  std::vector<double> speeds;
  const int64_t eval_limit = r.train.eval_batches * B;
  const int64_t first_step = step;
  const StopSignalGuard stop_guard;  // Ctrl-C / SIGTERM: finish the step, evaluate, checkpoint (exit 130)
  while (step < last_step) {
    const auto t0 = Clock::now();
    const int64_t epoch = step / per_epoch;
    const std::vector<int64_t> idx = sampler.batch(epoch, step % per_epoch);
    Generator aug(r.run.seed * 1000003ull + uint64_t(step) + 7);
    const data::FashionMnist::Batch b = train_set.batch(idx, r.data.augment ? &aug : nullptr);
    const double lr = sched.lr_at(step);
    dp.begin_step();
    dp.begin_micro_step(0);
    Tensor loss;
    {
      amp::AutocastScope autocast(policy);
      loss = model.loss(b.images, b.labels);
    }
    autograd::backward(scaler.enabled() ? fn::mul_scalar(loss, scaler.scale()) : loss);
    const double loss_v = loss.item();
    dp.finish_gradients();
    const GradientStep gs = apply_gradients(dp, *opt, scaler, policy, r.train, lr, *world);
    ++step;
    BRIGADE_CHECK(std::isfinite(loss_v), ValueError,
                  "training diverged at step {} (loss {}); lower optim.lr or raise schedule.warmup_steps", step,
                  loss_v);
    res.last_loss = loss_v;
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    const double img_s = double(B) / dt;
    const bool log_now = step % r.train.log_every == 0 || step == last_step;
    if (log_now) {
      speeds.push_back(img_s);
      nlohmann::json j{{"step", step}, {"loss", loss_v}, {"lr", lr}, {"images_per_s", img_s}, {"epoch", epoch}};
      if (!gs.skipped) j["grad_norm"] = gs.grad_norm;
      metrics << j.dump() << '\n';
      metrics.flush();
    }
    if (!opts.quiet) {
      const double elapsed = std::chrono::duration<double>(Clock::now() - t_start).count();
      const double eta = elapsed / double(step - first_step) * double(last_step - step);
      const std::string line =
          fmt::format("step {:>5}/{} | epoch {} | loss {:.4f} | lr {:.2e} | {:.0f} img/s | ETA {}", step, last_step,
                      epoch, loss_v, lr, img_s, fmt_duration(eta));
      if (tty)
        fmt::print(stderr, "\r{}\033[K", line);
      else if (log_now)
        fmt::print(stderr, "{}\n", line);
    }
    const bool stopping = stop_requested() && step < last_step;
    res.interrupted = stopping;
    const bool final_eval = step == last_step || stopping;
    if (final_eval || (r.train.eval_every > 0 && step % r.train.eval_every == 0)) {
      const EvalResult ev = evaluate(model, test_set, final_eval ? test_set.size() : eval_limit);
      metrics << nlohmann::json{{"step", step}, {"val_loss", ev.loss}, {"accuracy", ev.accuracy},
                                {"test_images", ev.total}}
                     .dump()
              << '\n';
      metrics.flush();
      if (tty) fmt::print(stderr, "\n");
      say(fmt::format("eval step {}: test loss {:.4f} | accuracy {:.2f}% ({}/{} test images)", step, ev.loss,
                      100.0 * ev.accuracy, ev.correct, ev.total));
      if (final_eval) {
        res.test_loss = ev.loss;
        res.test_accuracy = ev.accuracy;
        res.test_correct = ev.correct;
        res.test_total = ev.total;
      }
    }
    if (stopping) {
      say(fmt::format("interrupted at step {}: evaluated and checkpointed; continue with --resume", step));
      break;
    }
  }
  res.steps = step;
  res.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  if (!speeds.empty()) {
    std::vector<double> s = speeds;
    std::nth_element(s.begin(), s.begin() + long(s.size() / 2), s.end());
    res.images_per_s = s[s.size() / 2];
  }

  // checkpoint: parameters + buffers by name, optimizer state, state.json, recipe.toml
  TrainState state;
  state.step = step;
  state.tokens_seen = step * B;  // images seen
  state.last_val_loss = res.test_loss;
  state.optimizer_steps = opt->steps();
  state.scaler_state = scaler.state();
  if (model.vit) state.rng_state = model.vit->dropout_generator().state();
  const std::string tmp = begin_checkpoint(ckpt_dir);
  write_checkpoint_files(tmp, model.state_dict(), opt.get(), state, r, "");
  commit_checkpoint(ckpt_dir);
  res.checkpoint_dir = ckpt_dir;
  metrics.close();
  write_run_plot(metrics_path.string(), (out_dir / "loss.svg").string(),
                 r.run.name + " (" + r.model.type + ", Fashion-MNIST)", say);
  return res;
}

EvalResult evaluate_checkpoint(const std::string& ckpt_dir, int threads) {
  const Recipe r = eval_checkpoint_recipe(ckpt_dir, "runs/vit-fashion/checkpoint", threads);
  BRIGADE_CHECK(is_vision_model(r.model.type), CheckpointError,
                "--ckpt {}: a model.type = \"{}\" (language model) checkpoint; `brigade eval` evaluates the image "
                "classifiers (vit, resnet18, resnet50, swin); a language model's val loss is in its run's metrics.jsonl",
                ckpt_dir, r.model.type);
  Classifier model = make_classifier(r.model);
  load_state_dict((fs::path(ckpt_dir) / "model.safetensors").string(), model);
  const data::FashionMnist test_set(fashion_mnist_dir(r), data::FashionMnist::Split::Test);
  return evaluate(model, test_set, test_set.size());
}

}  // namespace brigade::train
