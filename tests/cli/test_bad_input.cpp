// Bad input, end to end through the `brigade` binary: every row of docs/reliability.md's "Bad
// input" table is a case here (and every case a row: BadInputDoc.EveryRowHasACaseAndEveryCaseARow).
// Each case sets up a fresh folder (a tiny GPT recipe and corpus, and whichever prepared pieces it
// names: a prepared data folder, a trained checkpoint, an exported Hugging Face folder, ...),
// damages one thing, runs one command under `timeout 60`, and requires
//   - an exit status in 1..127 that is not 124 (the time limit: a hang);
//   - exactly one stderr line starting with "brigade: error:", containing every phrase of the case
//     (what is wrong, where: the file, key or flag, and what to do where the message offers it);
//   - every other stderr line one of the normal progress lines (kProgressPrefixes);
//   - nothing on stdout (no result, no "done", no checkpoint written).
// Bad inputs that do not give such an error yet are kFindings, run only as DISABLED_ tests, and are
// not in the doc's table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "support/recipes.h"

namespace fs = std::filesystem;
using brigade::test_support::CmdResult;
using brigade::test_support::slurp;

namespace {

// The tiny GPT, 4 steps of 4 rows, a checkpoint every 2 steps, a 4-token sample.
const std::string kTiny =
    brigade::test_support::tiny_gpt_recipe({"train.steps=4", "train.batch_size=4", "train.checkpoint_every=2",
                                            "sample.prompt=\"And the king\"", "sample.tokens=4"});

// A tiny ViT on Fashion-MNIST in the folder `fashion` (which no case provides intact).
const char* kVit = R"([run]
name = "vit"
out_dir = "run"
seed = 5
threads = 1
[model]
type = "vit"
patch_size = 7
n_layer = 2
n_head = 2
n_embd = 32
intermediate_size = 64
[data]
corpus = "fashion-mnist"
dir = "fashion"
[train]
steps = 2
batch_size = 8
eval_every = 0
eval_batches = 1
log_every = 1
[optim]
lr = 3e-3
[schedule]
warmup_steps = 1
)";

// Fine-tuning from the Hugging Face folder `hf` (kTiny's checkpoint, exported), 2 steps.
const char* kInit = R"([run]
name = "ft"
out_dir = "ft"
seed = 7
threads = 1
[model]
init_from = "hf"
[data]
corpus = "corpus.txt"
dir = "ftdata"
val_fraction = 0.1
[train]
steps = 2
batch_size = 4
seq_len = 32
eval_every = 0
eval_batches = 1
log_every = 1
[optim]
lr = 3e-3
[schedule]
warmup_steps = 1
)";

// stderr lines a failing command may print besides its error line: data preparation, the model
// line, fine-tuning's init line and training progress (none of the cases gets that far, but a
// message after them would still be the one error line).
const char* const kProgressPrefixes[] = {"prepare: ", "model: ", "finetune: init from ", "step "};

// ---------------------------------------------------------------- set-up helpers (paths relative to the case folder)

void put(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path().empty() ? fs::path(".") : p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}
// XOR one byte with 0x01: at `offset` from the start, or from the end when negative.
void flip(const fs::path& p, int64_t offset) {
  std::string b = slurp(p);
  ASSERT_FALSE(b.empty()) << p;
  const size_t at = offset >= 0 ? size_t(offset) : b.size() - size_t(-offset);
  ASSERT_LT(at, b.size()) << p;
  b[at] = char(b[at] ^ 0x01);
  put(p, b);
}
void cut(const fs::path& p, uintmax_t bytes) { fs::resize_file(p, bytes); }
// Replaces the first `from` in the file by `to` (which must be there).
void replace(const fs::path& p, const std::string& from, const std::string& to) {
  std::string t = slurp(p);
  const size_t at = t.find(from);
  ASSERT_NE(at, std::string::npos) << from << " not in " << p;
  put(p, t.replace(at, from.size(), to));
}
std::string be32(uint32_t v) { return {char(v >> 24), char(v >> 16), char(v >> 8), char(v)}; }
// The four Fashion-MNIST IDX files (plain, under their .gz names) of n train / n test images with
// `image_bytes` pixel bytes in each images file and `labels` labels in the train labels file.
void write_idx(const fs::path& dir, uint32_t n, size_t image_bytes, uint32_t labels) {
  for (const char* split : {"train", "t10k"}) {
    const uint32_t nl = std::string(split) == "train" ? labels : n;
    put(dir / (std::string(split) + "-images-idx3-ubyte.gz"),
        be32(0x803) + be32(n) + be32(28) + be32(28) + std::string(image_bytes, '\0'));
    put(dir / (std::string(split) + "-labels-idx1-ubyte.gz"), be32(0x801) + be32(nl) + std::string(nl, '\0'));
  }
}
std::string sft_lines(int n) {
  std::string s;
  for (int i = 0; i < n; ++i)
    s += R"({"prompt": "And the king", "completion": " went up to the city"})"
         "\n";
  return s;
}

