// The op harness (after ggml's test-backend-ops): one table of op cases, each with
// its input shapes and layouts (contiguous, transposed/permuted, strided slices,
// expanded broadcast views), run through
//   (a) the ops:: front-end on the Cpu backend vs the Ref backend (forward and
//       backward outputs), and the f32 Ref forward vs the ref kernels in double;
//   (b) every backward (ref kernels in double, and ops:: on Cpu in f32) vs central
//       finite differences of the double-precision ref forward, on the scalar
//       L = sum(out0 * R) for a random R.
// Adding an op = one entry in all_cases(). Also: determinism (Cpu twice, bitwise),
// shapes above the OpenMP thresholds of ops/cpu run at 1, 2 and 3 threads against
// ref (bitwise across thread counts where the kernels claim it; ParallelBranches),
// and bad-input errors. Dropout (random) has its own tests at the end.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>

#include "brigade/core/error.h"
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
Input in(Shape s) { Input i; i.shape = std::move(s); return i; }

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

// The f32 tensor an op sees for this input: a view with the requested layout whose
// logical values are v. Memory outside the view holds NaN, so stray reads show up.
Tensor make_tensor(const Input& x, const DVec& v) {
  Tensor logical = contig_f32(v, x.shape);
  const int64_t nd = int64_t(x.shape.size());
  switch (x.layout) {
    case Layout::Contig: return logical;
    case Layout::Swap: {
      Shape st = x.shape;
      const int64_t a = x.d0 < 0 ? x.d0 + nd : x.d0, b = x.d1 < 0 ? x.d1 + nd : x.d1;
      std::swap(st[size_t(a)], st[size_t(b)]);
      Tensor store = Tensor::full(st, std::nan(""));  // x.shape with d0, d1 swapped
      Tensor view = store.transpose(a, b);
      view.copy_(logical);
      return view;
    }
    case Layout::Sliced: {
      Shape big = x.shape;
      big.back() = 2 * big.back() + 1;
      Tensor store = Tensor::full(big, std::nan(""));  // (..., 2C + 1)
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
  double tol_cpu = 2e-6;    // cpu vs ref (f32), forward and backward
  double tol_f32 = 2e-6;    // ref f32 forward vs ref double forward
  double tol_fd_d = 1e-7;   // ref double backward vs finite differences
  double tol_fd_f = 5e-5;   // cpu f32 backward vs finite differences
};

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
  c.fwd_d = [op, sa, sb](const std::vector<DVec>& x) -> std::vector<DVec> {
    const Shape out = ops::broadcast_shapes(sa, sb);
    DVec y(static_cast<size_t>(shape_numel(out)));
    const Shape ta = bstr(sa, out), tb = bstr(sb, out);
    ref::binary<double>(op, int(out.size()), out.data(), x[0].data(), ta.data(), x[1].data(), tb.data(), y.data());
    return {y};
  };
  return c;
}

OpCase unary_case(const std::string& name, std::function<Tensor(const Tensor&)> f, ref::UnaryOp op, double s,
                  Input x, std::function<Tensor(const Tensor& x, const Tensor& y, const Tensor& g)> grad) {
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
  c.bwd = [ta, tb](const TVec& x, const TVec&, const Tensor& g) -> TVec {
    return matmul_grads(x[0], x[1], g, ta, tb);
  };
  const Shape sa = a.shape, sb = b.shape;
  c.fwd_d = [sa, sb, ta, tb](const std::vector<DVec>& x) -> std::vector<DVec> {
    const size_t na = sa.size(), nb = sb.size();
    const Shape ab(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
    const Shape bs = ops::broadcast_shapes(ab, bb);
    const Shape ca = cstr(sa), cb = cstr(sb);
    Shape abst(bs.size(), 0), bbst(bs.size(), 0);
    for (size_t i = 0; i < ab.size(); ++i)
      abst[bs.size() - ab.size() + i] = ab[i] == 1 ? 0 : ca[i];
    for (size_t i = 0; i < bb.size(); ++i)
      bbst[bs.size() - bb.size() + i] = bb[i] == 1 ? 0 : cb[i];
    const int64_t M = ta ? sa[na - 1] : sa[na - 2], K = ta ? sa[na - 2] : sa[na - 1];
    const int64_t N = tb ? sb[nb - 2] : sb[nb - 1];
    const int64_t sam = ta ? 1 : ca[na - 2], sak = ta ? ca[na - 2] : 1;
    const int64_t sbk = tb ? 1 : cb[nb - 2], sbn = tb ? cb[nb - 2] : 1;
    DVec y(static_cast<size_t>(shape_numel(bs) * M * N));
    ref::matmul<double>(int(bs.size()), bs.data(), x[0].data(), abst.data(), sam, sak, x[1].data(), bbst.data(),
                        sbk, sbn, y.data(), M, N, K);
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
    ref::linear<double>(N, IN, OUT, v[0].data(), IN, 1, v[1].data(), swo, swi, bias ? v[2].data() : nullptr,
                        y.data());
    return {y};
  };
  c.bwd_d = [=](const std::vector<DVec>& v, const DVec& g) -> std::vector<DVec> {
    DVec gx(static_cast<size_t>(N * IN)), gw(static_cast<size_t>(IN * OUT)), gb(static_cast<size_t>(OUT));
    ref::linear_backward<double>(N, IN, OUT, g.data(), v[0].data(), IN, 1, v[1].data(), swo, swi, gx.data(),
                                 gw.data(), swo, swi, gb.data());
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
    Tensor r = ops::add(Tensor::zeros(sh), gk);  // sh
    return {is_mean ? ops::mul_scalar(r, 1.0 / double(count)) : r};
  };
  c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
    Shape so = cstr(keep);
    for (size_t i = 0; i < sh.size(); ++i)
      if (red[i]) so[i] = 0;
    DVec y(static_cast<size_t>(shape_numel(keep)));
    const Shape si = cstr(sh);
    ref::reduce_sum<double>(int(sh.size()), sh.data(), v[0].data(), si.data(), y.data(), so.data(),
                            int64_t(y.size()));
    if (is_mean)
      for (auto& e : y) e /= double(count);
    return {y};
  };
  return c;
}

std::vector<OpCase> all_cases() {
  using ref::BinaryOp;
  using ref::UnaryOp;
  std::vector<OpCase> cs;

  // ---- elementwise, with broadcasting and non-contiguous views
  for (auto [nm, op] : {std::pair{"add", BinaryOp::Add}, {"sub", BinaryOp::Sub}, {"mul", BinaryOp::Mul},
                        {"div", BinaryOp::Div}}) {
    const double lo = op == BinaryOp::Div ? 0.5 : -1.0;
    cs.push_back(binary_case(std::string(nm) + "_same", op, {in({3, 4}), in({3, 4}).Range(lo, 2)}));
    cs.push_back(binary_case(std::string(nm) + "_row_bcast", op, {in({2, 3, 5}), in({5}).Range(lo, 2)}));
    cs.push_back(binary_case(std::string(nm) + "_both_bcast", op, {in({2, 1, 4}), in({3, 1}).Range(lo, 2)}));
    cs.push_back(binary_case(std::string(nm) + "_views", op, {in({4, 3}).T(), in({4, 3}).Sliced().Range(lo, 2)}));
    cs.push_back(binary_case(std::string(nm) + "_expanded", op, {in({3, 4}).Expand(0), in({3, 4}).T().Range(lo, 2)}));
  }
  cs.push_back(unary_case("add_scalar", [](const Tensor& x) { return ops::add_scalar(x, 0.75); },
                          UnaryOp::AddScalar, 0.75, in({3, 5}).T(),
                          [](const Tensor&, const Tensor&, const Tensor& g) { return ops::mul_scalar(g, 1.0); }));
  cs.push_back(unary_case("mul_scalar", [](const Tensor& x) { return ops::mul_scalar(x, -1.5); },
                          UnaryOp::MulScalar, -1.5, in({3, 5}).Sliced(),
                          [](const Tensor&, const Tensor&, const Tensor& g) { return ops::mul_scalar(g, -1.5); }));
  cs.push_back(unary_case("neg", [](const Tensor& x) { return ops::neg(x); }, UnaryOp::Neg, 0, in({2, 3, 4}),
                          [](const Tensor&, const Tensor&, const Tensor& g) { return ops::neg(g); }));
  cs.push_back(unary_case("exp", [](const Tensor& x) { return ops::exp(x); }, UnaryOp::Exp, 0, in({4, 6}).T(),
                          [](const Tensor&, const Tensor& y, const Tensor& g) { return ops::mul(g, y); }));
  cs.push_back(unary_case("log", [](const Tensor& x) { return ops::log(x); }, UnaryOp::Log, 0,
                          in({4, 6}).Sliced().Range(0.2, 3),
                          [](const Tensor& x, const Tensor&, const Tensor& g) { return ops::div(g, x); }));
  cs.push_back(unary_case("tanh", [](const Tensor& x) { return ops::tanh(x); }, UnaryOp::Tanh, 0,
                          in({5, 7}).Range(-3, 3), [](const Tensor&, const Tensor& y, const Tensor& g) {
                            return ops::mul(g, ops::add_scalar(ops::neg(ops::mul(y, y)), 1.0));  // g (1 - y^2)
                          }));
  cs.push_back(unary_case("sqrt", [](const Tensor& x) { return ops::sqrt(x); }, UnaryOp::Sqrt, 0,
                          in({3, 4}).Expand(1).Range(0.2, 3), [](const Tensor&, const Tensor& y, const Tensor& g) {
                            return ops::div(ops::mul_scalar(g, 0.5), y);  // g / (2 sqrt(x))
                          }));

  // ---- add_ (in place, src broadcast, non-contiguous dst)
  {
    OpCase c;
    c.name = "add_inplace_bcast_noncontig_dst";
    c.inputs = {in({4, 3}), in({3})};
    c.fwd = [](const TVec& x) -> TVec {
      Tensor dst = Tensor::empty({3, 4}).transpose(0, 1);  // (4, 3), column-major
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
  for (auto [from, to] : {std::pair{Shape{2, 3, 4}, Shape{3, 1}}, {Shape{2, 3, 4}, Shape{4}},
                          {Shape{2, 3, 4}, Shape{2, 1, 4}}, {Shape{3, 4}, Shape{3, 4}}, {Shape{5, 2}, Shape{}}}) {
    OpCase c;
    c.name = fmt::format("sum_to_{}_{}", shape_str(from), shape_str(to));
    c.inputs = {from.size() >= 2 ? in(from).T() : in(from)};
    c.fwd = [to](const TVec& x) -> TVec { return {ops::sum_to(x[0], to)}; };
    c.bwd = [from](const TVec&, const TVec&, const Tensor& g) -> TVec {
      return {ops::add(Tensor::zeros(from), g)};
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
      cs.push_back(matmul_case(in(ta ? Shape{2, 3, 6, 5} : Shape{2, 3, 5, 6}), in(tb ? Shape{7, 6} : Shape{6, 7}),
                               ta, tb));
      cs.push_back(matmul_case(in(ta ? Shape{2, 1, 4, 3} : Shape{2, 1, 3, 4}).T(),
                               in(tb ? Shape{3, 5, 4} : Shape{3, 4, 5}).T(), ta, tb));
    }
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
      DVec y(static_cast<size_t>(N * C)), m(static_cast<size_t>(N)), r(static_cast<size_t>(N)), gx(static_cast<size_t>(N * C)), gw(static_cast<size_t>(C)), gb(static_cast<size_t>(C));
      ref::layer_norm<double>(N, C, v[0].data(), v[1].data(), v[2].data(), 1e-5, y.data(), m.data(), r.data());
      ref::layer_norm_backward<double>(N, C, g.data(), v[0].data(), v[1].data(), m.data(), r.data(), gx.data(),
                                       gw.data(), gb.data());
      return {gx, gw, gb};
    };
    c.tol_cpu = 1e-5;
    c.tol_fd_f = 2e-4;  // rstd amplifies f32 rounding of (x - mean)
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

  // ---- attention: causal and not; T not a multiple of any block size; (B, T, NH, HS) views
  struct AttnShape { int64_t B, NH, T, HS; bool causal; bool view; };
  for (auto s : {AttnShape{2, 2, 7, 5, true, false}, AttnShape{1, 3, 9, 4, false, true},
                 AttnShape{2, 1, 70, 3, true, true}, AttnShape{1, 2, 67, 6, false, false}}) {
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
      DVec o(static_cast<size_t>(BH * T * HS)), l(static_cast<size_t>(BH * T)), gq(o.size()), gk(o.size()), gv(o.size());
      ref::attention<double>(BH, T, HS, v[0].data(), v[1].data(), v[2].data(), causal, scale, o.data(), l.data());
      ref::attention_backward<double>(BH, T, HS, g.data(), v[0].data(), v[1].data(), v[2].data(), o.data(),
                                      l.data(), causal, scale, gq.data(), gk.data(), gv.data());
      return {gq, gk, gv};
    };
    c.tol_cpu = 1e-5;
    c.tol_f32 = 1e-5;
    c.tol_fd_f = 2e-4;
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
    cs.push_back(c);
  }
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
//   matmul.cpp       gather n > 1 << 15; linear_backward's bias grad is column_sum (elementwise.cpp)
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
  std::function<TVec()> run;   // forward + backward on the active backend; inputs captured
  double tol = 2e-6;           // cpu vs ref, every output: the harness tolerance of the op
  std::vector<bool> bitwise = {};  // per output: thread-count independent (empty: all outputs)
  // Oracle in double, used instead of the Ref backend where ref's f32 rounding is the larger error.
  std::function<std::vector<DVec>()> exact = {};
};

std::vector<BigCase> all_big_cases() {
  std::vector<BigCase> cs;
  // elementwise.cpp: n = 130 * 257 = 33410 > 1 << 15 (and not a multiple of any block size).
  const int64_t R = 130, C = 257;
  const Tensor a = randn({R, C}, 101), b = randn({R, C}, 102, 0.5, 2.0);
  const Tensor at = randn({C, R}, 103).transpose(0, 1);                   // (R, C), column-major
  const Tensor as = randn({R, 2 * C + 1}, 104).slice(1, 1, 2 * C + 1, 2);  // (R, C), stride 2
  const Tensor row = randn({C}, 105, 0.5, 2.0), col = randn({R, 1}, 106, 0.5, 2.0);

  cs.push_back({"binary_contig", [=] {
                  return TVec{ops::add(a, b), ops::sub(a, b), ops::mul(a, b), ops::div(a, b)};
                }});
  cs.push_back({"binary_strided_bcast", [=] {
                  return TVec{ops::add(at, row), ops::mul(as, col), ops::div(at, b), ops::sub(row, as),
                              ops::mul(at, as)};
                }});
  cs.push_back({"unary_contig", [=] {
                  return TVec{ops::add_scalar(a, 0.75), ops::mul_scalar(a, -1.5), ops::neg(a), ops::exp(a),
                              ops::tanh(a), ops::log(b), ops::sqrt(b)};
                }});
  cs.push_back({"unary_strided", [=] {
                  return TVec{ops::add_scalar(at, 0.75), ops::mul_scalar(as, -1.5), ops::neg(at), ops::exp(as),
                              ops::tanh(at)};
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
                  return TVec{ops::sum(a, {0}), ops::sum(a, {1}, true), ops::sum_to(a, {C}), ops::sum_to(a, {R, 1}),
                              ops::mean(a, {0}), ops::sum(a3, {0}), ops::sum(a3, {0, 1}), ops::sum(at, {0}),
                              ops::sum_to(as, {1, C})};
                }});
  {  // Long sums (33410 terms and more): contiguous_sum's 4096-blocks and row sums of whole
     // slices. The ref kernel sums in f32 in one sequential chain (measured 1.5e-5 off on these
     // sizes), so the oracle here is the sum in double. Positive values: no cancellation, so
     // the f32 result must be within a few ulp per block of the exact sum.
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
    cs.push_back({"long_sums", [=] {
                    return TVec{ops::sum_all(p), ops::sum_all(p3), ops::mean(p3, {}), ops::sum(p3, {1, 2}),
                                ops::sum_to(p3, {4, 1, 1})};
                  },
                  2e-6, {}, [=] {
                    return std::vector<DVec>{exact(p, 1), exact(p3, 1), mean3, exact(p3, 4), exact(p3, 4)};
                  }});
  }
  cs.push_back({"gelu", [=] {
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
    cs.push_back({"layer_norm", [=] {
                    ops::LayerNormOut o = ops::layer_norm(x, w, bb, 1e-5);
                    ops::LayerNormGrads g = ops::layer_norm_backward(gy, x, w, o.mean, o.rstd);
                    return TVec{o.y, o.mean, o.rstd, g.gx, g.gw, g.gb};
                  },
                  1e-5});
  }
  {  // softmax: N * C = 150 * 130 > 1 << 14
    const Tensor x = randn({150, 130}, 115, -5, 5), gy = randn({150, 130}, 116);
    cs.push_back({"softmax", [=] {
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
    cs.push_back({"cross_entropy", [=] {
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
                  1e-5, {false, false, false, false, false}});
  }
  // linear: the bias grad is column_sum (elementwise.cpp) with N * OUT = 300 * 130 > 1 << 15;
  // y, gx, gw come from oneDNN (no thread-count claim). x has stride 2 in its last dim, which
  // oneDNN does not take, so matmul.cpp gathers it (N * IN = 36000 > 1 << 15).
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
                  2e-6, {false, false, false, true}});
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
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message '" << msg << "' lacks '" << p << "'";
  }
}

TEST(Ops, BadInputsGiveHelpfulErrors) {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4, 3});
  expect_error<ShapeError>([&] { ops::add(a, b); }, {"add", "(2, 3)", "(4, 3)", "broadcast"});
  expect_error<ShapeError>([&] { ops::matmul(a, a); }, {"matmul", "inner", "K = 3", "K = 2"});
  expect_error<ShapeError>([&] { ops::matmul(a, Tensor::zeros({3})); }, {"matmul", "2 dims"});
  expect_error<ShapeError>([&] { ops::linear(a, Tensor::zeros({5, 4}), Tensor(), ops::WeightLayout::OutIn); },
                           {"linear", "3 input features", "expects 4"});
  expect_error<ShapeError>([&] { ops::add(a, Tensor::zeros({2, 3}, DType::I32)); }, {"add", "f32", "i32"});
  expect_error<ValueError>([&] { ops::embedding(Tensor::zeros({5, 2}), Tensor::from_vector_i64({1, 5}, {2})); },
                           {"embedding", "id 5", "V = 5"});
  expect_error<ValueError>([&] { ops::embedding(Tensor::zeros({5, 2}), Tensor::from_vector_i64({-1}, {1})); },
                           {"id -1"});
  expect_error<ValueError>(
      [&] { ops::cross_entropy(Tensor::zeros({2, 4}), Tensor::from_vector_i64({1, 9}, {2})); },
      {"cross_entropy", "target 9", "V = 4"});
  expect_error<ShapeError>([&] { ops::cross_entropy(Tensor::zeros({2, 4}), Tensor::from_vector_i64({1}, {1})); },
                           {"cross_entropy", "targets"});
  expect_error<ShapeError>([&] { ops::layer_norm(a, Tensor::ones({2}), Tensor::zeros({3}), 1e-5); },
                           {"layer_norm", "'w'", "(3)"});
  expect_error<ShapeError>(
      [&] { ops::attention(Tensor::zeros({1, 2, 3, 4}), Tensor::zeros({1, 2, 4, 4}), Tensor::zeros({1, 2, 3, 4}), true, 1.0); },
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

}  // namespace
