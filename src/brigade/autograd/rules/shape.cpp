// Derivative rules of the functions that only move values: views, copies, concatenation, the
// backward hook, and Swin's window partition / reverse and patch merging (compositions).
#include "brigade/autograd/rules.h"

namespace brigade::fn {

namespace {

struct ReshapeBackward : Node {
  Shape in_shape;
  const char* name() const override { return "ReshapeBackward"; }
  // forward: out = a.reshape(shape)
  std::vector<Tensor> backward(const Tensor& g) override { return {g.reshape(in_shape)}; }
};

struct TransposeBackward : Node {
  int64_t d0 = 0, d1 = 0;
  const char* name() const override { return "TransposeBackward"; }
  // forward: out = a.transpose(d0, d1)
  std::vector<Tensor> backward(const Tensor& g) override { return {g.transpose(d0, d1).contiguous()}; }
};

struct NarrowBackward : Node {
  Shape in_shape;
  int64_t dim = 0, start = 0, length = 0;
  const char* name() const override { return "NarrowBackward"; }
  // forward: out = a.narrow(dim, start, length)
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor ga = Tensor::zeros(in_shape, g.dtype());  // same shape as a
    ga.narrow(dim, start, length).copy_(g);
    return {ga};
  }
};

}  // namespace

struct HookBackward : Node {
  const char* name() const override { return "HookBackward"; }
  std::function<void()> fn;
  std::vector<Tensor> backward(const Tensor& g) override {
    if (fn) fn();
    return {g};
  }
  void release() override { fn = nullptr; }
};

Tensor backward_hook(const Tensor& x, std::function<void()> on_backward) {
  auto n = std::make_shared<HookBackward>();
  n->fn = std::move(on_backward);
  return record(x.detach(), n, {x});
}

Tensor reshape(const Tensor& a, const Shape& shape) {
  auto n = std::make_shared<ReshapeBackward>();
  n->in_shape = a.shape();
  return record(a.reshape(shape).detach(), n, {a});
}

Tensor transpose(const Tensor& a, int64_t d0, int64_t d1) {
  auto n = std::make_shared<TransposeBackward>();
  n->d0 = d0;
  n->d1 = d1;
  return record(a.transpose(d0, d1).detach(), n, {a});
}

Tensor narrow(const Tensor& a, int64_t dim, int64_t start, int64_t length) {
  auto n = std::make_shared<NarrowBackward>();
  n->in_shape = a.shape();
  n->dim = dim;
  n->start = start;
  n->length = length;
  return record(a.narrow(dim, start, length).detach(), n, {a});
}

namespace {

struct PrependTokenBackward : Node {
  Shape token_shape;
  int64_t T = 0;
  const char* name() const override { return "PrependTokenBackward"; }
  // forward: out[n, 0] = token, out[n, 1:] = x[n]
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor gt, gx;
    if (wants(*this, 0)) gt = ops::sum(g.narrow(1, 0, 1), {0, 1}).reshape(token_shape);  // token's shape
    if (wants(*this, 1)) gx = g.narrow(1, 1, T).contiguous();                            // (N, T, C)
    return {gt, gx};
  }
};

}  // namespace

