// Masked language modelling (BERT); see tasks.h.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>

#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"
#include "brigade/data/sampler.h"
#include "brigade/data/text/mlm.h"
#include "brigade/data/text/prepare.h"
#include "brigade/data/text/token_file.h"
#include "brigade/data/text/tokenizer.h"
#include "brigade/train/tasks.h"

namespace brigade::train {

namespace fs = std::filesystem;

namespace {

// Seeds of the masking generators: training step s uses splitmix64(splitmix64(seed ^ kTrainMask)
// + s); evaluation batch i uses splitmix64(kEvalMask + i) whatever the run's seed.
constexpr uint64_t kTrainMask = 0x6d6c6d2d74726e01ull;  // "mlm-trn"
constexpr uint64_t kEvalMask = 0x6d6c6d2d65766101ull;   // "mlm-eva"

const std::vector<int64_t>& special_ids() {
  static const std::vector<int64_t> ids{data::Tokenizer::kUnkId, data::Tokenizer::kBosId, data::Tokenizer::kEosId};
  return ids;
}

int64_t mask_id(const Recipe& r) { return r.model.vocab_size; }  // one past the tokenizer's pieces

// A split of the recipe's data.dir, with its vocabulary and length checked.
data::TokenDataset open_split(const Recipe& r, const char* file) {
  data::TokenDataset ds((fs::path(r.data.dir) / file).string());
  BRIGADE_CHECK(ds.vocab_size() == r.model.vocab_size, ConfigError,
                "recipe {}: token file {} has vocab {} but model.vocab_size is {}; set model.vocab_size = {} or point "
                "data.dir at data prepared for {} (`brigade prepare`)",
                r.path, ds.path(), ds.vocab_size(), r.model.vocab_size, ds.vocab_size(), r.model.vocab_size);
  BRIGADE_CHECK(ds.size() >= r.train.seq_len + 1, DataError,
                "recipe {}: {} holds {} tokens, fewer than train.seq_len + 1 = {}; lower train.seq_len or raise "
                "data.val_fraction and run `brigade prepare` again",
                r.path, ds.path(), ds.size(), r.train.seq_len + 1);
  return ds;
}

int64_t count_labelled(const Tensor& labels) {
  int64_t n = 0;
  const Tensor c = labels.contiguous();
  const int64_t* y = c.data<int64_t>();
  for (int64_t i = 0; i < c.numel(); ++i) n += y[i] != -100 ? 1 : 0;
  return n;
}

// The eval batch count and its rows (the recipe's global batch).
int64_t eval_batches(const Recipe& r) { return std::max<int64_t>(1, r.train.eval_batches); }
int64_t global_rows(const Recipe& r) { return r.train.batch_size * r.train.accumulation * r.parallel.dp; }

}  // namespace

namespace {

// The masked tokens' mean cross-entropy (M > 0 of them), adding the argmax hits and the count
// to the training extras.
Tensor masked_loss(const models::BERT::MaskedLogits& ml, Metrics& m) {
  m.add("train_correct", double(argmax_hits(ml.logits, ml.labels)));  // 16-bit logits under O2: widened
  m.add("train_masked", double(ml.labels.numel()));
  return fn::cross_entropy(ml.logits, ml.labels, -100);  // 0-d
}

// What an evaluation batch adds: the summed cross-entropy, argmax hits and masked count (M > 0).
void add_masked_scores(const models::BERT::MaskedLogits& ml, Metrics& m) {
  const int64_t M = ml.labels.numel();
  m.add("loss_sum", fn::cross_entropy(ml.logits, ml.labels, -100).item() * double(M));
  m.add("correct", double(argmax_hits(ml.logits, ml.labels)));
  m.add("masked", double(M));
}

}  // namespace

namespace {

// The masked-LM task as tasks.h describes it (masked_lm_task).
class MaskedLMTask : public Task {
 public:
  MaskedLMTask(const Recipe& r, std::unique_ptr<models::BERT> model) : r_(r), model_(std::move(model)) {}
  nn::Module& model() override { return *model_; }
  std::vector<parallel::ParamUnit> units(int zero) override { return single_unit_below_zero3(*model_, zero); }
  models::BERT& bert() { return *model_; }
  Generator* dropout_generator() override { return &model_->dropout_generator(); }
  std::string describe() override {
    return fmt::format("BERT {} layers, {} dims, {} heads, vocab {} + [MASK] = id {}, {:.2f}M parameters",
                       r_.model.n_layer, r_.model.n_embd, r_.model.n_head, r_.model.vocab_size, mask_id(r_),
                       double(model_->num_parameters()) / 1e6);
  }
  void open_data(dist::ProcessGroup& ctrl, const std::function<void(const std::string&)>& say) override {
    const fs::path data_dir(r_.data.dir);
    // Prepared by rank 0 on first use, and again when the folder was made from something else than
    // the recipe asks for (another corpus, vocabulary or split: data::ensure_prepared says which).
    if (ctrl.rank() == 0)
      data::ensure_prepared(prepare_options(r_), [&](const data::PrepareProgress& p) { say("prepare: " + p.message); });
    ctrl.barrier();
    train_.emplace(open_split(r_, data::kTrainFile));
    val_.emplace(open_split(r_, data::kValFile));

    // Unigram baselines of train.bin on the evaluation's masked positions: add-one smoothed
    // probabilities over the maskable ids, and the accuracy of always answering the most frequent one.
    const int64_t V = r_.model.vocab_size;
    std::vector<int64_t> count(size_t(V), 0);
    for (int64_t i = 0; i < train_->size(); ++i) ++count[size_t((*train_)[i])];
    for (int64_t id : special_ids()) count[size_t(id)] = 0;
    int64_t total = 0, top = 3;
    for (int64_t id = 0; id < V; ++id) {
      total += count[size_t(id)];
      if (count[size_t(id)] > count[size_t(top)]) top = id;
    }
    const int64_t n = eval_batches(r_), G = global_rows(r_);
    const data::BatchSampler val(*val_, G, r_.train.seq_len, r_.run.seed);
    double nll = 0.0;
    int64_t hits = 0, masked = 0;
    for (int64_t i = 0; i < n; ++i) {
      Tensor x, y;
      val.get_eval_batch(i, n, x, y);  // (G, T)
      const Batch b = masked_rows(x, data::splitmix64(kEvalMask + uint64_t(i)), 0, G);
      for (int64_t l : b.at("labels").to_vector_i64()) {
        if (l == -100) continue;
        ++masked;
        hits += l == top ? 1 : 0;
        const int64_t c = l < V ? count[size_t(l)] : 0;
        nll -= std::log(double(c + 1) / double(total + V));
      }
    }
    unigram_loss_ = masked ? nll / double(masked) : 0.0;
    unigram_accuracy_ = masked ? double(hits) / double(masked) : 0.0;
  }
  ItemKind item_kind() const override { return ItemKind::Token; }
  int64_t items_per_row() const override { return r_.train.seq_len; }
  double flops_per_item() const override { return model_->flops_per_token(r_.train.seq_len); }
  std::string data_summary() override {
    return fmt::format(
        "{} train / {} val tokens, {:.0f}% masked | baselines on the val masked positions: uniform loss ln({}) = "
        "{:.4f}, "
        "unigram loss {:.4f}, most-frequent-token accuracy {:.2f}%",
        train_->size(), val_->size(), 100.0 * r_.data.mlm_probability, model_->config().vocab_size,
        std::log(double(model_->config().vocab_size)), unigram_loss_, 100.0 * unigram_accuracy_);
  }
  Batch batch(int64_t step, int64_t micro, int64_t micro_steps, const Shard& s) override {
    const int64_t B = r_.train.batch_size, T = r_.train.seq_len, G = B * micro_steps * s.world;
    if (cached_step_ != step || cached_global_ != G) {
      // The whole global batch, masked in one pass: every rank draws the same masks.
      const data::BatchSampler sampler(*train_, G, T, r_.run.seed);
      Tensor x, y;  // (G, T)
      sampler.get_batch(step, x, y);
      cached_ = masked_rows(x, data::splitmix64(data::splitmix64(r_.run.seed ^ kTrainMask) + uint64_t(step)), 0, G);
      BRIGADE_CHECK(cached_.count > 0, DataError,
                    "step {}: no position of the batch was chosen for masking; raise train.batch_size, train.seq_len "
                    "or data.mlm_probability",
                    step);
      cached_step_ = step, cached_global_ = G;
    }
    const int64_t lo = (micro * s.world + s.rank) * B;
    Batch b;
    b.t["ids"] = cached_.at("ids").narrow(0, lo, B);
    b.t["labels"] = cached_.at("labels").narrow(0, lo, B);
    b.rows = B;
    b.count = count_labelled(b.t["labels"]);
    return b;
  }
  bool needs_whole_step() const override { return true; }  // masked tokens per micro-batch differ
  Loss loss(const Batch& b, int64_t micro, Metrics& m) override {
    if (b.count == 0) {
      // This micro-batch holds no masked token: no contribution (the trainer weights it by 0). The
      // whole model still runs forward and backward (the head on every position, a zero loss), so
      // every parameter gets its (zero) gradient and this rank makes the collectives the others
      // make: ZeRO-3 gathers each block in both passes and reduces each bucket once all its
      // gradients are ready; a rank that skipped them would hang the job.
      const models::BERT::MaskedLogits all = model_->masked_logits(b.at("ids"), b.at("ids"));  // (B*T, V)
      return {fn::mul_scalar(fn::sum_all(all.logits), 0.0)};
    }
    return {masked_loss(model_->masked_logits(b.at("ids"), b.at("labels")), m)};  // (M, V), (M)
  }
  std::vector<std::string> train_metric_keys() const override { return {"train_correct", "train_masked"}; }
  nlohmann::json train_fields(const Metrics& m, int64_t step) const override {
    return {{"train_accuracy", m.get("train_correct") / std::max(1.0, m.get("train_masked"))}};
  }
  std::string train_progress(const Metrics& m, int64_t step) const override {
    return fmt::format(" | masked acc {:5.2f}%", 100.0 * m.get("train_correct") / std::max(1.0, m.get("train_masked")));
  }
  Metrics evaluate(bool final, const Shard& s, const Scorer& score) override {
    // Every rank masks each eval batch whole (fixed generators: the same positions at every
    // evaluation of any run with the same data and shapes) and scores its rows of it.
    const int64_t n = eval_batches(r_), G = global_rows(r_), B = r_.train.batch_size;
    const data::BatchSampler val(*val_, G, r_.train.seq_len, r_.run.seed);
    Metrics m;
    for (int64_t i = 0; i < n; ++i) {
      Tensor x, y;
      val.get_eval_batch(i, n, x, y);  // (G, T)
      for (int64_t k = 0; k * s.world * B < G; ++k) {
        const int64_t lo = (k * s.world + s.rank) * B;
        if (lo >= G) break;
        score(masked_rows(x, data::splitmix64(kEvalMask + uint64_t(i)), lo, std::min(B, G - lo)), m);
      }
    }
    return m;
  }
  void score(const Batch& b, Metrics& m) override {
    // (with no masked token the encoder still runs: ZeRO-3 keeps the ranks' gathers in step)
    const models::BERT::MaskedLogits ml = model_->masked_logits(b.at("ids"), b.at("labels"));  // (M, V)
    if (ml.labels.numel() > 0) add_masked_scores(ml, m);
  }
  std::vector<std::string> eval_metric_keys() const override { return {"loss_sum", "correct", "masked"}; }
  nlohmann::json eval_fields(const Metrics& m) const override {
    BRIGADE_CHECK(m.get("masked") > 0, DataError,
                  "evaluation chose no position to mask ({} batches of {} x {} tokens); raise train.eval_batches or "
                  "data.mlm_probability",
                  eval_batches(r_), global_rows(r_), r_.train.seq_len);
    return {{"val_loss", m.get("loss_sum") / m.get("masked")},
            {"mlm_accuracy", m.get("correct") / m.get("masked")},
            {"masked_tokens", int64_t(m.get("masked"))}};
  }
  std::string eval_line(const Metrics& m) const override {
    return fmt::format("val MLM loss {:.6f} | masked accuracy {:.2f}% ({}/{} masked tokens)",
                       m.get("loss_sum") / m.get("masked"), 100.0 * m.get("correct") / m.get("masked"),
                       int64_t(m.get("correct")), int64_t(m.get("masked")));
  }
  std::string final_line(const Metrics& m) const override {
    return fmt::format(
        "final {}\nbaselines: uniform loss {:.4f} | unigram loss {:.4f} | most-frequent-token accuracy "
        "{:.2f}%",
        eval_line(m), std::log(double(model_->config().vocab_size)), unigram_loss_, 100.0 * unigram_accuracy_);
  }
  const Stages* stages() override {
    if (!stages_) {
      models::BERT* bert = model_.get();
      const int64_t T = r_.train.seq_len, D = bert->config().hidden_size;
      Stages st;
      st.num_blocks = bert->config().num_hidden_layers;
      st.embed = [bert](const Batch& b) { return bert->embed(b.at("ids")); };  // (Bm, T, D)
      st.blocks = [bert](const Tensor& x, int64_t lo, int64_t hi, const Batch&) { return bert->run_blocks(x, lo, hi); };
      st.head = [bert](const Tensor& x, const Batch& b, Metrics& m) {  // as loss()
        const models::BERT::MaskedLogits ml = bert->masked_head(x, b.at("labels"));
        // no masked token in this micro-batch: a zero loss whose gradient still reaches the stage's input
        if (ml.labels.numel() == 0) return fn::mul_scalar(fn::sum_all(x), 0.0);
        return masked_loss(ml, m);
      };
      st.score = [bert](const Tensor& x, const Batch& b, Metrics& m) {  // as score()
        const models::BERT::MaskedLogits ml = bert->masked_head(x, b.at("labels"));
        if (ml.labels.numel() > 0) add_masked_scores(ml, m);
      };
      st.hidden = [T, D](int64_t rows) { return Shape{rows, T, D}; };
      st.tied = bert->tied_parameters();
      st.count = [](const Batch& b) { return count_labelled(b.at("labels")); };  // masked tokens differ per row
      st.tp_plan = models::BERT::tp_plan();
      stages_ = std::move(st);
    }
    return &*stages_;
  }
  std::string tokenizer_dir() const override { return r_.data.dir; }
  Batch synthetic_batch(uint64_t seed, int64_t rows = -1) override {
    const int64_t B = rows > 0 ? rows : r_.train.batch_size, T = r_.train.seq_len, V = r_.model.vocab_size;
    Tensor ids = Tensor::empty({B, T}, DType::I64);  // (B, T)
    Generator g(seed);
    int64_t* p = ids.data<int64_t>();
    for (int64_t i = 0; i < ids.numel(); ++i)
      p[i] = 3 + std::min<int64_t>(int64_t(g.uniform_double() * double(V - 3)), V - 4);
    return masked_rows(ids, seed + 1, 0, B);
  }
  int64_t eval_rows() const override { return r_.train.batch_size; }

