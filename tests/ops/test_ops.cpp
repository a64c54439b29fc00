// The op harness (after ggml's test-backend-ops): one table of op cases, each with its input
// shapes and layouts (contiguous, transposed/permuted, strided slices, expanded broadcast views),
// run through
//   (a) the ops:: front-end on the Cpu backend vs the Ref backend (forward and
//       backward outputs), and the f32 Ref forward vs the ref kernels in double;
//   (b) every backward (ref kernels in double, and ops:: on Cpu in f32) vs central
//       finite differences of the double-precision ref forward, on the scalar
//       L = sum(out0 * R) for a random R.
// Every case also runs in bf16 and f16 (OpHarness16): the inputs rounded to the dtype, run on
// Cpu and Ref, each output compared with the Ref backend in f32 on the same rounded values
// (widened), within the case's per-dtype tolerance; output dtypes checked against the
// contract in ops.h.
// The table is the concatenation of the families' cases (tests/ops/cases/<family>.cpp, with the
// shared pieces in tests/ops/harness.h): adding an op = one entry in its family's file. Also here:
// determinism (Cpu twice, bitwise), the big cases above the OpenMP thresholds of ops/cpu at 1, 2
// and 3 threads against ref (bitwise across thread counts where the kernels claim it;
// ParallelBranches), bad-input errors, zero-dim and empty tensors, and the 16-bit tests outside
// the table: ops::cast against the scalar conversions, the dtype rules for mixed dtypes, and the
// native 16-bit cpu kernels (bitwise the widened path on every case of the table and above the
// OpenMP thresholds at 1, 2 and 3 threads; no f32 temporaries). Tests of one family's ops outside
// the table (dropout, the bf16 GEMMs, sum_squares, ...) sit in that family's case file.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <utility>

#include "brigade/core/allocator.h"
#include "brigade/core/error.h"
#include "brigade/ops/cpu/kernels.h"
#include "brigade/ops/ops.h"
#include "ops/harness.h"

