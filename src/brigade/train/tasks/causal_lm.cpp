// Causal language modelling (GPT, LLaMA); see tasks.h.
#include <omp.h>

#include <filesystem>
#include <map>
#include <optional>

#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/core/error.h"
#include "brigade/data/sampler.h"
#include "brigade/data/text/prepare.h"
#include "brigade/data/text/text_tokenizer.h"
#include "brigade/data/text/token_file.h"
#include "brigade/models/gpt/gpt.h"
#include "brigade/models/llama/llama.h"
#include "brigade/train/finetune.h"
#include "brigade/train/generate.h"
#include "brigade/train/registry.h"
#include "brigade/train/tasks.h"

namespace brigade::train {

namespace fs = std::filesystem;

data::PrepareOptions prepare_options(const Recipe& r) {
  data::PrepareOptions po;
  po.corpus = r.data.corpus;
  po.out_dir = r.data.dir;
  po.vocab_size = r.model.vocab_size;
  po.val_fraction = r.data.val_fraction;
  // a pretrained model reads text through its own tokenizer
  if (!r.model.init_from.empty()) po.tokenizer = init_from_tokenizer(r);
  return po;
}

std::string causal_lm_description(const Recipe& r, const models::CausalLM& model) {
  return fmt::format("{} {} layers, {} dims, {} heads, vocab {}, {:.2f}M parameters",
                     std::string(model.arch()) == "gpt" ? "GPT" : "LLaMA", r.model.n_layer, r.model.n_embd,
                     r.model.n_head, r.model.vocab_size, double(model.num_parameters()) / 1e6);
}

Batch causal_lm_synthetic_batch(const Recipe& r, uint64_t seed, int64_t rows) {
  const int64_t B = rows > 0 ? rows : r.train.batch_size, T = r.train.seq_len, V = r.model.vocab_size;
  // random ids (and targets: the next id), fixed by the seed
  Tensor ids = Tensor::empty({B, T + 1}, DType::I64);  // (B, T + 1)
  Generator g(seed);
  int64_t* p = ids.data<int64_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) p[i] = std::min<int64_t>(int64_t(g.uniform_double() * double(V)), V - 1);
  Batch b;
  b.t["ids"] = ids.narrow(1, 0, T).contiguous();      // (B, T)
  b.t["targets"] = ids.narrow(1, 1, T).contiguous();  // (B, T)
  b.rows = B;
  b.count = B * T;
  return b;
}

