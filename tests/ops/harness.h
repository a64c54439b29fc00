// The op harness's shared pieces (after ggml's test-backend-ops): inputs with their layouts
// (contiguous, transposed/permuted, strided slices, expanded broadcast views), OpCase and its
// builders, the big cases above the OpenMP thresholds of ops/cpu, and the helpers more than one
// file of the harness needs. Each tests/ops/cases/<family>.cpp fills its family's part of the
// tables (the functions declared at the end); tests/ops/test_ops.cpp concatenates them and runs
// them (OpHarness, OpHarness16, Native16, ParallelBranches, Native16Parallel).
#pragma once
#include <fmt/format.h>
#include <omp.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "brigade/ops/ops.h"
#include "brigade/ops/ref/kernels.h"
#include "support/numeric.h"

namespace brigade::optest {

namespace ref = ops::ref;
using DVec = std::vector<double>;
using TVec = std::vector<Tensor>;

// ------------------------------------------------------------------ inputs

enum class Layout { Contig, Swap, Sliced, Expand };

struct Input {
  // clang-format off
  Shape shape;                 // logical shape
  Layout layout = Layout::Contig;
  int64_t d0 = -2, d1 = -1;    // Swap: stored with d0, d1 exchanged, viewed through transpose(d0, d1)
  int64_t exp_dim = 0;         // Expand: this dim is a size-1 tensor expanded to shape[exp_dim]
  bool diff = true;            // differentiate L with respect to this input
  double lo = -1.0, hi = 1.0;  // value range
  Input& T() { layout = Layout::Swap; d0 = -2; d1 = -1; return *this; }
  Input& Swap(int64_t a, int64_t b) { layout = Layout::Swap; d0 = a; d1 = b; return *this; }
  Input& Sliced() { layout = Layout::Sliced; return *this; }
  Input& Expand(int64_t d) { layout = Layout::Expand; exp_dim = d; return *this; }
  Input& NoDiff() { diff = false; return *this; }
  Input& Range(double a, double b) { lo = a; hi = b; return *this; }
};
// clang-format on
Input in(Shape s);
const char* layout_name(Layout l);

// Values are drawn in f32 and held in double, so both paths see identical inputs.
DVec make_values(const Input& x, std::mt19937& rng);
Tensor contig_f32(const DVec& v, const Shape& s);
// The tensor (f32, or dt with v already representable in it) an op sees for this input: a
// view with the requested layout whose logical values are v. Memory outside the view holds
// NaN, so stray reads show up.
Tensor make_tensor(const Input& x, const DVec& v, DType dt = DType::F32);
// v rounded to dt (nearest even, as the ops round); f32 values are returned unchanged.
DVec round_to(DVec v, DType dt);
DVec to_d(const Tensor& t);
// max |a - b| / max(max |b|, floor): support/numeric.h's rel_err with the harness's floor of 1e-3,
// under which values are compared in absolute terms.
inline double rel_err(const DVec& a, const DVec& b, double floor = 1e-3) { return test_support::rel_err(a, b, floor); }

// A tensor of uniform values in [lo, hi), the same for the same seed.
Tensor randn(const Shape& s, unsigned seed, double lo = -1, double hi = 1);
// Same shape and bytes.
bool bitwise_equal(const Tensor& a, const Tensor& b);

// Sets the OpenMP thread count, restores the previous one on scope exit.
class OmpThreads {
 public:
  explicit OmpThreads(int n) : prev_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~OmpThreads() { omp_set_num_threads(prev_); }
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;

