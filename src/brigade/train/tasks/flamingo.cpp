// Flamingo on interleaved Fashion-MNIST sequences, with rank-classification evaluation and its
// two controls; see tasks.h (flamingo_task).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/data/image/captions.h"
#include "brigade/data/text/text_tokenizer.h"
#include "brigade/train/checkpoint.h"
#include "brigade/train/model_configs.h"
#include "brigade/train/tasks.h"
#include "brigade/train/tasks/fashion.h"

namespace brigade::train {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kMaxChunks = 4;  // a training row: k in {0..3} demonstration chunks, then the query chunk
constexpr int64_t kShots = 4;      // demonstrations of the few-shot evaluation
constexpr int64_t kClasses = 10;
constexpr int64_t kIgnore = -100;
constexpr int64_t kImagePixels = 28 * 28;

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// Streams: training row g of step s, test query i (its demonstrations), the shuffled-image control.
uint64_t row_seed(uint64_t seed, int64_t step, int64_t row) {
  return mix(mix(seed * 0xF1A3ull + uint64_t(step)) ^ uint64_t(row));
}
uint64_t query_seed(uint64_t seed, int64_t query) { return mix(mix(seed ^ 0x5E07ull) + uint64_t(query)); }
uint64_t shuffle_seed(uint64_t seed) { return mix(seed ^ 0x5A0FF1Eull); }

int64_t draw(Generator& g, int64_t n) { return std::min<int64_t>(int64_t(g.uniform_double() * double(n)), n - 1); }

// Restores the model's gate switch however the scope is left.
struct GatesForcedZero {
  models::Flamingo& m;
  bool was;
  explicit GatesForcedZero(models::Flamingo& model) : m(model), was(model.gates_forced_zero()) {
    m.set_gates_forced_zero(true);
  }
  ~GatesForcedZero() { m.set_gates_forced_zero(was); }
};

class FlamingoTask : public Task {
 public:
  FlamingoTask(const Recipe& r, std::unique_ptr<models::Flamingo> model)
      : r_(r), model_(std::move(model)), data_(r), tok_(data::load_text_tokenizer(r.model.lm_from)) {
    const data::CaptionTokenizer captions;  // the class names
    for (const std::string& name : captions.class_names()) {
      std::vector<int> ids = tok_->encode_strict(data::class_phrase(name), "a Fashion-MNIST class phrase");
      BRIGADE_CHECK(!ids.empty(), ConfigError,
                    "recipe {}: the tokenizer of model.lm_from = {} encodes \"{}\" as no tokens", r.path,
                    r.model.lm_from, data::class_phrase(name));
      phrases_.emplace_back(ids.begin(), ids.end());
      max_phrase_ = std::max<int64_t>(max_phrase_, int64_t(ids.size()));
    }
    T_ = kMaxChunks * (2 + max_phrase_) - 1;  // the longest row's tokens but its last
    const int64_t need = (kShots + 1) * (2 + max_phrase_) - 1;
    BRIGADE_CHECK(std::max(T_, need) <= model_->config().lm.block_size, ConfigError,
                  "recipe {}: Flamingo's sequences reach {} tokens ({} chunks of <image>, a class phrase of up to {} "
                  "tokens and <|endofchunk|>), more than the language model's block_size {} (model.lm_from = {}); "
                  "train the language model with a longer block_size",
                  r.path, std::max(T_, need), kShots + 1, max_phrase_, model_->config().lm.block_size, r.model.lm_from);
  }
  nn::Module& model() override { return *model_; }
  std::string describe() override {
    const models::FlamingoConfig& c = model_->config();
    int64_t trainable = 0;
    for (auto& [n, p] : model_->trainable_parameters()) trainable += p.numel();
    return fmt::format(
        "Flamingo: frozen CLIP vision tower ({} layers, {} wide, from {}), frozen GPT ({} layers, {} wide, vocab {} "
        "+ <|endofchunk|>, <image>, from {}); Perceiver resampler {} layers x {} latents, {} gated cross-attention "
        "blocks (every {} LM layers); {} parameters, {} trained",
        c.vision.num_hidden_layers, c.vision.hidden_size, r_.model.vision_from, c.lm.n_layer, c.lm.n_embd,
        c.lm.vocab_size, r_.model.lm_from, c.resampler_depth, c.resampler_n_latents, c.num_cross_attn_layers(),
        c.cross_attn_every_n_layers, model_->num_parameters(), trainable);
  }
  void open_data(dist::ProcessGroup&, const std::function<void(const std::string&)>&) override { data_.open(1, ""); }
  ItemKind item_kind() const override { return ItemKind::Token; }
  int64_t items_per_row() const override { return T_; }
  // Approximate: 2 FLOPs per weight per token a matmul sees. The frozen towers run forward (the
  // vision tower, not recorded) or forward and input gradients (the LM: 2x its forward); the
  // resampler and gated blocks forward and both gradients (3x). Per token position of a row (the
  // items counted: T per row, padding included), an average row holding 2.5 images (k uniform in 0..3).
  double flops_per_item() const override {
    const models::FlamingoConfig& c = model_->config();
    auto matmul_weights = [](const nn::NamedTensors& ps) {
      double n = 0;
      for (auto& [name, p] : ps)
        if (p.dim() == 2) n += double(p.numel());
      return n;
    };
    const double S = 1.0 + double(c.vision.num_patches()), L = double(c.resampler_n_latents);
    const double vision = 2.0 * matmul_weights(model_->vision_model->named_parameters()) * S;
    const double resampler = 6.0 * matmul_weights(model_->perceiver_resampler->named_parameters()) * (S + L);
    const double lm = 4.0 * (matmul_weights(model_->transformer->h->named_parameters()) +
                             double(c.lm.n_embd) * double(c.vocab_size()));
    const double gated = 6.0 * matmul_weights(model_->gated_cross_attn_layers->named_parameters());
    const double chunks = 2.5;
    const double per_row = chunks * (vision + resampler) + double(T_) * (lm + gated);
    return per_row / double(T_);
  }
  std::string data_summary() override {
    return data_.summary("rows") + fmt::format(" (each 0-3 demonstration chunks and a query, {} tokens)", T_);
  }

