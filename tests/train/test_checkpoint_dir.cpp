// Checkpoint directories (train/checkpoint.h) when a save goes wrong:
// - a save killed between its two renames (checkpoint -> checkpoint.old, then the
//   unfinished checkpoint.tmp never moved in) is repaired by open_checkpoint(), which
//   every reader (generate, eval, resume) calls first, and by checkpoint_recipe() /
//   checkpoint_state(); the restored weights are the saved ones, bit for bit;
// - a save that fails partway through writing checkpoint.tmp (a full disk, simulated
//   with BRIGADE_CKPT_FAIL_AFTER_BYTES) removes checkpoint.tmp, says how many bytes the
//   save needed and how many are free, and leaves the previous checkpoint loadable.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <regex>

#include "brigade/autograd/engine.h"
#include "brigade/core/error.h"
#include "brigade/models/gpt/gpt.h"
#include "brigade/optim/optimizer.h"
#include "brigade/train/checkpoint.h"

using namespace brigade;
using namespace brigade::train;
namespace fs = std::filesystem;

namespace {

// A scratch folder per test, removed when the test ends.
class CheckpointDir : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() / (std::string("brigade_ckpt_") + info->test_suite_name() + "_" + info->name() +
                                         "_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "run");
    ckpt_ = (root_ / "run" / "checkpoint").string();
    ::unsetenv("BRIGADE_CKPT_FAIL_AFTER_BYTES");
  }
  void TearDown() override {
    ::unsetenv("BRIGADE_CKPT_FAIL_AFTER_BYTES");
    fs::remove_all(root_);
  }
  fs::path root_;
  std::string ckpt_;
};

// A tiny GPT (odd sizes), its recipe, and an AdamW that has taken `steps` steps.
struct Tiny {
  models::GPTConfig c;
  Recipe recipe;
  std::unique_ptr<models::GPT> model;
  std::unique_ptr<optim::AdamW> opt;
  Tensor ids, targets;

  Tiny() {
    c.vocab_size = 53;
    c.block_size = 16;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 24;
    recipe.model.vocab_size = c.vocab_size;
    recipe.model.block_size = c.block_size;
    recipe.model.n_layer = c.n_layer;
    recipe.model.n_head = c.n_head;
    recipe.model.n_embd = c.n_embd;
    recipe.train.seq_len = c.block_size;
    model = std::make_unique<models::GPT>(c);
    Generator g(7);
    model->init_weights(g);
    opt = std::make_unique<optim::AdamW>(model->named_parameters(), optim::AdamWOptions{0.9, 0.95, 1e-8, 0.1});
    std::vector<int64_t> idv, tgv;
    for (int i = 0; i < 2 * 12; ++i) {
      idv.push_back((i * 37 + 11) % c.vocab_size);
      tgv.push_back((i * 53 + 5) % c.vocab_size);
    }
    ids = Tensor::from_vector_i64(idv, {2, 12});      // (B, T)
    targets = Tensor::from_vector_i64(tgv, {2, 12});  // (B, T)
  }
  void step() {
    opt->zero_grad();
    autograd::backward(model->loss(ids, targets));
    opt->step(1e-2);
  }
  void save(const std::string& dir, int64_t step_no) {
    TrainState st;
    st.step = step_no;
    save_checkpoint(dir, *model, opt.get(), st, recipe, "");
  }
  std::vector<std::vector<float>> weights() const {
    std::vector<std::vector<float>> out;
    for (auto& [name, p] : model->named_parameters()) out.push_back(p.to_vector());
    return out;
  }
  // A fresh model of the same shape with the weights of `dir`.
  std::vector<std::vector<float>> loaded(const std::string& dir) const {
    models::GPT m(c);
    load_model_weights((fs::path(dir) / "model.safetensors").string(), m);
    std::vector<std::vector<float>> out;
    for (auto& [name, p] : m.named_parameters()) out.push_back(p.to_vector());
    return out;
  }
};

