// Fine-tuning through the one trainer (train/finetune.h), for GPT and LLaMA at tiny sizes:
//   - a recipe with model.init_from takes the model's shape from the directory (a Hugging Face
//     config.json or a Brigade checkpoint's recipe.toml); a shape key set against it, an
//     init_from that is no model directory, [lora] keys without finetune.method = "lora", and
//     LoRA under tensor or pipeline parallelism are clear errors;
//   - `brigade export` writes a pretrained run as a Hugging Face directory whose logits are the
//     checkpoint's bitwise; a task built from init_from holds exactly those weights;
//   - a LoRA run from the export leaves every base weight bitwise as the directory holds it,
//     keeps optimizer state for the adapters only, writes PEFT's adapter files, and its merged
//     export gives the adapted model's logits within 1e-5;
//   - LoRA under dp 2 with ZeRO-1 and ZeRO-3 gives the one-process losses within 1e-5, --resume
//     is bitwise the uninterrupted run, O2 bf16 trains (finite, the loss falls);
//   - eval, generate and export read a LoRA checkpoint after the init_from directory is gone;
//   - lora.base_dtype = "bf16": at O0 the losses of the f32-base run on the base rounded to bf16
//     beforehand, the frozen base bf16 and bitwise that rounding after training, resume bitwise,
//     export merged in f32; under O2 bf16 (either storage) the fp32 run tracked within 1e-3, the
//     base bitwise, and dp 2 with ZeRO-1 the one-process O2 losses within 2e-4.
// The pretrained model is a 10-step run on the tiny corpus; fine-tuning reads another corpus of
// the same words in another order.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/ckpt/peft.h"
#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/data/text/sft.h"
#include "brigade/data/text/text_tokenizer.h"
#include "brigade/data/text/token_file.h"
#include "brigade/data/text/tokenizer.h"
#include "brigade/dist/process_group.h"
#include "brigade/models/causal_lm.h"
#include "brigade/models/hf/hf_dir.h"
#include "brigade/train/checkpoint.h"
#include "brigade/train/config.h"
#include "brigade/train/finetune.h"
#include "brigade/train/registry.h"
#include "brigade/train/task.h"
#include "brigade/train/trainer.h"
#include "support/parity.h"
#include "support/test_support.h"
#include "support/tiny_models.h"

using namespace brigade;
namespace fs = std::filesystem;
using test_support::CmdResult;
using test_support::Curve;
using test_support::expect_close;
using test_support::read_curve;