  // ---- training rows
  Batch batch(int64_t step, int64_t micro, int64_t micro_steps, const Shard& s) override {
    const int64_t B = r_.train.batch_size, G = B * micro_steps * s.world;
    if (cached_step_ != step || cached_global_ != G) {
      const data::FashionMnist::Batch& q = data_.global_batch(step, G);
      const std::vector<int64_t> qlabels = q.labels.to_vector_i64();
      std::vector<std::vector<int64_t>> demo_idx(static_cast<size_t>(G));
      std::vector<int64_t> all_idx;
      for (int64_t g = 0; g < G; ++g) {
        Generator gen(row_seed(r_.run.seed, step, g));
        const int64_t k = draw(gen, kMaxChunks);
        for (int64_t j = 0; j < k; ++j) demo_idx[size_t(g)].push_back(draw(gen, data_.train_size()));
        all_idx.insert(all_idx.end(), demo_idx[size_t(g)].begin(), demo_idx[size_t(g)].end());
      }
      data::FashionMnist::Batch demos;
      std::vector<int64_t> dlabels;
      if (!all_idx.empty()) {
        demos = data_.train_images(all_idx);
        dlabels = demos.labels.to_vector_i64();
      }
      const Tensor qimg = q.images.contiguous(), dimg = demos.images.defined() ? demos.images.contiguous() : Tensor();
      std::vector<std::vector<std::pair<const float*, int64_t>>> rows(static_cast<size_t>(G));
      size_t at = 0;
      for (int64_t g = 0; g < G; ++g) {
        for (size_t j = 0; j < demo_idx[size_t(g)].size(); ++j, ++at)
          rows[size_t(g)].emplace_back(dimg.data<float>() + int64_t(at) * kImagePixels, dlabels[at]);
        rows[size_t(g)].emplace_back(qimg.data<float>() + g * kImagePixels, qlabels[size_t(g)]);
      }
      cached_ = build_rows(rows);
      cached_step_ = step, cached_global_ = G;
    }
    Batch b = G == B ? cached_ : cached_.narrow((micro * s.world + s.rank) * B, B);
    b.count = trained_tokens(b);
    return b;
  }
  // Rows hold different numbers of trained tokens: the trainer weights micro-batches by them.
  bool needs_whole_step() const override { return true; }
  Loss loss(const Batch& b, int64_t, Metrics&) override {
    return {model_->loss(row_images(b), b.at("ids"), b.at("targets")), {}};  // mean over trained tokens
  }