 private:
  int prev_;
};

// ------------------------------------------------------------------ op cases

// One round-to-nearest of a value y to the dtype moves it by at most half an ulp, i.e. by
// the unit roundoff u |y|: u = 2^-8 = 3.9e-3 in bf16 (8 significant bits), 2^-11 = 4.9e-4 in
// f16 (11 bits). rel_err normalises by max |y|, so one rounded output is within u of the f32
// oracle (measured up to 0.985 u on these cases). On cpu the f32 result before rounding
// already differs from ref f32 by up to the case's tol_cpu, which is added to the bound
// (|round(y_cpu) - y_ref| <= u |y_cpu| + |y_cpu - y_ref|). Compute is f32 inside every op,
// so a single op rounds once; only compositions of ops (test-side backwards such as tanh's
// g * (1 - y*y)) round more often, and their tolerance is that many units (each rounding's
// relative error survives the following *, / and sums of same-sign-dominated terms).
constexpr double kBf16 = 1.0 / 256, kF16 = 1.0 / 2048;

struct OpCase {
  std::string name;
  std::vector<Input> inputs;
  // ops:: forward on the active backend; outputs[0] is the one differentiated.
  std::function<TVec(const TVec&)> fwd;
  // ops:: backward: grads of the diff inputs (in order), given gout for outputs[0]. Optional.
  std::function<TVec(const TVec& in, const TVec& out, const Tensor& gout)> bwd;
  // ref kernels in double on contiguous inputs: the same outputs as fwd.
  std::function<std::vector<DVec>(const std::vector<DVec>&)> fwd_d;
  // ref kernels in double: grads of the diff inputs given gout. Optional.
  std::function<std::vector<DVec>(const std::vector<DVec>&, const DVec&)> bwd_d;
  double tol_cpu = 2e-6;   // cpu vs ref (f32), forward and backward
  double tol_f32 = 2e-6;   // ref f32 forward vs ref double forward
  double tol_fd_d = 1e-7;  // ref double backward vs finite differences
  double tol_fd_f = 5e-5;  // cpu f32 backward vs finite differences
  // 16-bit variants: each output (in the dtype) vs ref f32 on the same rounded inputs, per
  // dtype: tol_bf16 / tol_f16 + tol_cpu. The default is one rounding of the output (kBf16,
  // kF16 above); a case whose test-side backward composes several ops rounds each
  // intermediate to the dtype too, and states its count with rounds16().
  double tol_bf16 = kBf16, tol_f16 = kF16;
  std::vector<bool> f32_outputs = {};  // forward outputs that are f32 whatever the inputs (lse, mean, ...)
  OpCase& rounds16(int n) {
    tol_bf16 = n * kBf16;
    tol_f16 = n * kF16;
    return *this;
  }
};

Shape cstr(const Shape& s);  // contiguous strides
// Strides reading a contiguous tensor of shape `s` over the broadcast shape `out`.
Shape bstr(const Shape& s, const Shape& out);

// Case builders for the ops with a common pattern. binary_case: ops::add / sub / mul / div with
// broadcasting, the backward as the autograd rules write it (ops:: calls, then sum_to).
OpCase binary_case(const std::string& name, ref::BinaryOp op, std::vector<Input> ins);
// A unary op f computed by ref::unary(op, s); grad(x, y, g) is its backward in ops:: calls.
OpCase unary_case(const std::string& name, std::function<Tensor(const Tensor&)> f, ref::UnaryOp op, double s, Input x,
                  std::function<Tensor(const Tensor& x, const Tensor& y, const Tensor& g)> grad);
OpCase matmul_case(Input a, Input b, bool ta, bool tb);
OpCase linear_case(Input x, Input w, bool bias, ops::WeightLayout layout);
// ops::sum (or ops::mean) over dims (empty: all).
OpCase reduce_case(const std::string& name, Input x, std::vector<int64_t> dims, bool keepdim, bool is_mean);

// ------------------------------------------------------------------ big cases
//
// The harness shapes stay below the OpenMP thresholds of ops/cpu, so they only run the serial
// branches. The big cases are sized just above each threshold (the sizes are stated with each
// case) and run on Cpu with 1, 2 and 3 OpenMP threads: BigCase against Ref (ParallelBranches),
// Big16Case natively against the widened path (Native16Parallel).

struct BigCase {
  std::string name;
  std::function<TVec()> run;       // forward + backward on the active backend; inputs captured
  double tol = 2e-6;               // cpu vs ref, every output: the harness tolerance of the op
  std::vector<bool> bitwise = {};  // per output: thread-count independent (empty: all outputs)
  // Oracle in double, used instead of the Ref backend where ref's f32 rounding is the larger error.
  std::function<std::vector<DVec>()> exact = {};
};

struct Big16Case {
  std::string name;
  std::function<TVec(DType)> run;  // builds its inputs in the dtype, runs on the cpu backend
};

// The inputs of the elementwise, reduction and dropout big cases, in dtype dt: (R, C) with
// R * C = 130 * 257 = 33410 > 1 << 15 (elementwise.cpp's kParallelMin), not a multiple of any
// block size; at is column-major, as has stride 2, row and col broadcast, a3 is (4, R, C).
constexpr int64_t kBigR = 130, kBigC = 257;
struct BigInputs {
  Tensor a, b, at, as, row, col, a3;
};
BigInputs big_inputs(DType dt = DType::F32);

// ------------------------------------------------------------------ the tables, by family
//
// Defined in tests/ops/cases/<family>.cpp (the families of src/brigade/ops/ops.h).

std::vector<OpCase> elementwise_cases();
std::vector<OpCase> reduce_cases();
std::vector<OpCase> gemm_cases();
std::vector<OpCase> embedding_cases();
std::vector<OpCase> norm_cases();
std::vector<OpCase> attention_cases();
std::vector<OpCase> loss_cases();
std::vector<OpCase> conv_cases();
std::vector<OpCase> position_cases();

std::vector<BigCase> elementwise_big_cases();
std::vector<BigCase> reduce_big_cases();
std::vector<BigCase> gemm_big_cases();
std::vector<BigCase> embedding_big_cases();
std::vector<BigCase> norm_big_cases();
std::vector<BigCase> attention_big_cases();
std::vector<BigCase> loss_big_cases();

std::vector<Big16Case> elementwise_big16_cases();
std::vector<Big16Case> reduce_big16_cases();
std::vector<Big16Case> embedding_big16_cases();
std::vector<Big16Case> norm_big16_cases();
std::vector<Big16Case> attention_big16_cases();
std::vector<Big16Case> loss_big16_cases();
std::vector<Big16Case> dropout_big16_cases();

}  // namespace brigade::optest
