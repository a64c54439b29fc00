// The definitions of tests/ops/harness.h: inputs and their layouts, the case builders, the
// shared inputs of the big cases.
#include "ops/harness.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

namespace brigade::optest {

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

Tensor make_tensor(const Input& x, const DVec& v, DType dt) {
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

Shape cstr(const Shape& s) { return contiguous_strides(s); }
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

namespace {
TVec matmul_grads(const Tensor& a, const Tensor& b, const Tensor& g, bool ta, bool tb) {
  // y = opA @ opB  =>  d opA = g @ opB^T,  d opB = opA^T @ g
  Tensor ga = ta ? ops::matmul(b, g, tb, true) : ops::matmul(g, b, false, !tb);
  Tensor gb = tb ? ops::matmul(g, a, true, ta) : ops::matmul(a, g, !ta, false);
  return {ops::sum_to(ga, a.shape()), ops::sum_to(gb, b.shape())};
}

}  // namespace

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

Tensor randn(const Shape& s, unsigned seed, double lo, double hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> U{float(lo), float(hi)};
  std::vector<float> v(static_cast<size_t>(shape_numel(s)));
  for (auto& e : v) e = U(rng);
  return Tensor::from_vector(v, s);
}
bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(), a.nbytes()) == 0;
}

BigInputs big_inputs(DType dt) {
  const int64_t R = kBigR, C = kBigC;
  return BigInputs{randn({R, C}, 101).to(dt),
                   randn({R, C}, 102, 0.5, 2.0).to(dt),
                   randn({C, R}, 103).to(dt).transpose(0, 1),                    // (R, C), column-major
                   randn({R, 2 * C + 1}, 104).to(dt).slice(1, 1, 2 * C + 1, 2),  // (R, C), stride 2
                   randn({C}, 105, 0.5, 2.0).to(dt),
                   randn({R, 1}, 106, 0.5, 2.0).to(dt),
                   randn({4, R, C}, 107).to(dt)};
}

}  // namespace brigade::optest
