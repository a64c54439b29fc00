// Masked-language-model pre-training of BERT through the one trainer (the masked-LM task, train/tasks.h): a tiny BERT
// on the tiny structured corpus (support/test_support.h) learns far beyond the context-free baselines, computed here
// from val.bin alone (the best constant answer's accuracy, the entropy of the maskable val tokens); its checkpoint
// holds the BertForMaskedLM names and evaluates, through evaluate_checkpoint and `brigade eval --ckpt`, to exactly the
// run's final numbers; runs are deterministic; Ctrl-C checkpoints and exits 130; bad inputs end in clear errors.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/data/text/prepare.h"
#include "brigade/data/text/token_file.h"
#include "brigade/train/checkpoint.h"
#include "brigade/train/config.h"
#include "brigade/train/registry.h"
#include "brigade/train/tasks.h"
#include "brigade/train/trainer.h"
#include "support/test_support.h"

namespace fs = std::filesystem;
using namespace brigade;

namespace {

constexpr int64_t kVocab = 128;

// A tiny BERT: 2 layers, 64 wide, sequences of 16 tokens, batches of 32, 1 thread.
std::string recipe_text(const fs::path& data_dir, const fs::path& out_dir, int64_t steps, uint64_t seed = 7) {
  return fmt::format(R"(
[run]
name = "bert-tiny"
out_dir = "{}"
seed = {}
threads = 1
[model]
type = "bert"
vocab_size = {}
block_size = 32
n_layer = 2
n_head = 4
n_embd = 64
intermediate_size = 128
layer_norm_eps = 1e-12
dropout = 0.0
[data]
corpus = "{}"
dir = "{}"
val_fraction = 0.1
[train]
steps = {}
batch_size = 32
seq_len = 16
eval_every = 100
eval_batches = 8
log_every = 10
grad_clip = 1.0
[optim]
name = "adamw"
lr = 2e-3
weight_decay = 0.01
beta1 = 0.9
beta2 = 0.98
[schedule]
name = "cosine"
warmup_steps = {}
min_lr = 2e-4
)",
                     out_dir.string(), seed, kVocab, (data_dir.parent_path() / "corpus.txt").string(),
                     data_dir.string(), steps, std::min<int64_t>(20, steps));
}

train::Recipe recipe(const fs::path& data_dir, const fs::path& out_dir, int64_t steps, uint64_t seed = 7) {
  return train::parse_recipe(recipe_text(data_dir, out_dir, steps, seed), "test-bert.toml");
}

train::TrainOptions quiet() {
  train::TrainOptions o;
  o.quiet = true;
  o.sample = false;
  return o;
}

// One trained run shared by the tests (the slow part, a few seconds).
class BertTrain : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / fmt::format("brigade_bert_train_{}", ::getpid());
    fs::remove_all(root_);
    fs::create_directories(root_);
    test_support::write_tiny_corpus(root_ / "corpus.txt");
    data::PrepareOptions po;
    po.corpus = (root_ / "corpus.txt").string();
    po.out_dir = (root_ / "data").string();
    po.vocab_size = kVocab;
    po.val_fraction = 0.1;
    data::prepare(po);
    const train::Recipe r = recipe(root_ / "data", root_ / "run", 300);
    task_ = train::make_task(r).release();
    result_ = new train::TrainResult(train::train(r, quiet(), *task_));
  }
  static void TearDownTestSuite() {
    delete result_;
    delete task_;
    result_ = nullptr;
    task_ = nullptr;
    fs::remove_all(root_);
  }
  // The run's baselines, from its final line ("... | unigram loss X | most-frequent-token accuracy Y%").
  static double baseline(const std::string& what) {
    const std::string& line = result_->final_line;
    const size_t at = line.find(what);
    return at == std::string::npos ? -1.0 : std::stod(line.substr(at + what.size()));
  }
  static fs::path root_;
  static train::Task* task_;
  static train::TrainResult* result_;
};
fs::path BertTrain::root_;
train::Task* BertTrain::task_ = nullptr;
train::TrainResult* BertTrain::result_ = nullptr;