namespace {

const std::string kBin = std::string(BRIGADE_BINARY_DIR) + "/bin/brigade";
const std::string kMpirun = BRIGADE_MPIRUN;
const fs::path kHf = fs::path(BRIGADE_FIXTURES_DIR) / "hf";

// The second corpus: the tiny corpus's words in another sentence frame.
void write_other_corpus(const fs::path& p) {
  test_support::write_tiny_corpus(p);
  std::ifstream in(p);
  std::string text, line;
  while (std::getline(in, line)) text += "Then" + line.substr(3) + "\n";  // "And ..." -> "Then ..."
  in.close();
  std::ofstream(p) << text;
}

std::string fine_tune_recipe(const fs::path& init_from, const std::string& extra) {
  return "[run]\nname = \"ft\"\nout_dir = \"ft\"\nseed = 7\nthreads = 1\n[model]\ninit_from = \"" + init_from.string() +
         "\"\n[data]\ncorpus = \"other.txt\"\ndir = \"data-other\"\nval_fraction = 0.1\n[train]\nsteps = 10\n"
         "batch_size = 8\nseq_len = 16\neval_every = 5\neval_batches = 1\nlog_every = 1\n[optim]\nlr = 1e-2\n"
         "weight_decay = 0.01\n[schedule]\nwarmup_steps = 2\nmin_lr = 1e-3\n" +
         extra;
}

const char* kLora = "[finetune]\nmethod = \"lora\"\n[lora]\nr = 4\nalpha = 8.0\n";

// Logits of a model on a fixed batch of ids.
Tensor logits_of(const models::CausalLM& m) {
  Tensor ids = Tensor::empty({2, 16}, DType::I64);
  for (int64_t i = 0; i < ids.numel(); ++i) ids.data<int64_t>()[i] = (i * 37 + 11) % 128;
  autograd::NoGradGuard ng;
  return m.forward(ids);
}

// A checkpoint's model, built as its run built it.
struct Loaded {
  std::unique_ptr<train::Task> task;
  models::CausalLM& lm() { return dynamic_cast<models::CausalLM&>(task->model()); }
};
Loaded load_checkpoint(const fs::path& dir) {
  Loaded l;
  l.task = train::make_task(train::checkpoint_recipe(dir.string()), /*init_weights=*/false);
  train::load_state((dir / "model.safetensors").string(), l.task->state_dict());
  l.task->model().train(false);
  return l;
}

// One pretrained tiny model per type, exported, shared by the cases of that type.
class FineTune : public ::testing::TestWithParam<std::string> {
 protected:
  static std::map<std::string, fs::path>& roots() {
    static std::map<std::string, fs::path> r;
    return r;
  }
  void SetUp() override {
    const std::string& type = GetParam();
    if (!roots().count(type)) {
      const fs::path root = test_support::fresh_test_dir("brigade_ft_" + type);
      const test_support::TinyModel* tm = nullptr;
      for (const auto& m : test_support::tiny_models())
        if (m.name == type) tm = &m;
      ASSERT_TRUE(tm);
      test_support::write_tiny_recipe(root, *tm, 8);
      const CmdResult pre = test_support::run_in(root, kBin + " train r.toml --quiet --no-sample");
      ASSERT_EQ(pre.code, 0) << pre.err;
      const CmdResult ex = test_support::run_in(root, kBin + " export --ckpt run/checkpoint --out hf");
      ASSERT_EQ(ex.code, 0) << ex.err;
      write_other_corpus(root / "other.txt");
      roots()[type] = root;
    }
    root_ = roots().at(type);
    dir_ = test_support::fresh_test_dir("brigade_ft_case");
    fs::copy_file(root_ / "other.txt", dir_ / "other.txt");
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  void write(const std::string& extra, const std::string& name = "ft.toml") {
    std::ofstream(dir_ / name) << fine_tune_recipe(root_ / "hf", extra);
  }
  CmdResult run(int np, const std::string& args) {
    return test_support::run_in(
        dir_, test_support::launcher(np > 1 ? np : 0, kMpirun, np > 1 ? "" : "OMP_NUM_THREADS=1") + " " + kBin +
                  " train ft.toml --quiet --no-sample " + args);
  }
  Curve ok(int np, const std::string& out, const std::string& args = "") {
    const CmdResult r = run(np, "--set run.out_dir=" + out + " " + args);
    EXPECT_EQ(r.code, 0) << GetParam() << " " << args << "\n" << r.err;
    return read_curve(dir_ / out / "metrics.jsonl");
  }
  fs::path root_, dir_;
};

TEST_P(FineTune, ExportGivesTheCheckpointsLogitsAndInitFromLoadsExactlyThem) {
  Loaded ck = load_checkpoint(root_ / "run" / "checkpoint");
  models::HfModel hf = models::load_hf_directory((root_ / "hf").string());
  hf.model->train(false);
  EXPECT_EQ(logits_of(*hf.model).to_vector(), logits_of(ck.lm()).to_vector());
  EXPECT_TRUE(fs::is_regular_file(root_ / "hf" / "tokenizer.model"));

  write("");
  const train::Recipe r = train::load_recipe((dir_ / "ft.toml").string());
  EXPECT_EQ(r.model.type, GetParam());
  EXPECT_EQ(r.model.n_embd, 32);
  std::unique_ptr<train::Task> t = train::make_task(r);
  std::map<std::string, Tensor> want;
  for (auto& [name, p] : hf.model->named_parameters()) want.emplace(name, p);
  for (auto& [name, p] : t->model().named_parameters()) {
    ASSERT_TRUE(want.count(name)) << name;
    EXPECT_EQ(p.to_vector(), want.at(name).to_vector()) << name;
    EXPECT_TRUE(p.requires_grad()) << name;  // full fine-tuning trains every parameter
  }
}

TEST_P(FineTune, LoraTrainsTheAdaptersOnlyAndWritesPeftFiles) {
  write(kLora);
  const Curve c = ok(1, "lora");
  ASSERT_EQ(c.loss.size(), 10u);
  EXPECT_LT(c.loss.rbegin()->second, c.loss.begin()->second);  // it learns the new corpus
  const fs::path ck = dir_ / "lora" / "checkpoint";
  ckpt::SafetensorsReader base((root_ / "hf" / "model.safetensors").string());
  ckpt::SafetensorsReader got((ck / "model.safetensors").string());
  int adapters = 0;
  for (const std::string& name : got.names()) {
    if (name.find(".lora_") != std::string::npos) {
      ++adapters;
      continue;
    }
    // the base exactly as the directory holds it (GPT-2's file keys have no prefix)
    const std::string key = base.contains(name) ? name : name.substr(name.find('.') + 1);
    ASSERT_TRUE(base.contains(key)) << name;
    EXPECT_EQ(got.get(name).to_vector(), base.get(key).to_vector()) << name;
  }
  const int layers = GetParam() == "gpt" ? 2 : 4;  // c_attn, or q_proj and v_proj, in 2 blocks
  EXPECT_EQ(adapters, 2 * layers);
  bool b_moved = false;
  for (const std::string& name : got.names())
    if (name.ends_with("lora_B.weight"))
      for (float v : got.get(name).to_vector()) b_moved = b_moved || v != 0.0f;
  EXPECT_TRUE(b_moved);
  ckpt::SafetensorsReader opt((ck / "optimizer.safetensors").string());
  EXPECT_EQ(opt.names().size(), size_t(2 * 2 * layers));  // exp_avg and exp_avg_sq of each adapter matrix
  for (const std::string& name : opt.names()) EXPECT_NE(name.find(".lora_"), std::string::npos) << name;
  const ckpt::PeftAdapter peft = ckpt::read_peft_adapter((ck / "adapter").string());
  EXPECT_EQ(peft.config.r, 4);
  EXPECT_EQ(peft.tensors.size(), size_t(2 * layers));

  // Merged into the base and exported, it gives the adapted model's logits.
  const CmdResult ex = test_support::run_in(dir_, kBin + " export --ckpt lora/checkpoint --out merged");
  ASSERT_EQ(ex.code, 0) << ex.err;
  Loaded adapted = load_checkpoint(ck);
  models::HfModel merged = models::load_hf_directory((dir_ / "merged").string());
  merged.model->train(false);
  EXPECT_LT(test_support::rel_err(logits_of(*merged.model), logits_of(adapted.lm())), 1e-5);

  // As one GGUF file for llama.cpp (the writer's own tests check its contents): GGUF v3 with the
  // architecture's tensors, the adapters merged away.
  const CmdResult gg =
      test_support::run_in(dir_, kBin + " export --ckpt lora/checkpoint --out model.gguf --format gguf --dtype f16");
  ASSERT_EQ(gg.code, 0) << gg.err;
  std::ifstream g(dir_ / "model.gguf", std::ios::binary);
  char magic[4];
  uint32_t version = 0;
  uint64_t tensors = 0;
  g.read(magic, 4);
  g.read(reinterpret_cast<char*>(&version), 4);
  g.read(reinterpret_cast<char*>(&tensors), 8);
  EXPECT_EQ(std::string(magic, 4), "GGUF");
  EXPECT_EQ(version, 3u);
  // gpt2: token + position embeddings, 12 per block, the final norm's 2, output; llama: 9 per block
  EXPECT_EQ(tensors, GetParam() == "gpt" ? 2u + 2u * 12u + 2u + 1u : 1u + 2u * 9u + 2u);
  const CmdResult both =
      test_support::run_in(dir_, kBin + " export --ckpt lora/checkpoint --out x --format gguf --adapter");
  EXPECT_NE(both.code, 0);
  EXPECT_NE(both.err.find("--adapter writes PEFT files"), std::string::npos) << both.err;
}

TEST_P(FineTune, LoraUnderDataParallelismWithZeroMatchesOneProcess) {
  if (!test_support::have_mpirun(kMpirun)) GTEST_SKIP() << "no mpirun";
  write(kLora);
  const Curve ref = ok(1, "ref");
  ASSERT_EQ(ref.loss.size(), 10u);
  for (int zero : {1, 3}) {
    const Curve d = ok(2, "dp-z" + std::to_string(zero),
                       "--set train.batch_size=4 --set parallel.dp=2 --set parallel.zero=" + std::to_string(zero));
    expect_close(d.loss, ref.loss, GetParam() + " LoRA dp 2 ZeRO-" + std::to_string(zero));
    expect_close(d.val_loss, ref.val_loss, GetParam() + " LoRA dp 2 ZeRO-" + std::to_string(zero) + " (val)");
  }
}

TEST_P(FineTune, LoraResumesBitwiseAndTrainsInBf16) {
  write(kLora);
  const Curve whole = ok(1, "whole");
  const Curve first = ok(1, "cut", "--stop-at 5");
  ASSERT_EQ(first.loss.size(), 5u);
  const Curve resumed = ok(1, "cut", "--resume");
  ASSERT_EQ(resumed.loss.size(), 10u);
  EXPECT_EQ(resumed.loss_text, whole.loss_text);
  EXPECT_EQ(resumed.val_text, whole.val_text);

  // with LoRA dropout: its masks come from the run's dropout stream, so a resumed run still matches
  const Curve drop_whole = ok(1, "drop-whole", "--set lora.dropout=0.1");
  ok(1, "drop-cut", "--set lora.dropout=0.1 --stop-at 5");
  const Curve drop_resumed = ok(1, "drop-cut", "--set lora.dropout=0.1 --resume");
  EXPECT_EQ(drop_resumed.loss_text, drop_whole.loss_text);
  EXPECT_NE(drop_whole.loss_text, whole.loss_text);  // the masks change the losses

  const Curve bf16 = ok(1, "bf16", "--set precision.level=O2 --set precision.dtype=bf16");
  ASSERT_EQ(bf16.loss.size(), 10u);
  for (auto& [step, v] : bf16.loss) EXPECT_TRUE(std::isfinite(v)) << step;
  EXPECT_LT(bf16.loss.rbegin()->second, bf16.loss.begin()->second);
}

// The bytes of a tensor as stored (row-major, little-endian).
std::string bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.raw_data()), c.nbytes());
}

