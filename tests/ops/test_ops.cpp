// The op harness (after ggml's test-backend-ops): one table of op cases, each with
// its input shapes and layouts (contiguous, transposed/permuted, strided slices,
// expanded broadcast views), run through
//   (a) the ops:: front-end on the Cpu backend vs the Ref backend (forward and
//       backward outputs), and the f32 Ref forward vs the ref kernels in double;
//   (b) every backward (ref kernels in double, and ops:: on Cpu in f32) vs central
//       finite differences of the double-precision ref forward, on the scalar
//       L = sum(out0 * R) for a random R.
// Every case also runs in bf16 and f16 (OpHarness16): the inputs rounded to the dtype, run on
// Cpu and Ref, each output compared with the Ref backend in f32 on the same rounded values
// (widened), within the case's per-dtype tolerance; output dtypes checked against the
// contract in ops.h.
// Adding an op = one entry in all_cases(). Also: determinism (Cpu twice, bitwise),
// shapes above the OpenMP thresholds of ops/cpu run at 1, 2 and 3 threads against
// ref (bitwise across thread counts where the kernels claim it; ParallelBranches),
// and bad-input errors. Dropout (random) has its own tests at the end, followed by the
// 16-bit tests outside the table: ops::cast against the scalar conversions, the dtype
// rules for mixed dtypes, the oneDNN bf16 GEMM path, and the native 16-bit cpu kernels
// (bitwise the widened path on every case of the table and above the OpenMP thresholds at
// 1, 2 and 3 threads; no f32 temporaries).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>

#include "brigade/core/allocator.h"
#include "brigade/core/error.h"
#include "brigade/ops/cpu/kernels.h"
#include "brigade/ops/ops.h"
#include "brigade/ops/ref/kernels.h"

using namespace brigade;
namespace ref = brigade::ops::ref;
using DVec = std::vector<double>;
using TVec = std::vector<Tensor>;

namespace {

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
Input in(Shape s) {
  Input i;
  i.shape = std::move(s);
  return i;
}

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::Contig: return "contig";
    case Layout::Swap: return "swap";
    case Layout::Sliced: return "sliced";
    case Layout::Expand: return "expand";
  }
  return "?";
}

// Values are drawn in f32 and held in double, so both paths see identical inputs.
DVec make_values(const Input& x, std::mt19937& rng) {
  std::uniform_real_distribution<double> U(x.lo, x.hi);
  const int64_t n = shape_numel(x.shape);
  DVec v(static_cast<size_t>(n));
  if (x.layout != Layout::Expand) {
    for (auto& e : v) e = double(float(U(rng)));
    return v;
  }
  Shape small = x.shape;
  const int64_t d = x.exp_dim < 0 ? x.exp_dim + int64_t(x.shape.size()) : x.exp_dim;
  small[size_t(d)] = 1;
  DVec s(static_cast<size_t>(shape_numel(small)));
  for (auto& e : s) e = double(float(U(rng)));
  const Shape cs = contiguous_strides(x.shape), ss = contiguous_strides(small);
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i, off = 0;
    for (size_t k = 0; k < x.shape.size(); ++k) {
      const int64_t idx = rem / cs[k];
      rem %= cs[k];
      if (int64_t(k) != d) off += idx * ss[k];
    }
    v[size_t(i)] = s[size_t(off)];
  }
  return v;
}

Tensor contig_f32(const DVec& v, const Shape& s) {
  std::vector<float> f(v.begin(), v.end());
  return Tensor::from_vector(f, s);
}

// The tensor (f32, or dt with v already representable in it) an op sees for this input: a
// view with the requested layout whose logical values are v. Memory outside the view holds
// NaN, so stray reads show up.
Tensor make_tensor(const Input& x, const DVec& v, DType dt = DType::F32) {
  Tensor logical = contig_f32(v, x.shape).to(dt);
  const int64_t nd = int64_t(x.shape.size());
  switch (x.layout) {
    case Layout::Contig: return logical;
    case Layout::Swap: {
      Shape st = x.shape;
      const int64_t a = x.d0 < 0 ? x.d0 + nd : x.d0, b = x.d1 < 0 ? x.d1 + nd : x.d1;
      std::swap(st[size_t(a)], st[size_t(b)]);
      Tensor store = Tensor::full(st, std::nan(""), dt);  // x.shape with d0, d1 swapped
      Tensor view = store.transpose(a, b);
      view.copy_(logical);
      return view;
    }
    case Layout::Sliced: {
      Shape big = x.shape;
      big.back() = 2 * big.back() + 1;
      Tensor store = Tensor::full(big, std::nan(""), dt);  // (..., 2C + 1)
      Tensor view = store.slice(-1, 1, big.back(), 2);
      view.copy_(logical);
      return view;
    }
    case Layout::Expand: {
      Shape small = x.shape;
      const int64_t d = x.exp_dim < 0 ? x.exp_dim + nd : x.exp_dim;
      small[size_t(d)] = 1;
      Tensor s = logical.narrow(d, 0, 1).contiguous();  // x.shape with size 1 at exp_dim
      return s.expand(x.shape);
    }
  }
  return logical;
}

// v rounded to dt (nearest even, as the ops round); f32 values are returned unchanged.
DVec round_to(DVec v, DType dt) {
  for (auto& e : v) {
    const float f = float(e);
    e = dt == DType::BF16 ? bf16_to_float(float_to_bf16(f)) : dt == DType::F16 ? f16_to_float(float_to_f16(f)) : f;
  }
  return v;
}

DVec to_d(const Tensor& t) {
  std::vector<float> f = t.to_vector();
  return DVec(f.begin(), f.end());
}

// max |a - b| / max(max |b|, floor): a normalised error that ignores where the values sit.
double rel_err(const DVec& a, const DVec& b, double floor = 1e-3) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = floor;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = std::fabs(a[i] - b[i]);
    num = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(num, d);
    den = std::max(den, std::fabs(b[i]));
  }
  return num / den;
}

// ------------------------------------------------------------------ cases

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
  // kF16 below); a case whose test-side backward composes several ops rounds each
  // intermediate to the dtype too, and states its count with rounds16().
  double tol_bf16, tol_f16;
  std::vector<bool> f32_outputs = {};  // forward outputs that are f32 whatever the inputs (lse, mean, ...)
  OpCase();
  OpCase& rounds16(int n);
};

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
OpCase::OpCase() : tol_bf16(kBf16), tol_f16(kF16) {}
OpCase& OpCase::rounds16(int n) {
  tol_bf16 = n * kBf16;
  tol_f16 = n * kF16;
  return *this;
}

Shape cstr(const Shape& s) { return contiguous_strides(s); }
// Strides reading a contiguous tensor of shape `s` over the broadcast shape `out`.
Shape bstr(const Shape& s, const Shape& out) {
  Shape st(out.size(), 0), cs = cstr(s);
  const size_t lead = out.size() - s.size();
  for (size_t i = 0; i < s.size(); ++i) st[lead + i] = (s[i] == 1 && out[lead + i] != 1) ? 0 : cs[i];
  return st;
}

