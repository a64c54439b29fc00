// Op-harness cases of the elementwise family (src/brigade/ops/elementwise.h): add, sub, mul, div
// with broadcasting and views (also the squeeze-and-excitation gate's (N, C, 1, 1) broadcast), the
// scalar and unary ops, add_ in place, sum_to, and the activations gelu, gelu_erf, silu, relu,
// sigmoid and reciprocal, the fused add_relu (also bitwise relu(add) on special values); the big
// cases above elementwise.cpp's OpenMP threshold.
#include "ops/harness.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "brigade/core/error.h"
#include "brigade/ops/cpu/kernels.h"

namespace brigade::optest {

namespace {

OpCase silu_case(Input x) {
  const int64_t n = shape_numel(x.shape);
  OpCase c;
  c.name = fmt::format("silu_{}{}", shape_str(x.shape), layout_name(x.layout));
  c.inputs = {x};
  c.fwd = [](const TVec& v) -> TVec { return {ops::silu(v[0])}; };
  c.bwd = [](const TVec& v, const TVec&, const Tensor& g) -> TVec { return {ops::silu_backward(g, v[0])}; };
  c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
    DVec y(static_cast<size_t>(n));
    ref::silu<double>(n, v[0].data(), y.data());
    return {y};
  };
  c.bwd_d = [=](const std::vector<DVec>& v, const DVec& g) -> std::vector<DVec> {
    DVec gx(static_cast<size_t>(n));
    ref::silu_backward<double>(n, g.data(), v[0].data(), gx.data());
    return {gx};
  };
  c.tol_cpu = 1e-5;
  return c;
}

OpCase add_relu_case(Input a, Input b) {
  const int64_t n = shape_numel(a.shape);
  OpCase c;
  c.name = fmt::format("add_relu_{}{}_{}", shape_str(a.shape), layout_name(a.layout), layout_name(b.layout));
  c.inputs = {a, b};
  c.fwd = [](const TVec& v) -> TVec { return {ops::add_relu(v[0], v[1])}; };
  c.bwd = [](const TVec&, const TVec& y, const Tensor& g) -> TVec {
    const Tensor gs = ops::relu_backward(g, y[0]);  // the gradient of both inputs
    return {gs, gs};
  };
  c.fwd_d = [n](const std::vector<DVec>& v) -> std::vector<DVec> {
    DVec y(static_cast<size_t>(n));
    ref::add_relu<double>(n, v[0].data(), v[1].data(), y.data());
    return {y};
  };
  c.bwd_d = [n](const std::vector<DVec>& v, const DVec& g) -> std::vector<DVec> {
    DVec y(static_cast<size_t>(n)), gs(static_cast<size_t>(n));
    ref::add_relu<double>(n, v[0].data(), v[1].data(), y.data());
    ref::relu_backward<double>(n, g.data(), y.data(), gs.data());
    return {gs, gs};
  };
  return c;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(), a.nbytes()) == 0;
}

}  // namespace