// Every frozen tensor of a LoRA checkpoint is `dt` and bitwise `base_file`'s tensor of that name
// (GPT-2's file keys have no prefix) in `dt`; every adapter matrix is f32. Returns the adapters.
int expect_frozen_base(const fs::path& ck, const fs::path& base_file, DType dt) {
  ckpt::SafetensorsReader base(base_file.string()), got((ck / "model.safetensors").string());
  int adapters = 0;
  for (const std::string& name : got.names()) {
    const Tensor t = got.get(name);
    if (name.find(".lora_") != std::string::npos) {
      ++adapters;
      EXPECT_EQ(t.dtype(), DType::F32) << name;
      continue;
    }
    const std::string key = base.contains(name) ? name : name.substr(name.find('.') + 1);
    EXPECT_TRUE(base.contains(key)) << name;
    if (!base.contains(key)) continue;
    EXPECT_EQ(t.dtype(), dt) << name;
    EXPECT_EQ(bytes_of(t), bytes_of(base.get(key).to(dt))) << name;
  }
  return adapters;
}

const char* kBf16Base = "base_dtype = \"bf16\"\n";  // appended to kLora's [lora] section

// lora.base_dtype = "bf16" (the frozen base stored in bf16, the adapters f32 master weights). At
// O0 the run is the f32-base LoRA run on the base rounded to bf16 beforehand (`brigade export
// --dtype bf16`, read back into f32 parameters: another way to the same values), losses within
// 1e-5. Every frozen tensor of its checkpoint is bf16 and bitwise that rounding after training,
// the optimizer holds the adapters' state only, --stop-at + --resume is bitwise, the merged export
// (merged in f32, written F32 by default) gives the adapted model's logits within 1e-5, --dtype
// bf16 writes that export rounded (torch_dtype bfloat16), and eval and generate read the checkpoint.
TEST_P(FineTune, LoraWithABf16BaseIsTheBaseRoundedToBf16) {
  const CmdResult rounded = test_support::run_in(
      dir_, kBin + " export --ckpt " + (root_ / "run" / "checkpoint").string() + " --out rounded --dtype bf16");
  ASSERT_EQ(rounded.code, 0) << rounded.err;
  std::ofstream(dir_ / "ft.toml") << fine_tune_recipe(dir_ / "rounded", kLora);
  const Curve ref = ok(1, "ref");
  ASSERT_EQ(ref.loss.size(), 10u);
  write(std::string(kLora) + kBf16Base);
  const Curve got = ok(1, "bf16");
  expect_close(got.loss, ref.loss, GetParam() + " bf16 base");
  expect_close(got.val_loss, ref.val_loss, GetParam() + " bf16 base (val)");
  EXPECT_LT(got.loss.rbegin()->second, got.loss.begin()->second);

  const fs::path ck = dir_ / "bf16" / "checkpoint";
  const int layers = GetParam() == "gpt" ? 2 : 4;
  EXPECT_EQ(expect_frozen_base(ck, dir_ / "rounded" / "model.safetensors", DType::BF16), 2 * layers);
  ckpt::SafetensorsReader opt((ck / "optimizer.safetensors").string());
  EXPECT_EQ(opt.names().size(), size_t(2 * 2 * layers));
  for (const std::string& name : opt.names()) EXPECT_NE(name.find(".lora_"), std::string::npos) << name;

  ok(1, "cut", "--stop-at 5");
  const Curve resumed = ok(1, "cut", "--resume");
  EXPECT_EQ(resumed.loss_text, got.loss_text);
  EXPECT_EQ(resumed.val_text, got.val_text);

  const CmdResult ex = test_support::run_in(dir_, kBin + " export --ckpt bf16/checkpoint --out merged");
  ASSERT_EQ(ex.code, 0) << ex.err;
  Loaded adapted = load_checkpoint(ck);
  models::HfModel merged = models::load_hf_directory((dir_ / "merged").string());
  merged.model->train(false);
  EXPECT_LT(test_support::rel_err(logits_of(*merged.model), logits_of(adapted.lm())), 1e-5);
  const CmdResult ex16 =
      test_support::run_in(dir_, kBin + " export --ckpt bf16/checkpoint --out merged16 --dtype bf16");
  ASSERT_EQ(ex16.code, 0) << ex16.err;
  std::ifstream cfg(dir_ / "merged16" / "config.json");
  EXPECT_EQ(nlohmann::json::parse(cfg).at("torch_dtype"), "bfloat16");
  ckpt::SafetensorsReader m32((dir_ / "merged" / "model.safetensors").string()),
      m16((dir_ / "merged16" / "model.safetensors").string());
  ASSERT_EQ(m16.names().size(), m32.names().size());
  for (const std::string& name : m32.names()) {
    EXPECT_EQ(m32.get(name).dtype(), DType::F32) << name;
    EXPECT_EQ(bytes_of(m16.get(name)), bytes_of(m32.get(name).to(DType::BF16))) << name;
  }
  EXPECT_NO_THROW(models::load_hf_directory((dir_ / "merged16").string()));

  const CmdResult ev = test_support::run_in(dir_, kBin + " eval --ckpt bf16/checkpoint --json");
  ASSERT_EQ(ev.code, 0) << ev.err;
  EXPECT_EQ(nlohmann::json::parse(ev.out).at("val_loss").dump(), got.val_text.rbegin()->second);
  const CmdResult gen = test_support::run_in(dir_, kBin + " generate --ckpt bf16/checkpoint --tokens 4");
  EXPECT_EQ(gen.code, 0) << gen.err;
}

