// Generator vs PyTorch 1.13, bit for bit: replays the cases recorded in
// tests/fixtures/rng.safetensors (AVX2 kernels) and rng_default.safetensors
// (ATEN_CPU_CAPABILITY=default), made by tests/reference/make_fixtures.py.
// Also: mt19937 against std::mt19937, state round trips, and argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"
#include "brigade/core/rng.h"

using namespace brigade;
using brigade::ckpt::TensorInfo;

namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The view a case fills: contiguous, transposed, or every second column.
Tensor make_view(const nlohmann::json& c) {
  Shape shape = c.at("shape").get<Shape>();
  const std::string layout = c.at("layout");
  if (layout == "contiguous") return Tensor::zeros(shape);
  if (layout == "transpose") return Tensor::zeros({shape[1], shape[0]}).transpose(0, 1);  // (s0, s1) view
  if (layout == "slice2") return Tensor::zeros({shape[0], 2 * shape[1]}).slice(1, 0, 2 * shape[1], 2);
  ADD_FAILURE() << "unknown layout " << layout;
  return {};
}

void replay(const std::string& file, CpuCapability cap, bool use_default_generator) {
  ckpt::SafetensorsReader r(std::string(BRIGADE_FIXTURES_DIR) + "/" + file);
  ASSERT_EQ(r.metadata("magic").value_or(""), "brigade-fixture");
  ASSERT_EQ(r.metadata("version").value_or(""), "1");
  const auto cases = nlohmann::json::parse(r.metadata("cases").value());
  Generator own;
  Generator& g = use_default_generator ? default_generator() : own;
  const CpuCapability saved = g.cpu_capability();
  g.set_cpu_capability(cap);
  ASSERT_GT(cases.size(), 20u);
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    if (c.contains("seed")) {
      if (use_default_generator)
        manual_seed(c["seed"].get<uint64_t>());
      else
        g.manual_seed(c["seed"].get<uint64_t>());
    }
    Tensor t = make_view(c);
    if (c["op"] == "normal")
      g.normal_(t, c["a"].get<double>(), c["b"].get<double>());
    else
      g.uniform_(t, c["a"].get<double>(), c["b"].get<double>());
    const Tensor want = r.get(fmt::format("case.{:02d}", i));
    ASSERT_EQ(want.shape(), t.shape()) << "case " << i << ": " << c.dump();
    const std::vector<float> a = t.to_vector(), b = want.to_vector();
    size_t bad = 0, first = 0;
    for (size_t k = 0; k < a.size(); ++k)
      if (bits(a[k]) != bits(b[k]) && bad++ == 0) first = k;
    ASSERT_EQ(bad, 0u) << file << " case " << i << " " << c.dump() << ": " << bad << " of " << a.size()
                       << " differ, first at " << first << ": got " << a[first] << " torch " << b[first];
  }
  g.set_cpu_capability(saved);
}

}  // namespace

TEST(Rng, MatchesTorchAvx2Kernels) { replay("rng.safetensors", CpuCapability::Avx2, false); }
TEST(Rng, MatchesTorchDefaultKernels) { replay("rng_default.safetensors", CpuCapability::Default, false); }
TEST(Rng, DefaultGeneratorAndManualSeed) { replay("rng.safetensors", CpuCapability::Avx2, true); }

TEST(Rng, Mt19937MatchesStd) {
  for (uint64_t seed : {uint64_t(5489), uint64_t(0), uint64_t(1234), uint64_t(0xffffffffull)}) {
    Generator g(seed);
    std::mt19937 ref(uint32_t(seed & 0xffffffffu));
    for (int i = 0; i < 2000; ++i) ASSERT_EQ(g.random(), ref()) << "seed " << seed << " draw " << i;
  }
  // torch seeds with the low 32 bits but remembers the full seed
  Generator a(0x100000005ull), b(5);
  EXPECT_EQ(a.initial_seed(), 0x100000005ull);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.random(), b.random());
}

TEST(Rng, Random64IsHighThenLow) {
  Generator g(7), h(7);
  for (int i = 0; i < 100; ++i) {
    const uint64_t hi = h.random(), lo = h.random();
    ASSERT_EQ(g.random64(), (hi << 32) | lo);
  }
}

TEST(Rng, UniformFloatIsTorchFloatRecipe) {
  Generator g(3), h(3), k(3);
  Tensor t = Tensor::empty({100});
  h.uniform_(t);
  const auto v = t.to_vector();
  for (int i = 0; i < 100; ++i) {
    const float u = g.uniform_float();
    ASSERT_EQ(bits(u), bits(v[size_t(i)]));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    ASSERT_EQ(u, float(k.random() & 0xffffffu) / 16777216.0f);
  }
}