namespace brigade::optest {
namespace {

// The tables: the families' lists, in the order of the families in ops.h.
template <class T>
std::vector<T> concat(std::initializer_list<std::vector<T> (*)()> parts) {
  std::vector<T> all;
  for (auto part : parts)
    for (T& c : part()) all.push_back(std::move(c));
  return all;
}

const std::vector<OpCase>& cases() {
  static const std::vector<OpCase> cs =
      concat<OpCase>({elementwise_cases, reduce_cases, gemm_cases, embedding_cases, norm_cases, attention_cases,
                      loss_cases, conv_cases, position_cases});
  return cs;
}

const std::vector<BigCase>& big_cases() {
  static const std::vector<BigCase> cs =
      concat<BigCase>({elementwise_big_cases, reduce_big_cases, gemm_big_cases, embedding_big_cases, norm_big_cases,
                       attention_big_cases, loss_big_cases});
  return cs;
}

const std::vector<Big16Case>& big16_cases() {
  static const std::vector<Big16Case> cs =
      concat<Big16Case>({elementwise_big16_cases, reduce_big16_cases, embedding_big16_cases, norm_big16_cases,
                         attention_big16_cases, loss_big16_cases, dropout_big16_cases});
  return cs;
}

// ------------------------------------------------------------------ the harness

class OpHarness : public ::testing::TestWithParam<size_t> {};

TEST_P(OpHarness, CpuMatchesRefAndGradientsMatchFiniteDifferences) {
  const OpCase& c = cases()[GetParam()];
  std::mt19937 rng(1234 + unsigned(GetParam()));
  std::vector<DVec> xd;
  TVec xt;
  for (const Input& x : c.inputs) {
    xd.push_back(make_values(x, rng));
    xt.push_back(make_tensor(x, xd.back()));
  }

  // (a) forward: cpu vs ref (f32), ref f32 vs ref double.
  TVec y_ref, y_cpu;
  {
    ops::BackendScope s(ops::Backend::Ref);
    y_ref = c.fwd(xt);
  }
  {
    ops::BackendScope s(ops::Backend::Cpu);
    y_cpu = c.fwd(xt);
  }
  const std::vector<DVec> y_d = c.fwd_d(xd);
  ASSERT_EQ(y_ref.size(), y_d.size());
  for (size_t k = 0; k < y_ref.size(); ++k) {
    ASSERT_EQ(y_ref[k].shape(), y_cpu[k].shape()) << "output " << k;
    EXPECT_LE(rel_err(to_d(y_cpu[k]), to_d(y_ref[k])), c.tol_cpu) << c.name << ": cpu vs ref, output " << k;
    EXPECT_LE(rel_err(to_d(y_ref[k]), y_d[k]), c.tol_f32) << c.name << ": ref f32 vs ref double, output " << k;
  }
  if (!c.bwd) return;

  // (b) backward: L = sum(out0 * R).
  std::uniform_real_distribution<double> U(-1, 1);
  DVec R(y_d[0].size());
  for (auto& e : R) e = double(float(U(rng)));
  const Tensor Rt = contig_f32(R, y_ref[0].shape());
  auto L = [&](const std::vector<DVec>& x) {
    const DVec y = c.fwd_d(x)[0];
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += y[i] * R[i];
    return l;
  };
  // A relative step: h = 1e-5 max(1, |x|).
  auto step = [](double x) { return 1e-5 * std::max(1.0, std::fabs(x)); };
  std::vector<DVec> fd;
  std::vector<DVec> xp = xd;
  for (size_t i = 0; i < c.inputs.size(); ++i)
    if (c.inputs[i].diff) fd.push_back(test_support::central_difference([&] { return L(xp); }, std::span(xp[i]), step));

  TVec g_ref, g_cpu;
  {
    ops::BackendScope s(ops::Backend::Ref);
    g_ref = c.bwd(xt, y_ref, Rt);
  }
  {
    ops::BackendScope s(ops::Backend::Cpu);
    g_cpu = c.bwd(xt, y_cpu, Rt);
  }
  ASSERT_EQ(g_cpu.size(), fd.size());
  ASSERT_EQ(g_ref.size(), fd.size());
  for (size_t k = 0; k < fd.size(); ++k) {
    EXPECT_LE(rel_err(to_d(g_cpu[k]), to_d(g_ref[k])), c.tol_cpu) << c.name << ": backward cpu vs ref, grad " << k;
    EXPECT_LE(rel_err(to_d(g_cpu[k]), fd[k]), c.tol_fd_f) << c.name << ": backward cpu f32 vs FD, grad " << k;
  }
  if (c.bwd_d) {
    const std::vector<DVec> g_d = c.bwd_d(xd, R);
    ASSERT_EQ(g_d.size(), fd.size());
    for (size_t k = 0; k < fd.size(); ++k)
      EXPECT_LE(rel_err(g_d[k], fd[k]), c.tol_fd_d) << c.name << ": backward ref double vs FD, grad " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, OpHarness, ::testing::Range<size_t>(0, cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           std::string n = cases()[info.param].name;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n + "_" + std::to_string(info.param);
                         });

// ------------------------------------------------------------------ the harness in bf16 and f16
//
// The case's inputs (and the backward's seed R) rounded to dt, with the case's layouts. For
// each backend, forward and backward run on the 16-bit tensors; the oracle is the Ref backend
// in f32 on the same rounded values widened: the inputs, R, and for the backward the 16-bit
// forward outputs the backward consumes (so each comparison sees only the rounding of the
// op(s) under test). Also: output dtypes (dt, or f32 where the contract says so; every
// gradient has its input's dtype), and Ref in 16-bit is bitwise the f32 Ref forward rounded
// once (it widens, runs ref<float> and rounds).

class OpHarness16 : public ::testing::TestWithParam<std::tuple<size_t, DType>> {};

TEST_P(OpHarness16, MatchesRefF32OnTheSameRoundedInputs) {
  const auto [ci, dt] = GetParam();
  const OpCase& c = cases()[ci];
  const double tol = dt == DType::BF16 ? c.tol_bf16 : c.tol_f16;
  std::mt19937 rng(1234 + unsigned(ci));
  TVec x16, x32;
  for (const Input& x : c.inputs) {
    const DVec v = round_to(make_values(x, rng), dt);
    x16.push_back(make_tensor(x, v, dt));
    x32.push_back(make_tensor(x, v));
  }
  TVec y32;
  {
    ops::BackendScope s(ops::Backend::Ref);
    y32 = c.fwd(x32);
  }
  std::uniform_real_distribution<double> U(-1, 1);
  DVec R(static_cast<size_t>(y32[0].numel()));
  for (auto& e : R) e = double(float(U(rng)));
  R = round_to(R, dt);
  const Tensor R32 = contig_f32(R, y32[0].shape()), R16 = R32.to(dt);
  auto want_dtype = [&](size_t k) { return k < c.f32_outputs.size() && c.f32_outputs[k] ? DType::F32 : dt; };

  for (auto be : {ops::Backend::Ref, ops::Backend::Cpu}) {
    const char* bn = be == ops::Backend::Ref ? "ref" : "cpu";
    TVec y16;
    {
      ops::BackendScope s(be);
      y16 = c.fwd(x16);
    }
    ASSERT_EQ(y16.size(), y32.size());
    for (size_t k = 0; k < y16.size(); ++k) {
      ASSERT_EQ(y16[k].shape(), y32[k].shape()) << c.name << " output " << k;
      EXPECT_EQ(y16[k].dtype(), want_dtype(k)) << c.name << " " << bn << ": dtype of output " << k;
      const double t = want_dtype(k) == DType::F32 ? c.tol_cpu : tol + c.tol_cpu;
      EXPECT_LE(rel_err(to_d(y16[k]), to_d(y32[k])), t) << c.name << " " << bn << ": forward output " << k;
      if (be == ops::Backend::Ref) {
        EXPECT_TRUE(bitwise_equal(y16[k], y32[k].to(y16[k].dtype())))
            << c.name << ": ref 16-bit forward output " << k << " is not the f32 ref output rounded once";
      }
    }
    if (!c.bwd) continue;
    TVec y16w;  // the 16-bit forward outputs, widened: what the oracle backward consumes
    for (const Tensor& y : y16) y16w.push_back(y.to(DType::F32));
    TVec g16, g32;
    {
      ops::BackendScope s(be);
      g16 = c.bwd(x16, y16, R16);
    }
    {
      ops::BackendScope s(ops::Backend::Ref);
      g32 = c.bwd(x32, y16w, R32);
    }
    ASSERT_EQ(g16.size(), g32.size());
    for (size_t k = 0; k < g16.size(); ++k) {
      EXPECT_EQ(g16[k].dtype(), dt) << c.name << " " << bn << ": dtype of grad " << k;
      EXPECT_LE(rel_err(to_d(g16[k]), to_d(g32[k])), tol + c.tol_cpu) << c.name << " " << bn << ": backward grad " << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, OpHarness16,
                         ::testing::Combine(::testing::Range<size_t>(0, cases().size()),
                                            ::testing::Values(DType::BF16, DType::F16)),
                         [](const ::testing::TestParamInfo<std::tuple<size_t, DType>>& info) {
                           std::string n = cases()[std::get<0>(info.param)].name;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n + "_" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::string(dtype_name(std::get<1>(info.param)));
                         });

// ------------------------------------------------------------------ determinism

TEST(Ops, CpuKernelsAreDeterministic) {
  ops::BackendScope scope(ops::Backend::Cpu);
  const int64_t B = 2, NH = 4, T = 37, HS = 16, C = 64, V = 300, N = B * T;
  Tensor x = randn({N, C}, 1), w = randn({3 * C, C}, 2), b = randn({3 * C}, 3);
  Tensor q = randn({B, NH, T, HS}, 4), k = randn({B, NH, T, HS}, 5), v = randn({B, NH, T, HS}, 6);
  Tensor logits = randn({N, V}, 7, -5, 5);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < N; ++i) ids.push_back((i * 13) % 17);  // many repeats
  Tensor idt = Tensor::from_vector_i64(ids, {N});
  auto run = [&]() {
    TVec r;
    r.push_back(ops::matmul(x, w, false, true));
    Tensor y = ops::linear(x, w, b, ops::WeightLayout::OutIn);
    ops::LinearGrads lg = ops::linear_backward(y, x, w, ops::WeightLayout::OutIn);
    r.insert(r.end(), {y, lg.gx, lg.gw, lg.gb});
    ops::LayerNormOut ln = ops::layer_norm(x, b.narrow(0, 0, C), b.narrow(0, C, C), 1e-5);
    ops::LayerNormGrads lng = ops::layer_norm_backward(x, x, b.narrow(0, 0, C), ln.mean, ln.rstd);
    r.insert(r.end(), {ln.y, ln.rstd, lng.gx, lng.gw, lng.gb});
    ops::AttentionOut at = ops::attention(q, k, v, true, 0.25);
    ops::AttentionGrads ag = ops::attention_backward(v, q, k, v, at.out, at.lse, true, 0.25);
    r.insert(r.end(), {at.out, at.lse, ag.gq, ag.gk, ag.gv});
    ops::CrossEntropyOut ce = ops::cross_entropy(logits, idt);
    r.insert(r.end(), {ce.loss, ops::cross_entropy_backward(1.0, logits, idt, ce.lse)});
    r.push_back(ops::embedding_backward(x, idt, 17));
    r.push_back(ops::sum(logits, {0}));
    r.push_back(ops::sum_all(logits));
    r.push_back(ops::sum_to(ops::gelu(x), {C}));
    r.push_back(ops::softmax(logits));
    return r;
  };
  const TVec r1 = run(), r2 = run();
  ASSERT_EQ(r1.size(), r2.size());
  for (size_t i = 0; i < r1.size(); ++i) EXPECT_TRUE(bitwise_equal(r1[i], r2[i])) << "result " << i;
}

// ------------------------------------------------------------------ parallel branches and thread counts
//
// The harness shapes above stay below the OpenMP thresholds of ops/cpu, so they only
// run the serial branches. The big cases (BigCase, in the families' case files) are sized just
// above each threshold:
//   elementwise.cpp  kParallelMin = 1 << 15   (n, N * C, V * C)
//   norm.cpp         kParallelMin = 1 << 14   (N * C, N * V)
//   attention.cpp    BH * T * T * HS > 1 << 16 (row / head loops), BH * T * HS > 1 << 15 (k, v transposes)
//   cpu/gemm.cpp     gather n > 1 << 15; linear_backward's bias grad is column_sum (elementwise.cpp)
//   core/tensor.cpp  copy_kernel n > 1 << 16  (StridedCopyParallelBranch below)
// Each case runs forward and backward on Ref once and on Cpu with 1, 2 and 3 OpenMP
// threads; every Cpu run must match Ref within the op's harness tolerance. Outputs of
// kernels whose file comment claims results independent of the thread count
// (elementwise.cpp, norm.cpp) must be bitwise identical across thread counts.
// No finite differences here: the harness above checks the maths on small shapes.

class ParallelBranches : public ::testing::TestWithParam<size_t> {};

TEST_P(ParallelBranches, CpuMatchesRefAtOneTwoAndThreeThreads) {
  const BigCase& c = big_cases()[GetParam()];
  std::vector<DVec> want;
  if (c.exact) {
    want = c.exact();
  } else {
    ops::BackendScope s(ops::Backend::Ref);
    for (const Tensor& t : c.run()) want.push_back(to_d(t));
  }
  ASSERT_TRUE(c.bitwise.empty() || c.bitwise.size() == want.size()) << c.name;
  const int before = omp_get_max_threads();
  std::vector<TVec> runs;
  for (int threads : {1, 2, 3}) {
    OmpThreads t(threads);
    ASSERT_EQ(omp_get_max_threads(), threads);
    ops::BackendScope s(ops::Backend::Cpu);
    runs.push_back(c.run());
    const TVec& y = runs.back();
    ASSERT_EQ(y.size(), want.size()) << c.name;
    for (size_t k = 0; k < y.size(); ++k) {
      ASSERT_EQ(y[k].numel(), int64_t(want[k].size())) << c.name << " output " << k;
      EXPECT_LE(rel_err(to_d(y[k]), want[k]), c.tol)
          << c.name << ": cpu (" << threads << " threads) vs " << (c.exact ? "double" : "ref") << ", output " << k;
    }
  }
  EXPECT_EQ(omp_get_max_threads(), before) << "thread count not restored";
  for (size_t k = 0; k < want.size(); ++k) {
    if (!c.bitwise.empty() && !c.bitwise[k]) continue;
    for (size_t r = 1; r < runs.size(); ++r)
      EXPECT_TRUE(bitwise_equal(runs[0][k], runs[r][k]))
          << c.name << ": output " << k << " differs between 1 and " << r + 1 << " threads";
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, ParallelBranches, ::testing::Range<size_t>(0, big_cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) { return big_cases()[info.param].name; });

TEST(Ops, StridedCopyParallelBranch) {
  // core/tensor.cpp copy_kernel: parallel over rows when n > 1 << 16. Expected values by index.
  const int64_t R = 300, C = 257;  // 77100 elements
  const Tensor x = randn({R, C}, 127);
  const std::vector<float> xv = x.to_vector();
  for (int threads : {1, 2, 3}) {
    OmpThreads t(threads);
    // Contiguous -> contiguous (flat loop).
    EXPECT_EQ(x.clone().to_vector(), xv) << threads << " threads";
    // Strided source: the transpose, made contiguous.
    const Tensor xt = x.transpose(0, 1).contiguous();  // (C, R)
    ASSERT_TRUE(xt.is_contiguous());
    const float* p = xt.data<float>();
    int64_t bad = 0;
    for (int64_t i = 0; i < C; ++i)
      for (int64_t j = 0; j < R; ++j) bad += p[i * R + j] != xv[size_t(j * C + i)];
    EXPECT_EQ(bad, 0) << "transpose().contiguous(), " << threads << " threads";
    // Strided destination: every other column of a wider buffer; the gaps stay untouched.
    Tensor store = Tensor::full({R, 2 * C + 1}, -7.0);  // (R, 2C + 1)
    store.slice(1, 1, 2 * C + 1, 2).copy_(x);
    const float* s = store.data<float>();
    bad = 0;
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < 2 * C + 1; ++j)
        bad += s[i * (2 * C + 1) + j] != (j % 2 == 1 ? xv[size_t(i * C + j / 2)] : -7.0f);
    EXPECT_EQ(bad, 0) << "copy_ into a strided view, " << threads << " threads";
    // Conversion on the strided path: f32 transpose -> i64 (exact for integer values).
    const Tensor xi = ops::mul_scalar(x, 1000.0).transpose(0, 1).to(DType::I64);  // (C, R), i64
    const std::vector<int64_t> iv = xi.to_vector_i64();
    bad = 0;
    for (int64_t i = 0; i < C; ++i)
      for (int64_t j = 0; j < R; ++j) bad += iv[size_t(i * R + j)] != int64_t(xv[size_t(j * C + i)] * 1000.0f);
    EXPECT_EQ(bad, 0) << "transpose().to(i64), " << threads << " threads";
  }
}

// ------------------------------------------------------------------ bad input

template <typename E, typename F>
void expect_error(F f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no exception thrown";
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "message '" << msg << "' lacks '" << p << "'";
  }
}

TEST(Ops, BadInputsGiveHelpfulErrors) {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4, 3});
  expect_error<ShapeError>([&] { ops::add(a, b); }, {"add", "(2, 3)", "(4, 3)", "broadcast"});
  expect_error<ShapeError>([&] { ops::matmul(a, a); }, {"matmul", "inner", "K = 3", "K = 2"});
  expect_error<ShapeError>([&] { ops::matmul(a, Tensor::zeros({3})); }, {"matmul", "2 dims"});
  expect_error<ShapeError>(
      [&] {
        ops::linear(a, Tensor::zeros({5, 4}), Tensor(), ops::WeightLayout::OutIn);
      },
      {"linear", "3 input features", "expects 4"});
  expect_error<ShapeError>([&] { ops::add(a, Tensor::zeros({2, 3}, DType::I32)); }, {"add", "f32", "i32"});
  expect_error<ValueError>(
      [&] {
        ops::embedding(Tensor::zeros({5, 2}), Tensor::from_vector_i64({1, 5}, {2}));
      },
      {"embedding", "id 5", "V = 5"});
  expect_error<ValueError>(
      [&] {
        ops::embedding(Tensor::zeros({5, 2}), Tensor::from_vector_i64({-1}, {1}));
      },
      {"id -1"});
  expect_error<ValueError>(
      [&] {
        ops::cross_entropy(Tensor::zeros({2, 4}), Tensor::from_vector_i64({1, 9}, {2}));
      },
      {"cross_entropy", "target 9", "V = 4"});
  expect_error<ShapeError>(
      [&] {
        ops::cross_entropy(Tensor::zeros({2, 4}), Tensor::from_vector_i64({1}, {1}));
      },
      {"cross_entropy", "targets"});
  expect_error<ShapeError>([&] { ops::layer_norm(a, Tensor::ones({2}), Tensor::zeros({3}), 1e-5); },
                           {"layer_norm", "'w'", "(3)"});
  expect_error<ShapeError>(
      [&] {
        ops::attention(Tensor::zeros({1, 2, 3, 4}), Tensor::zeros({1, 2, 4, 4}), Tensor::zeros({1, 2, 3, 4}), true,
                       1.0);
      },
      {"attention", "'k'"});
  expect_error<ShapeError>([&] { ops::add_(a, Tensor::zeros({4, 2, 3})); }, {"add_", "broadcast to dst"});
  expect_error<ShapeError>([&] { ops::sum_to(a, {4}); }, {"sum_to"});
  expect_error<ShapeError>([&] { ops::sum(a, {2}); }, {"sum", "out of range"});
  expect_error<ValueError>([&] { ops::add_(Tensor::zeros({3}).expand({2, 3}), a); }, {"add_", "expanded"});
}

// Bad inputs of attention with a key padding mask, patchify and exact GELU.
TEST(EncoderOps, BadInputsGiveHelpfulErrors) {
  const Tensor q = Tensor::zeros({2, 1, 3, 4});
  expect_error<ValueError>(
      [&] {
        ops::attention(q, q, q, false, 0.5, Tensor::from_vector_i64({1, 1, 0, 1, 2, 1}, {2, 3}));
      },
      {"attention:", "0 or 1", "2"});
  expect_error<ValueError>(
      [&] {
        ops::attention(q, q, q, false, 0.5, Tensor::from_vector_i64({1, 1, 0, 0, 0, 0}, {2, 3}));
      },
      {"attention:", "row 1", "every key"});
  expect_error<ShapeError>(
      [&] {
        ops::attention(q, q, q, false, 0.5, Tensor::ones({2, 4}));
      },
      {"attention:", "(B, T)", "(2, 3)", "(2, 4)"});
  expect_error<ValueError>(
      [&] {
        ops::attention(q, q, q, true, 0.5, Tensor::ones({2, 3}));
      },
      {"attention:", "key padding mask", "causal = false"});
  expect_error<ShapeError>(
      [&] {
        ops::patchify(Tensor::zeros({1, 3, 8, 10}), 4);
      },
      {"patchify", "8x10", "multiples", "4"});
  expect_error<ShapeError>([&] { ops::patchify(Tensor::zeros({3, 8, 8}), 4); }, {"patchify", "(N, C, H, W)"});
  expect_error<ShapeError>([&] { ops::gelu_erf(Tensor::zeros({3}, DType::I32)); }, {"gelu_erf", "'x'"});
}

TEST(Ops, ZeroDimAndEmpty) {
  for (auto be : {ops::Backend::Ref, ops::Backend::Cpu}) {
    ops::BackendScope s(be);
    Tensor x = Tensor::full({}, 3.0);
    EXPECT_EQ(ops::add(x, Tensor::from_vector({1, 2}, {2})).to_vector(), (std::vector<float>{4, 5}));
    EXPECT_EQ(ops::sum_all(Tensor::zeros({0, 3})).item(), 0.0);
    EXPECT_EQ(ops::matmul(Tensor::zeros({2, 0}), Tensor::zeros({0, 3})).to_vector(), std::vector<float>(6, 0.f));
  }
}

// ------------------------------------------------------------------ 16-bit: ops::cast

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// f32 values that exercise every branch of the scalar conversions, then random bit patterns;
// n is odd so no size is a multiple of 16.
std::vector<float> conversion_values() {
  std::vector<float> v;
  const float inf = std::numeric_limits<float>::infinity();
  for (uint32_t u : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fbfffffu, 0x7f801234u, 0x7fffffffu,
                     0xffffe000u, 0x7f802000u})  // quiet, signalling, payload and negative NaNs
    v.push_back(f32_from_bits(u));
  for (float f : {inf, -inf, 0.0f, -0.0f, 1.0f, -1.0f}) v.push_back(f);
  // f32 denormals (bf16 keeps them; f16 flushes them to +-0 by rounding) and the smallest normal.
  for (uint32_t u : {0x00000001u, 0x00000002u, 0x00008000u, 0x00008001u, 0x00018000u, 0x0007ffffu, 0x007fffffu,
                     0x00400000u, 0x00800000u, 0x807fffffu, 0x80000001u, 0x80018000u})
    v.push_back(f32_from_bits(u));
  // f16: max, overflow boundary (65520 rounds to Inf, just below stays 65504), subnormals and
  // the underflow ties around 2^-25.
  for (float f : {65504.0f, 65519.996f, 65520.0f, 65536.0f, 1e10f, -65520.0f, -65504.0f, 6.1035156e-5f /*2^-14*/,
                  6.0975552e-5f /*largest subnormal*/, 5.9604645e-8f /*2^-24*/, 2.9802322e-8f /*2^-25: tie -> 0*/,
                  2.9802326e-8f /*just above: -> 2^-24*/, 8.940697e-8f /*1.5 * 2^-24: tie -> even 2^-23*/, 1.0e-6f,
                  -3.0e-7f, 1.0e-9f})
    v.push_back(f);
  // Ties: 1 + 2^-8 and 1 + 3 * 2^-8 (bf16, to even: 1 and 1 + 2^-6), 1 + 2^-11 and 1 + 3 * 2^-11 (f16).
  for (float f : {1.00390625f, 1.01171875f, -1.00390625f, 1.00048828125f, 1.00146484375f, 3.3895314e38f /*bf16 max*/,
                  3.4028235e38f /*f32 max: bf16 rounds up to Inf*/})
    v.push_back(f);
  // Every bf16 and f16 value, widened (exact), and the halfway points between neighbours.
  for (uint32_t h = 0; h < 65536; h += 7) {
    v.push_back(bf16_to_float(uint16_t(h)));
    v.push_back(f32_from_bits((uint32_t(h) << 16) | 0x8000u));  // bf16 tie
    v.push_back(f16_to_float(uint16_t(h)));
  }
  std::mt19937 rng(99);
  for (int i = 0; i < 60001; ++i) v.push_back(f32_from_bits(uint32_t(rng())));
  if (v.size() % 16 == 0) v.push_back(0.5f);
  return v;
}

