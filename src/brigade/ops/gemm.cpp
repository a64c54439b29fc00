// Matmul and linear front-ends (ops/gemm.h): the bf16 GEMM path or the widened one, then
// oneDNN (cpu) or the oracle (ref).
#include "brigade/ops/gemm.h"

#include "brigade/ops/detail.h"

namespace brigade::ops {

using namespace detail;

// ---------------------------------------------------------------- matmul / linear

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  check_float(a, "matmul", "a");
  check_float(b, "matmul", "b");
  BRIGADE_CHECK(a.dim() >= 2 && b.dim() >= 2, ShapeError,
                "matmul: both operands need at least 2 dims, got a {} and b {}; unsqueeze 1-D vectors first",
                shape_str(a.shape()), shape_str(b.shape()));
  const int64_t na = a.dim(), nb = b.dim();
  const int64_t M = trans_a ? a.size(-1) : a.size(-2), K = trans_a ? a.size(-2) : a.size(-1);
  const int64_t K2 = trans_b ? b.size(-1) : b.size(-2), N = trans_b ? b.size(-2) : b.size(-1);
  BRIGADE_CHECK(K == K2, ShapeError, "matmul: inner dimensions differ: a {}{} gives K = {} but b {}{} gives K = {}",
                shape_str(a.shape()), trans_a ? " (transposed)" : "", K, shape_str(b.shape()),
                trans_b ? " (transposed)" : "", K2);
  const Shape ab(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
  const Shape bshape = broadcast_named(ab, bb, "matmul (batch dims)");
  // Batch strides of a/b over bshape (0 where broadcast): view the batch part as its own tensor.
  auto batch_strides = [&](const Tensor& t, const Shape& tb) {
    Shape st(bshape.size(), 0);
    const size_t lead = bshape.size() - tb.size();
    for (size_t i = 0; i < tb.size(); ++i) st[lead + i] = (tb[i] == 1 && bshape[lead + i] != 1) ? 0 : t.strides()[i];
    return st;
  };
  const Shape abst = batch_strides(a, ab), bbst = batch_strides(b, bb);
  const int64_t sam = trans_a ? a.stride(na - 1) : a.stride(na - 2),
                sak = trans_a ? a.stride(na - 2) : a.stride(na - 1);
  const int64_t sbk = trans_b ? b.stride(nb - 1) : b.stride(nb - 2),
                sbn = trans_b ? b.stride(nb - 2) : b.stride(nb - 1);
  Shape out = bshape;
  out.push_back(M);
  out.push_back(N);
  if (gemm16({&a, &b})) {                      // oneDNN 16-bit GEMM, f32 accumulation, rounded once
    Tensor c = Tensor::empty(out, a.dtype());  // (..., M, N)
    cpu::matmul16(a.dtype(), a.dtype(), int(bshape.size()), bshape.data(), a.data<uint16_t>(), abst.data(), sam, sak,
                  b.data<uint16_t>(), bbst.data(), sbk, sbn, c.raw_data(), M, N, K);
    return c;
  }
  if (auto r = via_f32(
          {same_or_f32(a, b)}, [&](const Tensor& x, const Tensor& y) { return matmul(x, y, trans_a, trans_b); }, a, b))
    return *r;
  Tensor c = Tensor::empty(out);  // (..., M, N)
  BRIGADE_DISPATCH(matmul, int(bshape.size()), bshape.data(), a.data<float>(), abst.data(), sam, sak, b.data<float>(),
                   bbst.data(), sbk, sbn, c.data<float>(), M, N, K);
  return c;
}

namespace {
struct LinearDims {
  int64_t N, IN, OUT, swo, swi;
  Tensor x2;  // x viewed (N, IN)
};
LinearDims linear_dims(const Tensor& x, const Tensor& w, WeightLayout layout, const char* op) {
  check_float(x, op, "x");
  check_float(w, op, "w");
  BRIGADE_CHECK(w.dim() == 2, ShapeError, "{}: the weight must be 2-D ({}), got {}", op,
                layout == WeightLayout::OutIn ? "(out, in)" : "(in, out)", shape_str(w.shape()));
  BRIGADE_CHECK(x.dim() >= 1, ShapeError, "{}: x must have at least 1 dim, got a 0-d tensor", op);
  LinearDims d;
  const bool oi = layout == WeightLayout::OutIn;
  d.OUT = oi ? w.size(0) : w.size(1);
  d.IN = oi ? w.size(1) : w.size(0);
  d.swo = oi ? w.stride(0) : w.stride(1);
  d.swi = oi ? w.stride(1) : w.stride(0);
  BRIGADE_CHECK(x.size(-1) == d.IN, ShapeError,
                "{}: x {} has {} input features but the weight {} ({} layout) expects {}; check the layer sizes "
                "and the WeightLayout",
                op, shape_str(x.shape()), x.size(-1), shape_str(w.shape()), oi ? "OutIn (out, in)" : "InOut (in, out)",
                d.IN);
  d.N = d.IN ? x.numel() / d.IN : 0;
  d.x2 = x.reshape({d.N, d.IN});  // (N, IN), a view when the strides allow it
  return d;
}
}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, WeightLayout layout) {
  LinearDims d = linear_dims(x, w, layout, "linear");
  Tensor bc;
  if (bias.defined()) {
    check_float(bias, "linear", "bias");
    BRIGADE_CHECK(bias.dim() == 1 && bias.size(0) == d.OUT, ShapeError,
                  "linear: bias must be ({}) to match {} output features, got {}", d.OUT, d.OUT,
                  shape_str(bias.shape()));
    bc = bias.contiguous();
  }
  Shape out = x.shape();
  out.back() = d.OUT;
  if (gemm16({&x, &w}) && d.N > 0 && d.IN > 0 && d.OUT > 0) {  // oneDNN 16-bit GEMM + bias, rounded once
    if (bc.defined() && bc.dtype() != DType::F32 && bc.dtype() != x.dtype()) bc = cast(bc, DType::F32);
    Tensor y = Tensor::empty(out, x.dtype());  // (..., OUT)
    cpu::linear16(x.dtype(), x.dtype(), d.N, d.IN, d.OUT, d.x2.data<uint16_t>(), d.x2.stride(0), d.x2.stride(1),
                  w.data<uint16_t>(), d.swo, d.swi, bc.defined() ? bc.raw_data() : nullptr,
                  bc.defined() ? bc.dtype() : DType::F32, y.raw_data());
    return y;
  }
  if (auto r = via_f32(
          {same_or_f32(x, w)},
          [&](const Tensor& a, const Tensor& b, const Tensor& c) { return linear(a, b, c, layout); }, x, w, bias))
    return *r;
  Tensor y = Tensor::empty(out);  // (..., OUT)
  BRIGADE_DISPATCH(linear, d.N, d.IN, d.OUT, d.x2.data<float>(), d.x2.stride(0), d.x2.stride(1), w.data<float>(), d.swo,
                   d.swi, bc.defined() ? bc.data<float>() : nullptr, y.data<float>());
  return y;
}