// ---------------------------------------------------------------- the table

struct Case {
  std::string id;                    // the doc table's id (kebab-case)
  std::vector<std::string> copy;     // prepared pieces: "data" (prepared in the folder), "run", "hf", "d256" (copied)
  std::function<void()> setup;       // run in the case folder (the current directory)
  std::string args;                  // the brigade command line
  std::vector<std::string> phrases;  // each must be in the error line
};

// gtest prints a case by its id.
void PrintTo(const Case& c, std::ostream* os) { *os << c.id; }

// Pieces prepared once per process (Template()): run/ (kTiny trained, a
// checkpoint at step 4), hf/ (that checkpoint exported), d256/ (the corpus prepared for vocab 256).
const std::vector<Case>& cases() {
  static const std::vector<Case> c{
      // ---------------------------------------------------------------- recipe
      {"recipe-missing-file", {}, [] {}, "train nope.toml", {"recipe file 'nope.toml' not found", "check the path"}},
      {"recipe-is-a-directory",
       {},
       [] { fs::create_directories("dd"); },
       "train dd",
       {"recipe 'dd' is not a file", "pass a .toml recipe file"}},
      {"recipe-toml-syntax",
       {},
       [] { put("bad.toml", "[run\nname = \"x\"\n"); },
       "train bad.toml",
       {"recipe bad.toml:1:", "invalid TOML", "fix the syntax"}},
      {"recipe-unknown-key",
       {},
       [] { replace("tiny.toml", "lr = 3e-3\n", "lr = 3e-3\nlrr = 1\n"); },
       "train tiny.toml --no-sample",
       {"recipe tiny.toml:", "unknown key 'optim.lrr'", "did you mean 'optim.lr'?", "docs/recipes.md"}},
      {"recipe-unknown-section",
       {},
       [] { put("tiny.toml", kTiny + "[extra]\nfoo = 1\n"); },
       "train tiny.toml --no-sample",
       {"recipe tiny.toml:", "unknown section '[extra]'", "sections are [run]"}},
      {"recipe-wrong-type",
       {},
       [] { replace("tiny.toml", "n_layer = 2", "n_layer = \"two\""); },
       "train tiny.toml --no-sample",
       {"recipe tiny.toml:9:", "'model.n_layer' must be an integer, got a string", "fix the value"}},
      {"set-malformed",
       {},
       [] {},
       "train tiny.toml --no-sample --set train.steps",
       {"override 'train.steps' must look like section.key=value", "e.g. train.steps=500"}},
      {"set-unknown-key",
       {},
       [] {},
       "train tiny.toml --no-sample --set train.stepz=3",
       {"override 'train.stepz=3'", "unknown key 'train.stepz'", "did you mean 'train.steps'?"}},
      {"set-wrong-type",
       {},
       [] {},
       "train tiny.toml --no-sample --set train.steps=many",
       {"override 'train.steps=many'", "'train.steps' must be an integer", "fix the value"}},
      {"recipe-negative-lr",
       {},
       [] {},
       "train tiny.toml --no-sample --set optim.lr=-1",
       {"recipe tiny.toml", "optim.lr = -1 must be > 0", "use e.g. 1e-3"}},
      {"recipe-nan",
       {},
       [] { replace("tiny.toml", "lr = 3e-3", "lr = nan"); },
       "train tiny.toml --no-sample",
       {"recipe tiny.toml", "optim.lr = nan must be a finite number", "set a real value"}},
      {"recipe-seq-len-over-block",
       {},
       [] {},
       "train tiny.toml --no-sample --set train.seq_len=64",
       {"train.seq_len = 64 exceeds model.block_size = 32", "lower train.seq_len or raise model.block_size"}},
      {"recipe-early-stop-without-eval",
       {},
       [] {},
       "train tiny.toml --no-sample --set train.early_stop=true --set train.eval_every=0",
       {"train.early_stop = true needs periodic evaluations", "set train.eval_every"}},
      {"recipe-dp-not-process-count",
       {},
       [] {},
       "train tiny.toml --no-sample --set parallel.dp=2",
       {"tiny.toml", "parallel.dp = 2 but this job has 1 process", "mpirun -np 2", "set parallel.dp = 1"}},
      // ---------------------------------------------------------------- checkpoint
      {"ckpt-resume-without-checkpoint",
       {},
       [] {},
       "train tiny.toml --no-sample --resume",
       {"--resume: no checkpoint in run/checkpoint", "run without --resume"}},
      {"ckpt-flipped-model",
       {"data", "run"},
       [] { flip("run/checkpoint/model.safetensors", -10); },
       "train tiny.toml --no-sample --resume --set train.steps=8",
       {"run/checkpoint: model.safetensors does not match its checksum", "resume from another checkpoint"}},
      {"ckpt-flipped-optimizer",
       {"data", "run"},
       [] { flip("run/checkpoint/optimizer.safetensors", -10); },
       "train tiny.toml --no-sample --resume --set train.steps=8",
       {"run/checkpoint: optimizer.safetensors does not match its checksum", "resume from another checkpoint"}},
      {"ckpt-flipped-state",
       {"data", "run"},
       [] { flip("run/checkpoint/state.json", 5); },
       "train tiny.toml --no-sample --resume --set train.steps=8",
       {"run/checkpoint: state.json does not match its checksum", "resume from another checkpoint"}},
      {"ckpt-flipped-recipe",
       {"data", "run"},
       [] { flip("run/checkpoint/recipe.toml", 5); },
       "train tiny.toml --no-sample --resume --set train.steps=8",
       {"run/checkpoint: recipe.toml does not match its checksum", "resume from another checkpoint"}},
      {"ckpt-flipped-tokenizer",
       {"data", "run"},
       [] { flip("run/checkpoint/tokenizer.model", 20); },
       "generate --ckpt run/checkpoint --prompt And",
       {"run/checkpoint: tokenizer.model does not match its checksum"}},
      {"ckpt-corrupt-checksums",
       {"data", "run"},
       [] { put("run/checkpoint/checksums.json", "{\n"); },
       "eval --ckpt run/checkpoint",
       {"run/checkpoint/checksums.json is corrupted", "delete checksums.json to read it unverified"}},
      {"ckpt-cut-state",
       {"data", "run"},
       [] { cut("run/checkpoint/state.json", 10); },
       "train tiny.toml --no-sample --resume --set train.steps=8",
       {"run/checkpoint: state.json has 10 bytes", "when it was saved", "resume from another checkpoint"}},
      {"ckpt-state-not-json",
       {"data", "run"},
       [] {
         put("run/checkpoint/state.json", "not json");
         fs::remove("run/checkpoint/checksums.json");  // read unverified, as a checkpoint from before checksums
       },
       "train tiny.toml --no-sample --resume --set train.steps=8",
       {"run/checkpoint/state.json is corrupted", "resume from another checkpoint or start without --resume"}},
      // (before the fix: "no checkpoint", and --resume-if-any started over, overwriting it)
      {"ckpt-missing-state",
       {"data", "run"},
       [] { fs::remove("run/checkpoint/state.json"); },
       "train tiny.toml --no-sample --resume --set train.steps=8",
       {"run/checkpoint", "state.json is missing", "resume from another"}},
      {"ckpt-missing-state-resume-if-any",
       {"data", "run"},
       [] { fs::remove("run/checkpoint/state.json"); },
       "train tiny.toml --no-sample --resume-if-any --set train.steps=8",
       {"run/checkpoint", "state.json is missing", "resume from another"}},
      {"ckpt-state-wrong-type",
       {"data", "run"},
       [] {
         replace("run/checkpoint/state.json", "\"step\": 4", "\"step\": \"four\"");
         fs::remove("run/checkpoint/checksums.json");
       },
       "train tiny.toml --no-sample --resume --set train.steps=8",
       {"state.json", "\"step\"", "resume from another"}},
      {"ckpt-state-missing-field",
       {"data", "run"},
       [] {
         replace("run/checkpoint/state.json", "\"step\": 4", "\"stepx\": 4");
         fs::remove("run/checkpoint/checksums.json");
       },
       "train tiny.toml --no-sample --resume --set train.steps=8",
       {"state.json", "step", "resume from another"}},
      {"ckpt-missing-file",
       {"data", "run"},
       [] { fs::remove("run/checkpoint/optimizer.safetensors"); },
       "train tiny.toml --no-sample --resume --set train.steps=8",
       {"run/checkpoint: optimizer.safetensors is missing (checksums.json lists it)", "resume from another one"}},
      {"ckpt-other-model",
       {"data", "run"},
       [] {},
       "train tiny.toml --no-sample --resume --set model.n_embd=64",
       {"the checkpoint in run/checkpoint holds a different model", "start a new run.out_dir"}},
      {"ckpt-resume-past-steps",
       {"data", "run"},
       [] {},
       "train tiny.toml --no-sample --resume",
       {"nothing to train", "run/checkpoint is at step 4 and this run ends at step 4", "raise train.steps"}},
      // ---------------------------------------------------------------- data
      {"data-missing-corpus",
       {},
       [] {},
       "train tiny.toml --no-sample --set data.corpus=missing.txt",
       {"corpus 'missing.txt' does not exist", "set data.corpus"}},
      {"data-empty-corpus",
       {},
       [] { put("corpus.txt", ""); },
       "train tiny.toml --no-sample",
       {"corpus 'corpus.txt' is empty", "point data.corpus at a non-empty text file or folder"}},
      {"data-cut-token-file",
       {"data"},
       [] { cut("data/train.bin", 1001); },
       "train tiny.toml --no-sample",
       {"token file 'data/train.bin' is 1001 bytes", "truncated or corrupt", "re-run `brigade prepare`"}},
      {"data-token-file-other-vocab",
       {"run", "d256"},
       [] {},
       "eval --ckpt run/checkpoint --data d256/val.bin",
       {"--data d256/val.bin: a token file of vocabulary 256, the model's is 128",
        "use a file prepared with the checkpoint's tokenizer"}},
      {"images-missing-folder",
       {},
       [] { put("vit.toml", kVit); },
       "train vit.toml",
       {"fashion/train-images-idx3-ubyte.gz: cannot open the IDX file", "dataset-fashion-mnist"}},
      {"images-corrupt-file",
       {},
       [] {
         put("vit.toml", kVit);
         write_idx("fashion", 10, 7840, 10);
         put("fashion/train-images-idx3-ubyte.gz", "garbage");
       },
       "train vit.toml",
       {"fashion/train-images-idx3-ubyte.gz: bad IDX magic", "not the IDX file expected here"}},
      {"images-truncated-file",
       {},
       [] {
         put("vit.toml", kVit);
         write_idx("fashion", 10, 100, 10);
       },
       "train vit.toml",
       {"fashion/train-images-idx3-ubyte.gz: truncated", "re-download the file"}},
      {"sft-malformed-line",
       {"hf"},
       [] {
         put("init.toml", kInit);
         put("sft.jsonl", sft_lines(5) + "{\"prompt\": oops\n");
       },
       "train init.toml --no-sample --set data.format=jsonl --set data.corpus=sft.jsonl",
       {"sft.jsonl:6: not a JSON object", "each line is one sample"}},
      {"sft-without-tokenizer",
       {},
       [] {},
       "train tiny.toml --no-sample --set data.format=jsonl --set data.corpus=corpus.txt",
       {"data.format = \"jsonl\" encodes with an existing tokenizer", "set model.init_from"}},
      // ---------------------------------------------------------------- tokenizer and model.init_from
      {"tok-corrupt-prepared",
       {"data"},
       [] { put("data/tokenizer.model", "garbage"); },
       "train tiny.toml --no-sample",
       {"tokenizer 'data/tokenizer.model' is not a valid SentencePiece model", "run `brigade prepare`"}},
      {"init-from-no-config",
       {"hf"},
       [] {
         put("init.toml", kInit);
         fs::remove("hf/config.json");
       },
       "train init.toml --no-sample",
       {"model.init_from = \"hf\" holds neither config.json", "point it at one of those"}},
      {"init-from-config-not-json",
       {"hf"},
       [] {
         put("init.toml", kInit);
         put("hf/config.json", "{oops");
       },
       "train init.toml --no-sample",
       {"hf/config.json: not a JSON object"}},
      {"init-from-shape-conflict",
       {"hf"},
       [] {
         put("init.toml", kInit);
         replace("init.toml", "init_from = \"hf\"\n", "init_from = \"hf\"\nn_embd = 64\n");
       },
       "train init.toml --no-sample",
       {"model.n_embd = 64, but model.init_from = \"hf\" holds a model with model.n_embd = 32",
        "remove model.n_embd from the recipe"}},
      // ---------------------------------------------------------------- command line
      {"recipe-empty-file",
       {},
       [] { put("empty.toml", ""); },
       "train empty.toml --no-sample",
       {"empty.toml", "is empty", "recipes/gpt-kjv.toml"}},
      {"recipe-sample-prompt-unknown-characters",
       {},
       [] {},
       "train tiny.toml --set sample.prompt=Zebra",
       {"sample.prompt", "U+005A", "use only characters from the training corpus"}},
      {"cli-unknown-command", {}, [] {}, "trian tiny.toml", {"unknown command 'trian'", "train", "brigade --help"}},
      {"cli-unknown-flag",
       {},
       [] {},
       "train tiny.toml --no-sample --resum",
       {"not expected: --resum", "see `brigade train --help`"}},
      {"cli-stop-at-zero", {}, [] {}, "train tiny.toml --no-sample --stop-at 0", {"--stop-at 0: must be a step >= 1"}},
      {"cli-resume-and-resume-if-any",
       {},
       [] {},
       "train tiny.toml --no-sample --resume --resume-if-any",
       {"--resume-if-any and --resume: give one of them"}},
      {"cli-json-without-dry-run",
       {},
       [] {},
       "train tiny.toml --no-sample --json",
       {"--json goes with --dry-run", "remove it"}},
  };
  return c;
}