TEST(Rng, StateRoundTripIsExact) {
  Generator g(99);
  Tensor t = Tensor::empty({3});
  g.normal_(t);                              // odd count: a cached double-normal sample is pending
  for (int i = 0; i < 700; ++i) g.random();  // cross a twist boundary
  g.normal_(t);
  const std::string s = g.state();
  for (char c : s) ASSERT_TRUE(c >= 32 && c < 127) << "state must be printable ASCII";

  Generator h(1);
  h.set_state(s);
  EXPECT_TRUE(h == g);
  EXPECT_EQ(h.initial_seed(), 99u);
  Tensor a = Tensor::empty({5}), b = Tensor::empty({5}), c = Tensor::empty({1000}), d = Tensor::empty({1000});
  g.normal_(a, 0.5, 2.0);
  h.normal_(b, 0.5, 2.0);
  g.normal_(c);
  h.normal_(d);
  const auto va = a.to_vector(), vb = b.to_vector(), vc = c.to_vector(), vd = d.to_vector();
  for (size_t i = 0; i < va.size(); ++i) EXPECT_EQ(bits(va[i]), bits(vb[i]));
  for (size_t i = 0; i < vc.size(); ++i) ASSERT_EQ(bits(vc[i]), bits(vd[i]));
  EXPECT_EQ(g.state(), h.state());
}

TEST(Rng, SetStateRejectsForeignStrings) {
  Generator g;
  const std::string good = g.state();
  EXPECT_THROW(g.set_state(""), ValueError);
  EXPECT_THROW(g.set_state("hello world"), ValueError);
  EXPECT_THROW(g.set_state(good.substr(0, good.size() / 2)), ValueError);
  EXPECT_THROW(g.set_state(good + " 17"), ValueError);
  EXPECT_NO_THROW(g.set_state(good));
}

TEST(Rng, ManualSeedDropsCachedNormal) {
  Generator g(5), h(5);
  Tensor t = Tensor::empty({1});
  g.normal_(t);  // caches the sine half
  g.manual_seed(5);
  Tensor a = Tensor::empty({1}), b = Tensor::empty({1});
  g.normal_(a);
  h.normal_(b);
  EXPECT_EQ(bits(a.item()), bits(b.item()));
}

TEST(Rng, ReducedPrecisionFillsRoundTheF32Draw) {
  Generator g(11), h(11);
  Tensor a = Tensor::empty({40}, DType::BF16), b = Tensor::empty({40});
  g.normal_(a, 0.0, 0.02);
  h.normal_(b, 0.0, 0.02);
  const auto va = a.to_vector(), vb = b.to_vector();
  for (size_t i = 0; i < va.size(); ++i) EXPECT_EQ(va[i], bf16_to_float(float_to_bf16(vb[i])));
}

TEST(Rng, BadArgumentsThrow) {
  Generator g;
  EXPECT_THROW(g.normal_(Tensor::zeros({4}, DType::I64)), ValueError);
  EXPECT_THROW(g.uniform_(Tensor::zeros({4}, DType::I32)), ValueError);
  EXPECT_THROW(g.normal_(Tensor::zeros({4}), 0.0, -1.0), ValueError);
  EXPECT_THROW(g.uniform_(Tensor::zeros({4}), 2.0, 1.0), ValueError);
  EXPECT_THROW(g.normal_(Tensor::zeros({1, 4}).expand({3, 4})), ValueError);
  EXPECT_THROW(g.normal_(Tensor()), ValueError);
}

// The GPT-2 init recipe of tests/reference/gpt2_ref.py (GPT2.init_weights), replayed with
// Generator, reproduces the parity fixture's initial parameters bit for bit. This is
// the order the C++ model must follow.
TEST(Rng, ReproducesGpt2FixtureInit) {
  ckpt::SafetensorsReader r(std::string(BRIGADE_FIXTURES_DIR) + "/gpt2_tiny.safetensors");
  const auto cfg = nlohmann::json::parse(r.metadata("config").value());
  const int64_t L = cfg.at("n_layer");
  const uint64_t seed = std::stoull(r.metadata("init_seed").value());
  const double proj_std = 0.02 / std::sqrt(2.0 * double(L));
  Generator g(seed);
  auto check_normal = [&](const std::string& name, double std) {
    const TensorInfo& ti = r.info(name);
    Tensor t = Tensor::empty(ti.shape);  // stored (HF) layout, contiguous f32
    g.normal_(t, 0.0, std);
    EXPECT_EQ(r.raw_bytes(name), std::string(static_cast<const char*>(t.raw_data()), t.nbytes())) << name;
  };
  check_normal("transformer.wte.weight", 0.02);
  check_normal("transformer.wpe.weight", 0.02);
  for (int64_t i = 0; i < L; ++i) {
    const std::string h = fmt::format("transformer.h.{}.", i);
    check_normal(h + "attn.c_attn.weight", 0.02);
    check_normal(h + "attn.c_proj.weight", proj_std);
    check_normal(h + "mlp.c_fc.weight", 0.02);
    check_normal(h + "mlp.c_proj.weight", proj_std);
    for (const char* n : {"ln_1.weight", "ln_2.weight"}) {
      const std::vector<float> ones(size_t(r.info(h + n).numel()), 1.0f);
      EXPECT_EQ(r.get(h + n).to_vector(), ones) << h + n;
    }
  }
}