namespace {

// The causal-LM task as tasks.h describes it (causal_lm_task).
class CausalLMTask : public Task {
 public:
  CausalLMTask(const Recipe& r, std::unique_ptr<models::CausalLM> model) : r_(r), model_(std::move(model)) {}
  nn::Module& model() override { return *model_; }
  models::CausalLM& lm() { return *model_; }
  Generator* dropout_generator() override { return &model_->dropout_generator(); }
  std::string describe() override { return causal_lm_description(r_, *model_); }
  void open_data(dist::ProcessGroup& ctrl, const std::function<void(const std::string&)>& say) override {
    const fs::path data_dir(r_.data.dir);
    // Prepared by rank 0 on first use, and again when the folder was made from something else than
    // the recipe asks for (another corpus, vocabulary or split: data::ensure_prepared says which).
    if (ctrl.rank() == 0)
      data::ensure_prepared(prepare_options(r_), [&](const data::PrepareProgress& p) { say("prepare: " + p.message); });
    ctrl.barrier();
    tok_ = data::load_text_tokenizer(data_dir.string());
    const bool own = tok_->kind() == "brigade";  // a pretrained model's embedding may be padded past its tokenizer
    BRIGADE_CHECK(own ? tok_->vocab_size() == r_.model.vocab_size : tok_->vocab_size() <= r_.model.vocab_size,
                  ConfigError,
                  "{}: the tokenizer in {} has vocab {} but model.vocab_size is {}; run `brigade prepare` again or set "
                  "data.dir to a fresh folder",
                  r_.path, r_.data.dir, tok_->vocab_size(), r_.model.vocab_size);
    train_.emplace((data_dir / data::kTrainFile).string());
    val_.emplace((data_dir / data::kValFile).string());
    for (const data::TokenDataset* ds : {&*train_, &*val_})
      BRIGADE_CHECK(ds->vocab_size() == r_.model.vocab_size, ConfigError,
                    "{}: token file {} has vocab {} but model.vocab_size is {}; run `brigade prepare` again", r_.path,
                    ds->path(), ds->vocab_size(), r_.model.vocab_size);
  }
  ItemKind item_kind() const override { return ItemKind::Token; }
  int64_t items_per_row() const override { return r_.train.seq_len; }
  double flops_per_item() const override { return model_->flops_per_token(r_.train.seq_len); }
  std::string data_summary() override { return fmt::format("{} train / {} val tokens", train_->size(), val_->size()); }
  Batch batch(int64_t step, int64_t micro, int64_t micro_steps, const Shard& s) override {
    const int64_t B = r_.train.batch_size, T = r_.train.seq_len;
    // Micro-step m of replica p takes rows [(m P + p) B, +B) of the step's global batch, so the
    // rows seen per step do not depend on how the batch is split (dp x accumulation x batch_size).
    if (split_micro_ != micro_steps || split_world_ != s.world || split_rank_ != s.rank) {
      samplers_.clear();
      for (int64_t m = 0; m < micro_steps; ++m)
        samplers_.emplace_back(*train_, B, T, r_.run.seed, int(m * s.world + s.rank), int(micro_steps * s.world));
      split_micro_ = micro_steps, split_world_ = s.world, split_rank_ = s.rank;
    }
    if (!x_.defined()) {
      x_ = Tensor::empty({B, T}, DType::I64);  // (B, T)
      y_ = Tensor::empty({B, T}, DType::I64);  // (B, T)
    }
    samplers_[size_t(micro)].get_batch(step, x_, y_);
    Batch b;
    b.t["ids"] = x_;
    b.t["targets"] = y_;
    b.rows = B;
    b.count = B * T;
    return b;
  }
  Loss loss(const Batch& b, int64_t micro, Metrics& m) override {
    return {model_->loss(b.at("ids"), b.at("targets"))};  // (): f32 at every level
  }
  Metrics evaluate(bool final, const Shard& s, const Scorer& score) override {
    // The recipe's (static) accumulation splits the eval windows as training splits its batch, so
    // val loss depends neither on the split nor on adaptive accumulation.
    const int64_t B = r_.train.batch_size, T = r_.train.seq_len, A = r_.train.accumulation;
    std::vector<data::BatchSampler> val;
    for (int64_t m = 0; m < A; ++m)
      val.emplace_back(*val_, B, T, r_.run.seed, int(m * s.world + s.rank), int(A * s.world));
    Tensor x = Tensor::empty({B, T}, DType::I64), y = Tensor::empty({B, T}, DType::I64);  // (B, T)
    Metrics m;
    const int64_t n = std::max<int64_t>(1, r_.train.eval_batches);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < A; ++k) {
        val[size_t(k)].get_eval_batch(i, n, x, y);
        Batch b;
        b.t["ids"] = x;
        b.t["targets"] = y;
        b.rows = B;
        b.count = B * T;
        score(b, m);
      }
    return m;
  }
  void score(const Batch& b, Metrics& m) override {
    m.add("loss_sum", model_->loss(b.at("ids"), b.at("targets")).item());
    m.add("batches", 1.0);
  }
  std::vector<std::string> eval_metric_keys() const override { return {"loss_sum", "batches"}; }
  nlohmann::json eval_fields(const Metrics& m) const override {
    return {{"val_loss", m.get("loss_sum") / m.get("batches")}};
  }
  std::string eval_line(const Metrics& m) const override {
    return fmt::format("val loss {:.4f}", m.get("loss_sum") / m.get("batches"));
  }
  std::string final_line(const Metrics& m) const override {
    return fmt::format("final val loss: {:.4f}", m.get("loss_sum") / m.get("batches"));
  }
  const Stages* stages() override {
    if (!stages_) {
      models::CausalLM* lm = model_.get();
      Stages st;
      st.num_blocks = int64_t(lm->blocks().size());
      st.embed = [lm](const Batch& b) { return lm->embed(b.at("ids")); };  // (Bm, T, C)
      st.blocks = [lm](const Tensor& x, int64_t lo, int64_t hi, const Batch&) { return lm->run_blocks(x, lo, hi); };
      st.head = [lm](const Tensor& x, const Batch& b, Metrics&) { return lm->head_loss(x, b.at("targets")); };
      st.score = [lm](const Tensor& x, const Batch& b, Metrics& m) {  // as score()
        m.add("loss_sum", lm->head_loss(x, b.at("targets")).item());
        m.add("batches", 1.0);
      };
      const int64_t T = r_.train.seq_len, C = lm->hidden_size();
      st.hidden = [T, C](int64_t rows) { return Shape{rows, T, C}; };
      st.tied = lm->tied_parameters();
      if (dynamic_cast<models::GPT*>(lm)) st.tp_plan = models::GPT::tp_plan();
      if (auto* llama = dynamic_cast<models::LLaMA*>(lm))
        st.tp_plan = models::LLaMA::tp_plan(llama->config().tie_word_embeddings);
      stages_ = std::move(st);
    }
    return &*stages_;
  }
  bool can_sample() const override { return true; }
  void check_sample() const override { (void)tok_->encode_strict(r_.sample.prompt, "sample.prompt"); }
  std::string sample(const nn::NamedTensors* full) override {
    const SampleOptions so{r_.sample.tokens, r_.sample.temperature, r_.sample.top_k, r_.run.seed};
    if (!full) {
      model_->train(false);
      return generate_text(*model_, *tok_, r_.sample.prompt, so);
    }
    std::unique_ptr<models::CausalLM> whole = make_causal_lm(r_.model);
    std::map<std::string, Tensor> by_name(full->begin(), full->end());
    for (auto& [name, p] : whole->named_parameters()) p.copy_(by_name.at(name));
    whole->train(false);
    return generate_text(*whole, *tok_, r_.sample.prompt, so);
  }
  std::string tokenizer_dir() const override { return r_.data.dir; }
  Batch synthetic_batch(uint64_t seed, int64_t rows = -1) override { return causal_lm_synthetic_batch(r_, seed, rows); }
  int64_t eval_rows() const override { return r_.train.batch_size; }

 private:
  Recipe r_;
  std::unique_ptr<models::CausalLM> model_;
  std::unique_ptr<data::TextTokenizer> tok_;
  std::optional<data::TokenDataset> train_, val_;
  // the samplers of one split (micro_steps x world parts), rebuilt when the split changes
  std::vector<data::BatchSampler> samplers_;
  int64_t split_micro_ = 0, split_world_ = 0, split_rank_ = -1;
  Tensor x_, y_;  // (B, T) I64, refilled by every batch
  std::optional<Stages> stages_;
};

}  // namespace

std::unique_ptr<Task> causal_lm_task(const Recipe& r, std::unique_ptr<models::CausalLM> model) {
  return std::make_unique<CausalLMTask>(r, std::move(model));
}

}  // namespace brigade::train