Tensor prepend_token(const Tensor& token, const Tensor& x) {
  BRIGADE_CHECK(x.defined() && x.dim() == 3, ShapeError, "prepend_token: x must be (N, T, C), got {}",
                x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  const int64_t N = x.size(0), T = x.size(1), C = x.size(2);
  BRIGADE_CHECK(token.defined() && token.numel() == C, ShapeError,
                "prepend_token: token must hold C = {} values (x is {}), got {}", C, shape_str(x.shape()),
                token.defined() ? shape_str(token.shape()) : std::string("an undefined tensor"));
  const Tensor tok = cast(token, x.dtype());           // recorded: an f32 parameter gets an f32 gradient
  Tensor y = Tensor::empty({N, 1 + T, C}, x.dtype());  // (N, 1 + T, C)
  y.narrow(1, 0, 1).copy_(tok.reshape({1, 1, C}).expand({N, 1, C}));
  y.narrow(1, 1, T).copy_(x);
  auto n = std::make_shared<PrependTokenBackward>();
  n->token_shape = tok.shape();
  n->T = T;
  return record(y, n, {tok, x});
}

namespace {

struct ConcatBackward : autograd::Node {
  int64_t dim = 0, na = 0, nb = 0;
  const char* name() const override { return "ConcatBackward"; }
  // forward: out = cat([a, b], dim); a = out.narrow(dim, 0, na), b = out.narrow(dim, na, nb)
  std::vector<Tensor> backward(const Tensor& g) override {
    std::vector<Tensor> out(2);
    if (rules::wants(*this, 0)) out[0] = g.narrow(dim, 0, na).contiguous();   // a's shape
    if (rules::wants(*this, 1)) out[1] = g.narrow(dim, na, nb).contiguous();  // b's shape
    return out;
  }
};

}  // namespace

Tensor concat(const Tensor& a0, const Tensor& b0, int64_t dim) {
  BRIGADE_CHECK(a0.defined() && b0.defined() && a0.dim() == b0.dim() && a0.dim() > 0, ShapeError,
                "concat: a and b must be defined tensors of the same rank, got {} and {}",
                a0.defined() ? a0.str() : "undefined", b0.defined() ? b0.str() : "undefined");
  const int64_t D = a0.dim();
  const int64_t d = dim < 0 ? dim + D : dim;
  BRIGADE_CHECK(0 <= d && d < D, ShapeError, "concat: dim {} is outside a {}-d tensor", dim, D);
  Shape s = a0.shape();
  for (int64_t i = 0; i < D; ++i)
    BRIGADE_CHECK(i == d || a0.size(i) == b0.size(i), ShapeError, "concat: {} and {} differ outside dim {}", a0.str(),
                  b0.str(), d);
  BRIGADE_CHECK(
      is_floating(a0.dtype()) == is_floating(b0.dtype()) && (is_floating(a0.dtype()) || a0.dtype() == b0.dtype()),
      ShapeError, "concat: dtypes {} and {} do not mix", dtype_name(a0.dtype()), dtype_name(b0.dtype()));
  const bool promote = a0.dtype() != b0.dtype();
  const Tensor a = promote ? cast(a0, DType::F32) : a0, b = promote ? cast(b0, DType::F32) : b0;
  const int64_t na = a.size(d), nb = b.size(d);
  s[size_t(d)] = na + nb;
  Tensor out = Tensor::empty(s, a.dtype());  // (..., na + nb, ...)
  out.narrow(d, 0, na).copy_(a);
  out.narrow(d, na, nb).copy_(b);
  auto n = std::make_shared<ConcatBackward>();
  n->dim = d;
  n->na = na;
  n->nb = nb;
  return autograd::record(out, n, {a, b});
}

Tensor window_partition(const Tensor& x, int64_t ws) {
  BRIGADE_CHECK(x.defined() && x.dim() == 4 && ws > 0 && x.size(1) % ws == 0 && x.size(2) % ws == 0, ShapeError,
                "window_partition: x must be (B, H, W, C) with H and W multiples of the window size {}, got {}", ws,
                shape_of(x));
  const int64_t B = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
  const Tensor t = transpose(reshape(x, {B, H / ws, ws, W / ws, ws, C}), 2, 3);  // (B, H/ws, W/ws, ws, ws, C)
  return reshape(t, {B * (H / ws) * (W / ws), ws * ws, C});                      // (B*nW, N, C)
}

Tensor window_reverse(const Tensor& windows, int64_t ws, int64_t H, int64_t W) {
  BRIGADE_CHECK(windows.defined() && ws > 0 && H % ws == 0 && W % ws == 0 && windows.dim() >= 3, ShapeError,
                "window_reverse: windows must be (B*nW, ws*ws, C) for a {}x{} grid of {}x{} windows, got {}", H, W, ws,
                ws, shape_of(windows));
  const int64_t nW = (H / ws) * (W / ws), C = windows.size(-1);
  BRIGADE_CHECK(windows.numel() % (nW * ws * ws * C) == 0 && windows.size(0) % nW == 0, ShapeError,
                "window_reverse: {} is not a whole number of images of {} windows of {}x{}", shape_of(windows), nW, ws,
                ws);
  const int64_t B = windows.size(0) / nW;
  const Tensor t = transpose(reshape(windows, {B, H / ws, W / ws, ws, ws, C}), 2, 3);  // (B, H/ws, ws, W/ws, ws, C)
  return reshape(t, {B, H, W, C});                                                     // (B, H, W, C)
}

Tensor patch_merge(const Tensor& x) {
  BRIGADE_CHECK(x.defined() && x.dim() == 4 && x.size(1) % 2 == 0 && x.size(2) % 2 == 0, ShapeError,
                "patch_merge: x must be (B, H, W, C) with H and W even, got {}", shape_of(x));
  const int64_t B = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
  Tensor t = reshape(x, {B, H / 2, 2, W / 2, 2, C});  // (B, H/2, hi, W/2, wi, C)
  t = transpose(transpose(t, 2, 3), 3, 4);            // (B, H/2, W/2, wi, hi, C): channel block wi*2 + hi
  return reshape(t, {B, (H / 2) * (W / 2), 4 * C});   // (B, H/2 * W/2, 4C)
}

}  // namespace brigade::fn