  // ---- evaluation
  Metrics evaluate(bool final, const Shard& s, const Scorer& score) override {
    const int64_t n = data_.eval_images(final), chunk = FashionMnistData::kEvalChunk;
    // the shuffled-image control: query i is shown test image perm[i] (a seeded permutation of the
    // evaluated images), its label still i's
    std::vector<int64_t> perm(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) perm[size_t(i)] = i;
    Generator sg(shuffle_seed(r_.run.seed));
    for (int64_t i = n - 1; i > 0; --i) std::swap(perm[size_t(i)], perm[size_t(draw(sg, i + 1))]);
    Metrics m;
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
      // every replica scores its rows of every chunk (the same forwards on every rank, as ZeRO-3's gathers need)
      const int64_t len = std::min(n, c0 + chunk) - c0;
      const int64_t lo = c0 + len * s.rank / s.world, hi = c0 + len * (s.rank + 1) / s.world;
      if (hi <= lo) continue;
      std::vector<int64_t> q, sh, demo;
      for (int64_t i = lo; i < hi; ++i) {
        q.push_back(i), sh.push_back(perm[size_t(i)]);
        Generator gen(query_seed(r_.run.seed, i));
        for (int64_t j = 0; j < kShots; ++j) demo.push_back(draw(gen, data_.train_size()));
      }
      const data::FashionMnist::Batch qb = data_.test_images(q), sb = data_.test_images(sh),
                                      db = data_.train_images(demo);
      Batch b;
      b.rows = b.count = hi - lo;
      b.t["images"] = qb.images;                                            // (n, 1, 28, 28)
      b.t["labels"] = qb.labels;                                            // (n)
      b.t["shuffled_images"] = sb.images;                                   // (n, 1, 28, 28)
      b.t["demo_images"] = db.images.reshape({b.rows, kShots, 1, 28, 28});  // (n, 4, 1, 28, 28)
      b.t["demo_labels"] = db.labels.reshape({b.rows, kShots});             // (n, 4)
      score(b, m);
    }
    return m;
  }
  void score(const Batch& b, Metrics& m) override {
    autograd::NoGradGuard ng;
    const int64_t n = b.rows;
    const std::vector<int64_t> labels = b.at("labels").to_vector_i64();
    const Tensor query = latents(b.at("images"));
    const Tensor demos = latents(b.at("demo_images").reshape({n * kShots, 1, 28, 28}));
    const std::vector<int64_t> demo_labels = b.at("demo_labels").to_vector_i64();
    auto hits = [&](const std::vector<std::array<double, kClasses>>& sc) {
      int64_t h = 0;
      for (int64_t i = 0; i < n; ++i) {
        const auto& row = sc[size_t(i)];
        h += int64_t(std::max_element(row.begin(), row.end()) - row.begin()) == labels[size_t(i)];  // ties: lowest
      }
      return double(h);
    };
    const auto zero = rank(query, Tensor(), {});
    m.add("zero_shot_correct", hits(zero));
    for (int64_t i = 0; i < n; ++i) {  // the correct caption's loss, per token
      const int64_t y = labels[size_t(i)];
      m.add("nll_sum", -zero[size_t(i)][size_t(y)]);
      m.add("nll_tokens", double(phrases_[size_t(y)].size() + 1));
    }
    m.add("four_shot_correct", hits(rank(query, demos, demo_labels)));
    {
      GatesForcedZero off(*model_);
      m.add("gates_zero_correct", hits(rank(query, Tensor(), {})));
    }
    m.add("shuffled_correct", hits(rank(latents(b.at("shuffled_images")), Tensor(), {})));
    m.add("queries", double(n));
  }
  std::vector<std::string> eval_metric_keys() const override {
    return {"queries",          "zero_shot_correct", "four_shot_correct", "gates_zero_correct",
            "shuffled_correct", "nll_sum",           "nll_tokens"};
  }
  nlohmann::json eval_fields(const Metrics& m) const override {
    const double n = std::max(1.0, m.get("queries"));
    return {{"val_loss", m.get("nll_sum") / std::max(1.0, m.get("nll_tokens"))},
            {"zero_shot_accuracy", m.get("zero_shot_correct") / n},
            {"four_shot_accuracy", m.get("four_shot_correct") / n},
            {"gates_zero_accuracy", m.get("gates_zero_correct") / n},
            {"shuffled_images_accuracy", m.get("shuffled_correct") / n},
            {"test_images", int64_t(m.get("queries"))}};
  }
  std::string eval_line(const Metrics& m) const override {
    const double n = std::max(1.0, m.get("queries"));
    return fmt::format(
        "rank classification over the 10 class phrases on {} test images: 0-shot {:.2f}%, 4-shot {:.2f}% | controls "
        "(0-shot): gates forced to 0 {:.2f}%, shuffled images {:.2f}% | caption loss {:.4f}",
        int64_t(m.get("queries")), 100.0 * m.get("zero_shot_correct") / n, 100.0 * m.get("four_shot_correct") / n,
        100.0 * m.get("gates_zero_correct") / n, 100.0 * m.get("shuffled_correct") / n,
        m.get("nll_sum") / std::max(1.0, m.get("nll_tokens")));
  }
  std::string final_line(const Metrics& m) const override { return "final " + eval_line(m); }
  Batch synthetic_batch(uint64_t seed, int64_t rows = -1) override {
    const int64_t B = rows > 0 ? rows : r_.train.batch_size;
    Generator g(seed);
    std::vector<int64_t> labels;
    const Tensor images = FashionMnistData::synthetic_images(g, B * kMaxChunks, labels);  // (B*4, 1, 28, 28)
    std::vector<std::vector<std::pair<const float*, int64_t>>> rs(static_cast<size_t>(B));
    for (int64_t r = 0; r < B; ++r) {
      const int64_t chunks = 1 + draw(g, kMaxChunks);
      for (int64_t j = 0; j < chunks; ++j) {
        const int64_t i = r * kMaxChunks + j;
        rs[size_t(r)].emplace_back(images.data<float>() + i * kImagePixels, labels[size_t(i)]);
      }
    }
    Batch b = build_rows(rs);
    b.count = trained_tokens(b);
    return b;
  }
  int64_t eval_rows() const override { return FashionMnistData::kEvalChunk; }
  std::string tokenizer_dir() const override { return r_.model.lm_from; }