Tensor f32_tensor_bits(const std::vector<float>& v, const Shape& s) {
  Tensor t = Tensor::empty(s);  // s
  if (!v.empty()) std::memcpy(t.raw_data(), v.data(), v.size() * 4);
  return t;
}
std::vector<uint16_t> u16_of(const Tensor& t) {
  Tensor c = t.contiguous();
  std::vector<uint16_t> r(size_t(c.numel()));
  if (!r.empty()) std::memcpy(r.data(), c.raw_data(), r.size() * 2);
  return r;
}
std::vector<uint32_t> u32_of(const Tensor& t) {
  Tensor c = t.contiguous();
  std::vector<uint32_t> r(size_t(c.numel()));
  if (!r.empty()) std::memcpy(r.data(), c.raw_data(), r.size() * 4);
  return r;
}
uint16_t scalar16(DType dt, float f) { return dt == DType::BF16 ? float_to_bf16(f) : float_to_f16(f); }
float widen16(DType dt, uint16_t h) { return dt == DType::BF16 ? bf16_to_float(h) : f16_to_float(h); }

// Counts positions where got != want and reports the first.
template <typename T>
int64_t mismatches(const std::vector<T>& got, const std::vector<T>& want, const std::vector<float>& in,
                   const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i)
    if (got[i] != want[i] && bad++ == 0)
      ADD_FAILURE() << what << ": element " << i << " input bits 0x" << std::hex
                    << (i < in.size() ? f32_bits(in[i]) : 0u) << " got 0x" << uint64_t(got[i]) << " want 0x"
                    << uint64_t(want[i]);
  return bad;
}