// What `kill -9` between the two renames of commit_checkpoint() leaves.
void interrupt_between_renames(const std::string& dir) {
  fs::rename(dir, dir + ".old");
  fs::create_directories(dir + ".tmp");
  std::ofstream(dir + ".tmp/model.safetensors", std::ios::binary) << "partial";
}

uint64_t folder_bytes(const fs::path& dir) {
  uint64_t total = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) total += e.file_size();
  return total;
}

// ---- item 2: readers recover an interrupted save

TEST_F(CheckpointDir, OpenCheckpointRestoresAnInterruptedSaveWithTheSameWeights) {
  Tiny t;
  t.step();
  t.save(ckpt_, 1);
  const auto saved = t.weights();
  interrupt_between_renames(ckpt_);
  ASSERT_FALSE(fs::exists(ckpt_));

  std::vector<std::string> said;
  const std::string dir = open_checkpoint(ckpt_, [&](const std::string& s) { said.push_back(s); });
  EXPECT_EQ(dir, ckpt_);
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find(ckpt_ + ".old"), std::string::npos) << said[0];
  EXPECT_NE(said[0].find("removed the unfinished " + ckpt_ + ".tmp"), std::string::npos) << said[0];
  EXPECT_EQ(said[0].find('\n'), std::string::npos);
  EXPECT_TRUE(fs::is_directory(ckpt_));
  EXPECT_FALSE(fs::exists(ckpt_ + ".old"));
  EXPECT_FALSE(fs::exists(ckpt_ + ".tmp"));
  EXPECT_EQ(t.loaded(dir), saved);  // bit for bit
  EXPECT_EQ(checkpoint_state(dir).step, 1);
  EXPECT_EQ(checkpoint_recipe(dir).model, t.recipe.model);

  // Opening a healthy checkpoint says nothing and changes nothing.
  said.clear();
  EXPECT_EQ(open_checkpoint(ckpt_ + "/", [&](const std::string& s) { said.push_back(s); }), ckpt_);
  EXPECT_TRUE(said.empty());
}

TEST_F(CheckpointDir, CheckpointRecipeAndStateRecoverOnTheirOwn) {
  Tiny t;
  t.save(ckpt_, 3);
  const auto saved = t.weights();
  interrupt_between_renames(ckpt_);
  EXPECT_EQ(checkpoint_recipe(ckpt_ + "/").model, t.recipe.model);  // a trailing '/' is the same folder
  EXPECT_FALSE(fs::exists(ckpt_ + ".tmp"));
  EXPECT_EQ(t.loaded(ckpt_), saved);

  interrupt_between_renames(ckpt_);
  EXPECT_EQ(checkpoint_state(ckpt_).step, 3);
  EXPECT_FALSE(fs::exists(ckpt_ + ".old"));
  EXPECT_TRUE(checkpoint_exists(ckpt_));
}

TEST_F(CheckpointDir, ATmpBesideACheckpointIsLeftAlone) {
  Tiny t;
  t.save(ckpt_, 1);
  fs::create_directories(ckpt_ + ".tmp");  // a save in progress, as far as a reader can tell
  std::vector<std::string> said;
  open_checkpoint(ckpt_, [&](const std::string& s) { said.push_back(s); });
  EXPECT_TRUE(said.empty());
  EXPECT_TRUE(fs::exists(ckpt_ + ".tmp"));
}