OpCase binary_case(const std::string& name, ref::BinaryOp op, std::vector<Input> ins) {
  OpCase c;
  c.name = name;
  c.inputs = ins;
  c.fwd = [op](const TVec& x) -> TVec {
    switch (op) {
      case ref::BinaryOp::Add: return {ops::add(x[0], x[1])};
      case ref::BinaryOp::Sub: return {ops::sub(x[0], x[1])};
      case ref::BinaryOp::Mul: return {ops::mul(x[0], x[1])};
      case ref::BinaryOp::Div: return {ops::div(x[0], x[1])};
    }
    return {};
  };
  // Backward as the autograd rules will write it: ops:: calls, then sum_to undoes broadcasting.
  c.bwd = [op](const TVec& x, const TVec& y, const Tensor& g) -> TVec {
    const Shape& sa = x[0].shape();
    const Shape& sb = x[1].shape();
    switch (op) {
      case ref::BinaryOp::Add: return {ops::sum_to(g, sa), ops::sum_to(g, sb)};
      case ref::BinaryOp::Sub: return {ops::sum_to(g, sa), ops::sum_to(ops::neg(g), sb)};
      case ref::BinaryOp::Mul: return {ops::sum_to(ops::mul(g, x[1]), sa), ops::sum_to(ops::mul(g, x[0]), sb)};
      case ref::BinaryOp::Div:  // y = a / b: ga = g / b, gb = -g * y / b
        return {ops::sum_to(ops::div(g, x[1]), sa), ops::sum_to(ops::neg(ops::div(ops::mul(g, y[0]), x[1])), sb)};
    }
    return {};
  };
  const Shape sa = ins[0].shape, sb = ins[1].shape;
  // 16-bit: mul's gradients round g * x then sum_to; div's gb rounds g * y, / b, then sum_to.
  c.rounds16(op == ref::BinaryOp::Div ? 3 : op == ref::BinaryOp::Mul ? 2 : 1);
  c.fwd_d = [op, sa, sb](const std::vector<DVec>& x) -> std::vector<DVec> {
    const Shape out = ops::broadcast_shapes(sa, sb);
    DVec y(static_cast<size_t>(shape_numel(out)));
    const Shape ta = bstr(sa, out), tb = bstr(sb, out);
    ref::binary<double>(op, int(out.size()), out.data(), x[0].data(), ta.data(), x[1].data(), tb.data(), y.data());
    return {y};
  };
  return c;
}

OpCase unary_case(const std::string& name, std::function<Tensor(const Tensor&)> f, ref::UnaryOp op, double s, Input x,
                  std::function<Tensor(const Tensor& x, const Tensor& y, const Tensor& g)> grad) {
  OpCase c;
  c.name = name;
  c.inputs = {x};
  c.fwd = [f](const TVec& v) -> TVec { return {f(v[0])}; };
  c.bwd = [grad](const TVec& v, const TVec& y, const Tensor& g) -> TVec { return {grad(v[0], y[0], g)}; };
  const Shape sh = x.shape;
  c.fwd_d = [op, s, sh](const std::vector<DVec>& v) -> std::vector<DVec> {
    DVec y(v[0].size());
    const Shape st = cstr(sh);
    ref::unary<double>(op, s, int(sh.size()), sh.data(), v[0].data(), st.data(), y.data());
    return {y};
  };
  return c;
}

TVec matmul_grads(const Tensor& a, const Tensor& b, const Tensor& g, bool ta, bool tb) {
  // y = opA @ opB  =>  d opA = g @ opB^T,  d opB = opA^T @ g
  Tensor ga = ta ? ops::matmul(b, g, tb, true) : ops::matmul(g, b, false, !tb);
  Tensor gb = tb ? ops::matmul(g, a, true, ta) : ops::matmul(a, g, !ta, false);
  return {ops::sum_to(ga, a.shape()), ops::sum_to(gb, b.shape())};
}

OpCase matmul_case(Input a, Input b, bool ta, bool tb) {
  OpCase c;
  c.name = fmt::format("matmul_{}{}_{}{}_{}_{}", shape_str(a.shape), layout_name(a.layout), shape_str(b.shape),
                       layout_name(b.layout), ta ? "T" : "N", tb ? "T" : "N");
  c.inputs = {a, b};
  c.fwd = [ta, tb](const TVec& x) -> TVec { return {ops::matmul(x[0], x[1], ta, tb)}; };
  c.bwd = [ta, tb](const TVec& x, const TVec&, const Tensor& g) -> TVec { return matmul_grads(x[0], x[1], g, ta, tb); };
  c.rounds16(2);  // the gradient GEMM's output, then sum_to over broadcast batch dims
  const Shape sa = a.shape, sb = b.shape;
  c.fwd_d = [sa, sb, ta, tb](const std::vector<DVec>& x) -> std::vector<DVec> {
    const size_t na = sa.size(), nb = sb.size();
    const Shape ab(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
    const Shape bs = ops::broadcast_shapes(ab, bb);
    const Shape ca = cstr(sa), cb = cstr(sb);
    Shape abst(bs.size(), 0), bbst(bs.size(), 0);
    for (size_t i = 0; i < ab.size(); ++i) abst[bs.size() - ab.size() + i] = ab[i] == 1 ? 0 : ca[i];
    for (size_t i = 0; i < bb.size(); ++i) bbst[bs.size() - bb.size() + i] = bb[i] == 1 ? 0 : cb[i];
    const int64_t M = ta ? sa[na - 1] : sa[na - 2], K = ta ? sa[na - 2] : sa[na - 1];
    const int64_t N = tb ? sb[nb - 2] : sb[nb - 1];
    const int64_t sam = ta ? 1 : ca[na - 2], sak = ta ? ca[na - 2] : 1;
    const int64_t sbk = tb ? 1 : cb[nb - 2], sbn = tb ? cb[nb - 2] : 1;
    DVec y(static_cast<size_t>(shape_numel(bs) * M * N));
    ref::matmul<double>(int(bs.size()), bs.data(), x[0].data(), abst.data(), sam, sak, x[1].data(), bbst.data(), sbk,
                        sbn, y.data(), M, N, K);
    return {y};
  };
  return c;
}

OpCase linear_case(Input x, Input w, bool bias, ops::WeightLayout layout) {
  const bool oi = layout == ops::WeightLayout::OutIn;
  OpCase c;
  c.name = fmt::format("linear_{}{}_{}{}_{}_{}", shape_str(x.shape), layout_name(x.layout), shape_str(w.shape),
                       layout_name(w.layout), oi ? "OutIn" : "InOut", bias ? "bias" : "nobias");
  const int64_t OUT = oi ? w.shape[0] : w.shape[1], IN = oi ? w.shape[1] : w.shape[0];
  c.inputs = {x, w};
  if (bias) c.inputs.push_back(in({OUT}));
  c.fwd = [layout, bias](const TVec& v) -> TVec { return {ops::linear(v[0], v[1], bias ? v[2] : Tensor(), layout)}; };
  c.bwd = [layout, bias](const TVec& v, const TVec&, const Tensor& g) -> TVec {
    ops::LinearGrads r = ops::linear_backward(g, v[0], v[1], layout, true, true, bias);
    if (bias) return {r.gx, r.gw, r.gb};
    return {r.gx, r.gw};
  };
  const int64_t N = shape_numel(x.shape) / IN;
  const int64_t swo = oi ? IN : 1, swi = oi ? 1 : OUT;
  c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
    DVec y(static_cast<size_t>(N * OUT));
    ref::linear<double>(N, IN, OUT, v[0].data(), IN, 1, v[1].data(), swo, swi, bias ? v[2].data() : nullptr, y.data());
    return {y};
  };
  c.bwd_d = [=](const std::vector<DVec>& v, const DVec& g) -> std::vector<DVec> {
    DVec gx(static_cast<size_t>(N * IN)), gw(static_cast<size_t>(IN * OUT)), gb(static_cast<size_t>(OUT));
    ref::linear_backward<double>(N, IN, OUT, g.data(), v[0].data(), IN, 1, v[1].data(), swo, swi, gx.data(), gw.data(),
                                 swo, swi, gb.data());
    if (bias) return {gx, gw, gb};
    return {gx, gw};
  };
  return c;
}

