// Contrastive image-caption training (CLIP, ALIGN) with zero-shot evaluation; see tasks.h.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"
#include "brigade/data/image/captions.h"
#include "brigade/nn/conv.h"
#include "brigade/nn/norm.h"
#include "brigade/train/tasks.h"
#include "brigade/train/tasks/fashion.h"

namespace brigade::train {

namespace {

// Test images per evaluation chunk, and per group of test pairs for the contrastive loss.
constexpr int64_t kEvalChunk = FashionMnistData::kEvalChunk;

// Caption seeds: training step s and test chunk c draw from separate streams of run.seed
// (make_caption_pairs mixes the seed through splitmix64).
uint64_t train_caption_seed(uint64_t seed, int64_t step) {
  return seed * 0x9E3779B97F4A7C15ull + 0xC1A9ull * 1000003ull + uint64_t(step);
}
uint64_t test_caption_seed(uint64_t seed, int64_t chunk) {
  return seed * 0x9E3779B97F4A7C15ull + 0x7E57ull * 1000003ull + uint64_t(chunk) + (uint64_t(1) << 40);
}

// Retrieval recall is reported at these K, per direction.
constexpr std::array<int64_t, 3> kRecallAt{1, 5, 10};
std::string recall_key(int dir, int64_t k) {
  return fmt::format("{}_recall_at_{}", dir == 0 ? "image_to_text" : "text_to_image", k);
}
// "recall@1/5/10 image->text 81.2/97.0/99.1%, text->image 80.3/96.2/98.8%" (class-level, per chunk)
std::string recall_text(const Metrics& m) {
  const double n = m.get("images");
  std::string s = "class-level recall@1/5/10";
  for (int dir = 0; dir < 2; ++dir) {
    s += dir == 0 ? " image->text " : ", text->image ";
    for (size_t i = 0; i < kRecallAt.size(); ++i)
      s += fmt::format("{}{:.1f}", i ? "/" : "", n > 0 ? 100.0 * m.get(recall_key(dir, kRecallAt[i])) / n : 0.0);
    s += "%";
  }
  return s;
}

}  // namespace

namespace {

// The contrastive task as tasks.h describes it (contrastive_task).
class ContrastiveTask : public Task {
 public:
  ContrastiveTask(const Recipe& r, std::unique_ptr<models::DualEncoder> model)
      : r_(r), model_(std::move(model)), data_(r) {}
  nn::Module& model() override { return *model_; }
  std::vector<parallel::ParamUnit> units(int zero) override { return single_unit_below_zero3(*model_, zero); }
  nn::NamedTensors state_dict() override {
    nn::NamedTensors out = model_->named_parameters();
    for (auto& b : model_->named_buffers()) out.push_back(b);
    return out;
  }
  nn::NamedTensors buffers() override { return model_->named_buffers(); }
  std::string describe() override {
    return fmt::format("{}, context {}, vocab {}; embedding {}; {} parameters", model_->describe(), tok_.max_length(),
                       tok_.vocab_size(), model_->embed_dim(), model_->num_parameters());
  }
  void open_data(dist::ProcessGroup& ctrl, const std::function<void(const std::string&)>& say) override {
    data_.open(2, ": the contrastive loss needs two pairs at least");
  }
  ItemKind item_kind() const override { return ItemKind::Pair; }
  double flops_per_item() const override { return model_->flops_per_pair(); }
  std::string data_summary() override { return data_.summary("image-caption pairs"); }
  Batch batch(int64_t step, int64_t micro, int64_t micro_steps, const Shard& s) override {
    const int64_t B = r_.train.batch_size, G = B * micro_steps * s.world, ctx = tok_.max_length();
    if (cached_step_ != step || cached_global_ != G) {
      const data::FashionMnist::Batch& fb = data_.global_batch(step, G);
      const data::CaptionPairs pairs =
          data::make_caption_pairs(tok_, fb.labels.to_vector_i64(), train_caption_seed(r_.run.seed, step), ctx);
      cached_ = Batch();
      cached_.t["images"] = fb.images;              // (G, 1, 28, 28)
      cached_.t["ids"] = pairs.tokens.ids;          // (G, ctx)
      cached_.t["lengths"] = pairs.tokens.lengths;  // (G)
      cached_.rows = cached_.count = G;
      cached_step_ = step, cached_global_ = G;
    }
    return G == B ? cached_ : cached_.narrow((micro * s.world + s.rank) * B, B);
  }
  bool needs_whole_step() const override { return true; }  // the loss couples the whole global batch
  bool rows_independent() const override { return false; }
  void begin_step(std::vector<Batch>& micro, const Shard& s) override {
    const int64_t A = int64_t(micro.size()), D = s.world;
    split_ = A * D;
    cached_grads_ = split_ > 1;
    if (!cached_grads_) return;
    // GradCache: the global batch's embeddings without a graph, gathered from every rank ...
    const int64_t B = r_.train.batch_size, E = model_->embed_dim(), G = B * A * D;
    std::vector<float> mine(size_t(A * 2 * B * E));
    {
      autograd::NoGradGuard ng;
      // BatchNorm normalises with the same batch statistics in the gradient pass below, which
      // moves the running statistics; this pass leaves them alone
      nn::FrozenBatchNormStats frozen;
      for (int64_t m = 0; m < A; ++m) {
        // the text tower first, as DualEncoder::logits runs them (ZeRO-3 gathers the blocks in that order)
        const Tensor txt =
            model_->encode_text(micro[size_t(m)].at("ids"), micro[size_t(m)].at("lengths")).to(DType::F32).contiguous();
        const Tensor img = model_->encode_image(micro[size_t(m)].at("images")).to(DType::F32).contiguous();  // (B, E)
        std::memcpy(mine.data() + size_t(m * 2 * B * E), img.data<float>(), size_t(B * E) * sizeof(float));
        std::memcpy(mine.data() + size_t((m * 2 + 1) * B * E), txt.data<float>(), size_t(B * E) * sizeof(float));
      }
    }
    std::vector<float> all(size_t(D) * mine.size());
    if (D > 1)
      s.group->allgather(mine.data(), all.data(), std::vector<int64_t>(size_t(D), int64_t(mine.size())));
    else
      all = mine;
    // ... in the global batch's row order (micro-step m of replica r holds rows [(m D + r) B, +B)),
    Tensor img_all = Tensor::empty({G, E}, DType::F32), txt_all = Tensor::empty({G, E}, DType::F32);  // (G, E)
    for (int64_t r = 0; r < D; ++r)
      for (int64_t m = 0; m < A; ++m) {
        const float* src = all.data() + size_t(r) * mine.size() + size_t(m * 2 * B * E);
        const int64_t row = (m * D + r) * B;
        std::memcpy(img_all.data<float>() + row * E, src, size_t(B * E) * sizeof(float));
        std::memcpy(txt_all.data<float>() + row * E, src + B * E, size_t(B * E) * sizeof(float));
      }
    // ... the global loss and its gradient with respect to every embedding and the scale (fp32).
    amp::AutocastScope fp32(amp::Policy{});
    img_all.set_requires_grad(true);
    txt_all.set_requires_grad(true);
    Tensor scale = Tensor::full({}, model_->scale_parameter().item(), DType::F32);  // 0-d, a leaf copy
    scale.set_requires_grad(true);
    const Tensor logits = model_->logits_with_scale(img_all, txt_all, scale);  // (G, G)
    const Tensor loss = model_->contrastive_loss_from_logits(logits);
    autograd::backward(loss);
    global_loss_ = loss.item();
    scale_grad_ = scale.grad().item();
    img_grad_.clear();
    txt_grad_.clear();
    for (int64_t m = 0; m < A; ++m) {
      const int64_t row = (m * D + s.rank) * B;
      img_grad_.push_back(img_all.grad().narrow(0, row, B).contiguous());  // (B, E)
      txt_grad_.push_back(txt_all.grad().narrow(0, row, B).contiguous());  // (B, E)
    }
  }
  Loss loss(const Batch& b, int64_t micro, Metrics& m) override {
    if (!cached_grads_) return {model_->contrastive_loss(b.at("images"), b.at("ids"), b.at("lengths")), {}};  // 0-d
    // A surrogate whose gradient is this micro-batch's share of the global loss's: the trainer
    // averages micro-steps and ranks (1 / (A D)), hence the factor A D on the embedding terms; the
    // scale's gradient is the same on every micro-step and rank.
    const Tensor txt = model_->encode_text(b.at("ids"), b.at("lengths"));  // (B, E); text first, as logits()
    const Tensor img = model_->encode_image(b.at("images"));               // (B, E)
    const Tensor dots = fn::add(fn::sum_all(fn::mul(img, img_grad_[size_t(micro)])),
                                fn::sum_all(fn::mul(txt, txt_grad_[size_t(micro)])));  // ()
    const Tensor surrogate =
        fn::add(fn::mul_scalar(dots, double(split_)), fn::mul_scalar(model_->scale_parameter(), scale_grad_));
    return {surrogate, global_loss_};
  }
  void after_update(const nn::NamedTensors& master) override {
    // the scale kept in the model's range (CLIP: logit_scale in [0, ln 100]; ALIGN: temperature >= 0.01)
    for (auto [name, p] : master) {
      if (name != model_->scale_name() || p.numel() == 0) continue;
      const double s = p.item(), c = model_->clamp_scale(s);
      if (c != s) p.fill_(c);
    }
  }
  nlohmann::json train_fields(const Metrics& m, int64_t step) const override {
    nlohmann::json j{{"epoch", data_.epoch(step - 1)}};
    // ZeRO-3 keeps the scale sharded between steps: not logged then
    if (model_->scale_parameter().materialized()) j[model_->scale_name()] = model_->scale_parameter().item();
    return j;
  }
  std::string train_progress(const Metrics& m, int64_t step) const override {
    return fmt::format(" | epoch {}", train_fields(m, step)["epoch"].get<int64_t>());
  }
  Metrics evaluate(bool final, const Shard& s, const Scorer& score) override {
    const int64_t n = data_.eval_images(final);
    const int64_t ctx = tok_.max_length();
    prepare_eval();
    Metrics m, elsewhere;
    int64_t chunk = 0;
    for (int64_t lo = 0; lo < n; lo += kEvalChunk, ++chunk) {
      // The test-pair loss couples a chunk's rows, so chunks are not split: every replica runs every
      // chunk (the same forwards on every rank, as ZeRO-3's collective gathers need) and counts the
      // chunks dealt to it.
      const int64_t hi = std::min(n, lo + kEvalChunk);
      const data::FashionMnist::Batch fb = data_.test(lo, hi);
      const data::CaptionPairs pairs = data::make_caption_pairs(tok_, fb.labels.to_vector_i64(),
                                                                test_caption_seed(r_.run.seed, lo / kEvalChunk), ctx);
      Batch b;
      b.t["images"] = fb.images;
      b.t["labels"] = fb.labels;
      b.t["ids"] = pairs.tokens.ids;
      b.t["lengths"] = pairs.tokens.lengths;
      b.rows = b.count = hi - lo;
      score(b, chunk % s.world == s.rank ? m : elsewhere);
    }
    return m;
  }
  void score(const Batch& b, Metrics& m) override {
    const Tensor img = model_->encode_image(b.at("images"));  // (m, E)
    // zero-shot: argmax of the cosine similarities, ties to the lowest class id
    const int64_t correct = argmax_hits(fn::matmul(img, class_embeds_, false, true), b.at("labels"));  // (m, K)
    // the contrastive loss of this chunk's (image, caption) pairs
    const Tensor txt = model_->encode_text(b.at("ids"), b.at("lengths"));  // (m, E)
    const Tensor logits = model_->logits_from_embeds(img, txt);            // (m, m)
    m.add("loss_sum", model_->contrastive_loss_from_logits(logits).item() * double(b.rows));
    m.add("correct", double(correct));
    m.add("images", double(b.rows));
    // class-level retrieval within the chunk: a hit when one of the K best is of the query's class
    const std::vector<float> sim = logits.to(DType::F32).contiguous().to_vector();
    const std::vector<int64_t> cls = b.at("labels").to_vector_i64();
    const int64_t n = b.rows;
    std::vector<int64_t> order(static_cast<size_t>(n));
    for (int dir = 0; dir < 2; ++dir) {  // 0: image -> text (rows), 1: text -> image (columns)
      for (int64_t q = 0; q < n; ++q) {
        auto at = [&](int64_t c) { return dir == 0 ? sim[size_t(q * n + c)] : sim[size_t(c * n + q)]; };
        for (int64_t c = 0; c < n; ++c) order[size_t(c)] = c;
        const int64_t top = std::min<int64_t>(n, kRecallAt.back());
        std::partial_sort(order.begin(), order.begin() + top, order.end(), [&](int64_t x, int64_t y) {
          return at(x) > at(y) || (at(x) == at(y) && x < y);  // ties to the lower index
        });
        for (int64_t k : kRecallAt) {
          bool hit = false;
          for (int64_t i = 0; i < std::min(k, n) && !hit; ++i) hit = cls[size_t(order[size_t(i)])] == cls[size_t(q)];
          if (hit) m.add(recall_key(dir, k), 1.0);
        }
      }
    }
  }
  std::vector<std::string> eval_metric_keys() const override {
    std::vector<std::string> k{"loss_sum", "correct", "images"};
    for (int dir = 0; dir < 2; ++dir)
      for (int64_t at : kRecallAt) k.push_back(recall_key(dir, at));
    return k;
  }
  nlohmann::json eval_fields(const Metrics& m) const override {
    const double n = m.get("images");
    nlohmann::json j{{"val_loss", n > 0 ? m.get("loss_sum") / n : 0.0},
                     {"zero_shot_accuracy", n > 0 ? m.get("correct") / n : 0.0},
                     {"test_images", int64_t(n)}};
    for (int dir = 0; dir < 2; ++dir)
      for (int64_t at : kRecallAt) j[recall_key(dir, at)] = n > 0 ? m.get(recall_key(dir, at)) / n : 0.0;
    return j;
  }
  std::string eval_line(const Metrics& m) const override {
    const double n = m.get("images");
    return fmt::format(
        "zero-shot test accuracy: {:.2f}% ({}/{}) over the 10 class captions | test-pair contrastive "
        "loss {:.4f} | {}",
        n > 0 ? 100.0 * m.get("correct") / n : 0.0, int64_t(m.get("correct")), int64_t(n),
        n > 0 ? m.get("loss_sum") / n : 0.0, recall_text(m));
  }
  std::string final_line(const Metrics& m) const override {
    const double n = m.get("images");
    return fmt::format("final zero-shot test accuracy: {:.2f}% ({}/{}) | test-pair contrastive loss {:.4f} | {}",
                       n > 0 ? 100.0 * m.get("correct") / n : 0.0, int64_t(m.get("correct")), int64_t(n),
                       n > 0 ? m.get("loss_sum") / n : 0.0, recall_text(m));
  }
  Batch synthetic_batch(uint64_t seed, int64_t rows = -1) override {
    const int64_t B = rows > 0 ? rows : r_.train.batch_size, ctx = tok_.max_length();
    Generator g(seed);
    std::vector<int64_t> labels;
    const Tensor images = FashionMnistData::synthetic_images(g, B, labels);  // (B, 1, 28, 28)
    const data::CaptionPairs pairs = data::make_caption_pairs(tok_, labels, seed, ctx);
    Batch b;
    b.t["images"] = images;
    b.t["labels"] = Tensor::from_vector_i64(labels, {B});  // (B): for score()
    b.t["ids"] = pairs.tokens.ids;
    b.t["lengths"] = pairs.tokens.lengths;
    b.rows = b.count = B;
    return b;
  }
  int64_t eval_rows() const override { return kEvalChunk; }
  void prepare_eval() override {  // the 10 class prompts' embeddings
    const data::TokenBatch prompts = tok_.batch(data::zero_shot_prompts(tok_.class_names()), tok_.max_length());
    class_embeds_ = model_->encode_text(prompts.ids, prompts.lengths);  // (K, E)
  }

 private:
  Recipe r_;
  std::unique_ptr<models::DualEncoder> model_;
  data::CaptionTokenizer tok_;
  FashionMnistData data_;
  int64_t cached_step_ = -1, cached_global_ = 0;
  Batch cached_;
  // GradCache state of the current step (split batches only)
  bool cached_grads_ = false;
  std::vector<Tensor> img_grad_, txt_grad_;  // per micro-batch: d loss / d embedding, (B, E)
  double scale_grad_ = 0.0, global_loss_ = 0.0;
  int64_t split_ = 1;    // micro-steps x world of the current step
  Tensor class_embeds_;  // eval: the 10 prompts' embeddings
};

}  // namespace

std::unique_ptr<Task> contrastive_task(const Recipe& r, std::unique_ptr<models::DualEncoder> model) {
  return std::make_unique<ContrastiveTask>(r, std::move(model));
}

}  // namespace brigade::train