TEST_F(CheckpointDir, NoCheckpointIsACheckpointErrorNamingTheFolder) {
  auto error_of = [](const std::string& dir) -> std::string {
    try {
      open_checkpoint(dir, [](const std::string&) {});
    } catch (const CheckpointError& e) {
      return e.what();
    }
    return "(no error)";
  };
  std::string msg = error_of(ckpt_);
  EXPECT_NE(msg.find(ckpt_ + ": no such checkpoint directory"), std::string::npos) << msg;
  EXPECT_NE(msg.find("pass the folder written by `brigade train`"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;

  fs::create_directories(ckpt_ + ".tmp");  // a first save that never finished
  msg = error_of(ckpt_);
  EXPECT_NE(msg.find(".tmp is an unfinished save"), std::string::npos) << msg;
  fs::remove_all(ckpt_ + ".tmp");

  Tiny t;
  t.save(ckpt_, 1);
  msg = error_of((root_ / "run").string());  // the run folder instead of its checkpoint
  EXPECT_NE(msg.find("not a Brigade checkpoint (no recipe.toml)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean " + (root_ / "run").string() + "/checkpoint?"), std::string::npos) << msg;
  EXPECT_THROW(checkpoint_recipe((root_ / "nowhere").string()), CheckpointError);
  EXPECT_THROW(checkpoint_state((root_ / "nowhere").string()), CheckpointError);
}

// ---- item 3: a save that fails on a full disk removes its partial folder

// The numbers a failed save's message gives: bytes needed and bytes free.
std::pair<uint64_t, uint64_t> needed_and_free(const std::string& msg) {
  std::smatch m;
  const std::regex re(R"(the save needs (\d+) bytes.* and (\d+) bytes.* is free on )");
  if (!std::regex_search(msg, m, re)) return {0, 0};
  return {std::stoull(m[1]), std::stoull(m[2])};
}

TEST_F(CheckpointDir, AFailedSaveRemovesItsTmpAndSaysWhatItNeededAndWhatWasFree) {
  Tiny t;
  t.step();
  t.save(ckpt_, 1);
  const auto first = t.weights();
  const uint64_t model_bytes = fs::file_size(ckpt_ + "/model.safetensors");
  t.step();  // new weights: the failed save must not leave them anywhere

  // Fails halfway through model.safetensors, then inside optimizer.safetensors.
  for (uint64_t limit : {model_bytes / 2, model_bytes + 100}) {
    SCOPED_TRACE(limit);
    ::setenv("BRIGADE_CKPT_FAIL_AFTER_BYTES", std::to_string(limit).c_str(), 1);
    std::string msg;
    try {
      t.save(ckpt_, 2);
      ADD_FAILURE() << "the injected full disk did not fail the save";
    } catch (const IoError& e) {
      msg = e.what();
    }
    EXPECT_FALSE(fs::exists(ckpt_ + ".tmp")) << "the partial save was left behind";
    EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
    EXPECT_NE(msg.find("removed the partial " + ckpt_ + ".tmp"), std::string::npos) << msg;
    EXPECT_NE(msg.find("the previous checkpoint in " + ckpt_ + " is intact"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    const auto [needed, free] = needed_and_free(msg);
    const fs::space_info sp = fs::space(root_);
    EXPECT_GT(free, 0u) << msg;
    EXPECT_LE(free, sp.capacity) << msg;
    // The previous checkpoint still loads, with its own weights and step.
    EXPECT_EQ(t.loaded(ckpt_), first);
    EXPECT_EQ(checkpoint_state(ckpt_).step, 1);

    // "Needs" is exactly what the same save writes once there is room.
    ::unsetenv("BRIGADE_CKPT_FAIL_AFTER_BYTES");
    const std::string other = (root_ / "room" / "checkpoint").string();
    t.save(other, 2);
    EXPECT_EQ(needed, folder_bytes(other)) << msg;
    fs::remove_all(root_ / "room");
  }
}

TEST_F(CheckpointDir, AFailedFirstSaveSaysThereIsNoPreviousCheckpoint) {
  Tiny t;
  ::setenv("BRIGADE_CKPT_FAIL_AFTER_BYTES", "0", 1);
  try {
    t.save(ckpt_, 1);
    ADD_FAILURE() << "the injected full disk did not fail the save";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(ckpt_ + " holds no previous checkpoint"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(ckpt_ + ".tmp"));
  EXPECT_FALSE(fs::exists(ckpt_));

  ::setenv("BRIGADE_CKPT_FAIL_AFTER_BYTES", "lots", 1);
  EXPECT_THROW(t.save(ckpt_, 1), ValueError);
  EXPECT_FALSE(fs::exists(ckpt_ + ".tmp"));
}

TEST_F(CheckpointDir, AFailedShardWriteRemovesTheTmpToo) {
  const std::string tmp = begin_checkpoint(ckpt_);
  std::map<std::string, Tensor> flat{{"exp_avg", Tensor::full({1000}, 0.5)}};  // (1000)
  ::setenv("BRIGADE_CKPT_FAIL_AFTER_BYTES", "100", 1);
  try {
    write_optimizer_shard(tmp, 0, 2, 0, 1000, flat);
    ADD_FAILURE() << "the injected full disk did not fail the shard";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("removed the partial " + tmp), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(tmp));
}

// state.json's counters are whole numbers >= 0, checked: a float such as 1e300 reached
// get<int64_t>() (undefined behaviour) and a negative step was taken as it was (found writing
// its fuzz target, tests/fuzz).
TEST_F(CheckpointDir, StateJsonCountersMustBeWholeNumbers) {
  fs::create_directories(ckpt_);
  std::ofstream(fs::path(ckpt_) / "recipe.toml") << "";
  auto state = [&](const std::string& fields) {
    std::ofstream(fs::path(ckpt_) / "state.json")
        << "{\"version\": 1, \"rng_state\": \"\", \"last_val_loss\": null, " << fields << "}";
  };
  auto expect_error = [&](const std::string& needle) {
    try {
      (void)checkpoint_state(ckpt_);
      ADD_FAILURE() << "no error; wanted one containing: " << needle;
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("state.json"), std::string::npos) << e.what();
    }
  };
  state("\"step\": 4.0, \"tokens_seen\": 96");  // a whole number written as a float reads
  EXPECT_EQ(checkpoint_state(ckpt_).step, 4);
  state("\"step\": 1e300, \"tokens_seen\": 96");
  expect_error("\"step\" = 1e+300 is not a whole number >= 0");
  state("\"step\": -1, \"tokens_seen\": 96");
  expect_error("\"step\" = -1 is not a whole number >= 0");
  state("\"step\": 3, \"tokens_seen\": 18446744073709551615");
  expect_error("\"tokens_seen\" = 18446744073709551615 is not a whole number >= 0");
  state(
      "\"step\": 3, \"tokens_seen\": 96, \"early_stop\": {\"best_step\": 2.5, \"best_val_loss\": 1, "
      "\"evals_since_best\": 0}");
  expect_error("\"early_stop.best_step\" = 2.5 is not a whole number >= 0");
  state("\"step\": 3, \"tokens_seen\": 96, \"optimizer_steps\": -1e300");
  expect_error("\"optimizer_steps\" = -1e+300 is not a whole number >= -1");
}

// optimizer.index.json names shard files of the checkpoint folder only (a "../" or absolute path
// was read wherever it pointed), and its ranges are whole numbers in order (found writing its
// fuzz target, tests/fuzz).
TEST_F(CheckpointDir, AnOptimizerIndexReadsOnlyItsOwnShards) {
  const std::vector<FlatLayoutEntry> layout{{"w", 0, 6}, {"b", 6, 2}};
  const fs::path dir(ckpt_), other = root_ / "other";
  fs::create_directories(dir);
  fs::create_directories(other);
  for (int r = 0; r < 2; ++r) {
    std::vector<float> v(4);
    for (int i = 0; i < 4; ++i) v[size_t(i)] = float(r * 4 + i);
    write_optimizer_shard(dir.string(), r, 2, r * 4, r * 4 + 4, {{"exp_avg", Tensor::from_vector(v, {4})}});
    write_optimizer_shard(other.string(), r, 2, r * 4, r * 4 + 4, {{"exp_avg", Tensor::from_vector(v, {4})}});
  }
  write_optimizer_index(dir.string(), 2, 8, layout, {{0, 4}, {4, 8}}, {"exp_avg"});
  EXPECT_EQ(read_optimizer_flat(dir.string(), layout, 0, 8).at("exp_avg").to_vector(),
            (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
  const fs::path index = dir / "optimizer.index.json";
  std::string text;
  {
    std::ifstream f(index);
    text.assign(std::istreambuf_iterator<char>(f), {});
  }
  const nlohmann::json orig = nlohmann::json::parse(text);
  auto expect_error = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& needle) {
    nlohmann::json j = orig;
    edit(j);
    std::ofstream(index) << j.dump(1);
    try {
      (void)read_optimizer_flat(dir.string(), layout, 0, 8);
      ADD_FAILURE() << "no error; wanted one containing: " << needle;
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const std::string shard0 = orig["shards"][0]["file"].get<std::string>();
  expect_error([&](nlohmann::json& j) { j["shards"][0]["file"] = "../../other/" + shard0; },
               "is not a file of the checkpoint folder");
  expect_error([&](nlohmann::json& j) { j["shards"][0]["file"] = (other / shard0).string(); },
               "is not a file of the checkpoint folder");
  expect_error([](nlohmann::json& j) { j["shards"][0]["lo"] = -1e300; },
               "a shard's \"lo\" = -1e+300 is not a whole number");
  expect_error([](nlohmann::json& j) { j["shards"][0]["hi"] = 1e300; },
               "a shard's \"hi\" = 1e+300 is not a whole number");
  expect_error(
      [](nlohmann::json& j) {
        j["shards"][0]["lo"] = 4;
        j["shards"][0]["hi"] = 0;
      },
      "a reversed range");
}

}  // namespace

// checksums.json: a byte flipped in any file of a checkpoint, a file cut short or removed, is an
// error naming that file when the checkpoint is opened; an untouched copy opens.
TEST_F(CheckpointDir, AChangedByteInAnyFileIsAnErrorNamingTheFile) {
  Tiny t;
  t.step();
  t.save(ckpt_, 1);
  const fs::path sums = fs::path(ckpt_) / ckpt::kChecksumFile;
  ASSERT_TRUE(fs::exists(sums));
  std::ifstream in(sums);
  const auto listed = nlohmann::json::parse(in)["files"];
  std::vector<std::string> files;
  for (auto& [rel, v] : listed.items()) files.push_back(rel);
  EXPECT_EQ(files,
            (std::vector<std::string>{"model.safetensors", "optimizer.safetensors", "recipe.toml", "state.json"}));
  int copies = 0;
  auto copy = [&]() {
    const fs::path c = root_ / ("copy" + std::to_string(copies++));
    fs::copy(ckpt_, c, fs::copy_options::recursive);
    return c;
  };
  auto expect_error = [&](const fs::path& dir, const std::string& file, const std::string& what) {
    try {
      open_checkpoint(dir.string());
      ADD_FAILURE() << "no error for " << file << " (" << what << ")";
    } catch (const CheckpointError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(file), std::string::npos) << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
    }
  };
  EXPECT_NO_THROW(open_checkpoint(copy().string()));
  for (const std::string& f : files) {
    const fs::path c = copy();
    {
      std::fstream io(c / f, std::ios::binary | std::ios::in | std::ios::out);
      const auto size = int64_t(fs::file_size(c / f));
      io.seekg(size / 2);
      char b = 0;
      io.read(&b, 1);
      b = char(b ^ 0x10);
      io.seekp(size / 2);
      io.write(&b, 1);
    }
    expect_error(c, f, "does not match its checksum");
  }
  const fs::path cut = copy();
  fs::resize_file(cut / "model.safetensors", fs::file_size(cut / "model.safetensors") - 1);
  expect_error(cut, "model.safetensors", "the file was cut or changed");
  const fs::path gone = copy();
  fs::remove(gone / "optimizer.safetensors");
  expect_error(gone, "optimizer.safetensors", "is missing");
  const fs::path bad = copy();
  std::ofstream(bad / ckpt::kChecksumFile) << "{not json";
  expect_error(bad, ckpt::kChecksumFile, "is corrupted");
  // a checkpoint from before checksums opens unverified
  const fs::path old = copy();
  fs::remove(old / ckpt::kChecksumFile);
  EXPECT_NO_THROW(open_checkpoint(old.string()));
}