  // The trivial baselines on the evaluation's masked positions (after open_data).
  double unigram_loss() const { return unigram_loss_; }
  double unigram_accuracy() const { return unigram_accuracy_; }

 private:
  Batch masked_rows(const Tensor& ids, uint64_t mask_seed, int64_t lo, int64_t n) const {
    Generator g(mask_seed);
    const data::MlmBatch mb =
        data::mask_tokens(ids, r_.model.vocab_size + 1, mask_id(r_), special_ids(), r_.data.mlm_probability, g);
    Batch b;
    b.t["ids"] = mb.inputs.narrow(0, lo, n);     // (n, T)
    b.t["labels"] = mb.labels.narrow(0, lo, n);  // (n, T), -100 where not masked
    b.rows = n;
    b.count = count_labelled(b.t["labels"]);
    return b;
  }
  Recipe r_;
  std::unique_ptr<models::BERT> model_;
  std::optional<data::TokenDataset> train_, val_;
  int64_t cached_step_ = -1, cached_global_ = 0;
  Batch cached_;  // the step's masked global batch
  double unigram_loss_ = 0.0, unigram_accuracy_ = 0.0;
  std::optional<Stages> stages_;
};

}  // namespace

std::unique_ptr<Task> masked_lm_task(const Recipe& r, std::unique_ptr<models::BERT> model) {
  return std::make_unique<MaskedLMTask>(r, std::move(model));
}

}  // namespace brigade::train