TEST(Ops16, CastFromF32IsBitwiseTheScalarConversion) {
  const std::vector<float> v = conversion_values();
  const int64_t n = int64_t(v.size());
  ASSERT_GT(n, 1 << 16);  // above the OpenMP threshold of cpu/cast.cpp
  ASSERT_NE(n % 16, 0);
  const Tensor x = f32_tensor_bits(v, {n});
  // Strided views of the same values: a transpose (inner stride != 1) and every other column
  // of a wider buffer (rows with inner stride 2); odd widths, so rows are not multiples of 16.
  const int64_t R = 9, C = 1021;
  const std::vector<float> vs(v.begin(), v.begin() + R * C);
  const Tensor xt = f32_tensor_bits(vs, {C, R}).transpose(0, 1);  // (R, C) viewing a (C, R) buffer
  std::vector<float> vt(size_t(R * C));                           // logical order of xt
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < C; ++j) vt[size_t(i * C + j)] = vs[size_t(j * R + i)];
  Tensor wide = Tensor::zeros({R, 2 * C + 1});  // (R, 2C + 1)
  Tensor xs = wide.slice(1, 1, 2 * C + 1, 2);   // (R, C), stride 2
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < C; ++j) wide.data<float>()[i * (2 * C + 1) + 1 + 2 * j] = vs[size_t(i * C + j)];
  const Tensor xr = f32_tensor_bits(v, {n}).narrow(0, 3, C * R).reshape({R, C});  // offset view
  const std::vector<float> vr(v.begin() + 3, v.begin() + 3 + R * C);

  for (DType dt : {DType::BF16, DType::F16}) {
    auto want = [&](const std::vector<float>& in) {
      std::vector<uint16_t> w;
      for (float f : in) w.push_back(scalar16(dt, f));
      return w;
    };
    const std::vector<uint16_t> wv = want(v), wt = want(vt), ws = want(vs), wr = want(vr);
    for (auto be : {ops::Backend::Ref, ops::Backend::Cpu})
      for (int threads : {1, 2, 3}) {
        if (be == ops::Backend::Ref && threads > 1) continue;
        OmpThreads th(threads);
        ops::BackendScope s(be);
        const std::string tag = std::string(dtype_name(dt)) + (be == ops::Backend::Cpu ? " cpu " : " ref ") +
                                std::to_string(threads) + " threads";
        Tensor y = ops::cast(x, dt);
        EXPECT_EQ(y.dtype(), dt);
        EXPECT_TRUE(y.is_contiguous());
        EXPECT_EQ(mismatches(u16_of(y), wv, v, "contiguous f32->" + tag), 0);
        EXPECT_EQ(mismatches(u16_of(ops::cast(xt, dt)), wt, vt, "transposed f32->" + tag), 0);
        EXPECT_EQ(mismatches(u16_of(ops::cast(xs, dt)), ws, vs, "stride-2 f32->" + tag), 0);
        EXPECT_EQ(mismatches(u16_of(ops::cast(xr, dt)), wr, vr, "offset f32->" + tag), 0);
        // Every small size (tails of the 16-lane loop).
        for (int64_t m = 0; m < 40; ++m)
          EXPECT_EQ(
              mismatches(u16_of(ops::cast(x.narrow(0, 5, m), dt)),
                         std::vector<uint16_t>(wv.begin() + 5, wv.begin() + 5 + m),
                         std::vector<float>(v.begin() + 5, v.begin() + 5 + m), tag + " size " + std::to_string(m)),
              0);
      }
  }
}

