// Swin's differentiable functions (autograd/ext_swin.h).
#include "brigade/autograd/ext_swin.h"

#include <memory>

#include "brigade/autograd/engine.h"
#include "brigade/core/error.h"
#include "brigade/ops/ops.h"

namespace brigade::fn {

using autograd::Node;
using autograd::record;

namespace {

struct Roll2dBackward : Node {
  int64_t sh = 0, sw = 0;
  const char* name() const override { return "Roll2dBackward"; }
  // forward: out = roll(x, (sh, sw)), a permutation; its inverse is the opposite roll
  std::vector<Tensor> backward(const Tensor& g) override { return {ops::roll2d(g, -sh, -sw)}; }
};

std::string shape_of(const Tensor& t) { return t.defined() ? shape_str(t.shape()) : "an undefined tensor"; }

}  // namespace

Tensor roll2d(const Tensor& x, int64_t shift_h, int64_t shift_w) {
  auto n = std::make_shared<Roll2dBackward>();
  n->sh = shift_h;
  n->sw = shift_w;
  return record(ops::roll2d(x, shift_h, shift_w), n, {x});
}

Tensor window_partition(const Tensor& x, int64_t ws) {
  BRIGADE_CHECK(x.defined() && x.dim() == 4 && ws > 0 && x.size(1) % ws == 0 && x.size(2) % ws == 0, ShapeError,
                "window_partition: x must be (B, H, W, C) with H and W multiples of the window size {}, got {}", ws,
                shape_of(x));
  const int64_t B = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
  const Tensor t = transpose(reshape(x, {B, H / ws, ws, W / ws, ws, C}), 2, 3);  // (B, H/ws, W/ws, ws, ws, C)
  return reshape(t, {B * (H / ws) * (W / ws), ws * ws, C});                       // (B*nW, N, C)
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
  return reshape(t, {B, H, W, C});                                                      // (B, H, W, C)
}

Tensor patch_merge(const Tensor& x) {
  BRIGADE_CHECK(x.defined() && x.dim() == 4 && x.size(1) % 2 == 0 && x.size(2) % 2 == 0, ShapeError,
                "patch_merge: x must be (B, H, W, C) with H and W even, got {}", shape_of(x));
  const int64_t B = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
  Tensor t = reshape(x, {B, H / 2, 2, W / 2, 2, C});  // (B, H/2, hi, W/2, wi, C)
  t = transpose(transpose(t, 2, 3), 3, 4);             // (B, H/2, W/2, wi, hi, C): channel block wi*2 + hi
  return reshape(t, {B, (H / 2) * (W / 2), 4 * C});    // (B, H/2 * W/2, 4C)
}

Tensor relative_position_bias(const Tensor& table, const Tensor& index) {
  BRIGADE_CHECK(table.defined() && table.dim() == 2 && index.defined() && index.dim() == 1, ShapeError,
                "relative_position_bias: table must be ((2ws-1)^2, NH) and index (N*N), got {} and {}",
                shape_of(table), shape_of(index));
  int64_t N = 0;
  while (N * N < index.size(0)) ++N;
  BRIGADE_CHECK(N * N == index.size(0), ShapeError, "relative_position_bias: index length {} is not N*N",
                index.size(0));
  const int64_t NH = table.size(1);
  const Tensor e = reshape(embedding(table, index), {N, N, NH});  // (N, N, NH)
  return transpose(transpose(e, 1, 2), 0, 1);                     // (NH, N, N)
}

Tensor window_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias, const Tensor& mask,
                        double scale) {
  BRIGADE_CHECK(q.defined() && q.dim() == 4 && k.defined() && k.shape() == q.shape() && v.defined() &&
                    v.shape() == q.shape(),
                ShapeError, "window_attention: q, k, v must be (B*nW, NH, N, HS) alike, got {}, {}, {}", shape_of(q),
                shape_of(k), shape_of(v));
  const int64_t BW = q.size(0), NH = q.size(1), N = q.size(2);
  BRIGADE_CHECK(bias.defined() && bias.shape() == Shape({NH, N, N}), ShapeError,
                "window_attention: bias must be (NH, N, N) = ({}, {}, {}), got {}", NH, N, N, shape_of(bias));
  Tensor s = add(mul_scalar(matmul(q, k, false, true), scale), bias);  // (B*nW, NH, N, N)
  if (mask.defined()) {
    BRIGADE_CHECK(mask.dim() == 3 && mask.size(1) == N && mask.size(2) == N && BW % mask.size(0) == 0, ShapeError,
                  "window_attention: mask must be (nW, N, N) with nW dividing {} windows, got {}", BW,
                  shape_of(mask));
    const int64_t nW = mask.size(0);
    s = add(reshape(s, {BW / nW, nW, NH, N, N}), reshape(mask, {1, nW, 1, N, N}));  // (B, nW, NH, N, N)
    s = reshape(s, {BW, NH, N, N});                                                // (B*nW, NH, N, N)
  }
  return matmul(softmax(s), v);  // (B*nW, NH, N, HS)
}

}  // namespace brigade::fn