// Bad inputs that do not give a clear one-line error yet (the report lists each with its
// reproduction). Their phrases say what the error should hold once fixed. Not in the doc table.
const std::vector<Case>& findings() {
  static const std::vector<Case> c{
      // model.init_from's corrupt tokenizer.model: "delete it and run `brigade prepare`" (wrong for a
      // model folder; prepare cannot rebuild a pretrained model's tokenizer)
      {"init-from-corrupt-tokenizer",
       {"hf"},
       [] {
         put("init.toml", kInit);
         put("hf/tokenizer.model", "garbage");
       },
       "train init.toml --no-sample",
       {"hf/tokenizer.model", "model.init_from"}},
      // model.init_from without its tokenizer.model: "run `brigade prepare` (or check data.dir)"
      {"init-from-missing-tokenizer",
       {"hf"},
       [] {
         put("init.toml", kInit);
         fs::remove("hf/tokenizer.model");
       },
       "train init.toml --no-sample",
       {"hf/tokenizer.model", "model.init_from"}},
  };
  return c;
}

// ---------------------------------------------------------------- the test

std::string test_name(const ::testing::TestParamInfo<Case>& info) {
  std::string n = info.param.id;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

class BadInput : public ::testing::TestWithParam<Case> {
 public:
  // The prepared pieces, made once per process: data/, run/, hf/, d256/.
  static const fs::path& Template() {
    static const fs::path dir = [] {
      const fs::path d = fs::temp_directory_path() / ("brigade_bad_input_template_" + std::to_string(::getpid()));
      fs::remove_all(d);
      fs::create_directories(d);
      brigade::test_support::write_tiny_run(d, kTiny);
      for (const std::string cmd :
           {"prepare tiny.toml", "train tiny.toml --no-sample --quiet", "export --ckpt run/checkpoint --out hf",
            "prepare tiny.toml --set model.vocab_size=256 --set data.dir=d256"}) {
        const CmdResult r = run(d, cmd);
        if (r.code != 0) {
          ADD_FAILURE() << "setting up the template: brigade " << cmd << " exited " << r.code << "\n" << r.err;
          break;
        }
      }
      return d;
    }();
    return dir;
  }
  static CmdResult run(const fs::path& dir, const std::string& args) {
    return brigade::test_support::run_brigade(dir, args, 0, "", "OMP_NUM_THREADS=1", /*limit_s=*/60);
  }
};

TEST_P(BadInput, OneClearErrorLine) {
  const Case& c = GetParam();
  const fs::path dir = brigade::test_support::fresh_test_dir("brigade_bad_input");
  fs::copy_file(Template() / "corpus.txt", dir / "corpus.txt");
  fs::copy_file(Template() / "tiny.toml", dir / "tiny.toml");
  for (const std::string& piece : c.copy) {
    if (piece == "data") {  // prepared here: a copied data folder records another corpus path, so is prepared again
      const CmdResult p = run(dir, "prepare tiny.toml");
      ASSERT_EQ(p.code, 0) << p.err;
      continue;
    }
    ASSERT_TRUE(fs::exists(Template() / piece)) << piece;
    fs::copy(Template() / piece, dir / piece, fs::copy_options::recursive);
  }
  {
    const fs::path cwd = fs::current_path();
    fs::current_path(dir);
    c.setup();
    fs::current_path(cwd);
    ASSERT_FALSE(HasFailure()) << "set-up of " << c.id;
  }
  const CmdResult r = run(dir, c.args);
  SCOPED_TRACE("brigade " + c.args + "\nexit " + std::to_string(r.code) + "\nstderr:\n" + r.err + "stdout:\n" + r.out);
  EXPECT_NE(r.code, 124) << "hung: ran into the 60-s limit";
  EXPECT_GE(r.code, 1);
  EXPECT_LE(r.code, 127) << "killed by a signal or an exit >= 128";
  std::istringstream lines(r.err);
  std::vector<std::string> errors, others;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("brigade: error:", 0) == 0) {
      errors.push_back(line);
      continue;
    }
    const bool progress = std::any_of(std::begin(kProgressPrefixes), std::end(kProgressPrefixes),
                                      [&](const char* p) { return line.rfind(p, 0) == 0; });
    if (!progress) others.push_back(line);
  }
  ASSERT_EQ(errors.size(), 1u) << "exactly one error line";
  for (const std::string& p : c.phrases) EXPECT_NE(errors[0].find(p), std::string::npos) << "missing: " << p;
  EXPECT_TRUE(others.empty()) << "other stderr line: " << others.front();
  EXPECT_EQ(r.out, "") << "stdout of a failed command";
  if (!HasFailure()) fs::remove_all(dir);
}