// The final evaluation's masked tokens, hits and accuracy.
int64_t masked(const train::TrainResult& r) { return r.eval_fields.at("masked_tokens").get<int64_t>(); }
int64_t correct(const train::TrainResult& r) { return int64_t(r.eval.get("correct")); }
double accuracy(const train::TrainResult& r) { return r.eval_fields.at("mlm_accuracy").get<double>(); }

TEST_F(BertTrain, LearnsFarBeyondContextFreeBaselines) {
  const train::TrainResult& res = *result_;
  ASSERT_FALSE(res.interrupted);
  EXPECT_EQ(res.steps, 300);
  // Independent baselines from val.bin: a predictor that ignores context can at best answer the
  // most frequent maskable token (accuracy = its share) and at best reach the entropy of the
  // maskable tokens' distribution (cross-entropy >= entropy).
  data::TokenDataset val((root_ / "data" / data::kValFile).string());
  std::map<int64_t, int64_t> count;
  int64_t n = 0;
  for (int64_t i = 0; i < val.size(); ++i) {
    const int64_t t = val[i];
    if (t <= 2) continue;  // unk, bos, eos: never masked
    ++count[t];
    ++n;
  }
  ASSERT_GT(n, 1000);
  int64_t top = 0;
  double entropy = 0.0;
  for (const auto& [id, c] : count) {
    top = std::max(top, c);
    const double p = double(c) / double(n);
    entropy -= p * std::log(p);
  }
  const double best_constant = double(top) / double(n);
  ASSERT_GT(masked(res), 300);
  EXPECT_GT(accuracy(res), best_constant + 0.2)
      << "masked accuracy " << accuracy(res) << " vs best constant answer " << best_constant;
  EXPECT_LT(res.val_loss, entropy - 0.6) << "val MLM loss vs unigram entropy " << entropy;
  EXPECT_LT(res.val_loss, std::log(double(kVocab + 1)) - 2.0);
  // The run's own baselines agree with the independent ones' meaning: unigram loss >= entropy
  // up to smoothing and sampling, most-frequent accuracy near the share of the top token.
  EXPECT_NEAR(baseline("most-frequent-token accuracy ") / 100.0, best_constant, 0.1);
  EXPECT_GT(baseline("unigram loss "), entropy - 0.3);
  EXPECT_NE(res.final_line.find(fmt::format("uniform loss {:.4f}", std::log(double(kVocab + 1)))), std::string::npos)
      << res.final_line;
  EXPECT_EQ(correct(res), int64_t(std::llround(accuracy(res) * double(masked(res)))));
}

TEST_F(BertTrain, WritesMetricsPlotAndHuggingFaceCheckpoint) {
  const fs::path run = root_ / "run";
  std::ifstream f(run / "metrics.jsonl");
  std::string line;
  int train_records = 0;
  std::vector<double> val_losses;
  double first_loss = -1, last_loss = -1;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("val_loss")) {
      val_losses.push_back(j["val_loss"].get<double>());
      EXPECT_TRUE(j.contains("mlm_accuracy"));
      EXPECT_GT(j["masked_tokens"].get<int64_t>(), 0);
    } else {
      ++train_records;
      for (const char* k : {"loss", "lr", "tokens_per_s", "train_accuracy"}) EXPECT_TRUE(j.contains(k)) << k;
      if (first_loss < 0) first_loss = j["loss"].get<double>();
      last_loss = j["loss"].get<double>();
    }
  }
  EXPECT_EQ(train_records, 30);      // every 10 of 300 steps
  ASSERT_EQ(val_losses.size(), 3u);  // steps 100, 200, 300
  EXPECT_EQ(val_losses.back(), result_->val_loss);
  EXPECT_LT(last_loss, first_loss - 1.0);
  EXPECT_TRUE(fs::exists(run / "loss.svg"));
  const fs::path ck = run / "checkpoint";
  for (const char* file :
       {"model.safetensors", "optimizer.safetensors", "state.json", "recipe.toml", "tokenizer.model"})
    EXPECT_TRUE(fs::exists(ck / file)) << file;
  ckpt::SafetensorsReader st((ck / "model.safetensors").string());
  ASSERT_TRUE(st.contains("bert.embeddings.word_embeddings.weight"));
  EXPECT_EQ(st.get("bert.embeddings.word_embeddings.weight").shape(), (Shape{kVocab + 1, 64}));  // + [MASK]
  EXPECT_TRUE(st.contains("bert.encoder.layer.1.attention.self.query.weight"));
  EXPECT_TRUE(st.contains("cls.predictions.transform.LayerNorm.bias"));
  EXPECT_EQ(st.get("cls.predictions.bias").shape(), (Shape{kVocab + 1}));
  EXPECT_EQ(train::checkpoint_state(ck.string()).step, 300);
}