TEST(Ops16, CastFrom16BitIsBitwiseTheScalarConversion) {
  // Every 16-bit pattern (NaNs, Inf, subnormals included), plus 7 more: 65543 elements.
  const int64_t n = 65536 + 7;
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) bits[size_t(i)] = uint16_t(i * 40503 % 65536);  // a permutation + 7 repeats
  for (DType from : {DType::BF16, DType::F16}) {
    Tensor h = Tensor::empty({n}, from);  // (n)
    std::memcpy(h.raw_data(), bits.data(), bits.size() * 2);
    std::vector<uint32_t> want32;
    std::vector<float> wf;
    for (uint16_t b : bits) {
      wf.push_back(widen16(from, b));
      want32.push_back(f32_bits(wf.back()));
    }
    const DType other = from == DType::BF16 ? DType::F16 : DType::BF16;
    std::vector<uint16_t> want_other;
    for (float f : wf) want_other.push_back(scalar16(other, f));
    // Strided: the transposed (R, C) view of the same bits.
    const int64_t R = 11, C = 4001;
    Tensor ht = Tensor::empty({C, R}, from);  // (C, R)
    std::memcpy(ht.raw_data(), bits.data(), size_t(R * C) * 2);
    std::vector<uint32_t> want_t;
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < C; ++j) want_t.push_back(want32[size_t(j * R + i)]);
    for (auto be : {ops::Backend::Ref, ops::Backend::Cpu})
      for (int threads : {1, 2, 3}) {
        if (be == ops::Backend::Ref && threads > 1) continue;
        OmpThreads th(threads);
        ops::BackendScope s(be);
        const std::string tag = std::string(dtype_name(from)) + (be == ops::Backend::Cpu ? " cpu " : " ref ") +
                                std::to_string(threads) + " threads";
        EXPECT_EQ(mismatches(u32_of(ops::cast(h, DType::F32)), want32, {}, tag + "->f32"), 0);
        EXPECT_EQ(mismatches(u32_of(ops::cast(ht.transpose(0, 1), DType::F32)), want_t, {}, tag + "->f32 strided"), 0);
        EXPECT_EQ(mismatches(u16_of(ops::cast(h, other)), want_other, {}, tag + "->other 16-bit"), 0);
        for (int64_t m = 0; m < 40; ++m)
          EXPECT_EQ(mismatches(u32_of(ops::cast(h.narrow(0, 3, m), DType::F32)),
                               std::vector<uint32_t>(want32.begin() + 3, want32.begin() + 3 + m), {},
                               tag + " size " + std::to_string(m)),
                    0);
      }
  }
}

TEST(Ops16, CastIsAFreshTaggedCopyAndRejectsIntegers) {
  const Tensor x = randn({4, 6}, 31).transpose(0, 1);  // (6, 4), strided
  for (auto be : {ops::Backend::Ref, ops::Backend::Cpu}) {
    ops::BackendScope s(be);
    MemTagScope tag(MemTag::Activations);
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
      const Tensor y = ops::cast(x, dt);
      EXPECT_EQ(y.tag(), MemTag::Activations);
      EXPECT_EQ(y.shape(), x.shape());
      EXPECT_TRUE(y.is_contiguous());
      EXPECT_FALSE(y.same_storage(x));
      const Tensor z = ops::cast(y, dt);  // same dtype: still a fresh copy
      EXPECT_FALSE(z.same_storage(y));
      EXPECT_TRUE(bitwise_equal(z, y));
      EXPECT_TRUE(bitwise_equal(y, x.to(dt)));  // Tensor::to uses the scalar conversions
    }
    const Tensor e = ops::cast(Tensor::zeros({0, 3}), DType::BF16);
    EXPECT_EQ(e.shape(), Shape({0, 3}));
  }
  expect_error<ShapeError>([&] { ops::cast(Tensor::zeros({2}, DType::I32), DType::F32); }, {"cast", "'x'", "i32"});
  expect_error<ShapeError>([&] { ops::cast(x, DType::I64); }, {"cast", "i64"});
  expect_error<ValueError>([&] { ops::cast(Tensor(), DType::F32); }, {"cast", "undefined"});
}

// ------------------------------------------------------------------ 16-bit: dtype rules with mixed dtypes