OpCase reduce_case(const std::string& name, Input x, std::vector<int64_t> dims, bool keepdim, bool is_mean) {
  OpCase c;
  c.name = name;
  c.inputs = {x};
  c.fwd = [=](const TVec& v) -> TVec {
    return {is_mean ? ops::mean(v[0], dims, keepdim) : ops::sum(v[0], dims, keepdim)};
  };
  const Shape sh = x.shape;
  std::vector<bool> red(sh.size(), dims.empty());
  for (int64_t d : dims) red[size_t(d < 0 ? d + int64_t(sh.size()) : d)] = true;
  Shape keep = sh;
  int64_t count = 1;
  for (size_t i = 0; i < sh.size(); ++i)
    if (red[i]) count *= std::exchange(keep[i], 1);
  // Backward: broadcast g (viewed with keepdim) back over x's shape.
  c.bwd = [=](const TVec& v, const TVec&, const Tensor& g) -> TVec {
    Tensor gk = g.reshape(keep);
    Tensor r = ops::add(Tensor::zeros(sh, g.dtype()), gk);  // sh
    return {is_mean ? ops::mul_scalar(r, 1.0 / double(count)) : r};
  };
  c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
    Shape so = cstr(keep);
    for (size_t i = 0; i < sh.size(); ++i)
      if (red[i]) so[i] = 0;
    DVec y(static_cast<size_t>(shape_numel(keep)));
    const Shape si = cstr(sh);
    ref::reduce_sum<double>(int(sh.size()), sh.data(), v[0].data(), si.data(), y.data(), so.data(), int64_t(y.size()));
    if (is_mean)
      for (auto& e : y) e /= double(count);
    return {y};
  };
  return c;
}

// Op cases by topic (tests/ops/cases_<topic>.inc): each defines std::vector<OpCase>
// <topic>_cases() here, and all_cases() appends them.
#if __has_include("cases_llama.inc")
#include "cases_llama.inc"
#endif
#if __has_include("cases_vision.inc")
#include "cases_vision.inc"
#endif
#if __has_include("cases_encoder.inc")
#include "cases_encoder.inc"
#endif
#if __has_include("cases_swin.inc")
#include "cases_swin.inc"
#endif