std::vector<OpCase> elementwise_cases() {
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
  cs.push_back(add_relu_case(in({3, 4}), in({3, 4})));  // sums of both signs
  cs.push_back(add_relu_case(in({3, 4}).T(), in({3, 4}).Sliced()));
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

  // ---- sum_to: the backward of broadcasting
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

  // ---- activations: gelu (tanh form), gelu_erf (erf form), silu, relu, sigmoid, reciprocal
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
  for (auto x : {in({4, 33}).Range(-5, 5), in({6, 5}).T().Range(-4, 4), in({3, 8}).Sliced().Range(-3, 3)}) {
    const int64_t n = shape_numel(x.shape);
    OpCase c;
    c.name = fmt::format("gelu_erf_{}{}", shape_str(x.shape), layout_name(x.layout));
    c.inputs = {x};
    c.fwd = [](const TVec& v) -> TVec { return {ops::gelu_erf(v[0])}; };
    c.bwd = [](const TVec& v, const TVec&, const Tensor& g) -> TVec { return {ops::gelu_erf_backward(g, v[0])}; };
    c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
      DVec y(static_cast<size_t>(n));
      ref::gelu_erf<double>(n, v[0].data(), y.data());
      return {y};
    };
    c.bwd_d = [=](const std::vector<DVec>& v, const DVec& g) -> std::vector<DVec> {
      DVec gx(static_cast<size_t>(n));
      ref::gelu_erf_backward<double>(n, g.data(), v[0].data(), gx.data());
      return {gx};
    };
    c.tol_cpu = 1e-5;
    cs.push_back(c);
  }
  for (auto x : {in({4, 33}).Range(-6, 6), in({6, 5}).T().Range(-6, 6)}) cs.push_back(silu_case(x));
  {
    OpCase c;
    c.name = "relu_3x17";
    c.inputs = {in({3, 17})};
    c.fwd = [](const TVec& v) -> TVec { return {ops::relu(v[0])}; };
    c.bwd = [](const TVec&, const TVec& y, const Tensor& g) -> TVec { return {ops::relu_backward(g, y[0])}; };
    c.fwd_d = [](const std::vector<DVec>& v) -> std::vector<DVec> {
      DVec y(v[0].size());
      ref::relu<double>(int64_t(y.size()), v[0].data(), y.data());
      return {y};
    };
    c.bwd_d = [](const std::vector<DVec>& v, const DVec& g) -> std::vector<DVec> {
      DVec y(v[0].size()), gx(v[0].size());
      ref::relu<double>(int64_t(y.size()), v[0].data(), y.data());
      ref::relu_backward<double>(int64_t(y.size()), g.data(), y.data(), gx.data());
      return {gx};
    };
    cs.push_back(c);
  }
  for (Input x : {in({3, 17}).Range(-6, 6), in({2, 3, 4, 5}).Swap(1, 3).Range(-6, 6)}) {
    const int64_t n = shape_numel(x.shape);
    OpCase c;
    c.name = fmt::format("sigmoid_{}{}", shape_str(x.shape), layout_name(x.layout));
    c.inputs = {x};
    c.fwd = [](const TVec& v) -> TVec { return {ops::sigmoid(v[0])}; };
    c.bwd = [](const TVec&, const TVec& y, const Tensor& g) -> TVec { return {ops::sigmoid_backward(g, y[0])}; };
    c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
      DVec y(static_cast<size_t>(n));
      ref::sigmoid<double>(n, v[0].data(), y.data());
      return {y};
    };
    c.bwd_d = [=](const std::vector<DVec>& v, const DVec& g) -> std::vector<DVec> {
      DVec y(static_cast<size_t>(n)), gx(static_cast<size_t>(n));
      ref::sigmoid<double>(n, v[0].data(), y.data());
      ref::sigmoid_backward<double>(n, g.data(), y.data(), gx.data());
      return {gx};
    };
    cs.push_back(c);
  }
  // away from 0 on both sides (1 / x is steep there, which a finite difference would blur)
  for (Input x : {in({3, 17}).Range(0.5, 4), in({2, 3, 4, 5}).Swap(1, 3).Range(-4, -0.5)}) {
    const int64_t n = shape_numel(x.shape);
    OpCase c;
    c.name = fmt::format("reciprocal_{}{}", shape_str(x.shape), layout_name(x.layout));
    c.inputs = {x};
    c.fwd = [](const TVec& v) -> TVec { return {ops::reciprocal(v[0])}; };
    c.bwd = [](const TVec&, const TVec& y, const Tensor& g) -> TVec { return {ops::reciprocal_backward(g, y[0])}; };
    c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
      DVec y(static_cast<size_t>(n));
      ref::reciprocal<double>(n, v[0].data(), y.data());
      return {y};
    };
    c.bwd_d = [=](const std::vector<DVec>& v, const DVec& g) -> std::vector<DVec> {
      DVec y(static_cast<size_t>(n)), gx(static_cast<size_t>(n));
      ref::reciprocal<double>(n, v[0].data(), y.data());
      ref::reciprocal_backward<double>(n, g.data(), y.data(), gx.data());
      return {gx};
    };
    cs.push_back(c);
  }

  // ---- the squeeze-and-excitation gate: x (N, C, H, W) * s (N, C, 1, 1), ops::mul's broadcasting;
  // the gradients as fn::mul computes them (s's through sum_to over H, W).
  cs.push_back(binary_case("mul_se_gate", ref::BinaryOp::Mul, {in({2, 3, 4, 5}), in({2, 3, 1, 1})}));
  cs.push_back(binary_case("mul_se_gate_views", ref::BinaryOp::Mul,
                           {in({2, 4, 3, 3}).Swap(1, 3), in({2, 4, 1, 1}).Range(0, 1)}));
  return cs;
}