// LoRA under O2 bf16 with the base stored in f32 and in bf16: 10 steps track the fp32 run (O0, f32
// base) within 1e-3 relative, train and val. bf16 rounds each GEMM input and output to 2^-8
// relative (unit roundoff 2^-9); in the loss of these tiny models that averages down to the
// largest gaps measured, 3e-5 with an f32 base and 1.9e-4 with a bf16 one (whose norms are
// rounded too). The bound is 5x that, and a tenth of the 1.1-1.4% the loss falls in 10 steps, so
// a run whose adapters did not train fails it. The frozen base stays bitwise as it started (f32: the directory's
// values; bf16: their rounding). dp 2 with ZeRO-1 gives the one-process O2 losses within 2e-4:
// the fp32 parts differ in summation order (~1e-7), and a bf16 activation on the other side of
// a rounding boundary moves by a bf16 ulp (2^-8 relative, 8x fp16's); measured at most 6.7e-5.
TEST_P(FineTune, LoraUnderO2Bf16TracksFp32AndKeepsTheBaseBitwise) {
  write(kLora);
  const Curve fp32 = ok(1, "fp32");
  ASSERT_EQ(fp32.loss.size(), 10u);
  const bool mpi = test_support::have_mpirun(kMpirun);
  for (const char* base : {"f32", "bf16"}) {
    const std::string what = GetParam() + " O2 bf16, base " + base;
    write(std::string(kLora) + "base_dtype = \"" + base + "\"\n");
    const Curve o2 = ok(1, std::string("o2-") + base, "--set precision.level=O2 --set precision.dtype=bf16");
    expect_close(o2.loss, fp32.loss, what, 1e-3);
    expect_close(o2.val_loss, fp32.val_loss, what + " (val)", 1e-3);
    EXPECT_LT(o2.loss.rbegin()->second, o2.loss.begin()->second) << what;
    EXPECT_NE(o2.loss_text, fp32.loss_text) << what;  // it did run in bf16
    expect_frozen_base(dir_ / (std::string("o2-") + base) / "checkpoint", root_ / "hf" / "model.safetensors",
                       std::string(base) == "bf16" ? DType::BF16 : DType::F32);
    if (!mpi) continue;
    const Curve d = ok(2, std::string("o2-dp-") + base,
                       "--set precision.level=O2 --set precision.dtype=bf16 --set train.batch_size=4 "
                       "--set parallel.dp=2 --set parallel.zero=1");
    expect_close(d.loss, o2.loss, what + " dp 2 ZeRO-1", 2e-4);
    expect_close(d.val_loss, o2.val_loss, what + " dp 2 ZeRO-1 (val)", 2e-4);
  }
}

TEST_P(FineTune, ALoraCheckpointEvaluatesGeneratesAndExportsWithoutItsInitFromDirectory) {
  // a copy of the export as init_from, removed after training
  fs::copy(root_ / "hf", dir_ / "base");
  std::ofstream(dir_ / "ft.toml") << fine_tune_recipe(dir_ / "base", kLora);
  const Curve c = ok(1, "lora");
  ASSERT_EQ(c.val_text.size(), 2u);
  fs::remove_all(dir_ / "base");
  const CmdResult ev = test_support::run_in(dir_, kBin + " eval --ckpt lora/checkpoint --json");
  ASSERT_EQ(ev.code, 0) << ev.err;
  EXPECT_EQ(nlohmann::json::parse(ev.out).at("val_loss").dump(), c.val_text.rbegin()->second);
  const CmdResult gen = test_support::run_in(dir_, kBin + " generate --ckpt lora/checkpoint --tokens 4");
  EXPECT_EQ(gen.code, 0) << gen.err;
  const CmdResult ad = test_support::run_in(dir_, kBin + " export --ckpt lora/checkpoint --out ad --adapter");
  ASSERT_EQ(ad.code, 0) << ad.err;
  EXPECT_TRUE(fs::is_regular_file(dir_ / "ad" / "adapter_model.safetensors"));
  EXPECT_TRUE(fs::is_regular_file(dir_ / "ad" / "adapter_config.json"));
  // the PEFT folder on the pretrained checkpoint generates what the LoRA checkpoint generates
  const std::string greedy = " --greedy --tokens 8 --prompt 'And the king'";
  const CmdResult own = test_support::run_in(dir_, kBin + " generate --ckpt lora/checkpoint" + greedy);
  const CmdResult on_base = test_support::run_in(
      dir_, kBin + " generate --ckpt " + (root_ / "run" / "checkpoint").string() + " --adapter ad" + greedy);
  ASSERT_EQ(own.code, 0) << own.err;
  ASSERT_EQ(on_base.code, 0) << on_base.err;
  EXPECT_EQ(on_base.out, own.out);
  const CmdResult twice = test_support::run_in(dir_, kBin + " generate --ckpt lora/checkpoint --adapter ad" + greedy);
  EXPECT_NE(twice.code, 0);
  EXPECT_NE(twice.err.find("has LoRA adapters already"), std::string::npos) << twice.err;
}

