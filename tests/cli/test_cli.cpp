// End-to-end tests of the `brigade` binary on a tiny corpus and model: bitwise
// determinism, exact resume, generation, and one clear error line (non-zero exit,
// no crash, no hang) for each kind of bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

namespace fs = std::filesystem;

namespace {

const std::string kBin = std::string(BRIGADE_BINARY_DIR) + "/bin/brigade";

struct CmdResult {
  int code = -1;
  std::string out, err;
};

// Runs `args` through the shell with a time limit; captures stdout and stderr.
CmdResult brigade(const std::string& args, const fs::path& cwd) {
  const fs::path out = cwd / "stdout.txt", err = cwd / "stderr.txt";
  const std::string cmd = "cd '" + cwd.string() + "' && timeout 300 " + kBin + " " + args + " >'" + out.string() +
                          "' 2>'" + err.string() + "'";
  int st = std::system(cmd.c_str());
  CmdResult r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  auto slurp = [](const fs::path& p) {
    std::ifstream f(p);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

// A small corpus with enough structure to learn from, written deterministically.
void write_corpus(const fs::path& p) {
  const char* subj[] = {"the king", "a shepherd", "the people", "my servant", "the prophet", "his son"};
  const char* verb[] = {"went up to", "spake unto", "came down from", "looked upon", "dwelt in", "built"};
  const char* obj[] = {"the city", "the mountain", "the temple", "the river", "the house of bread", "the land"};
  std::ofstream f(p);
  uint32_t s = 12345;
  for (int i = 0; i < 3000; ++i) {
    auto pick = [&](int n) {
      s = s * 1664525u + 1013904223u;
      return int((s >> 16) % uint32_t(n));
    };
    f << "And " << subj[pick(6)] << " " << verb[pick(6)] << " " << obj[pick(6)] << ", and it was good.\n";
  }
}

const char* kRecipe = R"(
[run]
name = "tiny"
out_dir = "run"
seed = 7
threads = 2
[model]
vocab_size = 128
block_size = 32
n_layer = 2
n_head = 2
n_embd = 32
[data]
corpus = "corpus.txt"
dir = "data"
val_fraction = 0.1
[train]
steps = 16
batch_size = 4
seq_len = 32
eval_every = 8
eval_batches = 2
log_every = 1
checkpoint_every = 0
[optim]
lr = 3e-3
[schedule]
warmup_steps = 4
min_lr = 3e-4
[sample]
prompt = "And the king"
tokens = 12
)";

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("brigade_cli_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
            std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    write_corpus(dir_ / "corpus.txt");
    write("tiny.toml", kRecipe);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream f(dir_ / name);
    f << text;
  }
  // Loss of every step, as printed in metrics.jsonl (full float precision).
  std::vector<std::string> losses(const std::string& run_dir) {
    std::ifstream f(dir_ / run_dir / "metrics.jsonl");
    std::vector<std::string> out;
    std::regex re("\"loss\":([-0-9.eE+]+)");
    std::smatch m;
    for (std::string line; std::getline(f, line);)
      if (std::regex_search(line, m, re)) out.push_back(m[1]);
    return out;
  }
  // Asserts a failed run that printed exactly one "brigade: error:" line containing `needle`.
  void expect_clean_error(const CmdResult& r, const std::string& needle) {
    EXPECT_EQ(r.code, 1) << r.err;
    std::istringstream s(r.err);
    std::string line, last;
    int error_lines = 0;
    for (; std::getline(s, line);)
      if (line.rfind("brigade: error:", 0) == 0) {
        ++error_lines;
        last = line;
      }
    EXPECT_EQ(error_lines, 1) << r.err;
    EXPECT_NE(last.find(needle), std::string::npos) << "error line: " << last;
    EXPECT_EQ(r.err.find("terminate called"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  }
  fs::path dir_;
};

TEST_F(Cli, SameSeedSameThreadsGivesBitwiseIdenticalLossCurve) {
  CmdResult a = brigade("train tiny.toml --quiet --no-sample --set run.out_dir=a", dir_);
  ASSERT_EQ(a.code, 0) << a.err;
  CmdResult b = brigade("train tiny.toml --quiet --no-sample --set run.out_dir=b", dir_);
  ASSERT_EQ(b.code, 0) << b.err;
  std::vector<std::string> la = losses("a"), lb = losses("b");
  ASSERT_EQ(la.size(), 16u);
  EXPECT_EQ(la, lb);
  // and it learns: the last loss is well below the first
  EXPECT_LT(std::stod(la.back()), std::stod(la.front()) - 0.5);
}

TEST_F(Cli, StopAndResumeGivesBitwiseIdenticalLosses) {
  // with dropout on, so the dropout generator's state must travel in the checkpoint too
  const std::string train = "train tiny.toml --quiet --no-sample --set model.dropout=0.1";
  CmdResult full = brigade(train + " --set run.out_dir=full", dir_);
  ASSERT_EQ(full.code, 0) << full.err;
  CmdResult first = brigade(train + " --set run.out_dir=split --stop-at 8", dir_);
  ASSERT_EQ(first.code, 0) << first.err;
  EXPECT_EQ(losses("split").size(), 8u);
  CmdResult second = brigade(train + " --set run.out_dir=split --resume", dir_);
  ASSERT_EQ(second.code, 0) << second.err;
  EXPECT_EQ(losses("full"), losses("split"));
  // the checkpoints at the end are identical too
  auto slurp = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  EXPECT_EQ(slurp(dir_ / "full/checkpoint/model.safetensors"), slurp(dir_ / "split/checkpoint/model.safetensors"));
  EXPECT_EQ(slurp(dir_ / "full/checkpoint/optimizer.safetensors"),
            slurp(dir_ / "split/checkpoint/optimizer.safetensors"));
}

TEST_F(Cli, ResumeRecoversFromACrashBetweenCheckpointRenames) {
  ASSERT_EQ(brigade("train tiny.toml --quiet --no-sample --stop-at 8", dir_).code, 0);
  // the state a crash between "checkpoint -> checkpoint.old" and "tmp -> checkpoint" leaves
  fs::rename(dir_ / "run/checkpoint", dir_ / "run/checkpoint.old");
  fs::create_directories(dir_ / "run/checkpoint.tmp");
  CmdResult r = brigade("train tiny.toml --quiet --no-sample --resume", dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(losses("run").size(), 16u);
  EXPECT_FALSE(fs::exists(dir_ / "run/checkpoint.old"));
  EXPECT_FALSE(fs::exists(dir_ / "run/checkpoint.tmp"));
  ASSERT_EQ(brigade("train tiny.toml --quiet --no-sample --set run.out_dir=straight", dir_).code, 0);
  EXPECT_EQ(losses("run"), losses("straight"));
}

TEST_F(Cli, NothingToResumeAndBadStopAtAreClearErrors) {
  ASSERT_EQ(brigade("train tiny.toml --quiet --no-sample", dir_).code, 0);
  expect_clean_error(brigade("train tiny.toml --quiet --no-sample --resume", dir_), "nothing to train");
  expect_clean_error(brigade("train tiny.toml --quiet --no-sample --stop-at 0", dir_), "--stop-at");
  CmdResult w = brigade("train tiny.toml --no-sample --resume --set train.steps=18 --set optim.lr=0.01", dir_);
  EXPECT_EQ(w.code, 0) << w.err;
  EXPECT_NE(w.err.find("warning: resuming with settings that differ"), std::string::npos) << w.err;
  EXPECT_NE(w.err.find("optim.lr"), std::string::npos) << w.err;
}

TEST_F(Cli, InterruptCheckpointsAndResumesExactly) {
  // A long run, stopped with SIGINT once a few steps are logged.
  const std::string long_run = "train tiny.toml --quiet --no-sample --set train.steps=100000 --set train.eval_every=0";
  const std::string script = "cd '" + dir_.string() + "' && (" + kBin + " " + long_run +
                             " --set run.out_dir=intr >/dev/null 2>intr.err & pid=$!; "
                             "for i in $(seq 600); do [ -f intr/metrics.jsonl ] && "
                             "[ $(wc -l < intr/metrics.jsonl) -ge 5 ] && break; sleep 0.1; done; "
                             "kill -INT $pid; wait $pid; echo $? > intr.code)";
  ASSERT_EQ(std::system(script.c_str()), 0);
  std::ifstream code(dir_ / "intr.code");
  int rc = -1;
  code >> rc;
  EXPECT_EQ(rc, 130);
  const size_t done = losses("intr").size();
  ASSERT_GE(done, 5u);
  std::ifstream st(dir_ / "intr/checkpoint/state.json");
  std::string state((std::istreambuf_iterator<char>(st)), {});
  EXPECT_NE(state.find("\"step\": " + std::to_string(done)), std::string::npos) << state;
  // resume for 3 more steps == an uninterrupted run of done + 3 steps (same schedule)
  const std::string until = " --stop-at " + std::to_string(done + 3);
  ASSERT_EQ(brigade(long_run + " --set run.out_dir=intr --resume" + until, dir_).code, 0);
  ASSERT_EQ(brigade(long_run + " --set run.out_dir=straight" + until, dir_).code, 0);
  EXPECT_EQ(losses("intr"), losses("straight"));
  EXPECT_EQ(losses("straight").size(), done + 3);
}

TEST_F(Cli, TrainPrintsValLossAndSampleThenGenerateContinuesPrompt) {
  CmdResult r = brigade("train tiny.toml --quiet", dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("final val loss:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("And the king"), std::string::npos) << r.out;
  CmdResult g1 = brigade("generate --ckpt run/checkpoint --prompt 'And the people' --tokens 10 --seed 3", dir_);
  ASSERT_EQ(g1.code, 0) << g1.err;
  EXPECT_EQ(g1.out.rfind("And the people", 0), 0u) << g1.out;
  CmdResult g2 = brigade("generate --ckpt run/checkpoint --prompt 'And the people' --tokens 10 --seed 3", dir_);
  EXPECT_EQ(g1.out, g2.out);
}

TEST_F(Cli, UnknownRecipeKeyIsNamed) {
  write("bad.toml", std::string(kRecipe) + "\n[extra]\nfoo = 1\n");
  expect_clean_error(brigade("train bad.toml --quiet", dir_), "extra");
  CmdResult r = brigade("train tiny.toml --quiet --set train.stepz=3", dir_);
  expect_clean_error(r, "train.stepz");
}

TEST_F(Cli, MistypedRecipeValueIsNamed) {
  CmdResult r = brigade("train tiny.toml --quiet --set 'train.steps=\"many\"'", dir_);
  expect_clean_error(r, "train.steps");
  std::string text = std::regex_replace(std::string(kRecipe), std::regex("n_layer = 2"), "n_layer = \"two\"");
  write("typo.toml", text);
  CmdResult r2 = brigade("train typo.toml --quiet", dir_);
  expect_clean_error(r2, "model.n_layer");
  EXPECT_NE(r2.err.find("typo.toml"), std::string::npos) << r2.err;
}

TEST_F(Cli, MissingRecipeAndCorpusAreClearErrors) {
  expect_clean_error(brigade("train nope.toml --quiet", dir_), "nope.toml");
  expect_clean_error(brigade("train tiny.toml --quiet --set data.corpus=missing.txt --set data.dir=d2", dir_),
                     "missing.txt");
}

TEST_F(Cli, TruncatedTokenFileIsAClearError) {
  ASSERT_EQ(brigade("prepare tiny.toml", dir_).code, 0);
  const fs::path bin = dir_ / "data/train.bin";
  fs::resize_file(bin, fs::file_size(bin) / 2 + 1);
  expect_clean_error(brigade("train tiny.toml --quiet", dir_), "train.bin");
}

TEST_F(Cli, TruncatedOrCorruptedCheckpointIsAClearError) {
  ASSERT_EQ(brigade("train tiny.toml --quiet --no-sample", dir_).code, 0);
  const fs::path st = dir_ / "run/checkpoint/model.safetensors";
  const std::string gen = "generate --ckpt run/checkpoint --prompt 'And' --tokens 4";
  ASSERT_EQ(brigade(gen, dir_).code, 0);
  // corrupt the JSON header
  {
    std::fstream f(st, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(9);
    f.write("\x01\x02\x03", 3);
  }
  expect_clean_error(brigade(gen, dir_), "model.safetensors");
  // truncate the tensor data
  ASSERT_EQ(brigade("train tiny.toml --quiet --no-sample", dir_).code, 0);
  fs::resize_file(st, fs::file_size(st) - 100);
  expect_clean_error(brigade(gen, dir_), "model.safetensors");
  expect_clean_error(brigade("train tiny.toml --quiet --no-sample --resume", dir_), "model.safetensors");
  // not a checkpoint at all
  expect_clean_error(brigade("generate --ckpt data --prompt And", dir_), "data");
}

TEST_F(Cli, PromptWithUnknownCharactersIsAClearError) {
  ASSERT_EQ(brigade("train tiny.toml --quiet --no-sample", dir_).code, 0);
  CmdResult r = brigade("generate --ckpt run/checkpoint --prompt 'And the king ☃ é'", dir_);
  expect_clean_error(r, "U+2603");
}

}  // namespace