std::vector<BigCase> elementwise_big_cases() {
  std::vector<BigCase> cs;
  // n = 130 * 257 = 33410 > 1 << 15 (and not a multiple of any block size).
  const int64_t R = kBigR, C = kBigC;
  const BigInputs big = big_inputs();
  const Tensor a = big.a, b = big.b, at = big.at, as = big.as, row = big.row, col = big.col;

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
  cs.push_back({"add_relu", [=] {
                  const Tensor y = ops::add_relu(a, ops::neg(b));  // both signs
                  return TVec{y, ops::add_relu(at, as), ops::relu_backward(a, y)};
                }});
  cs.push_back({"gelu",
                [=] {
                  Tensor x = ops::mul_scalar(a, 4.0);
                  return TVec{ops::gelu(x), ops::gelu_backward(b, x)};
                },
                1e-5});
  return cs;
}

std::vector<Big16Case> elementwise_big16_cases() {
  std::vector<Big16Case> cs;
  const int64_t R = kBigR, C = kBigC;
  cs.push_back({"binary", [=](DType dt) {
                  const BigInputs x = big_inputs(dt);
                  return TVec{ops::add(x.a, x.b),  ops::sub(x.a, x.b),    ops::mul(x.a, x.b),
                              ops::div(x.a, x.b),  ops::add(x.at, x.row), ops::mul(x.as, x.col),
                              ops::div(x.at, x.b), ops::sub(x.row, x.as), ops::mul(x.at, x.as)};
                }});
  cs.push_back({"add_relu", [=](DType dt) {
                  const BigInputs x = big_inputs(dt);
                  return TVec{ops::add_relu(x.a, ops::neg(x.b)), ops::add_relu(x.at, x.as)};
                }});
  cs.push_back({"unary", [=](DType dt) {
                  const BigInputs x = big_inputs(dt);
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
                  const BigInputs x = big_inputs(dt);
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
  cs.push_back(
      {"gelu", [=](DType dt) {
         const BigInputs x = big_inputs(dt);
         const Tensor x4 = ops::mul_scalar(x.a, 4.0);
         return TVec{ops::gelu(x4), ops::gelu_backward(x.b, x4), ops::gelu(x.at), ops::gelu_backward(x.as, x.at)};
       }});
  return cs;
}

// add_relu is bitwise relu(add(a, b)) in f32, bf16 and f16, natively and widened, on both
// backends: every pair of special values (signed zeros, infinities whose sum is NaN, NaN,
// denormals, sums that overflow f16) and random values above the OpenMP threshold.
TEST(Ops, AddReluIsBitwiseReluOfAdd) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> sp = {0.f, -0.f, 1.f, -1.f, 0.5f, inf, -inf, nan, 1e-40f, -1e-40f, 6e4f, -3e-8f, 2.75f};
  const int64_t m = int64_t(sp.size());
  std::vector<float> va, vb;
  for (float x : sp)
    for (float y : sp) {
      va.push_back(x);
      vb.push_back(y);
    }
  const Tensor sa = Tensor::from_vector(va, {m, m}), sb = Tensor::from_vector(vb, {m, m});
  const Tensor ra = randn({kBigR, kBigC}, 101), rb = ops::neg(randn({kBigR, kBigC}, 102));
  for (ops::Backend be : {ops::Backend::Cpu, ops::Backend::Ref})
    for (DType dt : {DType::F32, DType::BF16, DType::F16})
      for (bool native : {true, false}) {
        ops::BackendScope s(be);
        ops::cpu::Native16Scope mode(native);
        SCOPED_TRACE(fmt::format("{} {} {}", be == ops::Backend::Cpu ? "cpu" : "ref", dtype_name(dt),
                                 native ? "native" : "widened"));
        for (auto [a0, b0] :
             {std::pair{sa, sb}, std::pair{ra, rb}, std::pair{ra.transpose(0, 1), rb.transpose(0, 1)}}) {
          const Tensor a = a0.to(dt), b = b0.to(dt);
          EXPECT_TRUE(same_bytes(ops::add_relu(a, b), ops::relu(ops::add(a, b))));
        }
      }
  try {
    ops::add_relu(Tensor::zeros({2, 3}), Tensor::zeros({3}));
    ADD_FAILURE() << "a broadcast was accepted";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("add_relu: a (2, 3) and b (3) must have the same shape"), std::string::npos)
        << e.what();
  }
}

}  // namespace brigade::optest