TEST_F(BertTrain, CheckpointEvaluationReproducesFinalNumbersExactly) {
  const train::EvalReport ev = train::evaluate_checkpoint((root_ / "run" / "checkpoint").string(), 1);
  EXPECT_EQ(ev.fields.at("val_loss").get<double>(),
            result_->val_loss);  // bitwise: same weights, batches, masks, threads
  EXPECT_EQ(int64_t(ev.metrics.get("correct")), correct(*result_));
  EXPECT_EQ(ev.fields.at("masked_tokens").get<int64_t>(), masked(*result_));
  EXPECT_EQ(ev.fields.at("mlm_accuracy").get<double>(), accuracy(*result_));
}

TEST_F(BertTrain, CliEvalPrintsTheSameNumbers) {
  const std::string bin = std::string(BRIGADE_BINARY_DIR) + "/bin/brigade";
  if (!fs::exists(bin)) GTEST_SKIP() << "build the brigade binary for this test";
  const fs::path out = root_ / "eval_out.txt", err = root_ / "eval_err.txt";
  auto run = [&](const std::string& ckpt) {
    const std::string cmd =
        bin + " eval --ckpt '" + ckpt + "' --threads 1 >'" + out.string() + "' 2>'" + err.string() + "'";
    const int st = std::system(cmd.c_str());
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  };
  ASSERT_EQ(run((root_ / "run" / "checkpoint").string()), 0) << test_support::slurp(err);
  const train::TrainResult& f = *result_;
  const std::string expect = fmt::format("val MLM loss {:.6f} | masked accuracy {:.2f}% ({}/{} masked tokens)\n",
                                         f.val_loss, 100.0 * accuracy(f), correct(f), masked(f));
  EXPECT_EQ(test_support::slurp(out), expect);
  EXPECT_EQ(run((root_ / "no-such-dir").string()), 1);
  const std::string e = test_support::slurp(err);
  EXPECT_NE(e.find("no such checkpoint directory"), std::string::npos) << e;
  EXPECT_EQ(std::count(e.begin(), e.end(), '\n'), 1) << e;  // one line
}

// Ctrl-C: `brigade train` finishes the step, writes the checkpoint and exits 130.
TEST_F(BertTrain, InterruptCheckpointsAndExits130) {
  const std::string bin = std::string(BRIGADE_BINARY_DIR) + "/bin/brigade";
  if (!fs::exists(bin)) GTEST_SKIP() << "build the brigade binary for this test";
  const fs::path dir = root_ / "interrupt";
  fs::create_directories(dir);
  { std::ofstream(dir / "r.toml") << recipe_text(root_ / "data", dir / "run", 100000); }
  const fs::path pidfile = dir / "pid";
  const std::string cmd = "cd '" + dir.string() + "' && { " + bin + " train r.toml >out.txt 2>err.txt & echo $! >'" +
                          pidfile.string() + "'; wait $!; echo $? >rc.txt; }";
  std::thread runner([cmd] { (void)std::system(cmd.c_str()); });
  // Signal only once a training step was logged (the handler is installed before the loop).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    if (fs::exists(dir / "run" / "metrics.jsonl") && fs::file_size(dir / "run" / "metrics.jsonl") > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const pid_t pid = pid_t(std::stol(test_support::slurp(pidfile)));
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  runner.join();
  EXPECT_EQ(std::stoi(test_support::slurp(dir / "rc.txt")), 130) << test_support::slurp(dir / "err.txt");
  const int64_t step = train::checkpoint_state((dir / "run" / "checkpoint").string()).step;
  EXPECT_GE(step, 10);
  EXPECT_LT(step, 100000);
  EXPECT_NE(test_support::slurp(dir / "err.txt").find("interrupted at step"), std::string::npos);
}