std::vector<OpCase> all_cases() {
  using ref::BinaryOp;
  using ref::UnaryOp;
  std::vector<OpCase> cs;

  // ---- elementwise, with broadcasting and non-contiguous views
  for (auto [nm, op] :
       {std::pair{"add", BinaryOp::Add}, {"sub", BinaryOp::Sub}, {"mul", BinaryOp::Mul}, {"div", BinaryOp::Div}}) {
    const double lo = op == BinaryOp::Div ? 0.5 : -1.0;
    cs.push_back(binary_case(std::string(nm) + "_same", op, {in({3, 4}), in({3, 4}).Range(lo, 2)}));
    cs.push_back(binary_case(std::string(nm) + "_row_bcast", op, {in({2, 3, 5}), in({5}).Range(lo, 2)}));
    cs.push_back(binary_case(std::string(nm) + "_both_bcast", op, {in({2, 1, 4}), in({3, 1}).Range(lo, 2)}));
    cs.push_back(binary_case(std::string(nm) + "_views", op, {in({4, 3}).T(), in({4, 3}).Sliced().Range(lo, 2)}));
    cs.push_back(binary_case(std::string(nm) + "_expanded", op, {in({3, 4}).Expand(0), in({3, 4}).T().Range(lo, 2)}));
  }
  cs.push_back(unary_case(
      "add_scalar", [](const Tensor& x) { return ops::add_scalar(x, 0.75); }, UnaryOp::AddScalar, 0.75, in({3, 5}).T(),
      [](const Tensor&, const Tensor&, const Tensor& g) { return ops::mul_scalar(g, 1.0); }));
  cs.push_back(unary_case(
      "mul_scalar", [](const Tensor& x) { return ops::mul_scalar(x, -1.5); }, UnaryOp::MulScalar, -1.5,
      in({3, 5}).Sliced(), [](const Tensor&, const Tensor&, const Tensor& g) { return ops::mul_scalar(g, -1.5); }));
  cs.push_back(unary_case(
      "neg", [](const Tensor& x) { return ops::neg(x); }, UnaryOp::Neg, 0, in({2, 3, 4}),
      [](const Tensor&, const Tensor&, const Tensor& g) { return ops::neg(g); }));
  cs.push_back(unary_case(
      "exp", [](const Tensor& x) { return ops::exp(x); }, UnaryOp::Exp, 0, in({4, 6}).T(),
      [](const Tensor&, const Tensor& y, const Tensor& g) { return ops::mul(g, y); }));
  cs.push_back(unary_case(
      "log", [](const Tensor& x) { return ops::log(x); }, UnaryOp::Log, 0, in({4, 6}).Sliced().Range(0.2, 3),
      [](const Tensor& x, const Tensor&, const Tensor& g) { return ops::div(g, x); }));
  cs.push_back(unary_case(
      "tanh", [](const Tensor& x) { return ops::tanh(x); }, UnaryOp::Tanh, 0, in({5, 7}).Range(-3, 3),
      [](const Tensor&, const Tensor& y, const Tensor& g) {
        return ops::mul(g, ops::add_scalar(ops::neg(ops::mul(y, y)), 1.0));  // g (1 - y^2)
      }));
  cs.back().rounds16(3);  // 16-bit: y*y, 1 - y*y and the product are each rounded
  cs.push_back(unary_case(
      "sqrt", [](const Tensor& x) { return ops::sqrt(x); }, UnaryOp::Sqrt, 0, in({3, 4}).Expand(1).Range(0.2, 3),
      [](const Tensor&, const Tensor& y, const Tensor& g) {
        return ops::div(ops::mul_scalar(g, 0.5), y);  // g / (2 sqrt(x))
      }));

  // ---- add_ (in place, src broadcast, non-contiguous dst)
  {
    OpCase c;
    c.name = "add_inplace_bcast_noncontig_dst";
    c.inputs = {in({4, 3}), in({3})};
    c.fwd = [](const TVec& x) -> TVec {
      Tensor dst = Tensor::empty({3, 4}, x[0].dtype()).transpose(0, 1);  // (4, 3), column-major
      dst.copy_(x[0]);
      ops::add_(dst, x[1], -0.5);
      return {dst.contiguous()};
    };
    c.bwd = [](const TVec& x, const TVec&, const Tensor& g) -> TVec {
      return {g.clone(), ops::sum_to(ops::mul_scalar(g, -0.5), x[1].shape())};
    };
    c.fwd_d = [](const std::vector<DVec>& x) -> std::vector<DVec> {
      DVec y = x[0];
      const Shape sh{4, 3}, sd = cstr(sh), ss{0, 1};
      ref::axpy<double>(2, sh.data(), y.data(), sd.data(), x[1].data(), ss.data(), -0.5);
      return {y};
    };
    cs.push_back(c);
  }

  // ---- sum_to, sum / mean / sum_all
  for (auto [from, to] : {std::pair{Shape{2, 3, 4}, Shape{3, 1}},
                          {Shape{2, 3, 4}, Shape{4}},
                          {Shape{2, 3, 4}, Shape{2, 1, 4}},
                          {Shape{3, 4}, Shape{3, 4}},
                          {Shape{5, 2}, Shape{}}}) {
    OpCase c;
    c.name = fmt::format("sum_to_{}_{}", shape_str(from), shape_str(to));
    c.inputs = {from.size() >= 2 ? in(from).T() : in(from)};
    c.fwd = [to](const TVec& x) -> TVec { return {ops::sum_to(x[0], to)}; };
    c.bwd = [from](const TVec&, const TVec&, const Tensor& g) -> TVec {
      return {ops::add(Tensor::zeros(from, g.dtype()), g)};
    };
    c.fwd_d = [from, to](const std::vector<DVec>& x) -> std::vector<DVec> {
      DVec y(static_cast<size_t>(shape_numel(to)));
      const Shape so = bstr(to, from), si = cstr(from);
      ref::reduce_sum<double>(int(from.size()), from.data(), x[0].data(), si.data(), y.data(), so.data(),
                              int64_t(y.size()));
      return {y};
    };
    cs.push_back(c);
  }
  cs.push_back(reduce_case("sum_dim0", in({4, 5}), {0}, false, false));
  cs.push_back(reduce_case("sum_dim_last_keep", in({3, 4, 5}).T(), {-1}, true, false));
  cs.push_back(reduce_case("sum_dims_0_2", in({3, 4, 5}).Sliced(), {0, 2}, false, false));
  cs.push_back(reduce_case("sum_all", in({3, 7}).Swap(0, 1), {}, false, false));
  cs.push_back(reduce_case("mean_dim1", in({3, 4, 5}), {1}, false, true));
  cs.push_back(reduce_case("mean_all_keep", in({6, 5}).Expand(0), {0, 1}, true, true));

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

  // ---- embedding (repeated ids exercise the scatter-add)
  {
    const std::vector<int64_t> ids{3, 0, 6, 3, 3, 1};
    const int64_t V = 7, C = 5;
    OpCase c;
    c.name = "embedding";
    c.inputs = {in({V, C}).T()};
    c.fwd = [=](const TVec& x) -> TVec {
      return {ops::embedding(x[0], Tensor::from_vector_i64(ids, {2, 3}, DType::I32))};
    };
    c.bwd = [=](const TVec&, const TVec&, const Tensor& g) -> TVec {
      return {ops::embedding_backward(g, Tensor::from_vector_i64(ids, {2, 3}), V)};
    };
    c.fwd_d = [=](const std::vector<DVec>& x) -> std::vector<DVec> {
      DVec y(ids.size() * size_t(C));
      ref::embedding<double>(int64_t(ids.size()), C, x[0].data(), C, 1, ids.data(), y.data());
      return {y};
    };
    c.bwd_d = [=](const std::vector<DVec>&, const DVec& g) -> std::vector<DVec> {
      DVec gw(static_cast<size_t>(V * C));
      ref::embedding_backward<double>(int64_t(ids.size()), C, V, g.data(), ids.data(), gw.data());
      return {gw};
    };
    cs.push_back(c);
  }

  // ---- layer norm
  for (auto x : {in({2, 3, 16}), in({16, 6}).T(), in({5, 9}).Sliced()}) {
    const int64_t C = x.shape.back(), N = shape_numel(x.shape) / C;
    OpCase c;
    c.name = fmt::format("layer_norm_{}{}", shape_str(x.shape), layout_name(x.layout));
    c.inputs = {x, in({C}).Range(0.5, 1.5), in({C})};
    c.fwd = [](const TVec& v) -> TVec {
      ops::LayerNormOut o = ops::layer_norm(v[0], v[1], v[2], 1e-5);
      return {o.y, o.mean, o.rstd};
    };
    c.bwd = [](const TVec& v, const TVec& o, const Tensor& g) -> TVec {
      ops::LayerNormGrads r = ops::layer_norm_backward(g, v[0], v[1], o[1], o[2]);
      return {r.gx, r.gw, r.gb};
    };
    c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
      DVec y(static_cast<size_t>(N * C)), m(static_cast<size_t>(N)), r(static_cast<size_t>(N));
      ref::layer_norm<double>(N, C, v[0].data(), v[1].data(), v[2].data(), 1e-5, y.data(), m.data(), r.data());
      return {y, m, r};
    };
    c.bwd_d = [=](const std::vector<DVec>& v, const DVec& g) -> std::vector<DVec> {
      DVec y(static_cast<size_t>(N * C)), m(static_cast<size_t>(N)), r(static_cast<size_t>(N)),
          gx(static_cast<size_t>(N * C)), gw(static_cast<size_t>(C)), gb(static_cast<size_t>(C));
      ref::layer_norm<double>(N, C, v[0].data(), v[1].data(), v[2].data(), 1e-5, y.data(), m.data(), r.data());
      ref::layer_norm_backward<double>(N, C, g.data(), v[0].data(), v[1].data(), m.data(), r.data(), gx.data(),
                                       gw.data(), gb.data());
      return {gx, gw, gb};
    };
    c.tol_cpu = 1e-5;
    c.tol_fd_f = 2e-4;                    // rstd amplifies f32 rounding of (x - mean)
    c.f32_outputs = {false, true, true};  // mean, rstd
    cs.push_back(c);
  }

  // ---- gelu, softmax
  for (auto x : {in({4, 33}).Range(-4, 4), in({6, 5}).T().Range(-4, 4)}) {
    const int64_t n = shape_numel(x.shape);
    OpCase c;
    c.name = fmt::format("gelu_{}{}", shape_str(x.shape), layout_name(x.layout));
    c.inputs = {x};
    c.fwd = [](const TVec& v) -> TVec { return {ops::gelu(v[0])}; };
    c.bwd = [](const TVec& v, const TVec&, const Tensor& g) -> TVec { return {ops::gelu_backward(g, v[0])}; };
    c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
      DVec y(static_cast<size_t>(n));
      ref::gelu<double>(n, v[0].data(), y.data());
      return {y};
    };
    c.bwd_d = [=](const std::vector<DVec>& v, const DVec& g) -> std::vector<DVec> {
      DVec gx(static_cast<size_t>(n));
      ref::gelu_backward<double>(n, g.data(), v[0].data(), gx.data());
      return {gx};
    };
    c.tol_cpu = 1e-5;
    cs.push_back(c);
  }
  for (auto x : {in({3, 17}).Range(-3, 3), in({2, 9, 4}).T().Range(-3, 3), in({4, 8}).Sliced().Range(-20, 20)}) {
    const int64_t C = x.shape.back(), N = shape_numel(x.shape) / C;
    OpCase c;
    c.name = fmt::format("softmax_{}{}", shape_str(x.shape), layout_name(x.layout));
    c.inputs = {x};
    c.fwd = [](const TVec& v) -> TVec { return {ops::softmax(v[0])}; };
    c.bwd = [](const TVec&, const TVec& y, const Tensor& g) -> TVec { return {ops::softmax_backward(g, y[0])}; };
    c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
      DVec y(static_cast<size_t>(N * C));
      ref::softmax<double>(N, C, v[0].data(), y.data());
      return {y};
    };
    c.bwd_d = [=](const std::vector<DVec>& v, const DVec& g) -> std::vector<DVec> {
      DVec y(static_cast<size_t>(N * C)), gx(static_cast<size_t>(N * C));
      ref::softmax<double>(N, C, v[0].data(), y.data());
      ref::softmax_backward<double>(N, C, g.data(), y.data(), gx.data());
      return {gx};
    };
    c.tol_cpu = 1e-5;
    cs.push_back(c);
  }

  // ---- attention: causal and not; T not a multiple of any tile size; (B, T, NH, HS) views
  struct AttnShape {
    int64_t B, NH, T, HS;
    bool causal;
    bool view;
  };
  for (auto s : {AttnShape{2, 2, 7, 5, true, false}, AttnShape{1, 3, 9, 4, false, true},
                 AttnShape{2, 1, 70, 3, true, true}, AttnShape{1, 2, 67, 6, false, false},
                 // several query and key tiles (cpu kernel: 64 queries x 128 keys), ragged last tiles
                 AttnShape{1, 2, 150, 4, true, false}, AttnShape{1, 1, 133, 3, false, true}}) {
    OpCase c;
    c.name = fmt::format("attention_B{}_NH{}_T{}_HS{}_{}{}", s.B, s.NH, s.T, s.HS, s.causal ? "causal" : "full",
                         s.view ? "_view" : "");
    const Shape sh{s.B, s.NH, s.T, s.HS};
    Input q = in(sh).Range(-2, 2);
    if (s.view) q.Swap(1, 2);
    c.inputs = {q, in(sh).Range(-2, 2), s.view ? in(sh).Swap(1, 2) : in(sh).T()};
    const double scale = 1.0 / std::sqrt(double(s.HS));
    const bool causal = s.causal;
    c.fwd = [=](const TVec& v) -> TVec {
      ops::AttentionOut o = ops::attention(v[0], v[1], v[2], causal, scale);
      return {o.out, o.lse};
    };
    c.bwd = [=](const TVec& v, const TVec& o, const Tensor& g) -> TVec {
      ops::AttentionGrads r = ops::attention_backward(g, v[0], v[1], v[2], o[0], o[1], causal, scale);
      return {r.gq, r.gk, r.gv};
    };
    const int64_t BH = s.B * s.NH, T = s.T, HS = s.HS;
    c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
      DVec o(static_cast<size_t>(BH * T * HS)), l(static_cast<size_t>(BH * T));
      ref::attention<double>(BH, T, HS, v[0].data(), v[1].data(), v[2].data(), causal, scale, o.data(), l.data());
      return {o, l};
    };
    c.bwd_d = [=](const std::vector<DVec>& v, const DVec& g) -> std::vector<DVec> {
      DVec o(static_cast<size_t>(BH * T * HS)), l(static_cast<size_t>(BH * T)), gq(o.size()), gk(o.size()),
          gv(o.size());
      ref::attention<double>(BH, T, HS, v[0].data(), v[1].data(), v[2].data(), causal, scale, o.data(), l.data());
      ref::attention_backward<double>(BH, T, HS, g.data(), v[0].data(), v[1].data(), v[2].data(), o.data(), l.data(),
                                      causal, scale, gq.data(), gk.data(), gv.data());
      return {gq, gk, gv};
    };
    c.tol_cpu = 1e-5;
    c.tol_f32 = 1e-5;
    c.tol_fd_f = 2e-4;
    c.f32_outputs = {false, true};  // lse
    cs.push_back(c);
  }

  // ---- cross-entropy with ignore_index rows
  for (auto [N, V, view] : {std::tuple{6, 11, false}, std::tuple{5, 40, true}}) {
    std::vector<int64_t> t;
    for (int64_t i = 0; i < N; ++i) t.push_back(i % 3 == 1 ? -100 : (i * 7 + 3) % V);
    OpCase c;
    c.name = fmt::format("cross_entropy_N{}_V{}{}", N, V, view ? "_view" : "");
    c.inputs = {view ? in({N, V}).Sliced().Range(-4, 4) : in({N, V}).Range(-4, 4)};
    c.fwd = [=](const TVec& v) -> TVec {
      ops::CrossEntropyOut o = ops::cross_entropy(v[0], Tensor::from_vector_i64(t, {N}), -100);
      return {o.loss, o.lse};
    };
    c.bwd = [=](const TVec& v, const TVec& o, const Tensor& g) -> TVec {
      return {ops::cross_entropy_backward(g.item(), v[0], Tensor::from_vector_i64(t, {N}, DType::I32), o[1], -100)};
    };
    c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
      DVec loss(1), lse(static_cast<size_t>(N));
      ref::cross_entropy<double>(N, V, v[0].data(), t.data(), -100, loss.data(), lse.data());
      return {loss, lse};
    };
    c.bwd_d = [=](const std::vector<DVec>& v, const DVec& g) -> std::vector<DVec> {
      DVec loss(1), lse(static_cast<size_t>(N)), gl(size_t(N * V));
      ref::cross_entropy<double>(N, V, v[0].data(), t.data(), -100, loss.data(), lse.data());
      ref::cross_entropy_backward<double>(N, V, g[0], v[0].data(), t.data(), lse.data(), -100, gl.data());
      return {gl};
    };
    c.tol_cpu = 1e-5;
    c.f32_outputs = {true, true};  // loss, lse
    cs.push_back(c);
  }