 private:
  // Rows of chunks (image, label): `<image>` phrase(label) `<|endofchunk|>` each, the last token
  // dropped from ids and the first from targets; targets ignore `<image>` and padding (ids padded
  // with `<|endofchunk|>`). images (rows, 4, 1, 28, 28) hold a row's images in order, zeros after.
  Batch build_rows(const std::vector<std::vector<std::pair<const float*, int64_t>>>& rows) const {
    const int64_t G = int64_t(rows.size());
    const int64_t img = model_->config().image_token_id(), eoc = model_->config().end_of_chunk_token_id();
    Tensor images = Tensor::zeros({G, kMaxChunks, 1, 28, 28}, DType::F32);
    std::vector<int64_t> ids(size_t(G * T_), eoc), targets(size_t(G * T_), kIgnore), count(static_cast<size_t>(G));
    for (int64_t g = 0; g < G; ++g) {
      std::vector<int64_t> seq;
      for (size_t j = 0; j < rows[size_t(g)].size(); ++j) {
        const auto& [pixels, label] = rows[size_t(g)][j];
        std::memcpy(images.data<float>() + (g * kMaxChunks + int64_t(j)) * kImagePixels, pixels,
                    sizeof(float) * kImagePixels);
        seq.push_back(img);
        seq.insert(seq.end(), phrases_[size_t(label)].begin(), phrases_[size_t(label)].end());
        seq.push_back(eoc);
      }
      count[size_t(g)] = int64_t(rows[size_t(g)].size());
      for (size_t t = 0; t + 1 < seq.size(); ++t) {
        ids[size_t(g * T_) + t] = seq[t];
        if (seq[t + 1] != img) targets[size_t(g * T_) + t] = seq[t + 1];
      }
    }
    Batch b;
    b.t["images"] = images;
    b.t["n_images"] = Tensor::from_vector_i64(count, {G});
    b.t["ids"] = Tensor::from_vector_i64(ids, {G, T_});
    b.t["targets"] = Tensor::from_vector_i64(targets, {G, T_});
    b.rows = G;
    return b;
  }
  static int64_t trained_tokens(const Batch& b) {
    int64_t n = 0;
    for (int64_t t : b.at("targets").contiguous().to_vector_i64()) n += t != kIgnore;
    return n;
  }
  // The images of a batch's rows, one per `<image>` token in row-major order: (N, 1, 28, 28).
  static Tensor row_images(const Batch& b) {
    const std::vector<int64_t> count = b.at("n_images").to_vector_i64();
    const Tensor all = b.at("images").contiguous();  // (rows, 4, 1, 28, 28)
    int64_t N = 0;
    for (int64_t c : count) N += c;
    Tensor out = Tensor::empty({N, 1, 28, 28}, DType::F32);
    int64_t at = 0;
    for (int64_t r = 0; r < b.rows; ++r)
      for (int64_t j = 0; j < count[size_t(r)]; ++j, ++at)
        std::memcpy(out.data<float>() + at * kImagePixels, all.data<float>() + (r * kMaxChunks + j) * kImagePixels,
                    sizeof(float) * kImagePixels);
    return out;
  }
  Tensor latents(const Tensor& images) const {  // (n, 1, 28, 28) -> (n, L, Dv) f32
    return model_->media_latents(images).to(DType::F32).contiguous();
  }
  // log softmax(z)[t] from the softmax p of logits z (V of them): log p[t], or where p[t] is too
  // small for float, z[t] - logsumexp(z) in double (rare, exact either way).
  static double log_prob(const float* z, const float* p, int64_t V, int64_t t) {
    if (p[t] > 1e-30f) return std::log(double(p[t]));
    const double mx = *std::max_element(z, z + V);
    double se = 0;
    for (int64_t v = 0; v < V; ++v) se += std::exp(double(z[v]) - mx);
    return double(z[t]) - mx - std::log(se);
  }
  // Rank classification: for each query (latents (n, L, Dv)) the log-likelihood of each class
  // phrase and `<|endofchunk|>` after `[demonstrations] <image>`; demonstrations (n * 4, L, Dv)
  // with their labels, or none. The queries are scored in groups whose 10 candidate rows fit a
  // bounded logits buffer.
  std::vector<std::array<double, kClasses>> rank(const Tensor& query, const Tensor& demos,
                                                 const std::vector<int64_t>& demo_labels) const {
    const int64_t n = query.size(0), L = query.size(1), Dv = query.size(2);
    const int64_t nd = demos.defined() ? kShots : 0;
    const int64_t img = model_->config().image_token_id(), eoc = model_->config().end_of_chunk_token_id();
    const int64_t V = model_->config().vocab_size();
    const int64_t T = (nd + 1) * (2 + max_phrase_) - 1;
    const int64_t group = std::max<int64_t>(1, 4096 / (kClasses * T));
    std::vector<std::array<double, kClasses>> out(static_cast<size_t>(n));
    for (int64_t q0 = 0; q0 < n; q0 += group) {
      const int64_t qn = std::min(group, n - q0), rows = qn * kClasses;
      std::vector<int64_t> ids(size_t(rows * T), eoc);
      std::vector<int64_t> first(static_cast<size_t>(rows));  // the position after which the candidate starts
      std::vector<std::vector<int64_t>> scored(
          static_cast<size_t>(rows));  // the candidate's tokens, predicted from first on
      Tensor lat = Tensor::empty({rows * (nd + 1), L, Dv}, DType::F32);
      const size_t one = size_t(L * Dv) * sizeof(float);
      for (int64_t qi = 0; qi < qn; ++qi)
        for (int64_t c = 0; c < kClasses; ++c) {
          const int64_t row = qi * kClasses + c, i = q0 + qi;
          std::vector<int64_t> seq;
          for (int64_t d = 0; d < nd; ++d) {
            const auto& p = phrases_[size_t(demo_labels[size_t(i * kShots + d)])];
            seq.push_back(img);
            seq.insert(seq.end(), p.begin(), p.end());
            seq.push_back(eoc);
            std::memcpy(lat.data<float>() + (row * (nd + 1) + d) * L * Dv,
                        demos.data<float>() + (i * kShots + d) * L * Dv, one);
          }
          std::memcpy(lat.data<float>() + (row * (nd + 1) + nd) * L * Dv, query.data<float>() + i * L * Dv, one);
          seq.push_back(img);
          first[size_t(row)] = int64_t(seq.size()) - 1;
          scored[size_t(row)] = phrases_[size_t(c)];
          scored[size_t(row)].push_back(eoc);
          seq.insert(seq.end(), scored[size_t(row)].begin(), scored[size_t(row)].end());
          for (size_t t = 0; t + 1 < seq.size(); ++t) ids[size_t(row * T) + t] = seq[t];
        }
      // the final hidden states of the scored positions only, then the head and a softmax on them
      const Tensor hidden =
          model_->hidden_from_latents(lat, Tensor::from_vector_i64(ids, {rows, T})).to(DType::F32).contiguous();
      const int64_t C = hidden.size(1);
      int64_t R = 0;
      for (const auto& sc : scored) R += int64_t(sc.size());
      Tensor picked = Tensor::empty({R, C}, DType::F32);  // (R, C)
      int64_t at = 0;
      for (int64_t row = 0; row < rows; ++row)
        for (size_t j = 0; j < scored[size_t(row)].size(); ++j, ++at)
          std::memcpy(picked.data<float>() + at * C,
                      hidden.data<float>() + (row * T + first[size_t(row)] + int64_t(j)) * C,
                      sizeof(float) * size_t(C));
      const Tensor logits = model_->transformer->wte->attend(picked).to(DType::F32).contiguous();  // (R, V)
      const Tensor probs = fn::softmax(logits).to(DType::F32).contiguous();                        // (R, V)
      at = 0;
      for (int64_t row = 0; row < rows; ++row) {
        double s = 0;
        for (size_t j = 0; j < scored[size_t(row)].size(); ++j, ++at)
          s += log_prob(logits.data<float>() + at * V, probs.data<float>() + at * V, V, scored[size_t(row)][j]);
        out[size_t(q0 + row / kClasses)][size_t(row % kClasses)] = s;
      }
    }
    return out;
  }

