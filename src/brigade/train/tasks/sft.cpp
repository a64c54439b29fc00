// Supervised fine-tuning of a causal LM on JSONL samples (data.format = "jsonl"); see tasks.h.
#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>
#include <optional>

#include "brigade/amp/policy.h"
#include "brigade/core/error.h"
#include "brigade/data/sampler.h"
#include "brigade/data/text/sft.h"
#include "brigade/data/text/text_tokenizer.h"
#include "brigade/models/causal_lm.h"
#include "brigade/train/finetune.h"
#include "brigade/train/tasks.h"

namespace brigade::train {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kIgnore = -100;  // a target the cross-entropy leaves out

class SftTask : public Task {
 public:
  SftTask(const Recipe& r, std::unique_ptr<models::CausalLM> model) : r_(r), model_(std::move(model)) {}
  nn::Module& model() override { return *model_; }
  Generator* dropout_generator() override { return &model_->dropout_generator(); }
  std::string describe() override { return causal_lm_description(r_, *model_); }
  std::string tokenizer_dir() const override {
    return r_.model.init_from.empty() ? r_.data.dir : init_from_tokenizer(r_);
  }
  void open_data(dist::ProcessGroup&, const std::function<void(const std::string&)>&) override {
    const std::string tok_dir = tokenizer_dir();
    BRIGADE_CHECK(!data::detect_tokenizer(tok_dir).empty(), ConfigError,
                  "{}: data.format = \"jsonl\" encodes with an existing tokenizer: set model.init_from to a pretrained "
                  "model, or data.dir to a prepared folder ({} holds no tokenizer)",
                  r_.path, tok_dir);
    tok_ = data::load_text_tokenizer(tok_dir);
    const bool own = tok_->kind() == "brigade";  // a pretrained model's embedding may be padded past its tokenizer
    BRIGADE_CHECK(own ? tok_->vocab_size() == r_.model.vocab_size : tok_->vocab_size() <= r_.model.vocab_size,
                  ConfigError, "{}: the tokenizer of {} has vocab {} but the model's is {}", r_.path, tok_dir,
                  tok_->vocab_size(), r_.model.vocab_size);
    data::SftOptions o;
    o.chat_template = r_.data.chat_template;
    o.loss_on_all = r_.train.loss_on == "all";
    data::SftData d = data::read_sft_jsonl(r_.data.corpus, *tok_, o);
    shape_ = d.shape;
    // Samples whose trained tokens all fall past the first seq_len + 1 are left out (nothing to learn).
    const int64_t T = r_.train.seq_len;
    std::vector<data::SftSample> kept;
    int64_t truncated = 0, cut = 0;
    for (data::SftSample& s : d.samples) {
      const int64_t n = std::min<int64_t>(int64_t(s.ids.size()), T + 1);
      bool any = false;
      for (int64_t i = 1; i < n; ++i) any = any || s.trained[size_t(i)];
      if (int64_t(s.ids.size()) > T + 1) ++cut;
      if (any)
        kept.push_back(std::move(s));
      else
        ++truncated;
    }
    const int64_t N = int64_t(kept.size());
    const int64_t n_val =
        r_.data.val_fraction > 0 ? std::max<int64_t>(1, int64_t(double(N) * r_.data.val_fraction)) : 0;
    BRIGADE_CHECK(N - n_val >= 1, DataError, "{}: {} usable samples leave none to train on after the val split",
                  r_.data.corpus, N);
    train_.assign(std::make_move_iterator(kept.begin()), std::make_move_iterator(kept.end() - n_val));
    val_.assign(std::make_move_iterator(kept.end() - n_val), std::make_move_iterator(kept.end()));
    // The trivial baseline of a classification-like set: always answering the training set's most
    // frequent completion (its trained tokens), scored by exact match on the val samples.
    std::map<std::vector<int>, int64_t> counts;
    for (const data::SftSample& s : train_) ++counts[trained_ids(s)];
    const auto top = std::max_element(counts.begin(), counts.end(),
                                      [](const auto& a, const auto& b) { return a.second < b.second; });
    int64_t hits = 0;
    for (const data::SftSample& s : val_) hits += trained_ids(s) == top->first;
    majority_ = val_.empty() ? 0.0 : double(hits) / double(val_.size());
    majority_text_ = tok_->decode(top->first);
    while (!majority_text_.empty() && (majority_text_.back() == '\n' || majority_text_.back() == ' '))
      majority_text_.pop_back();
    summary_ = fmt::format("{} {} samples{}{}: {} train / {} val{}", N + truncated + d.skipped, shape_,
                           d.skipped ? fmt::format(", {} without a trained token skipped", d.skipped) : "",
                           truncated ? fmt::format(", {} left out (no trained token in their first seq_len + 1 = {} "
                                                   "tokens)",
                                                   truncated, T + 1)
                                     : "",
                           train_.size(), val_.size(), cut ? fmt::format(" ({} cut to {} tokens)", cut, T + 1) : "");
    summary_ +=
        fmt::format(" | majority completion \"{}\": {:.2f}% exact match on val", majority_text_, 100.0 * majority_);
  }
  ItemKind item_kind() const override { return ItemKind::Token; }
  int64_t items_per_row() const override { return r_.train.seq_len; }
  double flops_per_item() const override { return model_->flops_per_token(r_.train.seq_len); }
  std::string data_summary() override { return summary_; }