#if __has_include("cases_llama.inc")
  for (OpCase& c : llama_cases()) cs.push_back(std::move(c));
#endif
#if __has_include("cases_vision.inc")
  for (OpCase& c : vision_cases()) cs.push_back(std::move(c));
#endif
#if __has_include("cases_encoder.inc")
  for (OpCase& c : encoder_cases()) cs.push_back(std::move(c));
#endif
#if __has_include("cases_swin.inc")
  for (OpCase& c : swin_cases()) cs.push_back(std::move(c));
#endif
  return cs;
}

const std::vector<OpCase>& cases() {
  static const std::vector<OpCase> cs = all_cases();
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
  std::vector<DVec> fd;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (!c.inputs[i].diff) continue;
    std::vector<DVec> xp = xd;
    DVec g(xd[i].size());
    for (size_t j = 0; j < g.size(); ++j) {
      const double h = 1e-5 * std::max(1.0, std::fabs(xd[i][j]));
      xp[i][j] = xd[i][j] + h;
      const double lp = L(xp);
      xp[i][j] = xd[i][j] - h;
      const double lm = L(xp);
      xp[i][j] = xd[i][j];
      g[j] = (lp - lm) / (2 * h);
    }
    fd.push_back(g);
  }

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

bool bitwise_equal(const Tensor& a, const Tensor& b);

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

// ------------------------------------------------------------------ reductions that return doubles

TEST(Ops, SumSquares) {
  Tensor x = Tensor::from_vector({1, -2, 3, 0.5, 4, -1}, {2, 3}).transpose(0, 1);
  for (auto be : {ops::Backend::Ref, ops::Backend::Cpu}) {
    ops::BackendScope s(be);
    EXPECT_DOUBLE_EQ(ops::sum_squares(x), 1 + 4 + 9 + 0.25 + 16 + 1);
  }
}

// ------------------------------------------------------------------ determinism

Tensor randn(const Shape& s, unsigned seed, double lo = -1, double hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> U{float(lo), float(hi)};
  std::vector<float> v(static_cast<size_t>(shape_numel(s)));
  for (auto& e : v) e = U(rng);
  return Tensor::from_vector(v, s);
}
bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(), a.nbytes()) == 0;
}

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
// run the serial branches. These cases are sized just above each threshold:
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

struct BigCase {
  std::string name;
  std::function<TVec()> run;       // forward + backward on the active backend; inputs captured
  double tol = 2e-6;               // cpu vs ref, every output: the harness tolerance of the op
  std::vector<bool> bitwise = {};  // per output: thread-count independent (empty: all outputs)
  // Oracle in double, used instead of the Ref backend where ref's f32 rounding is the larger error.
  std::function<std::vector<DVec>()> exact = {};
};

