// Op-harness cases of the gemm family (src/brigade/ops/gemm.h): matmul in every transpose
// combination with batched, broadcast and long-K shapes and views, linear in both weight layouts
// with and without bias; the big linear cases (the bias grad's column sums above the OpenMP
// threshold, a strided x that cpu/gemm.cpp gathers); the oneDNN bf16 GEMM path.
#include "ops/harness.h"

#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <utility>

#include "brigade/ops/cpu/kernels.h"

namespace brigade::optest {

std::vector<OpCase> gemm_cases() {
  std::vector<OpCase> cs;
  // ---- matmul: every transpose combination, batched + broadcast batch dims, views
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      cs.push_back(matmul_case(in(ta ? Shape{5, 3} : Shape{3, 5}), in(tb ? Shape{4, 5} : Shape{5, 4}), ta, tb));
      cs.push_back(
          matmul_case(in(ta ? Shape{2, 3, 6, 5} : Shape{2, 3, 5, 6}), in(tb ? Shape{7, 6} : Shape{6, 7}), ta, tb));
      cs.push_back(matmul_case(in(ta ? Shape{2, 1, 4, 3} : Shape{2, 1, 3, 4}).T(),
                               in(tb ? Shape{3, 5, 4} : Shape{3, 4, 5}).T(), ta, tb));
    }
  // long K (K >= 16 max(M, N)), both row-major: the cpu backend computes the transposed product
  // and transposes it back (cpu/gemm.cpp); its gradients are long-K too in the other layouts
  cs.push_back(matmul_case(in({3, 70}), in({70, 4}), false, false));
  cs.push_back(matmul_case(in({2, 3, 4}).Sliced(), in({4, 6}).Expand(0), false, false));
  cs.push_back(matmul_case(in({2, 3, 4}).Swap(0, 1), in({1, 4, 6}), false, false));
  cs.push_back(matmul_case(in({3, 4, 5}).Expand(0), in({3, 5, 2}).Swap(0, 2), false, false));

  // ---- linear: both layouts, with and without bias, views
  for (auto layout : {ops::WeightLayout::OutIn, ops::WeightLayout::InOut})
    for (bool bias : {true, false}) {
      const bool oi = layout == ops::WeightLayout::OutIn;
      cs.push_back(linear_case(in({2, 3, 5}), in(oi ? Shape{4, 5} : Shape{5, 4}), bias, layout));
      cs.push_back(linear_case(in({5, 6}).T(), in(oi ? Shape{3, 6} : Shape{6, 3}).T(), bias, layout));
    }
  cs.push_back(linear_case(in({4, 5}).Sliced(), in({3, 5}).Sliced(), true, ops::WeightLayout::OutIn));
  return cs;
}

std::vector<BigCase> gemm_big_cases() {
  std::vector<BigCase> cs;
  // linear: the bias grad is column_sum (elementwise.cpp) with N * OUT = 300 * 130 > 1 << 15;
  // y, gx, gw come from oneDNN (no thread-count claim). x has stride 2 in its last dim, which
  // oneDNN does not take, so cpu/gemm.cpp gathers it (N * IN = 36000 > 1 << 15).
  for (auto layout : {ops::WeightLayout::OutIn, ops::WeightLayout::InOut}) {
    const bool oi = layout == ops::WeightLayout::OutIn;
    const int64_t N = 300, IN = 120, OUT = 130;
    const Tensor x = randn({N, 2 * IN + 1}, 122).slice(1, 1, 2 * IN + 1, 2);  // (N, IN), stride 2
    const Tensor w = randn(oi ? Shape{OUT, IN} : Shape{IN, OUT}, 123);
    const Tensor bias = randn({OUT}, 124), gy = randn({N, OUT}, 125);
    cs.push_back({oi ? "linear_OutIn" : "linear_InOut",
                  [=] {
                    ops::LinearGrads r = ops::linear_backward(gy, x, w, layout);
                    return TVec{ops::linear(x, w, bias, layout), r.gx, r.gw, r.gb};
                  },
                  2e-6,
                  {false, false, false, true}});
  }
  return cs;
}