LinearGrads linear_backward(const Tensor& gy, const Tensor& x, const Tensor& w, WeightLayout layout, bool need_gx,
                            bool need_gw, bool need_gb) {
  LinearDims d = linear_dims(x, w, layout, "linear_backward");
  check_float(gy, "linear_backward", "gy");
  Shape ys = x.shape();
  ys.back() = d.OUT;
  BRIGADE_CHECK(gy.shape() == ys, ShapeError, "linear_backward: gy has shape {} but the output of linear was {}",
                shape_str(gy.shape()), shape_str(ys));
  const bool oi = layout == WeightLayout::OutIn;
  if (gemm16({&gy, &x, &w}) && d.N > 0 && d.IN > 0 && d.OUT > 0) {  // oneDNN 16-bit GEMMs, rounded once
    const DType dt = x.dtype();
    Tensor gyc = gy.contiguous();
    LinearGrads g;
    if (need_gx) g.gx = Tensor::empty(x.shape(), dt);  // (..., IN)
    if (need_gw) g.gw = Tensor::empty(w.shape(), dt);  // (OUT, IN) or (IN, OUT)
    cpu::linear_backward16(dt, d.N, d.IN, d.OUT, gyc.data<uint16_t>(), d.x2.data<uint16_t>(), d.x2.stride(0),
                           d.x2.stride(1), w.data<uint16_t>(), d.swo, d.swi, need_gx ? g.gx.data<uint16_t>() : nullptr,
                           need_gw ? g.gw.data<uint16_t>() : nullptr, oi ? d.IN : 1, oi ? 1 : d.OUT);
    if (need_gb) {                                                       // column sums of gy in f32, rounded once
      Tensor gyf = cast(gyc, DType::F32), gbf = Tensor::empty({d.OUT});  // (N, OUT), (OUT)
      cpu::column_sum(d.N, d.OUT, gyf.data<float>(), gbf.data<float>());
      g.gb = cast(gbf, dt);  // (OUT)
    }
    return g;
  }
  if (auto r = via_f32(
          {x.dtype(), w.dtype(), gy.dtype()},
          [&](const Tensor& gy_, const Tensor& x_, const Tensor& w_) {
            return linear_backward(gy_, x_, w_, layout, need_gx, need_gw, need_gb);
          },
          gy, x, w))
    return *r;
  Tensor gyc = gy.contiguous();
  LinearGrads g;
  if (need_gx) g.gx = Tensor::empty(x.shape());  // (..., IN)
  if (need_gw) g.gw = Tensor::empty(w.shape());  // (OUT, IN) or (IN, OUT)
  if (need_gb) g.gb = Tensor::empty({d.OUT});    // (OUT)
  BRIGADE_DISPATCH(linear_backward, d.N, d.IN, d.OUT, gyc.data<float>(), d.x2.data<float>(), d.x2.stride(0),
                   d.x2.stride(1), w.data<float>(), d.swo, d.swi, need_gx ? g.gx.data<float>() : nullptr,
                   need_gw ? g.gw.data<float>() : nullptr, oi ? d.IN : 1, oi ? 1 : d.OUT,
                   need_gb ? g.gb.data<float>() : nullptr);
  return g;
}

}  // namespace brigade::ops