// eval --data: a prepared token file and the text it came from score alike; one window's loss is
// the model's loss on it, computed here directly.
TEST_P(FineTune, EvalOnAFileScoresEveryTokenOnce) {
  const std::string ck = (root_ / "run" / "checkpoint").string();
  const train::TextEval bin = train::evaluate_on_file(ck, (root_ / "data" / "val.bin").string());
  EXPECT_GT(bin.tokens, 100);
  EXPECT_NEAR(bin.perplexity, std::exp(bin.loss), 1e-9 * bin.perplexity);
  // one window of seq_len + 1 = 17 tokens, as a token list the model scores directly
  Loaded m = load_checkpoint(ck);
  const data::TokenDataset val((root_ / "data" / "val.bin").string());
  std::vector<int64_t> ids(17);
  val.read(0, 17, ids.data());
  const fs::path one = dir_ / "one.bin";
  data::write_token_file(one.string(), std::vector<int32_t>(ids.begin(), ids.end()), 128);
  const train::TextEval e = train::evaluate_on_file(ck, one.string());
  EXPECT_EQ(e.tokens, 16);
  EXPECT_EQ(e.windows, 1);
  Tensor x = Tensor::empty({1, 16}, DType::I64), y = Tensor::empty({1, 16}, DType::I64);
  for (int t = 0; t < 16; ++t) x.data<int64_t>()[t] = ids[size_t(t)], y.data<int64_t>()[t] = ids[size_t(t + 1)];
  autograd::NoGradGuard ng;
  EXPECT_NEAR(e.loss, m.lm().loss(x, y).item(), 1e-6);
  // text is encoded with the checkpoint's tokenizer: the same score as its ids in a token file
  const data::Tokenizer tok = data::Tokenizer::load((root_ / "run" / "checkpoint" / "tokenizer.model").string());
  const std::string text = "And the king went up to the city, and it was good.\nAnd his son built the land.\n";
  std::ofstream(dir_ / "val.txt") << text;
  const std::vector<int> enc = tok.encode(text);
  data::write_token_file((dir_ / "val_txt.bin").string(), std::vector<int32_t>(enc.begin(), enc.end()), 128);
  const train::TextEval txt = train::evaluate_on_file(ck, (dir_ / "val.txt").string());
  EXPECT_EQ(txt.tokens, int64_t(enc.size()) - 1);
  EXPECT_EQ(txt.loss, train::evaluate_on_file(ck, (dir_ / "val_txt.bin").string()).loss);
  // a token file of another vocabulary is refused
  data::write_token_file((dir_ / "v.bin").string(), std::vector<int32_t>(ids.begin(), ids.end()), 300);
  EXPECT_THROW(train::evaluate_on_file(ck, (dir_ / "v.bin").string()), ConfigError);
}

// ---- supervised fine-tuning (data.format = "jsonl")

// Prompt/completion samples from the tiny corpus's words: the completion is the sentence's subject.
void write_sft(const fs::path& p, int n) {
  const char* subj[] = {"the king", "a shepherd", "the people", "my servant", "the prophet", "his son"};
  const char* verb[] = {"went up to", "spake unto", "came down from", "looked upon", "dwelt in", "built"};
  const char* obj[] = {"the city", "the mountain", "the temple", "the river", "the land"};
  std::ofstream f(p);
  uint32_t s = 99;
  auto pick = [&](int k) {
    s = s * 1664525u + 1013904223u;
    return int((s >> 16) % uint32_t(k));
  };
  for (int i = 0; i < n; ++i) {
    const int a = pick(6), b = pick(6), c = pick(5);
    f << nlohmann::json{{"prompt", std::string(verb[b]) + " " + obj[c] + ", said"},
                        {"completion", std::string(" ") + subj[a]}}
             .dump()
      << "\n";
  }
}

std::string sft_recipe(const fs::path& init_from, const std::string& extra) {
  return "[run]\nname = \"sft\"\nout_dir = \"sft\"\nseed = 3\nthreads = 1\n[model]\ninit_from = \"" +
         init_from.string() +
         "\"\n[data]\nformat = \"jsonl\"\ncorpus = \"sft.jsonl\"\nval_fraction = 0.1\n[train]\nsteps = 10\n"
         "batch_size = 8\nseq_len = 16\neval_every = 5\neval_batches = 2\nlog_every = 1\neval_at_start = true\n"
         "[optim]\nlr = 1e-2\nweight_decay = 0.01\n[schedule]\nwarmup_steps = 2\nmin_lr = 1e-3\n" +
         extra;
}

// The loss is the mean cross-entropy over the completion's tokens alone, computed here from the
// logits; the logits of prompt positions get exactly zero gradient; train.loss_on = "all" is the
// mean over every position of the sample.
TEST_P(FineTune, SftTrainsOnCompletionsOnly) {
  write_sft(dir_ / "sft.jsonl", 40);
  for (const char* loss_on : {"completion", "all"}) {
    train::Recipe r =
        train::parse_recipe(sft_recipe(root_ / "hf", ""), "sft.toml",
                            {"data.corpus=" + (dir_ / "sft.jsonl").string(), std::string("train.loss_on=") + loss_on});
    std::unique_ptr<train::Task> task = train::make_task(r);
    auto null_group = dist::ProcessGroup::world();
    task->open_data(*null_group, [](const std::string&) {});
    const train::Batch b = task->batch(0, 0, 1, train::Shard{0, 1, null_group.get()});
    auto& lm = dynamic_cast<models::CausalLM&>(task->model());
    const Tensor x = b.at("ids"), y = b.at("targets");
    // the completion is " <subject>" + EOS: 2-4 tokens of 17; "all": every real position
    int64_t scored = 0, real = 0;
    for (int64_t i = 0; i < y.numel(); ++i) scored += y.data<int64_t>()[i] != -100;
    EXPECT_EQ(scored, b.count);
    Tensor logits;
    {
      autograd::NoGradGuard ng;
      logits = lm.forward(x).contiguous();  // (B, T, V)
    }
    const int64_t V = logits.size(2);
    double want = 0;
    for (int64_t i = 0; i < y.numel(); ++i) {
      const int64_t t = y.data<int64_t>()[i];
      if (t == -100) continue;
      const float* row = logits.data<float>() + i * V;
      double mx = row[0], sum = 0;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, double(row[v]));
      for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - mx);
      want += std::log(sum) + mx - double(row[t]);
      ++real;
    }
    want /= double(real);
    {
      autograd::NoGradGuard ng;
      train::Metrics extras;
      EXPECT_NEAR(task->loss(b, 0, extras).loss.item(), want, 1e-5 * want) << loss_on;
    }
    if (std::string(loss_on) == "completion") {
      EXPECT_LT(scored, y.numel() / 3) << "only the completions are scored";
      // the gradient of the loss with respect to the logits: zero on every prompt position
      Tensor leaf = logits.view({y.numel(), V}).clone();
      leaf.set_requires_grad(true);
      const Tensor l = fn::cross_entropy(leaf, y.view({y.numel()}));
      autograd::backward(l);
      const Tensor g = leaf.grad().contiguous();
      for (int64_t i = 0; i < y.numel(); ++i) {
        double mag = 0;
        for (int64_t v = 0; v < V; ++v) mag += std::fabs(g.data<float>()[i * V + v]);
        if (y.data<int64_t>()[i] == -100)
          EXPECT_EQ(mag, 0.0) << "position " << i;
        else
          EXPECT_GT(mag, 0.0) << "position " << i;
      }
    } else {
      EXPECT_GT(scored, y.numel() / 2);
    }
  }
}