TEST_F(BertTrain, RunsAreDeterministicAndSeeded) {
  auto short_run = [&](uint64_t seed, const char* name) {
    return train::train(recipe(root_ / "data", root_ / name, 6, seed), quiet());
  };
  const train::TrainResult a = short_run(11, "det-a"), b = short_run(11, "det-b"), c = short_run(12, "det-c");
  EXPECT_EQ(a.last_loss, b.last_loss);
  EXPECT_EQ(a.val_loss, b.val_loss);
  EXPECT_NE(a.last_loss, c.last_loss);
  // evaluation masks do not depend on the seed: same masked positions, different models
  EXPECT_EQ(masked(a), masked(c));
  EXPECT_NE(a.val_loss, c.val_loss);
}

TEST_F(BertTrain, StopsAtStepAndCheckpoints) {
  train::TrainOptions o = quiet();
  o.stop_at = 4;
  const train::TrainResult r = train::train(recipe(root_ / "data", root_ / "stop", 300), o);
  EXPECT_EQ(r.steps, 4);
  EXPECT_GT(masked(r), 0);  // evaluated at the last step run
  EXPECT_EQ(train::checkpoint_state((root_ / "stop" / "checkpoint").string()).step, 4);
}

template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no error";
}

TEST_F(BertTrain, BadInputsGiveClearErrors) {
  // a recipe whose vocabulary differs from the prepared data's: the data is prepared again for it
  // (data::ensure_prepared), never trained on with the wrong vocabulary
  fs::copy(root_ / "data", root_ / "data-256", fs::copy_options::recursive);
  train::Recipe r = recipe(root_ / "data-256", root_ / "bad", 5);
  r.model.vocab_size = 256;
  EXPECT_EQ(train::train(r, quiet()).steps, 5);
  EXPECT_EQ(data::TokenDataset((root_ / "data-256" / data::kTrainFile).string()).vocab_size(), 256);
  std::string e;
  // --resume without a checkpoint
  train::TrainOptions o = quiet();
  o.resume = true;
  e = error_of<CheckpointError>([&] { train::train(recipe(root_ / "data", root_ / "bad-resume", 5), o); });
  EXPECT_NE(e.find("--resume: no checkpoint"), std::string::npos) << e;
  // a missing checkpoint directory
  e = error_of<CheckpointError>([&] { train::evaluate_checkpoint((root_ / "nope").string(), 1); });
  EXPECT_NE(e.find("no such checkpoint directory"), std::string::npos) << e;
  // a checkpoint whose tokenizer is not the one of its data.dir
  const fs::path copy = root_ / "ckpt-copy";
  fs::copy(root_ / "run" / "checkpoint", copy, fs::copy_options::recursive);
  std::ofstream(copy / "tokenizer.model", std::ios::trunc) << "another tokenizer";
  fs::remove(copy / ckpt::kChecksumFile);  // unverified, as an older checkpoint: the tokenizer check answers
  e = error_of<CheckpointError>([&] { train::evaluate_checkpoint(copy.string(), 1); });
  EXPECT_NE(e.find("differs from the checkpoint's tokenizer.model"), std::string::npos) << e;
  // a checkpoint missing a tensor is refused by name
  fs::remove_all(copy);
  fs::copy(root_ / "run" / "checkpoint", copy, fs::copy_options::recursive);
  {
    ckpt::SafetensorsReader st((copy / "model.safetensors").string());
    std::vector<std::pair<std::string, Tensor>> keep;
    for (const std::string& name : st.names())
      if (name != "cls.predictions.bias") keep.emplace_back(name, st.get(name));
    ckpt::save_safetensors((copy / "model.safetensors").string(), keep);
  }
  fs::remove(copy / ckpt::kChecksumFile);  // unverified: the strict loader answers
  e = error_of<CheckpointError>([&] { train::evaluate_checkpoint(copy.string(), 1); });
  EXPECT_NE(e.find("cls.predictions.bias"), std::string::npos) << e;
}

}  // namespace