std::vector<BigCase> all_big_cases() {
  std::vector<BigCase> cs;
  // elementwise.cpp: n = 130 * 257 = 33410 > 1 << 15 (and not a multiple of any block size).
  const int64_t R = 130, C = 257;
  const Tensor a = randn({R, C}, 101), b = randn({R, C}, 102, 0.5, 2.0);
  const Tensor at = randn({C, R}, 103).transpose(0, 1);                    // (R, C), column-major
  const Tensor as = randn({R, 2 * C + 1}, 104).slice(1, 1, 2 * C + 1, 2);  // (R, C), stride 2
  const Tensor row = randn({C}, 105, 0.5, 2.0), col = randn({R, 1}, 106, 0.5, 2.0);

  cs.push_back({"binary_contig", [=] { return TVec{ops::add(a, b), ops::sub(a, b), ops::mul(a, b), ops::div(a, b)}; }});
  cs.push_back(
      {"binary_strided_bcast", [=] {
         return TVec{ops::add(at, row), ops::mul(as, col), ops::div(at, b), ops::sub(row, as), ops::mul(at, as)};
       }});
  cs.push_back({"unary_contig", [=] {
                  return TVec{ops::add_scalar(a, 0.75),
                              ops::mul_scalar(a, -1.5),
                              ops::neg(a),
                              ops::exp(a),
                              ops::tanh(a),
                              ops::log(b),
                              ops::sqrt(b)};
                }});
  cs.push_back(
      {"unary_strided", [=] {
         return TVec{ops::add_scalar(at, 0.75), ops::mul_scalar(as, -1.5), ops::neg(at), ops::exp(as), ops::tanh(at)};
       }});
  cs.push_back({"add_inplace_mul_scalar_inplace", [=] {
                  Tensor d0 = a.clone();  // contiguous dst and src
                  ops::add_(d0, b, -0.5);
                  Tensor d1 = Tensor::empty({C, R}).transpose(0, 1);  // (R, C) strided dst, broadcast src
                  d1.copy_(a);
                  ops::add_(d1, row, 2.0);
                  Tensor d2 = a.clone();
                  ops::mul_scalar_(d2, 0.3);
                  Tensor d3 = Tensor::empty({C, R}).transpose(0, 1);  // (R, C) strided
                  d3.copy_(b);
                  ops::mul_scalar_(d3, -1.25);
                  return TVec{d0, d1.contiguous(), d2, d3.contiguous()};
                }});
  // Reductions with short sums (<= 520 terms): column_sum (64-column chunks) and row sums.
  const Tensor a3 = randn({4, R, C}, 107);  // (4, R, C): column sums over 4 rows of 33410
  cs.push_back({"partial_sums", [=] {
                  return TVec{ops::sum(a, {0}),       ops::sum(a, {1}, true), ops::sum_to(a, {C}),
                              ops::sum_to(a, {R, 1}), ops::mean(a, {0}),      ops::sum(a3, {0}),
                              ops::sum(a3, {0, 1}),   ops::sum(at, {0}),      ops::sum_to(as, {1, C})};
                }});
  {  // Long sums (33410 terms and more): contiguous_sum's 4096-blocks and row sums of whole
     // slices (also summed in 4096-blocks). The ref kernel sums in f32 in one sequential chain (measured 1.5e-5 off on
     // these sizes), so the oracle here is the sum in double. Positive values: no cancellation, so the f32 result must
     // be within a few ulp per block of the exact sum.
    const Tensor p = randn({R, C}, 128, 0, 1), p3 = randn({4, R, C}, 129, 0, 1);
    auto exact = [](const Tensor& t, int64_t parts) {  // sums of `parts` equal contiguous slices
      const std::vector<float> v = t.to_vector();
      DVec s(static_cast<size_t>(parts), 0.0);
      const size_t len = v.size() / size_t(parts);
      for (size_t i = 0; i < v.size(); ++i) s[i / len] += double(v[i]);
      return s;
    };
    DVec mean3 = exact(p3, 1);
    mean3[0] /= double(p3.numel());
    cs.push_back({"long_sums",
                  [=] {
                    return TVec{ops::sum_all(p), ops::sum_all(p3), ops::mean(p3, {}), ops::sum(p3, {1, 2}),
                                ops::sum_to(p3, {4, 1, 1})};
                  },
                  2e-6,
                  {},
                  [=] {
                    return std::vector<DVec>{exact(p, 1), exact(p3, 1), mean3, exact(p3, 4), exact(p3, 4)};
                  }});
  }
  cs.push_back({"gelu",
                [=] {
                  Tensor x = ops::mul_scalar(a, 4.0);
                  return TVec{ops::gelu(x), ops::gelu_backward(b, x)};
                },
                1e-5});
  {  // embedding: N * C = 600 * 70 > 1 << 15 (C not a multiple of the 16-column chunks),
     // V * C = 500 * 70 > 1 << 15; ids repeat, some rows of V are never used.
    const int64_t N = 600, V = 500, EC = 70;
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < N; ++i) ids.push_back((i * i * 7 + 3) % 311);
    const Tensor w = randn({V, EC}, 108), gy = randn({N, EC}, 109), idt = Tensor::from_vector_i64(ids, {N});
    const Tensor wt = randn({EC, V}, 110).transpose(0, 1);  // (V, EC) strided
    cs.push_back({"embedding", [=] {
                    return TVec{ops::embedding(w, idt), ops::embedding(wt, idt), ops::embedding_backward(gy, idt, V)};
                  }});
  }
  {  // layer norm: N * C = 200 * 130 > 1 << 14; backward has 7 blocks of 32 rows (the last partial).
    const int64_t N = 200, LC = 130;
    const Tensor x = randn({N, LC}, 111, -2, 2), w = randn({LC}, 112, 0.5, 1.5), bb = randn({LC}, 113);
    const Tensor gy = randn({N, LC}, 114);
    cs.push_back({"layer_norm",
                  [=] {
                    ops::LayerNormOut o = ops::layer_norm(x, w, bb, 1e-5);
                    ops::LayerNormGrads g = ops::layer_norm_backward(gy, x, w, o.mean, o.rstd);
                    return TVec{o.y, o.mean, o.rstd, g.gx, g.gw, g.gb};
                  },
                  1e-5});
  }
  {  // softmax: N * C = 150 * 130 > 1 << 14
    const Tensor x = randn({150, 130}, 115, -5, 5), gy = randn({150, 130}, 116);
    cs.push_back({"softmax",
                  [=] {
                    Tensor y = ops::softmax(x);
                    return TVec{y, ops::softmax_backward(gy, y)};
                  },
                  1e-5});
  }
  {  // cross-entropy: N * V = 64 * 300 > 1 << 14, every third row ignored
    const int64_t N = 64, V = 300;
    std::vector<int64_t> t;
    for (int64_t i = 0; i < N; ++i) t.push_back(i % 3 == 1 ? -100 : (i * 37 + 5) % V);
    const Tensor logits = randn({N, V}, 117, -4, 4), tt = Tensor::from_vector_i64(t, {N});
    cs.push_back({"cross_entropy",
                  [=] {
                    ops::CrossEntropyOut o = ops::cross_entropy(logits, tt, -100);
                    return TVec{o.loss, o.lse, ops::cross_entropy_backward(0.7, logits, tt, o.lse, -100)};
                  },
                  1e-5});
  }
  // attention: BH * T * HS = 4 * 130 * 64 = 33280 > 1 << 15, BH * T * T * HS = 4.3e6 > 1 << 16;
  // T = 130 spans three 64-key blocks. Not claimed thread-independent: tolerance only.
  for (bool causal : {true, false}) {
    const Shape sh{2, 2, 130, 64};
    const Tensor q = randn(sh, 118, -2, 2), k = randn(sh, 119, -2, 2), v = randn(sh, 120), g = randn(sh, 121);
    const double scale = 0.125;
    cs.push_back({causal ? "attention_causal" : "attention_full",
                  [=] {
                    ops::AttentionOut o = ops::attention(q, k, v, causal, scale);
                    ops::AttentionGrads r = ops::attention_backward(g, q, k, v, o.out, o.lse, causal, scale);
                    return TVec{o.out, o.lse, r.gq, r.gk, r.gv};
                  },
                  1e-5,
                  {false, false, false, false, false}});
  }
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

