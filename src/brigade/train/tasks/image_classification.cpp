// Image classification on Fashion-MNIST (ViT, ResNet, Swin, user models); see tasks.h.
#include <algorithm>
#include <optional>

#include "brigade/amp/policy.h"
#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"
#include "brigade/data/ext_fashion_mnist.h"
#include "brigade/train/tasks.h"

namespace brigade::train {

namespace {

// Test-set evaluation runs in chunks of this many images (independent of train.batch_size and
// of the data-parallel split, so `brigade eval` reproduces a run's final numbers exactly).
constexpr int64_t kEvalChunk = 500;

// Augmentation draws of step s (crop offsets and flips over the global batch, in order).
uint64_t augment_seed(uint64_t seed, int64_t step) { return seed * 1000003ull + uint64_t(step) + 7; }

}  // namespace

std::string fashion_mnist_dir(const Recipe& r) {
  return r.data.dir == DataConfig{}.dir ? std::string(data::kFashionMnistDir) : r.data.dir;
}

void add_image_scores(const Tensor& logits_in, const Batch& b, Metrics& m) {
  const Tensor logits = logits_in.contiguous();  // (N, classes)
  m.add("loss_sum", fn::cross_entropy(logits, b.at("labels")).item() * double(b.rows));
  const Tensor lf = logits.dtype() == DType::F32 ? logits : logits.to(DType::F32).contiguous();
  const float* p = lf.data<float>();
  const int64_t* y = b.at("labels").data<int64_t>();
  const int64_t k = lf.shape()[1];
  int64_t correct = 0;
  for (int64_t i = 0; i < b.rows; ++i) {
    const float* row = p + i * k;
    correct += int64_t(std::max_element(row, row + k) - row) == y[i] ? 1 : 0;
  }
  m.add("correct", double(correct));
  m.add("images", double(b.rows));
}

namespace {

// Fashion-MNIST (data.dir, or Debian's folder when data.dir is left at its default). The step's
// global batch is batch (s mod E) of epoch s / E of a shuffled permutation (E = 60000 / global
// batch, the last partial batch dropped), augmented (data.augment) from a generator seeded by
// (run.seed, step) over the global batch in order; each micro-batch takes its rows. Evaluation
// on the TEST set in chunks of 500 (split over ranks, sums exact): periodic ones on its first
// eval_batches x global batch images, the final one on all 10000.
class ImageClassificationTask : public Task {
 public:
  ImageClassificationTask(const Recipe& r, ImageClassifier c) : r_(r), c_(std::move(c)) {
    BRIGADE_CHECK(c_.module && c_.forward, ValueError, "ImageClassificationTask: the classifier needs a module and a forward");
  }
  nn::Module& model() override { return *c_.module; }
  std::vector<parallel::ParamUnit> units(int zero) override { return single_unit_below_zero3(*c_.module, zero); }
  nn::NamedTensors state_dict() override {
    nn::NamedTensors out = c_.module->named_parameters();
    for (auto& b : c_.buffers) out.push_back(b);
    return out;
  }
  nn::NamedTensors buffers() override { return c_.buffers; }
  Generator* dropout_generator() override { return c_.dropout; }
  std::string describe() override {
    return fmt::format("{}, {} parameters", c_.description, c_.module->num_parameters());
  }
  void open_data(dist::ProcessGroup& ctrl, const std::function<void(const std::string&)>& say) override {
    const std::string dir = fashion_mnist_dir(r_);
    train_set_.emplace(dir, data::FashionMnist::Split::Train);
    test_set_.emplace(dir, data::FashionMnist::Split::Test);
    const int64_t G = r_.train.batch_size * r_.train.accumulation * r_.parallel.dp;
    BRIGADE_CHECK(G <= train_set_->size(), ConfigError,
                  "recipe {}: the global batch (train.batch_size x accumulation x dp = {}) exceeds the {} training images",
                  r_.path, G, train_set_->size());
  }
  ItemKind item_kind() const override { return ItemKind::Image; }
  double flops_per_item() const override { return c_.flops_per_image; }
  std::string data_summary() override {
    const int64_t G = r_.train.batch_size * r_.train.accumulation * r_.parallel.dp;
    return fmt::format("Fashion-MNIST {} train / {} test images, {:.2f} epochs of {} images{}", train_set_->size(),
                       test_set_->size(), double(r_.train.steps * G) / double(train_set_->size()), G,
                       r_.data.augment ? ", augmented" : "");
  }
  Batch batch(int64_t step, int64_t micro, int64_t micro_steps, const Shard& s) override {
    const int64_t B = r_.train.batch_size, G = B * micro_steps * s.world;
    if (cached_step_ != step || cached_global_ != G) {
      // The step's global batch: batch (step mod E) of epoch step / E, augmented in order.
      const data::ShuffledBatchSampler sampler(train_set_->size(), G, r_.run.seed, /*drop_last=*/true);
      const int64_t per_epoch = sampler.batches_per_epoch();
      const std::vector<int64_t> idx = sampler.batch(step / per_epoch, step % per_epoch);
      Generator aug(augment_seed(r_.run.seed, step));
      cached_ = train_set_->batch(idx, r_.data.augment ? &aug : nullptr);
      cached_step_ = step, cached_global_ = G;
    }
    const int64_t lo = (micro * s.world + s.rank) * B;
    Batch b;
    b.t["images"] = G == B ? cached_.images : cached_.images.narrow(0, lo, B);  // (B, 1, 28, 28)
    b.t["labels"] = G == B ? cached_.labels : cached_.labels.narrow(0, lo, B);  // (B)
    b.rows = B;
    b.count = B;
    return b;
  }
  Loss loss(const Batch& b, int64_t micro, Metrics& m) override {
    return {fn::cross_entropy(c_.forward(b.at("images")), b.at("labels"))};
  }
  std::vector<std::string> train_metric_keys() const override { return {}; }
  nlohmann::json train_fields(const Metrics& m, int64_t step) const override {
    return {{"epoch", epoch_of(step - 1)}};
  }
  std::string train_progress(const Metrics& m, int64_t step) const override {
    return fmt::format(" | epoch {}", epoch_of(step - 1));
  }
  Metrics evaluate(bool final, const Shard& s, const Scorer& score) override {
    const int64_t G = r_.train.batch_size * r_.train.accumulation * r_.parallel.dp;
    const int64_t n = std::min(final ? test_set_->size() : r_.train.eval_batches * G, test_set_->size());
    Metrics m;
    for (int64_t c0 = 0; c0 < n; c0 += kEvalChunk) {
      // Every replica scores its rows of every chunk: the same number of forwards on every rank
      // (ZeRO-3's forward gathers its parameters collectively).
      const int64_t len = std::min(n, c0 + kEvalChunk) - c0;
      const int64_t lo = c0 + len * s.rank / s.world, hi = c0 + len * (s.rank + 1) / s.world;
      if (hi <= lo) continue;
      std::vector<int64_t> idx(size_t(hi - lo));
      for (int64_t i = lo; i < hi; ++i) idx[size_t(i - lo)] = i;
      const data::FashionMnist::Batch fb = test_set_->batch(idx);
      Batch b;
      b.t["images"] = fb.images;
      b.t["labels"] = fb.labels;
      b.rows = b.count = hi - lo;
      score(b, m);
    }
    return m;
  }
  void score(const Batch& b, Metrics& m) override {
    amp::AutocastScope fp32(amp::Policy{});  // evaluation runs in fp32 at every precision level
    add_image_scores(c_.forward(b.at("images")), b, m);
  }
  std::vector<std::string> eval_metric_keys() const override { return {"loss_sum", "correct", "images"}; }
  nlohmann::json eval_fields(const Metrics& m) const override {
    const double n = m.get("images");
    return {{"val_loss", n > 0 ? m.get("loss_sum") / n : 0.0},
            {"accuracy", n > 0 ? m.get("correct") / n : 0.0},
            {"test_images", int64_t(n)}};
  }
  std::string eval_line(const Metrics& m) const override {
    const double n = m.get("images");
    return fmt::format("test accuracy: {:.2f}% ({}/{}) | test loss {:.4f}", n > 0 ? 100.0 * m.get("correct") / n : 0.0,
                       int64_t(m.get("correct")), int64_t(n), n > 0 ? m.get("loss_sum") / n : 0.0);
  }
  std::string final_line(const Metrics& m) const override {
    const double n = m.get("images");
    return fmt::format("final test accuracy: {:.2f}% ({}/{}) | test loss {:.4f}", n > 0 ? 100.0 * m.get("correct") / n : 0.0,
                       int64_t(m.get("correct")), int64_t(n), n > 0 ? m.get("loss_sum") / n : 0.0);
  }
  const Stages* stages() override { return c_.stages ? &*c_.stages : nullptr; }
  Batch synthetic_batch(uint64_t seed, int64_t rows = -1) override {
    const int64_t B = rows > 0 ? rows : r_.train.batch_size;
    Tensor images = Tensor::empty({B, 1, 28, 28}, DType::F32);  // (B, 1, 28, 28)
    Tensor labels = Tensor::empty({B}, DType::I64);            // (B)
    Generator g(seed);
    float* p = images.data<float>();
    for (int64_t i = 0; i < images.numel(); ++i) p[i] = float(g.uniform_double() * 2.0 - 1.0);
    int64_t* y = labels.data<int64_t>();
    for (int64_t i = 0; i < B; ++i) y[i] = std::min<int64_t>(int64_t(g.uniform_double() * 10.0), 9);
    Batch b;
    b.t["images"] = images;
    b.t["labels"] = labels;
    b.rows = b.count = B;
    return b;
  }
  int64_t eval_rows() const override { return kEvalChunk; }

 private:
  int64_t epoch_of(int64_t step) const {
    const int64_t G = r_.train.batch_size * r_.train.accumulation * r_.parallel.dp;
    const int64_t n = train_set_ ? train_set_->size() : 60000;
    const int64_t per_epoch = std::max<int64_t>(1, n / G);
    return step / per_epoch;
  }
  Recipe r_;
  ImageClassifier c_;
  std::optional<data::FashionMnist> train_set_, test_set_;
  int64_t cached_step_ = -1, cached_global_ = 0;
  data::FashionMnist::Batch cached_;
};

}  // namespace

std::unique_ptr<Task> image_classification_task(const Recipe& r, ImageClassifier c) {
  return std::make_unique<ImageClassificationTask>(r, std::move(c));
}

}  // namespace brigade::train