  // Rows of the step's global batch: training samples in a shuffled order per epoch (seeded by
  // run.seed and the epoch), row g of step s is sample k = s G + g of that sequence.
  Batch batch(int64_t step, int64_t micro, int64_t micro_steps, const Shard& s) override {
    const int64_t B = r_.train.batch_size, G = B * micro_steps * s.world;
    std::vector<const data::SftSample*> rows;
    for (int64_t i = 0; i < B; ++i) {
      const int64_t k = step * G + (micro * s.world + s.rank) * B + i, N = int64_t(train_.size());
      rows.push_back(&train_[size_t(order(k / N)[size_t(k % N)])]);
    }
    return make_batch(rows);
  }
  bool needs_whole_step() const override { return true; }  // trained tokens per micro-batch differ
  Loss loss(const Batch& b, int64_t, Metrics&) override { return {model_->loss(b.at("ids"), b.at("targets"))}; }

  Metrics evaluate(bool final, const Shard& s, const Scorer& score) override {
    // periodic: the first eval_batches global batches' worth of samples, the same set however the
    // batch is split; final: all of them
    const int64_t B = r_.train.batch_size, G = B * r_.train.accumulation * s.world;
    const int64_t n = final ? int64_t(val_.size())
                            : std::min<int64_t>(int64_t(val_.size()), std::max<int64_t>(1, r_.train.eval_batches) * G);
    const int64_t batches = (n + B - 1) / B;
    Metrics m;
    for (int64_t j = s.rank; j < batches; j += s.world) {
      std::vector<const data::SftSample*> rows;
      for (int64_t i = j * B; i < std::min(n, (j + 1) * B); ++i) rows.push_back(&val_[size_t(i)]);
      score(make_batch(rows), m);
    }
    return m;
  }
  // The summed loss over trained tokens, and exact matches: samples whose every trained token is
  // the argmax given the ones before it, which is what greedy decoding from the prompt returns.
  void score(const Batch& b, Metrics& m) override {
    const Tensor& y = b.at("targets");
    m.add("loss_sum", model_->loss(b.at("ids"), y).item() * double(b.count));
    m.add("tokens", double(b.count));
    const Tensor logits = model_->forward(b.at("ids")).to(DType::F32).contiguous();  // (R, T, V)
    const int64_t R = y.size(0), T = y.size(1), V = logits.size(2);
    const float* l = logits.data<float>();
    const int64_t* t = y.data<int64_t>();
    for (int64_t r = 0; r < R; ++r) {
      bool all = true;
      for (int64_t p = 0; p < T && all; ++p) {
        const int64_t want = t[r * T + p];
        if (want == kIgnore) continue;
        const float* row = l + (r * T + p) * V;
        all = int64_t(std::max_element(row, row + V) - row) == want;
      }
      m.add("exact", all ? 1.0 : 0.0);
      m.add("samples", 1.0);
    }
  }
  std::vector<std::string> eval_metric_keys() const override { return {"loss_sum", "tokens", "exact", "samples"}; }
  nlohmann::json eval_fields(const Metrics& m) const override {
    return {{"val_loss", m.get("loss_sum") / m.get("tokens")}, {"exact_match", m.get("exact") / m.get("samples")}};
  }
  std::string eval_line(const Metrics& m) const override {
    return fmt::format("val loss {:.4f} | exact match {:.2f}%", m.get("loss_sum") / m.get("tokens"),
                       100.0 * m.get("exact") / m.get("samples"));
  }
  std::string final_line(const Metrics& m) const override {
    return fmt::format(
        "final val loss: {:.4f} | exact match {:.2f}% of {:.0f} held-out samples (always the "
        "majority completion: {:.2f}%)",
        m.get("loss_sum") / m.get("tokens"), 100.0 * m.get("exact") / m.get("samples"), m.get("samples"),
        100.0 * majority_);
  }
  // every position a target, as a full row of trained tokens
  Batch synthetic_batch(uint64_t seed, int64_t rows = -1) override { return causal_lm_synthetic_batch(r_, seed, rows); }
  int64_t eval_rows() const override { return r_.train.batch_size; }