// A LoRA SFT run learns (val loss below the pretrained model's, measured before the first step),
// reports exact matches, and under dp 2 with ZeRO-1 gives the one-process losses within 1e-5
// (micro-batches weighted by their trained-token counts).
TEST_P(FineTune, SftLoraLearnsAndMatchesUnderDataParallelism) {
  write_sft(dir_ / "sft.jsonl", 400);
  std::ofstream(dir_ / "ft.toml") << sft_recipe(root_ / "hf", kLora);
  const Curve one = ok(1, "one");
  ASSERT_EQ(one.val_loss.size(), 3u);  // steps 0, 5, 10
  EXPECT_LT(one.val_loss.rbegin()->second, one.val_loss.begin()->second);
  {
    std::ifstream f(dir_ / "one" / "metrics.jsonl");
    std::string line, last_eval;
    while (std::getline(f, line))
      if (line.find("val_loss") != std::string::npos) last_eval = line;
    const auto j = nlohmann::json::parse(last_eval);
    EXPECT_GE(j.at("exact_match").get<double>(), 0.0);
    EXPECT_LE(j.at("exact_match").get<double>(), 1.0);
    // `brigade eval` of the checkpoint is the run's final evaluation
    const CmdResult ev = test_support::run_in(dir_, kBin + " eval --ckpt one/checkpoint --json");
    ASSERT_EQ(ev.code, 0) << ev.err;
    const auto e = nlohmann::json::parse(ev.out);
    EXPECT_EQ(e.at("val_loss").dump(), j.at("val_loss").dump());
    EXPECT_EQ(e.at("exact_match").dump(), j.at("exact_match").dump());
  }
  if (!test_support::have_mpirun(kMpirun)) GTEST_SKIP() << "no mpirun";
  const Curve two = ok(2, "two", "--set train.batch_size=4 --set parallel.dp=2 --set parallel.zero=1");
  expect_close(two.loss, one.loss, GetParam() + " SFT dp 2");
  expect_close(two.val_loss, one.val_loss, GetParam() + " SFT dp 2 (val)");
}

TEST(SftData, ShapesTemplatesAndBadLines) {
  // the tokenizer of a tiny corpus
  const fs::path d = test_support::fresh_test_dir("brigade_sft_data");
  test_support::write_tiny_corpus(d / "c.txt");
  const std::unique_ptr<data::TextTokenizer> own =
      data::brigade_tokenizer(data::Tokenizer::train(test_support::slurp(d / "c.txt") + "<|>[]/_:STINY\n",
                                                     data::TokenizerTrainOptions{.vocab_size = 160}),
                              d.string());
  const data::TextTokenizer& tok = *own;
  auto write = [&](const std::string& text) {
    std::ofstream(d / "s.jsonl") << text;
    return (d / "s.jsonl").string();
  };
  // prompt-completion: the prompt's tokens untrained, the completion's and the final EOS trained
  const data::SftData pc =
      data::read_sft_jsonl(write("{\"prompt\": \"the king\", \"completion\": \" built the city\"}\n\n"), tok, {});
  ASSERT_EQ(pc.samples.size(), 1u);
  EXPECT_EQ(pc.shape, "prompt-completion");
  const std::vector<int> p = tok.encode("the king"), c = tok.encode(" built the city");
  const data::SftSample& s = pc.samples[0];
  ASSERT_EQ(s.ids.size(), p.size() + c.size() + 1);
  EXPECT_EQ(s.ids.back(), data::Tokenizer::kEosId);
  for (size_t i = 0; i < s.ids.size(); ++i) EXPECT_EQ(s.trained[i], i >= p.size() ? 1 : 0) << i;
  // messages through each template: trained pieces are the assistant's content and end marker
  const std::vector<std::pair<std::string, std::string>> m{
      {"system", "be brief"}, {"user", "who built it"}, {"assistant", "the king"}};
  std::string trained, all;
  for (const data::Piece& piece : data::render_chat(m, "chatml", "x")) {
    all += piece.text;
    if (piece.trained) trained += piece.text;
  }
  EXPECT_EQ(all,
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nwho built it<|im_end|>\n"
            "<|im_start|>assistant\nthe king<|im_end|>\n");
  EXPECT_EQ(trained, "the king<|im_end|>\n");
  all.clear();
  for (const data::Piece& piece : data::render_chat(m, "llama-2", "x")) all += piece.text;
  EXPECT_EQ(all, "<s>[INST] <<SYS>>\nbe brief\n<</SYS>>\n\nwho built it [/INST] the king </s>");
  all.clear();
  for (const data::Piece& piece : data::render_chat(m, "llama-3", "x")) all += piece.text;
  EXPECT_EQ(all,
            "<|start_header_id|>system<|end_header_id|>\n\nbe brief<|eot_id|><|start_header_id|>user<|end_header_id|>"
            "\n\nwho built it<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nthe king<|eot_id|>");
  // each bad line: one error naming the file and line
  const std::vector<std::pair<std::string, std::string>> bad{
      {"{\"text\": \"a\"}\nnot json\n", ":2: not a JSON object"},
      {"{\"text\": \"a\", \"prompt\": \"b\", \"completion\": \"c\"}\n", ":1: a sample has exactly one"},
      {"{\"prompt\": \"b\"}\n", ":1: a prompt-completion sample needs both"},
      {"{\"text\": 3}\n", ":1: \"text\" must be a string"},
      {"{\"text\": [1, 2]}\n", ":1: \"text\" must be a string, got an array"},
      // nested a million deep: named by its kind, never printed (printing recurses per level)
      {"{\"text\": " + std::string(1000000, '[') + std::string(1000000, ']') + "}\n",
       ":1: \"text\" must be a string, got an array"},
      {"{\"messages\": [{\"role\": \"bot\", \"content\": \"x\"}]}\n", ":1: role \"bot\""},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n", ":1: no \"assistant\" message"},
      {"{\"text\": \"a\"}\n{\"prompt\": \"b\", \"completion\": \"c\"}\n",
       ":2: a prompt-completion sample in a file of text"},
  };
  for (auto& [text, want] : bad) {
    try {
      data::read_sft_jsonl(write(text), tok, {});
      ADD_FAILURE() << "no error for " << text;
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find("s.jsonl" + want), std::string::npos) << e.what();
    }
  }
  fs::remove_all(d);
}