  Recipe r_;
  std::unique_ptr<models::Flamingo> model_;
  FashionMnistData data_;
  std::unique_ptr<data::TextTokenizer> tok_;
  std::vector<std::vector<int64_t>> phrases_;  // per class: its phrase's token ids
  int64_t max_phrase_ = 0, T_ = 0;
  int64_t cached_step_ = -1, cached_global_ = 0;
  Batch cached_;
};

}  // namespace

models::FlamingoConfig flamingo_config(const Recipe& r) {
  auto tower = [&](const std::string& key, const std::string& dir, const char* type) {
    BRIGADE_CHECK(!dir.empty(), ConfigError,
                  "recipe {}: model.type = \"flamingo\" needs {}: a Brigade checkpoint directory of a {} run (e.g. "
                  "\"runs/{}/checkpoint\")",
                  r.path, key, type, std::string(type) == "clip" ? "clip-fashion" : "gpt-kjv");
    BRIGADE_CHECK(checkpoint_exists(dir), ConfigError,
                  "recipe {}: {} = \"{}\" is not a checkpoint directory (no state.json + model.safetensors there); "
                  "train the {} recipe first (brigade train recipes/{}.toml)",
                  r.path, key, dir, type, std::string(type) == "clip" ? "clip-fashion" : "gpt-kjv");
    Recipe t = checkpoint_recipe(dir);
    BRIGADE_CHECK(t.model.type == type, ConfigError,
                  "recipe {}: {} = \"{}\" is a checkpoint of model.type = \"{}\"; Flamingo's {} must be a \"{}\" "
                  "checkpoint",
                  r.path, key, dir, t.model.type, key == "model.vision_from" ? "vision tower" : "language model", type);
    return t;
  };
  const Recipe vr = tower("model.vision_from", r.model.vision_from, "clip");
  const Recipe lr = tower("model.lm_from", r.model.lm_from, "gpt");
  const models::CLIPConfig clip = clip_config(vr.model, data::CaptionTokenizer());
  models::FlamingoConfig c;
  c.vision = clip.vision;
  c.vision_hidden_act = clip.hidden_act;
  c.lm = gpt_config(lr.model);
  c.lm.dropout = 0.0;  // the frozen LM runs as in evaluation
  const int64_t Dv = c.vision.hidden_size, C = c.lm.n_embd;
  BRIGADE_CHECK(
      r.model.resampler_depth >= 1 && r.model.resampler_latents >= 1 && r.model.resampler_heads >= 1 &&
          Dv % r.model.resampler_heads == 0,
      ConfigError,
      "recipe {}: model.resampler_depth = {}, resampler_latents = {} must be >= 1 and model.resampler_heads = "
      "{} must divide the vision width {}",
      r.path, r.model.resampler_depth, r.model.resampler_latents, r.model.resampler_heads, Dv);
  BRIGADE_CHECK(r.model.cross_attn_every_n_layers >= 1 && r.model.cross_attn_every_n_layers <= c.lm.n_layer,
                ConfigError, "recipe {}: model.cross_attn_every_n_layers = {} must be in [1, {}] (the LM's layers)",
                r.path, r.model.cross_attn_every_n_layers, c.lm.n_layer);
  c.resampler_depth = r.model.resampler_depth;
  c.resampler_n_heads = r.model.resampler_heads;
  c.resampler_head_dim = Dv / r.model.resampler_heads;
  c.resampler_n_latents = r.model.resampler_latents;
  c.resampler_ff_mult = 4;
  c.cross_attn_every_n_layers = r.model.cross_attn_every_n_layers;
  c.cross_attn_heads = c.lm.n_head;
  c.cross_attn_head_dim = C / c.lm.n_head;
  c.cross_attn_ff_mult = 4;
  c.initializer_range = r.model.init_std;
  c.validate();
  return c;
}

