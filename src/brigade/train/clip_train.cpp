// Contrastive image-caption training and zero-shot evaluation; see clip_train.h.
#include "brigade/train/clip_train.h"

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

#include "brigade/amp/loss_scaler.h"
#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"
#include "brigade/dist/process_group.h"
#include "brigade/optim/schedule.h"
#include "brigade/parallel/data_parallel.h"
#include "brigade/train/checkpoint.h"
#include "brigade/train/classify.h"
#include "brigade/train/run_metrics.h"

namespace fs = std::filesystem;

namespace brigade::train {
namespace {

// Test images per evaluation chunk (and per group of test pairs for the contrastive loss);
// independent of train.batch_size so `brigade eval` reproduces the run's final numbers exactly.
constexpr int64_t kEvalChunk = 500;
// CLIP clamps logit_scale to ln(100): logits are at most 100 x cosine similarity.
const double kMaxLogitScale = std::log(100.0);

// Caption seeds: training step s and test chunk c draw from separate streams of run.seed
// (make_caption_pairs mixes the seed through splitmix64).
uint64_t train_caption_seed(uint64_t seed, int64_t step) {
  return seed * 0x9E3779B97F4A7C15ull + 0xC1A9ull * 1000003ull + uint64_t(step);
}
uint64_t test_caption_seed(uint64_t seed, int64_t chunk) {
  return seed * 0x9E3779B97F4A7C15ull + 0x7E57ull * 1000003ull + uint64_t(chunk) + (uint64_t(1) << 40);
}

void clamp_logit_scale(models::CLIP& model) {
  const double s = model.logit_scale.item();
  if (s > kMaxLogitScale) model.logit_scale.fill_(kMaxLogitScale);
  else if (s < 0.0) model.logit_scale.fill_(0.0);
}

}  // namespace

models::CLIPConfig clip_config(const ModelConfig& m, const data::CaptionTokenizer& tok) {
  models::CLIPConfig c;
  c.vision.image_size = m.image_size;
  c.vision.patch_size = m.patch_size;
  c.vision.num_channels = m.in_channels;
  c.vision.hidden_size = m.n_embd;
  c.vision.num_hidden_layers = m.n_layer;
  c.vision.num_attention_heads = m.n_head;
  c.vision.intermediate_size = m.intermediate_size > 0 ? m.intermediate_size : 4 * m.n_embd;
  c.vision.layer_norm_eps = m.layer_norm_eps;
  c.text.vocab_size = tok.vocab_size();
  c.text.max_position_embeddings = tok.max_length();
  c.text.hidden_size = m.text_width > 0 ? m.text_width : m.n_embd;
  c.text.num_hidden_layers = m.text_layers > 0 ? m.text_layers : m.n_layer;
  c.text.num_attention_heads = m.text_heads > 0 ? m.text_heads : m.n_head;
  c.text.intermediate_size = 4 * c.text.hidden_size;
  c.text.layer_norm_eps = m.layer_norm_eps;
  c.projection_dim = m.projection_dim > 0 ? m.projection_dim : m.n_embd;
  c.hidden_act = "quick_gelu";
  c.initializer_range = m.init_std;
  c.validate();
  return c;
}

ClipEvalResult evaluate_zero_shot(models::CLIP& model, const data::CaptionTokenizer& tok,
                                  const data::FashionMnist& test_set, int64_t limit, uint64_t caption_seed) {
  const int64_t n = std::min(limit, test_set.size());
  const int64_t ctx = model.config().text.max_position_embeddings;
  const bool was_training = model.is_training();
  model.train(false);
  autograd::NoGradGuard no_grad;
  const data::TokenBatch prompts = tok.batch(data::zero_shot_prompts(tok.class_names()), ctx);
  const Tensor class_embeds = model.encode_text(prompts.ids, prompts.lengths);  // (K, E)
  const int64_t K = class_embeds.size(0);
  ClipEvalResult res;
  double loss_sum = 0;
  for (int64_t lo = 0; lo < n; lo += kEvalChunk) {
    const int64_t hi = std::min(n, lo + kEvalChunk), m = hi - lo;
    std::vector<int64_t> idx(static_cast<size_t>(m));
    for (int64_t i = lo; i < hi; ++i) idx[size_t(i - lo)] = i;
    const data::FashionMnist::Batch b = test_set.batch(idx);
    const std::vector<int64_t> labels = b.labels.to_vector_i64();
    const Tensor img = model.encode_image(b.images);  // (m, E)
    // zero-shot: argmax of the cosine similarities, ties to the lowest class id
    const std::vector<float> s = fn::matmul(img, class_embeds, false, true).to_vector();  // (m, K)
    for (int64_t i = 0; i < m; ++i) {
      int64_t pred = 0;
      for (int64_t k = 1; k < K; ++k)
        if (s[size_t(i * K + k)] > s[size_t(i * K + pred)]) pred = k;
      res.correct += pred == labels[size_t(i)] ? 1 : 0;
    }
    // contrastive loss on this chunk's (image, caption) pairs
    const data::CaptionPairs pairs = data::make_caption_pairs(tok, labels, test_caption_seed(caption_seed, lo / kEvalChunk), ctx);
    const Tensor txt = model.encode_text(pairs.tokens.ids, pairs.tokens.lengths);  // (m, E)
    loss_sum += model.contrastive_loss_from_logits(model.logits_from_embeds(img, txt)).item() * double(m);
  }
  res.total = n;
  res.accuracy = n > 0 ? double(res.correct) / double(n) : 0.0;
  res.loss = n > 0 ? loss_sum / double(n) : 0.0;
  model.train(was_training);
  return res;
}

ClipResult run_clip(const Recipe& r, const TrainOptions& opts) {
  BRIGADE_CHECK(r.model.type == "clip", ConfigError, "recipe {}: model.type = \"{}\" is not \"clip\"", r.path,
                r.model.type);
  BRIGADE_CHECK(r.data.corpus == "fashion-mnist", ConfigError,
                "recipe {}: model.type = \"clip\" trains on data.corpus = \"fashion-mnist\" (image-caption pairs "
                "from the class names), not \"{}\"",
                r.path, r.data.corpus);
  BRIGADE_CHECK(r.parallel.dp == 1 && dist::Env::world_size() == 1, ConfigError,
                "recipe {}: parallel.dp = {} (processes: {}): CLIP trains on one process for now; set "
                "parallel.dp = 1 and run without mpirun",
                r.path, r.parallel.dp, dist::Env::world_size());
  BRIGADE_CHECK(!opts.resume, ConfigError,
                "--resume is not supported for model.type = \"clip\" yet; start the run again without it");
  BRIGADE_CHECK(!opts.dry_run, ConfigError,
                "--dry-run predicts the language models' memory; model.type = \"clip\" has no prediction yet");
  if (r.run.threads > 0) omp_set_num_threads(r.run.threads);
  const bool tty = isatty(fileno(stderr)) && !opts.quiet;

  const std::string dir = fashion_mnist_dir(r);
  const data::FashionMnist train_set(dir, data::FashionMnist::Split::Train);
  const data::FashionMnist test_set(dir, data::FashionMnist::Split::Test);
  const data::CaptionTokenizer tok;
  const int64_t ctx = tok.max_length();

  models::CLIP model(clip_config(r.model, tok));
  {
    Generator init(r.run.seed);
    model.init_weights(init);
  }
  model.train(true);

  parallel::DataParallelOptions dpo;
  const std::shared_ptr<dist::ProcessGroup> world = dist::ProcessGroup::world();
  std::vector<parallel::ParamUnit> units{{"model", model.named_parameters(), nullptr}};
  parallel::DataParallel dp(std::move(units), world, dpo);
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(r.optim, dp.optimizer_params(), dp);
  const amp::Policy policy = precision_policy(r.precision);
  amp::LossScaler scaler(loss_scaler_options(r.precision));

  const optim::Schedule sched = make_schedule(r);

  const int64_t B = r.train.batch_size;
  BRIGADE_CHECK(B >= 2 && B <= train_set.size(), ConfigError,
                "train.batch_size = {}: a contrastive batch needs 2 to {} (the training images) pairs", B,
                train_set.size());
  const data::ShuffledBatchSampler sampler(train_set.size(), B, r.run.seed, /*drop_last=*/true);
  const int64_t per_epoch = sampler.batches_per_epoch();
  const int64_t last_step = opts.stop_at > 0 ? std::min(opts.stop_at, r.train.steps) : r.train.steps;

  const fs::path out_dir(r.run.out_dir);
  fs::create_directories(out_dir);
  const fs::path metrics_path = out_dir / "metrics.jsonl";
  std::ofstream metrics(metrics_path, std::ios::trunc);
  BRIGADE_CHECK(metrics.good(), IoError, "cannot write {}; check run.out_dir", metrics_path.string());
  auto say = [&](const std::string& s) {
    if (!opts.quiet) fmt::print(stderr, "{}\n", s);
  };
  ClipResult res;
  res.num_parameters = model.num_parameters();
  say(fmt::format("clip: {} parameters (image tower {} layers x {}, patch {}; text tower {} layers x {}, context {}, "
                  "vocab {}; projection {}) on Fashion-MNIST image-caption pairs ({} train / {} test images), {} steps "
                  "of {} pairs ({:.2f} epochs){}",
                  res.num_parameters, model.config().vision.num_hidden_layers, model.config().vision.hidden_size,
                  model.config().vision.patch_size, model.config().text.num_hidden_layers,
                  model.config().text.hidden_size, ctx, tok.vocab_size(), model.config().projection_dim,
                  train_set.size(), test_set.size(), r.train.steps, B, double(r.train.steps) / double(per_epoch),
                  r.data.augment ? ", augmented" : ""));

  const StopSignalGuard stop_guard;  // Ctrl-C / SIGTERM: finish the step, evaluate, checkpoint, exit 130
  using Clock = std::chrono::steady_clock;
  const auto t_start = Clock::now();
  std::vector<double> speeds;
  const int64_t eval_limit = r.train.eval_batches * B;
  int64_t step = 0;
  while (step < last_step) {
    const auto t0 = Clock::now();
    const int64_t epoch = step / per_epoch;
    const std::vector<int64_t> idx = sampler.batch(epoch, step % per_epoch);
    Generator aug(r.run.seed * 1000003ull + uint64_t(step) + 7);
    const data::FashionMnist::Batch b = train_set.batch(idx, r.data.augment ? &aug : nullptr);
    const data::CaptionPairs pairs =
        data::make_caption_pairs(tok, b.labels.to_vector_i64(), train_caption_seed(r.run.seed, step), ctx);
    const double lr = sched.lr_at(step);
    dp.begin_step();
    dp.begin_micro_step(0);
    Tensor loss;
    {
      amp::AutocastScope autocast(policy);
      loss = model.contrastive_loss(b.images, pairs.tokens.ids, pairs.tokens.lengths);  // 0-d
    }
    autograd::backward(scaler.enabled() ? fn::mul_scalar(loss, scaler.scale()) : loss);
    const double loss_v = loss.item();
    dp.finish_gradients();
    const GradientStep gs = apply_gradients(dp, *opt, scaler, policy, r.train, lr, *world);
    clamp_logit_scale(model);
    ++step;
    BRIGADE_CHECK(std::isfinite(loss_v), ValueError,
                  "training diverged at step {} (loss {}); lower optim.lr or raise schedule.warmup_steps", step,
                  loss_v);
    res.last_loss = loss_v;
    const bool stop = stop_requested();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    const double img_s = double(B) / dt;
    const bool log_now = step % r.train.log_every == 0 || step == last_step || stop;
    if (log_now) {
      speeds.push_back(img_s);
      nlohmann::json j{{"step", step},   {"loss", loss_v}, {"lr", lr}, {"images_per_s", img_s},
                       {"epoch", epoch}, {"logit_scale", model.logit_scale.item()}};
      if (!gs.skipped) j["grad_norm"] = gs.grad_norm;
      metrics << j.dump() << '\n';
      metrics.flush();
    }
    if (!opts.quiet) {
      const double elapsed = std::chrono::duration<double>(Clock::now() - t_start).count();
      const double eta = elapsed / double(step) * double(last_step - step);
      const std::string line =
          fmt::format("step {:>5}/{} | epoch {} | loss {:.4f} | lr {:.2e} | {:.0f} img/s | ETA {}", step, last_step,
                      epoch, loss_v, lr, img_s, fmt_duration(eta));
      if (tty)
        fmt::print(stderr, "\r{}\033[K", line);
      else if (log_now)
        fmt::print(stderr, "{}\n", line);
    }
    const bool final_eval = step == last_step || stop;
    if (final_eval || (r.train.eval_every > 0 && step % r.train.eval_every == 0)) {
      const ClipEvalResult ev =
          evaluate_zero_shot(model, tok, test_set, final_eval ? test_set.size() : eval_limit, r.run.seed);
      metrics << nlohmann::json{{"step", step}, {"val_loss", ev.loss}, {"zero_shot_accuracy", ev.accuracy},
                                {"test_images", ev.total}}
                     .dump()
              << '\n';
      metrics.flush();
      if (tty) fmt::print(stderr, "\n");
      say(fmt::format("eval step {}: zero-shot accuracy {:.2f}% ({}/{} test images) | test-pair contrastive loss "
                      "{:.4f} | logit scale {:.3f}",
                      step, 100.0 * ev.accuracy, ev.correct, ev.total, ev.loss, model.logit_scale.item()));
      if (final_eval) {
        res.test_loss = ev.loss;
        res.zero_shot_accuracy = ev.accuracy;
        res.test_correct = ev.correct;
        res.test_total = ev.total;
      }
    }
    if (stop) {
      res.interrupted = true;
      say(fmt::format("stopped by a signal after step {}; writing the checkpoint", step));
      break;
    }
  }
  res.steps = step;
  res.logit_scale = model.logit_scale.item();
  res.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  if (!speeds.empty()) {
    std::vector<double> s = speeds;
    std::nth_element(s.begin(), s.begin() + long(s.size() / 2), s.end());
    res.images_per_s = s[s.size() / 2];
  }

  // checkpoint: parameters by Hugging Face CLIPModel name, optimizer state, state.json, recipe.toml
  const std::string ckpt_dir = (out_dir / "checkpoint").string();
  TrainState state;
  state.step = step;
  state.tokens_seen = step * B;  // pairs seen
  state.last_val_loss = res.test_loss;
  state.optimizer_steps = step - scaler.skipped();
  const std::string tmp = begin_checkpoint(ckpt_dir);
  write_checkpoint_files(tmp, model.named_parameters(), opt.get(), state, r, "");
  commit_checkpoint(ckpt_dir);
  res.checkpoint_dir = ckpt_dir;
  metrics.close();
  write_run_plot(metrics_path.string(), (out_dir / "loss.svg").string(),
                 r.run.name + " (clip, Fashion-MNIST; val = test-pair contrastive loss)", say);
  return res;
}

ClipEvalResult evaluate_clip_checkpoint(const std::string& ckpt_dir, int threads) {
  const Recipe r = eval_checkpoint_recipe(ckpt_dir, "runs/clip-fashion/checkpoint", threads);
  BRIGADE_CHECK(r.model.type == "clip", CheckpointError,
                "--ckpt {}: a model.type = \"{}\" checkpoint, not a clip one; `brigade eval` picks the right "
                "evaluation by itself",
                ckpt_dir, r.model.type);
  const data::CaptionTokenizer tok;
  models::CLIP model(clip_config(r.model, tok));
  load_model_weights((fs::path(ckpt_dir) / "model.safetensors").string(), model);
  const data::FashionMnist test_set(fashion_mnist_dir(r), data::FashionMnist::Split::Test);
  return evaluate_zero_shot(model, tok, test_set, test_set.size(), r.run.seed);
}

int train_clip_cli(const Recipe& r, const TrainOptions& opts) {
  const ClipResult res = run_clip(r, opts);
  fmt::print("final zero-shot test accuracy: {:.2f}% ({}/{}) | test-pair contrastive loss {:.4f} | {} steps in {:.0f}s "
             "| checkpoint {}\n",
             100.0 * res.zero_shot_accuracy, res.test_correct, res.test_total, res.test_loss, res.steps, res.seconds,
             res.checkpoint_dir);
  return res.interrupted ? 130 : 0;
}

int eval_clip_cli(const std::string& ckpt_dir, int threads) {
  const ClipEvalResult ev = evaluate_clip_checkpoint(ckpt_dir, threads);
  fmt::print("zero-shot test accuracy: {:.2f}% ({}/{}) over the 10 class captions | test-pair contrastive loss {:.4f}\n",
             100.0 * ev.accuracy, ev.correct, ev.total, ev.loss);
  return 0;
}

}  // namespace brigade::train