// The contract of ops.h for inputs of different floating dtypes, on both backends; values are
// checked against the same op on the inputs widened to f32 (one rounding of the output).
TEST(Ops16, MixedDtypeRules) {
  const DType F32 = DType::F32, BF = DType::BF16, H = DType::F16;
  auto r = [](const Shape& s, unsigned seed, DType dt, double lo = -1, double hi = 1) {
    return randn(s, seed, lo, hi).to(dt);
  };
  auto w32 = [](const Tensor& t) { return t.to(DType::F32); };
  for (auto be : {ops::Backend::Ref, ops::Backend::Cpu}) {
    ops::BackendScope s(be);
    SCOPED_TRACE(be == ops::Backend::Ref ? "ref" : "cpu");
    auto near = [](const Tensor& got, const Tensor& want, double tol) {
      EXPECT_LE(rel_err(to_d(got), to_d(want)), tol);
    };
    const Tensor a16 = r({3, 5}, 1, BF), b32 = r({3, 5}, 2, F32), c16 = r({5}, 3, H);
    // elementwise
    EXPECT_EQ(ops::add(a16, a16).dtype(), BF);
    EXPECT_EQ(ops::add(a16, b32).dtype(), F32);
    EXPECT_TRUE(bitwise_equal(ops::add(a16, b32), ops::add(w32(a16), b32)));  // widening is exact
    EXPECT_EQ(ops::mul(a16, c16).dtype(), F32);
    EXPECT_EQ(ops::div(c16, c16).dtype(), H);
    EXPECT_EQ(ops::exp(c16).dtype(), H);
    EXPECT_EQ(ops::sum(a16, {0}).dtype(), BF);
    EXPECT_EQ(ops::mean(a16, {}).dtype(), BF);
    EXPECT_TRUE(bitwise_equal(ops::mean(a16, {1}), ops::mean(w32(a16), {1}).to(BF)));  // one rounding
    EXPECT_EQ(ops::sum_to(a16, {5}).dtype(), BF);
    EXPECT_EQ(ops::sum_squares(a16), ops::sum_squares(w32(a16)));
    // in place: dst keeps its dtype, computed in f32 and rounded once
    {
      Tensor d = a16.clone();
      ops::add_(d, b32, -0.5);
      EXPECT_EQ(d.dtype(), BF);
      Tensor want = w32(a16);
      ops::add_(want, b32, -0.5);
      EXPECT_TRUE(bitwise_equal(d, want.to(BF)));
      Tensor d32 = b32.clone();
      ops::add_(d32, c16, 2.0);  // f32 dst, f16 src
      Tensor want32 = b32.clone();
      ops::add_(want32, w32(c16), 2.0);
      EXPECT_TRUE(bitwise_equal(d32, want32));
      Tensor dh = Tensor::empty({5, 3}, H).transpose(0, 1);  // (3, 5) strided f16 dst
      dh.copy_(a16);
      ops::mul_scalar_(dh, 0.3);
      EXPECT_EQ(dh.dtype(), H);
      EXPECT_TRUE(bitwise_equal(dh, ops::mul_scalar(w32(a16), 0.3).to(H)));
    }
    // matmul / linear
    const Tensor x16 = r({4, 6}, 4, BF), w16 = r({3, 6}, 5, BF), w32t = r({3, 6}, 6, F32);
    EXPECT_EQ(ops::matmul(x16, w16, false, true).dtype(), BF);
    EXPECT_EQ(ops::matmul(x16, w32t, false, true).dtype(), F32);
    EXPECT_EQ(ops::matmul(x16.to(H), w16.to(H), false, true).dtype(), H);
    EXPECT_EQ(ops::matmul(x16, w16.to(H), false, true).dtype(), F32);
    for (const Tensor& bias : {Tensor(), r({3}, 7, F32), r({3}, 8, BF), r({3}, 9, H)}) {
      SCOPED_TRACE(bias.defined() ? std::string(dtype_name(bias.dtype())) : "no bias");
      const Tensor y = ops::linear(x16, w16, bias, ops::WeightLayout::OutIn);
      EXPECT_EQ(y.dtype(), BF);
      ops::BackendScope rs(ops::Backend::Ref);
      near(y, ops::linear(w32(x16), w32(w16), bias.defined() ? w32(bias) : Tensor(), ops::WeightLayout::OutIn), kBf16);
    }
    EXPECT_EQ(ops::linear(x16, w32t, Tensor(), ops::WeightLayout::OutIn).dtype(), F32);
    EXPECT_EQ(ops::linear(x16.to(H), w16.to(H), r({3}, 10, F32), ops::WeightLayout::OutIn).dtype(), H);
    {
      const Tensor gy32 = r({4, 3}, 11, F32);
      ops::LinearGrads g = ops::linear_backward(gy32, x16, w32t, ops::WeightLayout::OutIn);
      EXPECT_EQ(g.gx.dtype(), BF);
      EXPECT_EQ(g.gw.dtype(), F32);
      EXPECT_EQ(g.gb.dtype(), F32);
      ops::LinearGrads h = ops::linear_backward(gy32.to(H), x16, w16, ops::WeightLayout::OutIn);
      EXPECT_EQ(h.gx.dtype(), BF);
      EXPECT_EQ(h.gw.dtype(), BF);
      EXPECT_EQ(h.gb.dtype(), H);
      ops::LinearGrads k = ops::linear_backward(gy32.to(BF), x16, w16, ops::WeightLayout::OutIn, false, true, false);
      EXPECT_FALSE(k.gx.defined());
      EXPECT_EQ(k.gw.dtype(), BF);
      EXPECT_FALSE(k.gb.defined());
    }
    // embedding
    {
      const Tensor wt = r({7, 5}, 12, BF), ids = Tensor::from_vector_i64({3, 0, 6, 3}, {2, 2});
      const Tensor y = ops::embedding(wt, ids);
      EXPECT_EQ(y.dtype(), BF);
      EXPECT_TRUE(bitwise_equal(y, ops::embedding(w32(wt), ids).to(BF)));  // rows copied exactly
      EXPECT_TRUE(bitwise_equal(ops::embedding(wt.to(H).transpose(0, 1).contiguous().transpose(0, 1), ids),
                                ops::embedding(w32(wt), ids).to(H)));
      EXPECT_EQ(ops::embedding_backward(r({2, 2, 5}, 13, H), ids, 7).dtype(), H);
    }
    // layer norm: y x's dtype, mean/rstd f32; grads gx x's, gw gb w's
    {
      const Tensor x = r({4, 8}, 14, BF, -2, 2), w = r({8}, 15, F32, 0.5, 1.5), b = r({8}, 16, H);
      ops::LayerNormOut o = ops::layer_norm(x, w, b, 1e-5);
      EXPECT_EQ(o.y.dtype(), BF);
      EXPECT_EQ(o.mean.dtype(), F32);
      EXPECT_EQ(o.rstd.dtype(), F32);
      ops::LayerNormGrads g = ops::layer_norm_backward(r({4, 8}, 17, H), x, w, o.mean, o.rstd);
      EXPECT_EQ(g.gx.dtype(), BF);
      EXPECT_EQ(g.gw.dtype(), F32);
      EXPECT_EQ(g.gb.dtype(), F32);
      EXPECT_EQ(ops::layer_norm(x, w.to(H), Tensor(), 1e-5).y.dtype(), BF);
    }
    // attention: out q's, lse f32; grads q's, k's, v's dtypes
    {
      const Shape sh{1, 2, 5, 4};
      const Tensor q = r(sh, 18, BF), k = r(sh, 19, F32), v = r(sh, 20, H);
      ops::AttentionOut o = ops::attention(q, k, v, true, 0.5);
      EXPECT_EQ(o.out.dtype(), BF);
      EXPECT_EQ(o.lse.dtype(), F32);
      ops::AttentionGrads g = ops::attention_backward(r(sh, 21, F32), q, k, v, o.out, o.lse, true, 0.5);
      EXPECT_EQ(g.gq.dtype(), BF);
      EXPECT_EQ(g.gk.dtype(), F32);
      EXPECT_EQ(g.gv.dtype(), H);
    }
    // cross-entropy: loss, lse f32; glogits logits' dtype
    {
      const Tensor logits = r({3, 9}, 22, H, -3, 3), t = Tensor::from_vector_i64({1, -100, 8}, {3});
      ops::CrossEntropyOut o = ops::cross_entropy(logits, t);
      EXPECT_EQ(o.loss.dtype(), F32);
      EXPECT_EQ(o.lse.dtype(), F32);
      EXPECT_TRUE(bitwise_equal(o.loss, ops::cross_entropy(w32(logits), t).loss));  // widening is exact
      EXPECT_EQ(ops::cross_entropy_backward(1.0, logits, t, o.lse).dtype(), H);
    }
    // gelu / softmax backward: the dtype of what they differentiate
    EXPECT_EQ(ops::gelu_backward(b32, a16).dtype(), BF);
    EXPECT_EQ(ops::softmax_backward(b32, ops::softmax(a16)).dtype(), BF);
    EXPECT_EQ(ops::softmax(c16.reshape({1, 5})).dtype(), H);
    // dropout: y and mask in x's dtype; y == x * mask with the stored (rounded) mask
    for (DType dt : {BF, H}) {
      Generator g1(5), g2(5);
      const Tensor x = r({40, 30}, 23, dt);
      ops::DropoutOut o = ops::dropout(x, 0.3, g1);
      EXPECT_EQ(o.y.dtype(), dt);
      EXPECT_EQ(o.mask.dtype(), dt);
      EXPECT_TRUE(bitwise_equal(o.mask, ops::dropout(w32(x), 0.3, g2).mask.to(dt)));  // same draws
      EXPECT_TRUE(bitwise_equal(ops::dropout_backward(x, o.mask), o.y));
      EXPECT_EQ(ops::dropout_backward(r({40, 30}, 25, F32), o.mask).dtype(), dt);  // gx: the mask's (x's) dtype
      Generator g3(5);
      EXPECT_TRUE(bitwise_equal(ops::dropout(x, 0.0, g3).y, x));
    }
  }
  // Integer and undefined inputs keep their errors, naming the op and the argument.
  const Tensor a16 = randn({2, 3}, 24).to(BF);
  expect_error<ShapeError>([&] { ops::add(a16, Tensor::zeros({2, 3}, DType::I32)); }, {"add", "'b'", "i32"});
  expect_error<ShapeError>(
      [&] {
        ops::linear(a16, Tensor::zeros({4, 3}, DType::I64), Tensor(), ops::WeightLayout::OutIn);
      },
      {"linear", "'w'", "i64"});
  expect_error<ShapeError>([&] { ops::layer_norm(a16, Tensor::ones({3}, DType::I32), Tensor(), 1e-5); },
                           {"layer_norm", "'w'"});
  expect_error<ValueError>([&] { ops::exp(Tensor()); }, {"exp", "undefined"});
  expect_error<ShapeError>([&] { ops::add_(a16, Tensor::zeros({3}, DType::I32)); }, {"add_", "'src'"});
}