void load_flamingo_towers(const Recipe& r, models::Flamingo& model) {
  autograd::NoGradGuard ng;
  int64_t loaded = 0;
  auto load = [&](const std::string& dir, const std::string& prefix, const std::string& key) {
    const std::string file = (fs::path(dir) / "model.safetensors").string();
    const ckpt::SafetensorsReader f(file);
    for (auto& [name, p] : model.named_parameters()) {
      if (name.rfind(prefix, 0) != 0 || p.requires_grad()) continue;  // the frozen tower's parameters only
      BRIGADE_CHECK(f.contains(name), ConfigError, "recipe {}: {} = \"{}\": {} has no tensor {}", r.path, key, dir,
                    file, name);
      const Tensor t = f.get(name);
      BRIGADE_CHECK(t.shape() == p.shape(), ConfigError, "recipe {}: {} = \"{}\": {} is {} in {}, Flamingo needs {}",
                    r.path, key, dir, name, shape_str(t.shape()), file, shape_str(p.shape()));
      p.copy_(t.to(p.dtype()));
      ++loaded;
    }
  };
  load(r.model.vision_from, "vision_model.", "model.vision_from");
  load(r.model.lm_from, "transformer.", "model.lm_from");
  BRIGADE_CHECK(loaded > 0, InternalError, "Flamingo has no frozen tower parameters to load");
}

std::unique_ptr<Task> flamingo_task(const Recipe& r, std::unique_ptr<models::Flamingo> model) {
  return std::make_unique<FlamingoTask>(r, std::move(model));
}

}  // namespace brigade::train