namespace {

// On the cpu backend, matmul / linear / linear_backward with bf16 operands run oneDNN bf16
// primitives (not the widened f32 path); results within one bf16 rounding of ref f32 on the
// same values; primitives cached. f16 takes the widened path (no f16 GEMM in oneDNN here).
TEST(Ops16, Bf16GemmsUseOneDnnBf16Primitives) {
  ops::BackendScope s(ops::Backend::Cpu);
  ASSERT_TRUE(ops::cpu::gemm16_available(DType::BF16)) << "this CPU has AVX512-BF16; oneDNN should serve bf16";
  const int64_t N = 96, IN = 160, OUT = 72;
  const Tensor x = randn({2, N / 2, IN}, 41).to(DType::BF16);
  auto ref32 = [](auto f) {
    ops::BackendScope r(ops::Backend::Ref);
    return f();
  };
  auto w32 = [](const Tensor& t) { return t.to(DType::F32); };
  for (auto layout : {ops::WeightLayout::OutIn, ops::WeightLayout::InOut}) {
    const bool oi = layout == ops::WeightLayout::OutIn;
    SCOPED_TRACE(oi ? "OutIn" : "InOut");
    const Tensor w = randn(oi ? Shape{OUT, IN} : Shape{IN, OUT}, 42).to(DType::BF16);
    for (const Tensor& bias : {randn({OUT}, 43), randn({OUT}, 44).to(DType::BF16)}) {
      const Tensor y = ops::linear(x, w, bias, layout);
      const std::string impl = ops::cpu::last_matmul_impl();
      EXPECT_NE(impl.find("bf16->bf16"), std::string::npos) << impl;
      EXPECT_EQ(impl.find("ref"), std::string::npos) << impl;
      EXPECT_EQ(y.dtype(), DType::BF16);
      const Tensor want = ref32([&] { return ops::linear(w32(x), w32(w), w32(bias), layout); });
      EXPECT_LE(rel_err(to_d(y), to_d(want)), kBf16);
      // Cached: the same call again creates no primitive and gives the same bits.
      const int64_t created = ops::cpu::matmul_primitives_created();
      EXPECT_TRUE(bitwise_equal(ops::linear(x, w, bias, layout), y));
      EXPECT_EQ(ops::cpu::matmul_primitives_created(), created);
    }
    const Tensor gy = randn({2, N / 2, OUT}, 45).to(DType::BF16);
    const ops::LinearGrads g = ops::linear_backward(gy, x, w, layout);
    const std::string impl = ops::cpu::last_matmul_impl();
    EXPECT_NE(impl.find("bf16->bf16"), std::string::npos) << impl;
    EXPECT_EQ(impl.find("ref"), std::string::npos) << impl;
    const ops::LinearGrads want = ref32([&] { return ops::linear_backward(w32(gy), w32(x), w32(w), layout); });
    for (auto [got, exp, name] : {std::tuple{g.gx, want.gx, "gx"}, {g.gw, want.gw, "gw"}, {g.gb, want.gb, "gb"}}) {
      EXPECT_EQ(got.dtype(), DType::BF16) << name;
      EXPECT_LE(rel_err(to_d(got), to_d(exp)), kBf16) << name;
    }
  }
  // Batched, transposed, broadcast and strided (gathered) bf16 matmuls.
  const Tensor a = randn({3, 40, 24}, 46).to(DType::BF16), b = randn({24, 56}, 47).to(DType::BF16);
  const Tensor at = randn({3, 24, 40}, 48).to(DType::BF16).transpose(1, 2);    // (3, 40, 24) strided
  const Tensor bs = randn({24, 113}, 49).to(DType::BF16).slice(1, 1, 113, 2);  // (24, 56), stride 2
  for (auto [p, q] : {std::pair{a, b}, {at, b}, {a, bs}}) {
    const Tensor c = ops::matmul(p, q);
    EXPECT_NE(ops::cpu::last_matmul_impl().find("bf16->bf16"), std::string::npos) << ops::cpu::last_matmul_impl();
    EXPECT_EQ(c.dtype(), DType::BF16);
    EXPECT_LE(rel_err(to_d(c), to_d(ref32([&] { return ops::matmul(w32(p), w32(q)); }))), kBf16);
  }
  // Mixed bf16 x f32 and f16 x f16 are widened: the GEMM oneDNN ran was f32.
  ops::matmul(a, w32(b));
  EXPECT_NE(ops::cpu::last_matmul_impl().find("f32->f32"), std::string::npos) << ops::cpu::last_matmul_impl();
  const Tensor ch = ops::matmul(a.to(DType::F16), b.to(DType::F16));
  EXPECT_EQ(ch.dtype(), DType::F16);
  if (!ops::cpu::gemm16_available(DType::F16)) {
    EXPECT_NE(ops::cpu::last_matmul_impl().find("f32->f32"), std::string::npos) << ops::cpu::last_matmul_impl();
  }
  EXPECT_LE(rel_err(to_d(ch), to_d(ref32([&] { return ops::matmul(w32(a.to(DType::F16)), w32(b.to(DType::F16))); }))),
            kF16);
}

// The bf16 GEMMs at sizes where oneDNN and the bias-grad column sums run multi-threaded.
TEST(Ops16, Bf16LinearAtOneTwoAndThreeThreads) {
  const int64_t N = 300, IN = 120, OUT = 130;
  const Tensor x = randn({N, IN}, 51).to(DType::BF16), w = randn({OUT, IN}, 52).to(DType::BF16);
  const Tensor bias = randn({OUT}, 53), gy = randn({N, OUT}, 54).to(DType::BF16);
  TVec want;
  {
    ops::BackendScope r(ops::Backend::Ref);
    ops::LinearGrads g =
        ops::linear_backward(gy.to(DType::F32), x.to(DType::F32), w.to(DType::F32), ops::WeightLayout::OutIn);
    want = {ops::linear(x.to(DType::F32), w.to(DType::F32), bias, ops::WeightLayout::OutIn), g.gx, g.gw, g.gb};
  }
  for (int threads : {1, 2, 3}) {
    OmpThreads t(threads);
    ops::BackendScope s(ops::Backend::Cpu);
    ops::LinearGrads g = ops::linear_backward(gy, x, w, ops::WeightLayout::OutIn);
    const TVec got{ops::linear(x, w, bias, ops::WeightLayout::OutIn), g.gx, g.gw, g.gb};
    for (size_t k = 0; k < got.size(); ++k) {
      EXPECT_EQ(got[k].dtype(), DType::BF16);
      EXPECT_LE(rel_err(to_d(got[k]), to_d(want[k])), kBf16) << threads << " threads, output " << k;
    }
  }
}

}  // namespace

}  // namespace brigade::optest