// ------------------------------------------------------------------ 16-bit: the native cpu kernels
//
// On the cpu backend, ops whose floating inputs are one 16-bit dtype run native 16-bit
// kernels (cpu/kernels.h): pieces/rows/heads widened into per-thread f32 buffers, the f32
// kernel's arithmetic, one rounding per output. The contract is that this is bitwise the
// widened path (ops::cast to f32 copies, the f32 kernel, ops::cast back), which the test hook
// cpu::Native16Scope(false) selects. Checked on every case of the op table (their layouts:
// contiguous, transposed, sliced, expanded), on special values, and above the OpenMP
// thresholds at 1, 2 and 3 threads; plus: the native ops allocate no f32 copies.

// Same dtype, shape and bits. With any_nan, two NaNs count as equal whatever their sign and
// payload: when two NaNs meet in one addition, x86 keeps the first operand's, and that order
// is the compiler's choice per loop (the f32 column sums themselves keep one operand's NaN in
// their vector body and the other's in their scalar tail).
::testing::AssertionResult same_bits(const Tensor& got, const Tensor& want, bool any_nan = false) {
  if (got.defined() != want.defined()) return ::testing::AssertionFailure() << "one output is undefined";
  if (!got.defined()) return ::testing::AssertionSuccess();
  if (got.dtype() != want.dtype())
    return ::testing::AssertionFailure() << "dtype " << dtype_name(got.dtype()) << " vs " << dtype_name(want.dtype());
  if (got.shape() != want.shape())
    return ::testing::AssertionFailure() << "shape " << shape_str(got.shape()) << " vs " << shape_str(want.shape());
  const Tensor a = got.contiguous(), b = want.contiguous();
  const size_t es = dtype_size(a.dtype());
  const char* pa = static_cast<const char*>(a.raw_data());
  const char* pb = static_cast<const char*>(b.raw_data());
  const Tensor af = any_nan ? a.to(DType::F32) : Tensor(), bf = any_nan ? b.to(DType::F32) : Tensor();
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::memcmp(pa + size_t(i) * es, pb + size_t(i) * es, es) != 0 &&
        !(any_nan && std::isnan(af.data<float>()[i]) && std::isnan(bf.data<float>()[i])))
      return ::testing::AssertionFailure()
             << "first difference at flat element " << i << " of " << a.numel() << " (got "
             << a.reshape({a.numel()}).narrow(0, i, 1).to(DType::F32).item() << ", widened path "
             << b.reshape({b.numel()}).narrow(0, i, 1).to(DType::F32).item() << ")";
  return ::testing::AssertionSuccess();
}

// f(), natively and on the widened path (same thread count), compared output by output
// (any_nan: for these outputs, see same_bits).
void expect_native_is_widened(const std::function<TVec()>& f, const std::string& what,
                              const std::vector<size_t>& any_nan = {}) {
  const TVec native = f();
  TVec widened;
  {
    ops::cpu::Native16Scope off(false);
    ASSERT_FALSE(ops::cpu::native16_enabled());
    widened = f();
  }
  ASSERT_TRUE(ops::cpu::native16_enabled());
  ASSERT_EQ(native.size(), widened.size()) << what;
  for (size_t k = 0; k < native.size(); ++k) {
    const bool nan_ok = std::find(any_nan.begin(), any_nan.end(), k) != any_nan.end();
    EXPECT_TRUE(same_bits(native[k], widened[k], nan_ok)) << what << ", output " << k;
  }
}

class Native16 : public ::testing::TestWithParam<std::tuple<size_t, DType>> {};

TEST_P(Native16, BitwiseTheWidenedPath) {
  const auto [ci, dt] = GetParam();
  const OpCase& c = cases()[ci];
  std::mt19937 rng(1234 + unsigned(ci));
  TVec x16;
  for (const Input& x : c.inputs) x16.push_back(make_tensor(x, round_to(make_values(x, rng), dt), dt));
  ops::BackendScope s(ops::Backend::Cpu);
  TVec y16;
  expect_native_is_widened([&] { return y16 = c.fwd(x16); }, c.name + " forward");
  if (!c.bwd) return;
  std::uniform_real_distribution<double> U(-1, 1);
  DVec R(static_cast<size_t>(y16[0].numel()));
  for (auto& e : R) e = double(float(U(rng)));
  const Tensor R16 = contig_f32(round_to(R, dt), y16[0].shape()).to(dt);
  expect_native_is_widened([&] { return c.bwd(x16, y16, R16); }, c.name + " backward");
}

INSTANTIATE_TEST_SUITE_P(Ops, Native16,
                         ::testing::Combine(::testing::Range<size_t>(0, cases().size()),
                                            ::testing::Values(DType::BF16, DType::F16)),
                         [](const ::testing::TestParamInfo<std::tuple<size_t, DType>>& info) {
                           std::string n = cases()[std::get<0>(info.param)].name;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n + "_" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::string(dtype_name(std::get<1>(info.param)));
                         });