INSTANTIATE_TEST_SUITE_P(Models, FineTune, ::testing::Values("gpt", "llama"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// ---- LoRA on the other models: any model's Linear layers by name, from scratch (no init_from)

struct OtherModel {
  std::string name, targets;
};
class LoraOnEveryModel : public ::testing::TestWithParam<OtherModel> {};

// 10 LoRA steps train (finite losses) and leave every base weight bitwise at its initialisation
// (the task built from the same recipe, here), the adapters moved.
TEST_P(LoraOnEveryModel, TrainsTheAdaptersAndLeavesTheBaseAtItsInit) {
  const test_support::TinyModel* tm = nullptr;
  for (const auto& m : test_support::tiny_models())
    if (m.name == GetParam().name) tm = &m;
  ASSERT_TRUE(tm);
  if (tm->images && !test_support::have_fashion_mnist()) GTEST_SKIP() << "no Fashion-MNIST";
  const fs::path dir = test_support::fresh_test_dir("brigade_lora_" + tm->name);
  test_support::write_tiny_recipe(dir, *tm, tm->batch);
  std::ofstream(dir / "r.toml", std::ios::app)
      << "[finetune]\nmethod = \"lora\"\n[lora]\nr = 4\nalpha = 8.0\ntarget_modules = \"" << GetParam().targets
      << "\"\n";
  const CmdResult run = test_support::run_in(dir, "OMP_NUM_THREADS=1 " + kBin + " train r.toml --quiet --no-sample");
  ASSERT_EQ(run.code, 0) << run.err;
  const Curve c = read_curve(dir / "run" / "metrics.jsonl");
  ASSERT_EQ(c.loss.size(), 10u);
  for (auto& [step, v] : c.loss) EXPECT_TRUE(std::isfinite(v)) << step;
  // the initial model, built in this process from the same recipe (relative paths from dir)
  const fs::path cwd = fs::current_path();
  fs::current_path(dir);
  const std::unique_ptr<train::Task> init = train::make_task(train::load_recipe("r.toml"));
  fs::current_path(cwd);
  ckpt::SafetensorsReader got((dir / "run" / "checkpoint" / "model.safetensors").string());
  int adapters = 0, moved = 0;
  for (auto& [name, p] : init->model().named_parameters()) {
    ASSERT_TRUE(got.contains(name)) << name;
    const std::vector<float> after = got.get(name).to_vector(), before = p.to_vector();
    if (name.find(".lora_") != std::string::npos) {
      ++adapters;
      moved += after != before;
    } else {
      EXPECT_EQ(after, before) << name;
    }
  }
  EXPECT_GT(adapters, 0);
  EXPECT_GT(moved, 0);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Models, LoraOnEveryModel,
                         ::testing::Values(OtherModel{"bert", "query,value"}, OtherModel{"vit", "query,value"},
                                           OtherModel{"swin", "query,value"}, OtherModel{"clip", "q_proj,v_proj"}),
                         [](const ::testing::TestParamInfo<OtherModel>& i) { return i.param.name; });

// ---- the recipe surface

std::string error_of(const std::string& toml) {
  try {
    train::parse_recipe(toml, "test.toml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(FineTuneRecipe, InitFromFillsTheShapeFromAHuggingFaceConfig) {
  const fs::path dir = kHf / "llama";
  const models::HfConfig c = models::read_hf_config(dir.string());
  const train::Recipe r =
      train::parse_recipe("[model]\ninit_from = \"" + dir.string() + "\"\n[train]\nseq_len = 8\n", "test.toml");
  EXPECT_EQ(r.model.type, "llama");
  EXPECT_EQ(r.model.vocab_size, c.llama.vocab_size);
  EXPECT_EQ(r.model.n_layer, c.llama.n_layer);
  EXPECT_EQ(r.model.n_head, c.llama.n_head);
  EXPECT_EQ(r.model.n_kv_head, c.llama.n_kv_head);
  EXPECT_EQ(r.model.n_embd, c.llama.hidden_size);
  EXPECT_EQ(r.model.intermediate_size, c.llama.intermediate_size);
  EXPECT_EQ(r.model.block_size, c.llama.max_position);
  EXPECT_EQ(r.model.layer_norm_eps, c.llama.rms_norm_eps);
  EXPECT_EQ(r.model.rope_theta, c.llama.rope_theta);
  // the same value stated again is fine; another one is refused, naming both
  EXPECT_EQ(error_of("[model]\ninit_from = \"" + dir.string() + "\"\nn_layer = " + std::to_string(c.llama.n_layer) +
                     "\n[train]\nseq_len = 8\n"),
            "");
  const std::string e = error_of("[model]\ninit_from = \"" + dir.string() + "\"\nn_layer = 7\n[train]\nseq_len = 8\n");
  EXPECT_NE(e.find("model.n_layer = 7"), std::string::npos) << e;
  EXPECT_NE(e.find("model.n_layer = " + std::to_string(c.llama.n_layer)), std::string::npos) << e;
}

// Llama 3.2's layout (llama3 rope_scaling, tied head) maps onto the recipe's keys, and the task
// built from it holds the directory's weights with the head tied (one embedding parameter),
// under full fine-tuning and under LoRA.
TEST(FineTuneRecipe, InitFromReadsTheRopeScalingAndTheTiedHead) {
  const fs::path dir = kHf / "llama3_tied";
  const std::string head = "[model]\ninit_from = \"" + dir.string() + "\"\n";
  const std::string tail = "[train]\nseq_len = 8\n";
  const train::Recipe r = train::parse_recipe(head + tail, "test.toml");
  EXPECT_EQ(r.model.type, "llama");
  EXPECT_EQ(r.model.rope_scaling, "llama3");
  EXPECT_EQ(r.model.rope_scaling_factor, 8.0);
  EXPECT_EQ(r.model.rope_low_freq_factor, 1.0);
  EXPECT_EQ(r.model.rope_high_freq_factor, 4.0);
  EXPECT_EQ(r.model.rope_original_max_positions, 128);
  EXPECT_TRUE(r.model.tie_embeddings);
  const std::string e = error_of(head + "rope_scaling_factor = 4.0\n" + tail);
  EXPECT_NE(e.find("model.rope_scaling_factor = 4"), std::string::npos) << e;
  EXPECT_NE(e.find("holds a model with model.rope_scaling_factor = 8"), std::string::npos) << e;
  const std::string t = error_of(head + "tie_embeddings = false\n" + tail);
  EXPECT_EQ(t, "");  // false is the default: "not set", so the directory's true stands
  const train::Recipe lin =
      train::parse_recipe("[model]\ninit_from = \"" + (kHf / "llama_linear").string() + "\"\n" + tail, "test.toml");
  EXPECT_EQ(lin.model.rope_scaling, "linear");
  EXPECT_EQ(lin.model.rope_scaling_factor, 4.0);
  EXPECT_EQ(lin.model.rope_low_freq_factor, 0.0);
  EXPECT_FALSE(lin.model.tie_embeddings);

  ckpt::SafetensorsReader want((dir / "expected.safetensors").string());
  for (const char* method : {"full", "lora"}) {
    const std::string ft = std::string("[finetune]\nmethod = \"") + method + "\"\n";
    train::Recipe rr = train::parse_recipe(head + tail + ft, "test.toml");
    std::unique_ptr<train::Task> task = train::make_task(rr);
    auto& lm = dynamic_cast<models::LLaMA&>(task->model());
    EXPECT_EQ(lm.lm_head, nullptr) << method;
    int embeddings = 0;
    for (auto& [name, p] : lm.named_parameters()) {
      EXPECT_NE(name, "lm_head.weight") << method;
      if (name == "model.embed_tokens.weight") {
        ++embeddings;
        EXPECT_EQ(p.requires_grad(), std::string(method) == "full") << method;  // LoRA freezes the base
      }
    }
    EXPECT_EQ(embeddings, 1) << method;
    lm.train(false);
    autograd::NoGradGuard ng;
    EXPECT_LT(test_support::rel_err(lm.forward(want.get("ids")), want.get("logits")), 1e-5) << method;
  }
}

TEST(FineTuneRecipe, BadFineTuningSettingsAreClearErrors) {
  const std::string nowhere = error_of("[model]\ninit_from = \"/nonexistent/model\"\n");
  EXPECT_NE(nowhere.find("is not a directory"), std::string::npos) << nowhere;
  const fs::path empty = test_support::fresh_test_dir("brigade_ft_empty");
  const std::string neither = error_of("[model]\ninit_from = \"" + empty.string() + "\"\n");
  EXPECT_NE(neither.find("neither config.json"), std::string::npos) << neither;
  const std::string stray = error_of("[lora]\nr = 16\n");
  EXPECT_NE(stray.find("finetune.method = \"full\""), std::string::npos) << stray;
  const std::string method = error_of("[finetune]\nmethod = \"qlora\"\n");
  EXPECT_NE(method.find("is not a fine-tuning method"), std::string::npos) << method;
  const std::string tp = error_of("[finetune]\nmethod = \"lora\"\n[parallel]\ntp = 2\n");
  EXPECT_NE(tp.find("LoRA runs under data parallelism"), std::string::npos) << tp;
  const std::string bf16_full = error_of("[lora]\nbase_dtype = \"bf16\"\n");
  EXPECT_NE(bf16_full.find("lora.base_dtype = \"bf16\""), std::string::npos) << bf16_full;
  EXPECT_NE(bf16_full.find("finetune.method = \"full\" freezes nothing"), std::string::npos) << bf16_full;
  EXPECT_NE(bf16_full.find("set finetune.method = \"lora\""), std::string::npos) << bf16_full;
  const std::string bad_dtype = error_of("[finetune]\nmethod = \"lora\"\n[lora]\nbase_dtype = \"fp16\"\n");
  EXPECT_NE(bad_dtype.find("lora.base_dtype = \"fp16\" is not a storage dtype"), std::string::npos) << bad_dtype;
  const std::string bf16_vit = error_of(
      "[model]\ntype = \"vit\"\npatch_size = 7\n[data]\ncorpus = \"fashion-mnist\"\n[finetune]\nmethod = "
      "\"lora\"\n[lora]\ntarget_modules = \"query,value\"\nbase_dtype = \"bf16\"\n");
  EXPECT_NE(bf16_vit.find("lora.base_dtype = \"bf16\" is supported for model.type = \"gpt\" and \"llama\", not "
                          "\"vit\""),
            std::string::npos)
      << bf16_vit;
  // a bf16 base under ZeRO-3 and O3 is accepted (the frozen base is in no ZeRO unit, and O3's
  // rounding touches the trainable state only)
  EXPECT_EQ(error_of("[finetune]\nmethod = \"lora\"\n[lora]\nbase_dtype = \"bf16\"\n[parallel]\nzero = 3\n"
                     "[precision]\nlevel = \"O3\"\n"),
            "");
  const std::string rank = error_of("[finetune]\nmethod = \"lora\"\n[lora]\nr = 0\n");
  EXPECT_NE(rank.find("lora.r = 0"), std::string::npos) << rank;
  const std::string noval = error_of("[data]\nformat = \"jsonl\"\ncorpus = \"s.jsonl\"\nval_fraction = 0.0\n");
  EXPECT_NE(noval.find("needs data.val_fraction > 0"), std::string::npos) << noval;
  const std::string vit = error_of(
      "[model]\ntype = \"vit\"\npatch_size = 7\n[data]\ncorpus = \"fashion-mnist\"\n[finetune]\nmethod = \"lora\"\n");
  EXPECT_NE(vit.find("needs lora.target_modules"), std::string::npos) << vit;
  fs::remove_all(empty);
}

}  // namespace
