// Image classification on Fashion-MNIST (ViT, ResNet, Swin, user models), or on random images
// of any shape for `brigade bench` (data.corpus = "synthetic"); see tasks.h.
#include <algorithm>

#include "brigade/amp/policy.h"
#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"
#include "brigade/train/tasks.h"
#include "brigade/train/tasks/fashion.h"

namespace brigade::train {

std::string fashion_mnist_dir(const Recipe& r) {
  return r.data.dir == DataConfig{}.dir ? std::string(data::kFashionMnistDir) : r.data.dir;
}

int64_t argmax_hits(const Tensor& scores, const Tensor& labels) {
  const Tensor f =
      scores.dtype() == DType::F32 ? scores.detach().contiguous() : scores.detach().to(DType::F32).contiguous();
  const float* p = f.data<float>();
  const Tensor y = labels.contiguous();
  const int64_t* yp = y.data<int64_t>();
  const int64_t n = f.shape()[0], k = f.shape()[1];
  int64_t hits = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float* row = p + i * k;
    hits += int64_t(std::max_element(row, row + k) - row) == yp[i] ? 1 : 0;
  }
  return hits;
}

void add_image_scores(const Tensor& logits, const Batch& b, Metrics& m) {
  m.add("loss_sum", fn::cross_entropy(logits, b.at("labels")).item() * double(b.rows));
  m.add("correct", double(argmax_hits(logits, b.at("labels"))));
  m.add("images", double(b.rows));
}

namespace {

// Fashion-MNIST as FashionMnistData reads it; each micro-batch takes its rows of the step's
// global batch. Evaluation chunks are split over the ranks (the sums are exact).
class ImageClassificationTask : public Task {
 public:
  ImageClassificationTask(const Recipe& r, ImageClassifier c) : r_(r), c_(std::move(c)), data_(r) {
    BRIGADE_CHECK(c_.module && c_.forward, ValueError,
                  "ImageClassificationTask: the classifier needs a module and a forward");
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
    BRIGADE_CHECK(r_.data.corpus != "synthetic", ConfigError,
                  "recipe {}: data.corpus = \"synthetic\" is random images with random labels, for `brigade bench` "
                  "and `brigade train --dry-run` only: there is nothing to learn; set data.corpus = \"fashion-mnist\" "
                  "to train",
                  r_.path);
    data_.open(1, "");
  }
  ItemKind item_kind() const override { return ItemKind::Image; }
  double flops_per_item() const override { return c_.flops_per_image; }
  std::string data_summary() override { return data_.summary("images"); }
  Batch batch(int64_t step, int64_t micro, int64_t micro_steps, const Shard& s) override {
    const int64_t B = r_.train.batch_size, G = B * micro_steps * s.world;
    const data::FashionMnist::Batch& all = data_.global_batch(step, G);
    const int64_t lo = (micro * s.world + s.rank) * B;
    Batch b;
    b.t["images"] = G == B ? all.images : all.images.narrow(0, lo, B);  // (B, 1, 28, 28)
    b.t["labels"] = G == B ? all.labels : all.labels.narrow(0, lo, B);  // (B)
    b.rows = B;
    b.count = B;
    return b;
  }
  Loss loss(const Batch& b, int64_t micro, Metrics& m) override {
    return {fn::cross_entropy(c_.forward(b.at("images")), b.at("labels")), {}};
  }
  std::vector<std::string> train_metric_keys() const override { return {}; }
  nlohmann::json train_fields(const Metrics& m, int64_t step) const override {
    return {{"epoch", data_.epoch(step - 1)}};
  }
  std::string train_progress(const Metrics& m, int64_t step) const override {
    return fmt::format(" | epoch {}", data_.epoch(step - 1));
  }
  Metrics evaluate(bool final, const Shard& s, const Scorer& score) override {
    const int64_t n = data_.eval_images(final), kEvalChunk = FashionMnistData::kEvalChunk;
    Metrics m;
    for (int64_t c0 = 0; c0 < n; c0 += kEvalChunk) {
      // Every replica scores its rows of every chunk: the same number of forwards on every rank
      // (ZeRO-3's forward gathers its parameters collectively).
      const int64_t len = std::min(n, c0 + kEvalChunk) - c0;
      const int64_t lo = c0 + len * s.rank / s.world, hi = c0 + len * (s.rank + 1) / s.world;
      if (hi <= lo) continue;
      const data::FashionMnist::Batch fb = data_.test(lo, hi);
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
    return fmt::format("final test accuracy: {:.2f}% ({}/{}) | test loss {:.4f}",
                       n > 0 ? 100.0 * m.get("correct") / n : 0.0, int64_t(m.get("correct")), int64_t(n),
                       n > 0 ? m.get("loss_sum") / n : 0.0);
  }
  const Stages* stages() override { return c_.stages ? &*c_.stages : nullptr; }
  Batch synthetic_batch(uint64_t seed, int64_t rows = -1) override {
    const int64_t B = rows > 0 ? rows : r_.train.batch_size;
    Generator g(seed);
    std::vector<int64_t> labels;
    Batch b;
    // (B, C, S, S): Fashion-MNIST's (B, 1, 28, 28) unless data.corpus = "synthetic" sets another shape
    b.t["images"] = FashionMnistData::synthetic_images(g, B, labels, r_.model.in_channels, r_.model.image_size,
                                                       r_.model.num_classes);
    b.t["labels"] = Tensor::from_vector_i64(labels, {B});  // (B)
    b.rows = b.count = B;
    return b;
  }
  // Synthetic images (bench, --dry-run and calibrate at shapes Fashion-MNIST does not have) are
  // never evaluated, since training refuses them: their dry step evaluates one training batch
  // rather than a 500-image chunk at, say, 224 x 224 (tens of GiB for Swin-B).
  int64_t eval_rows() const override {
    return r_.data.corpus == "synthetic" ? r_.train.batch_size : FashionMnistData::kEvalChunk;
  }

 private:
  Recipe r_;
  ImageClassifier c_;
  FashionMnistData data_;
};

}  // namespace

std::unique_ptr<Task> image_classification_task(const Recipe& r, ImageClassifier c) {
  return std::make_unique<ImageClassificationTask>(r, std::move(c));
}

}  // namespace brigade::train