// The template goes when the whole program ends (both suites below share it).
class RemoveTemplate : public ::testing::Environment {
 public:
  void TearDown() override {
    fs::remove_all(fs::temp_directory_path() / ("brigade_bad_input_template_" + std::to_string(::getpid())));
  }
};
[[maybe_unused]] ::testing::Environment* const kRemoveTemplate =
    ::testing::AddGlobalTestEnvironment(new RemoveTemplate);

INSTANTIATE_TEST_SUITE_P(Table, BadInput, ::testing::ValuesIn(cases()), test_name);
// Not a clear one-line error yet: --gtest_also_run_disabled_tests runs them.
INSTANTIATE_TEST_SUITE_P(DISABLED_Findings, BadInput, ::testing::ValuesIn(findings()), test_name);

// The ids of docs/reliability.md's "Bad input" table: the first cell of each row of the section.
std::vector<std::string> doc_ids() {
  std::ifstream f(fs::path(BRIGADE_SOURCE_DIR) / "docs" / "reliability.md");
  std::vector<std::string> ids;
  bool in = false;
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("## ", 0) == 0) {
      in = line == "## Bad input";
      continue;
    }
    if (!in || line.rfind("| `", 0) != 0) continue;
    const size_t end = line.find('`', 3);
    if (end != std::string::npos) ids.push_back(line.substr(3, end - 3));
  }
  return ids;
}

TEST(BadInputDoc, EveryRowHasACaseAndEveryCaseARow) {
  const std::vector<std::string> rows = doc_ids();
  ASSERT_FALSE(rows.empty()) << "no rows under \"## Bad input\" in docs/reliability.md";
  const std::set<std::string> doc(rows.begin(), rows.end());
  EXPECT_EQ(doc.size(), rows.size()) << "an id is in the doc table twice";
  std::set<std::string> tested;
  for (const Case& c : cases()) EXPECT_TRUE(tested.insert(c.id).second) << c.id << " is in the case table twice";
  for (const std::string& id : doc) EXPECT_EQ(tested.count(id), 1u) << id << ": a doc row without a case";
  for (const std::string& id : tested) EXPECT_EQ(doc.count(id), 1u) << id << ": a case without a doc row";
  for (const Case& c : findings()) {
    EXPECT_EQ(doc.count(c.id), 0u) << c.id << " is a finding (not a clear error yet), not a doc row";
    EXPECT_EQ(tested.count(c.id), 0u) << c.id << " is both a case and a finding";
  }
}

}  // namespace