 private:
  // (R, T) inputs and targets: a sample's first T + 1 ids, a target only where trained, the rest
  // of the row padding (id 0, no target).
  Batch make_batch(const std::vector<const data::SftSample*>& rows) const {
    const int64_t R = int64_t(rows.size()), T = r_.train.seq_len;
    Tensor x = Tensor::zeros({R, T}, DType::I64), y = Tensor::full({R, T}, double(kIgnore), DType::I64);
    int64_t* px = x.data<int64_t>();
    int64_t* py = y.data<int64_t>();
    int64_t count = 0;
    for (int64_t r = 0; r < R; ++r) {
      const data::SftSample& s = *rows[size_t(r)];
      const int64_t n = std::min<int64_t>(int64_t(s.ids.size()) - 1, T);
      for (int64_t p = 0; p < n; ++p) {
        px[r * T + p] = s.ids[size_t(p)];
        if (s.trained[size_t(p + 1)]) py[r * T + p] = s.ids[size_t(p + 1)], ++count;
      }
    }
    Batch b;
    b.t["ids"] = x;
    b.t["targets"] = y;
    b.rows = R;
    b.count = count;
    return b;
  }
  // A sample's trained tokens (its completion and EOS), within the row's seq_len + 1.
  std::vector<int> trained_ids(const data::SftSample& s) const {
    std::vector<int> out;
    const size_t n = std::min(s.ids.size(), size_t(r_.train.seq_len + 1));
    for (size_t i = 1; i < n; ++i)
      if (s.trained[i]) out.push_back(s.ids[i]);
    return out;
  }
  // The training samples' order in epoch e (a seeded Fisher-Yates shuffle), cached per epoch.
  const std::vector<int64_t>& order(int64_t e) {
    if (order_epoch_ != e) {
      order_.resize(train_.size());
      std::iota(order_.begin(), order_.end(), 0);
      Generator g(data::splitmix64(r_.run.seed ^ data::splitmix64(uint64_t(e) + 0x5f7u)));
      for (int64_t i = int64_t(order_.size()) - 1; i > 0; --i)
        std::swap(order_[size_t(i)], order_[size_t(int64_t(g.uniform_double() * double(i + 1)) % (i + 1))]);
      order_epoch_ = e;
    }
    return order_;
  }

  Recipe r_;
  std::unique_ptr<models::CausalLM> model_;
  std::unique_ptr<data::TextTokenizer> tok_;
  std::vector<data::SftSample> train_, val_;
  std::string shape_, summary_, majority_text_;
  double majority_ = 0.0;
  std::vector<int64_t> order_;
  int64_t order_epoch_ = -1;
};

}  // namespace

std::unique_ptr<Task> sft_task(const Recipe& r, std::unique_ptr<models::CausalLM> model) {
  return std::make_unique<SftTask>(r, std::move(model));
}

}  // namespace brigade::train