const std::vector<BigCase>& big_cases() {
  static const std::vector<BigCase> cs = all_big_cases();
  return cs;
}

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

TEST(Ops, CrossEntropyBackwardInPlaceWhenItHoldsTheLogitsAlone) {
  // cross_entropy_backward_: the gradient written over the logits when the call holds the
  // only reference, bitwise the out-of-place result; a shared tensor is left untouched.
  const int64_t N = 5, V = 37;
  std::vector<int64_t> tv{3, 36, -100, 0, 17};
  const Tensor targets = Tensor::from_vector_i64(tv, {N});
  for (DType dt : {DType::F32, DType::BF16}) {
    const Tensor base = randn({N, V}, 211).to(dt);
    const ops::CrossEntropyOut ce = ops::cross_entropy(base, targets);
    const Tensor want = ops::cross_entropy_backward(0.7, base, targets, ce.lse);
    Tensor mine = base.clone();
    const void* buffer = mine.raw_data();
    const Tensor got = ops::cross_entropy_backward_(0.7, std::move(mine), targets, ce.lse);
    EXPECT_EQ(got.raw_data(), buffer) << dtype_name(dt) << ": the sole owner's buffer is reused";
    EXPECT_EQ(got.to(DType::F32).to_vector(), want.to(DType::F32).to_vector()) << dtype_name(dt);
    // another handle shares the logits: a new buffer, the logits unchanged
    Tensor shared = base.clone();
    const Tensor keep = shared;
    const Tensor got2 = ops::cross_entropy_backward_(0.7, shared, targets, ce.lse);
    EXPECT_NE(got2.raw_data(), keep.raw_data()) << dtype_name(dt);
    EXPECT_EQ(keep.to(DType::F32).to_vector(), base.to(DType::F32).to_vector()) << dtype_name(dt);
    EXPECT_EQ(got2.to(DType::F32).to_vector(), want.to(DType::F32).to_vector()) << dtype_name(dt);
  }
}

TEST(Ops, SumSquaresParallelBranchIsThreadIndependent) {
  // elementwise.cpp sum_squares: n = 33410 > 1 << 15, blocks of 4096 summed in double.
  const Tensor x = randn({130, 257}, 126);
  double want;
  {
    ops::BackendScope s(ops::Backend::Ref);
    want = ops::sum_squares(x);
  }
  std::vector<double> got;
  for (int threads : {1, 2, 3}) {
    OmpThreads t(threads);
    ops::BackendScope s(ops::Backend::Cpu);
    got.push_back(ops::sum_squares(x));
    EXPECT_NEAR(got.back(), want, 1e-12 * want) << threads << " threads";
  }
  EXPECT_EQ(got[0], got[1]);
  EXPECT_EQ(got[0], got[2]);
}

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

// ------------------------------------------------------------------ dropout

TEST(Ops, DropoutZeroIsIdentity) {
  for (auto be : {ops::Backend::Ref, ops::Backend::Cpu}) {
    ops::BackendScope s(be);
    Generator gen(7);
    Tensor x = randn({5, 6}, 11).transpose(0, 1);
    ops::DropoutOut o = ops::dropout(x, 0.0, gen);
    EXPECT_TRUE(bitwise_equal(o.y, x));
    EXPECT_EQ(o.mask.to_vector(), std::vector<float>(30, 1.0f));
  }
}