// NaN, Inf, -0, denormals, values that overflow f16: every bf16 / f16 pattern of
// conversion_values() through the native kernels, against the widened path. Bitwise, except
// which NaN survives where column sums add two NaNs (same_bits).
TEST(Ops16, NativeKernelsKeepSpecialValuesLikeTheWidenedPath) {
  ops::BackendScope s(ops::Backend::Cpu);
  const std::vector<float> v = conversion_values();
  const int64_t n = 33 * (int64_t(v.size()) / 33);  // (33, n / 33): rows of odd length
  const Tensor x32 = f32_tensor_bits(std::vector<float>(v.begin(), v.begin() + n), {n / 33, 33});
  for (DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const Tensor x = x32.to(dt), y = x32.transpose(0, 1).contiguous().to(dt).transpose(0, 1);  // y: a strided view
    expect_native_is_widened(
        [&] {
          Tensor d = x.clone();
          ops::add_(d, y, 0.3);
          Tensor e = x.clone();
          ops::mul_scalar_(e, 1e5);  // overflows f16
          return TVec{ops::add(x, y),
                      ops::mul(x, y),
                      ops::div(x, y),
                      ops::add_scalar(x, -0.0),
                      ops::neg(y),
                      ops::mul_scalar(x, 3.0),
                      ops::exp(x),
                      ops::sqrt(y),
                      ops::gelu(x),
                      ops::gelu_backward(y, x),
                      ops::sum_to(x, x.shape()),
                      d,
                      e,
                      ops::sum(y, {0})};
        },
        "special values", {13});
  }
}

// ---- above the OpenMP thresholds, 1, 2 and 3 threads (the Big16Case lists of the case files)

class Native16Parallel : public ::testing::TestWithParam<std::tuple<size_t, DType>> {};

// Native == widened at each thread count, and (as for the f32 kernels) the same bits at every
// thread count.
TEST_P(Native16Parallel, BitwiseTheWidenedPathAtOneTwoAndThreeThreads) {
  const auto [ci, dt] = GetParam();
  const Big16Case& c = big16_cases()[ci];
  ops::BackendScope s(ops::Backend::Cpu);
  std::vector<TVec> runs;
  for (int threads : {1, 2, 3}) {
    OmpThreads t(threads);
    expect_native_is_widened(
        [&] {
          runs.push_back(c.run(dt));
          return runs.back();
        },
        c.name + " at " + std::to_string(threads) + " threads");
  }
  // runs: native, widened for each thread count
  for (size_t r = 2; r < runs.size(); r += 2)
    for (size_t k = 0; k < runs[0].size(); ++k)
      EXPECT_TRUE(same_bits(runs[r][k], runs[0][k]))
          << c.name << " output " << k << ": " << r / 2 + 1 << " threads vs 1";
}

INSTANTIATE_TEST_SUITE_P(Ops, Native16Parallel,
                         ::testing::Combine(::testing::Range<size_t>(0, big16_cases().size()),
                                            ::testing::Values(DType::BF16, DType::F16)),
                         [](const ::testing::TestParamInfo<std::tuple<size_t, DType>>& info) {
                           return big16_cases()[std::get<0>(info.param)].name + "_" +
                                  std::string(dtype_name(std::get<1>(info.param)));
                         });

// ---- no f32 temporaries: the allocator's peak grows by the outputs only

TEST(Ops16, NativeKernelsAllocateOnlyTheirOutputs) {
  ops::BackendScope s(ops::Backend::Cpu);
  Allocator& al = Allocator::instance();
  const int64_t B = 4, T = 128, C = 256, NH = 4, HS = C / NH, N = B * T * C;  // N = 131072
  auto r16 = [](const Shape& sh, unsigned seed) { return randn(sh, seed).to(DType::BF16); };
  const Tensor x = r16({B * T, C}, 1), y = r16({B * T, C}, 2), bias = r16({C}, 3), w = r16({C}, 4);
  const Tensor q = r16({B, NH, T, HS}, 5), k = r16({B, NH, T, HS}, 6), v = r16({B, NH, T, HS}, 7);
  const Tensor logits = r16({B * T, 512}, 8);
  std::vector<int64_t> tv;
  for (int64_t i = 0; i < B * T; ++i) tv.push_back((i * 37) % 512);
  const Tensor targets = Tensor::from_vector_i64(tv, {B * T});
  const ops::AttentionOut att = ops::attention(q, k, v, true, 0.125);
  const ops::LayerNormOut ln = ops::layer_norm(x, w, bias, 1e-5);
  const ops::CrossEntropyOut ce = ops::cross_entropy(logits, targets);
  auto rs = [](int64_t bytes) { return int64_t(Allocator::round_size(size_t(bytes))); };
  const int64_t h = rs(2 * N), slack = 16384;  // one bf16 (B*T, C) output; slack: small f32 side tensors
  struct Check {
    const char* name;
    std::function<void()> run;
    int64_t outputs;         // bytes the op's outputs take
    int64_t per_thread = 0;  // scratch allowed per OpenMP thread (from the caching allocator)
  };
  // The attention kernels widen one head at a time into per-thread f32 buffers (at most 8
  // (T, HS) arrays in the backward) plus two 64 x 128 f32 tiles; a whole widened q, k or v
  // (B * NH heads) is far over this budget at two threads.
  const int64_t head_scratch = rs(4 * (8 * T * HS + 2 * 64 * 128 + T));
  const std::vector<Check> checks = {
      {"add", [&] { ops::add(x, y); }, h},
      {"add (broadcast)", [&] { ops::add(x, bias); }, h},
      {"mul_scalar", [&] { ops::mul_scalar(x, 0.5); }, h},
      {"add_", [&] { ops::add_(x, y, 0.5); }, 0},
      {"mul_scalar_", [&] { ops::mul_scalar_(x, 1.0); }, 0},
      {"sum_to (same shape)", [&] { ops::sum_to(x, x.shape()); }, h},
      {"sum_to (rows)", [&] { ops::sum_to(x, {C}); }, rs(2 * C)},
      {"gelu", [&] { ops::gelu(x); }, h},
      {"gelu_backward", [&] { ops::gelu_backward(y, x); }, h},
      {"dropout",
       [&] {
         Generator g(1);
         ops::dropout(x, 0.1, g);
       },
       2 * h},
      {"dropout_backward", [&] { ops::dropout_backward(y, x); }, h},
      {"softmax", [&] { ops::softmax(x); }, h},
      {"softmax_backward", [&] { ops::softmax_backward(y, x); }, h},
      {"layer_norm", [&] { ops::layer_norm(x, w, bias, 1e-5); }, h + 2 * rs(4 * B * T)},
      {"layer_norm_backward", [&] { ops::layer_norm_backward(y, x, w, ln.mean, ln.rstd); }, h + 2 * rs(2 * C)},
      {"attention", [&] { ops::attention(q, k, v, true, 0.125); }, h + rs(4 * B * NH * T), head_scratch},
      {"attention_backward", [&] { ops::attention_backward(q, q, k, v, att.out, att.lse, true, 0.125); }, 3 * h,
       head_scratch},
      {"cross_entropy", [&] { ops::cross_entropy(logits, targets); }, rs(4) + rs(4 * B * T)},
      {"cross_entropy_backward", [&] { ops::cross_entropy_backward(1.0, logits, targets, ce.lse); },
       rs(2 * B * T * 512)},
      {"embedding_backward", [&] { ops::embedding_backward(x, targets, 512); }, rs(2 * 512 * C)},
  };
  for (const Check& c : checks) {
    for (bool native : {true, false}) {
      ops::cpu::Native16Scope scope(native);
      const int64_t live = al.stats().live_total;
      al.reset_peak();
      c.run();
      const int64_t growth = al.stats().peak_total - live;
      if (native)
        EXPECT_LE(growth, c.outputs + slack + omp_get_max_threads() * c.per_thread)
            << c.name << ": the native op allocated more than its outputs";
      else  // the test can see widened copies: the widened path allocates at least one f32 copy of x
        EXPECT_GE(growth, c.outputs + 2 * N) << c.name << " (widened path)";
    }
  }
}

}  // namespace
}  // namespace brigade::optest