TEST(Ops, DropoutStatisticsAndBackward) {
  const double p = 0.3;
  Tensor x = randn({200, 100}, 12);
  Generator g1(42), g2(42);
  ops::DropoutOut ref_o, cpu_o;
  {
    ops::BackendScope s(ops::Backend::Ref);
    ref_o = ops::dropout(x, p, g1);
  }
  {
    ops::BackendScope s(ops::Backend::Cpu);
    cpu_o = ops::dropout(x, p, g2);
  }
  // Same generator state -> same mask on both backends; mask values are 0 or 1/(1-p).
  EXPECT_TRUE(bitwise_equal(ref_o.mask, cpu_o.mask));
  EXPECT_TRUE(bitwise_equal(ref_o.y, cpu_o.y));
  const std::vector<float> m = cpu_o.mask.to_vector(), xv = x.to_vector(), yv = cpu_o.y.to_vector();
  const float inv = float(1.0 / (1.0 - p));
  int64_t kept = 0;
  for (size_t i = 0; i < m.size(); ++i) {
    ASSERT_TRUE(m[i] == 0.0f || m[i] == inv) << m[i];
    kept += m[i] != 0.0f;
    ASSERT_EQ(yv[i], xv[i] * m[i]);
  }
  // Keep fraction: 20000 Bernoulli(0.7) draws, sd = sqrt(0.21 / 20000) = 0.0032; allow 5 sd.
  EXPECT_NEAR(double(kept) / double(m.size()), 1.0 - p, 0.016);
  // E[y] = x: the mean of mask is ~1.
  EXPECT_NEAR(ops::mean(cpu_o.mask, {}).item(), 1.0, 0.025);
  // Backward uses the same mask: gx = gy * mask, on both backends.
  Tensor gy = randn({200, 100}, 13);
  for (auto be : {ops::Backend::Ref, ops::Backend::Cpu}) {
    ops::BackendScope s(be);
    EXPECT_TRUE(bitwise_equal(ops::dropout_backward(gy, cpu_o.mask), ops::mul(gy, cpu_o.mask)));
  }
  // A different seed gives a different mask; the same seed the same one.
  Generator g3(43), g4(42);
  EXPECT_FALSE(bitwise_equal(ops::dropout(x, p, g3).mask, cpu_o.mask));
  EXPECT_TRUE(bitwise_equal(ops::dropout(x, p, g4).mask, cpu_o.mask));
  Generator g5(1);
  EXPECT_THROW(ops::dropout(x, 1.5, g5), ValueError);
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

// ------------------------------------------------------------------ 16-bit: the oneDNN bf16 GEMM path

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

// ---- above the OpenMP thresholds, 1, 2 and 3 threads (sizes as in all_big_cases)

struct Big16Case {
  std::string name;
  std::function<TVec(DType)> run;  // builds its inputs in the dtype, runs on the cpu backend
};

std::vector<Big16Case> all_big16_cases() {
  std::vector<Big16Case> cs;
  const int64_t R = 130, C = 257;  // R * C = 33410 > 1 << 15
  struct In {
    Tensor a, b, at, as, row, col, a3;
  };
  auto ins = [=](DType dt) {
    return In{randn({R, C}, 101).to(dt),
              randn({R, C}, 102, 0.5, 2.0).to(dt),
              randn({C, R}, 103).to(dt).transpose(0, 1),
              randn({R, 2 * C + 1}, 104).to(dt).slice(1, 1, 2 * C + 1, 2),
              randn({C}, 105, 0.5, 2.0).to(dt),
              randn({R, 1}, 106, 0.5, 2.0).to(dt),
              randn({4, R, C}, 107).to(dt)};
  };
  cs.push_back({"binary", [=](DType dt) {
                  const In x = ins(dt);
                  return TVec{ops::add(x.a, x.b),  ops::sub(x.a, x.b),    ops::mul(x.a, x.b),
                              ops::div(x.a, x.b),  ops::add(x.at, x.row), ops::mul(x.as, x.col),
                              ops::div(x.at, x.b), ops::sub(x.row, x.as), ops::mul(x.at, x.as)};
                }});
  cs.push_back({"unary", [=](DType dt) {
                  const In x = ins(dt);
                  return TVec{ops::add_scalar(x.a, 0.75),
                              ops::mul_scalar(x.a, -1.5),
                              ops::neg(x.a),
                              ops::exp(x.a),
                              ops::tanh(x.a),
                              ops::log(x.b),
                              ops::sqrt(x.b),
                              ops::add_scalar(x.at, 0.75),
                              ops::mul_scalar(x.as, -1.5),
                              ops::exp(x.as),
                              ops::tanh(x.at)};
                }});
  cs.push_back({"in_place", [=](DType dt) {
                  const In x = ins(dt);
                  Tensor d0 = x.a.clone();  // contiguous dst and src
                  ops::add_(d0, x.b, 0.3);
                  Tensor d1 = Tensor::empty({C, R}, dt).transpose(0, 1);  // (R, C) strided dst, broadcast src
                  d1.copy_(x.a);
                  ops::add_(d1, x.row, 2.0);
                  Tensor d2 = x.a.clone();  // 16-bit dst, f32 src
                  ops::add_(d2, randn({R, C}, 108), -0.7);
                  Tensor d3 = randn({R, C}, 109);  // f32 dst, 16-bit strided src
                  ops::add_(d3, x.at, 0.3);
                  Tensor d4 = x.a.clone();
                  ops::mul_scalar_(d4, 0.3);
                  Tensor d5 = Tensor::empty({C, R}, dt).transpose(0, 1);  // (R, C) strided
                  d5.copy_(x.b);
                  ops::mul_scalar_(d5, -1.25);
                  return TVec{d0, d1.contiguous(), d2, d3, d4, d5.contiguous()};
                }});
  cs.push_back({"sums", [=](DType dt) {
                  const In x = ins(dt);
                  return TVec{ops::sum(x.a, {0}),        ops::sum(x.a, {1}, true),     ops::sum_to(x.a, {C}),
                              ops::sum_to(x.a, {R, 1}),  ops::mean(x.a, {0}),          ops::sum(x.a3, {0}),
                              ops::sum(x.a3, {0, 1}),    ops::sum(x.at, {0}),          ops::sum_to(x.as, {1, C}),
                              ops::sum_all(x.a),         ops::sum_all(x.a3),           ops::mean(x.a3, {}),
                              ops::sum(x.a3, {1, 2}),    ops::sum_to(x.a3, {4, 1, 1}), ops::sum(x.a3, {0, 2}),
                              ops::sum_to(x.at, {R, C}), ops::mean(x.as, {1}, true)};
                }});
  cs.push_back(
      {"gelu", [=](DType dt) {
         const In x = ins(dt);
         const Tensor x4 = ops::mul_scalar(x.a, 4.0);
         return TVec{ops::gelu(x4), ops::gelu_backward(x.b, x4), ops::gelu(x.at), ops::gelu_backward(x.as, x.at)};
       }});
  cs.push_back({"dropout", [=](DType dt) {
                  const In x = ins(dt);
                  Generator g(42);
                  const ops::DropoutOut o = ops::dropout(x.at, 0.3, g);
                  return TVec{o.y, o.mask, ops::dropout_backward(x.b, o.mask),
                              ops::dropout_backward(randn({R, C}, 110), o.mask)};
                }});
  cs.push_back({"embedding_backward", [=](DType dt) {
                  const int64_t N = 600, V = 500, EC = 70;  // N * C, V * C > 1 << 15
                  std::vector<int64_t> ids;
                  for (int64_t i = 0; i < N; ++i) ids.push_back((i * i * 7 + 3) % 311);
                  const Tensor idt = Tensor::from_vector_i64(ids, {N});
                  return TVec{ops::embedding_backward(randn({N, EC}, 111).to(dt), idt, V),
                              ops::embedding_backward(randn({EC, N}, 112).to(dt).transpose(0, 1), idt, V)};
                }});
  cs.push_back(
      {"layer_norm", [=](DType dt) {
         const int64_t N = 200, LC = 130;  // N * C > 1 << 14; 7 blocks of 32 rows
         const Tensor x = randn({N, LC}, 113, -2, 2).to(dt), gy = randn({N, LC}, 114).to(dt);
         const Tensor xt = randn({LC, N}, 115, -2, 2).to(dt).transpose(0, 1);  // (N, LC) strided
         const Tensor w = randn({LC}, 116, 0.5, 1.5), b = randn({LC}, 117);
         TVec r;
         for (const auto& [xx, ww, bb] : {std::tuple{x, w, b}, {xt, w.to(dt), b.to(dt)}, {x, w.to(dt), Tensor()}}) {
           const ops::LayerNormOut o = ops::layer_norm(xx, ww, bb, 1e-5);
           const ops::LayerNormGrads g = ops::layer_norm_backward(gy, xx, ww, o.mean, o.rstd);
           r.insert(r.end(), {o.y, o.mean, o.rstd, g.gx, g.gw, g.gb});
         }
         return r;
       }});
  cs.push_back({"softmax", [=](DType dt) {
                  const Tensor x = randn({150, 130}, 118, -5, 5).to(dt), gy = randn({150, 130}, 119).to(dt);
                  const Tensor xs = randn({150, 261}, 120, -5, 5).to(dt).slice(1, 1, 261, 2);  // (150, 130) stride 2
                  const Tensor y = ops::softmax(x);
                  return TVec{y, ops::softmax_backward(gy, y), ops::softmax(xs)};
                }});
  cs.push_back({"cross_entropy", [=](DType dt) {
                  const int64_t N = 64, V = 300;  // N * V > 1 << 14
                  std::vector<int64_t> t;
                  for (int64_t i = 0; i < N; ++i) t.push_back(i % 3 == 1 ? -100 : (i * 37 + 5) % V);
                  const Tensor logits = randn({N, V}, 121, -4, 4).to(dt), tt = Tensor::from_vector_i64(t, {N});
                  const ops::CrossEntropyOut o = ops::cross_entropy(logits, tt, -100);
                  return TVec{o.loss, o.lse, ops::cross_entropy_backward(0.7, logits, tt, o.lse, -100)};
                }});
  for (bool causal : {true, false})  // BH * T * T * HS > 1 << 16; T = 130 spans three key blocks
    cs.push_back({causal ? "attention_causal" : "attention_full", [=](DType dt) {
                    const Shape sh{2, 2, 130, 64};
                    const Tensor q = randn(sh, 122, -2, 2).to(dt), k = randn(sh, 123, -2, 2).to(dt);
                    const Tensor v = randn({2, 130, 2, 64}, 124).to(dt).transpose(1, 2);  // (B, NH, T, HS) view
                    const Tensor g = randn(sh, 125).to(dt);
                    const ops::AttentionOut o = ops::attention(q, k, v, causal, 0.125);
                    const ops::AttentionGrads r = ops::attention_backward(g, q, k, v, o.out, o.lse, causal, 0.125);
                    return TVec{o.out, o.lse, r.gq, r.gk, r.gv};
                  }});
  return cs;
}

const std::vector<Big16Case>& big16_cases() {
  static const std::vector<Big16Case> cs = all_big16_cases();
  return cs;
}

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
