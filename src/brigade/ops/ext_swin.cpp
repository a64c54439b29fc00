// Front-ends and the cpu kernel of the Swin ops (ext_swin.h).
#include "brigade/ops/ext_swin.h"

#include <omp.h>

#include <vector>

#include "brigade/core/error.h"

namespace brigade::ops {

namespace {

bool is_ref() { return current_backend() == Backend::Ref; }

// One (b, h) row of the output per iteration: two contiguous chunks of the source row.
void roll2d_cpu(int64_t B, int64_t H, int64_t W, int64_t C, int64_t sh, int64_t sw, size_t esize, const char* x,
                char* out) {
  const int64_t rows = B * H;
  const int64_t s = ref::wrap(sw, W);
  const size_t px = size_t(C) * esize;  // bytes of one pixel
#pragma omp parallel for schedule(static) if (rows * W * C > (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / H, h = r % H;
    const char* src = x + size_t((b * H + h) * W) * px;
    char* dst = out + size_t((b * H + ref::wrap(h + sh, H)) * W) * px;
    // dst[(w + s) mod W] = src[w]: dst[s .. W) = src[0 .. W - s), dst[0 .. s) = src[W - s .. W)
    std::memcpy(dst + size_t(s) * px, src, size_t(W - s) * px);
    if (s > 0) std::memcpy(dst, src + size_t(W - s) * px, size_t(s) * px);
  }
}

}  // namespace

Tensor roll2d(const Tensor& x, int64_t shift_h, int64_t shift_w) {
  BRIGADE_CHECK(x.defined(), ValueError, "roll2d: 'x' is an undefined tensor");
  BRIGADE_CHECK(is_floating(x.dtype()), ShapeError, "roll2d: 'x' must be f32, bf16 or f16, got {}", x.str());
  BRIGADE_CHECK(x.dim() == 4 && x.size(1) > 0 && x.size(2) > 0, ShapeError,
                "roll2d: x must be (B, H, W, C) with H, W > 0, got {}", shape_str(x.shape()));
  const int64_t B = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
  Tensor xc = x.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype());  // (B, H, W, C)
  if (is_ref() && x.dtype() == DType::F32) {
    ref::roll2d<float>(B, H, W, C, shift_h, shift_w, xc.data<float>(), y.data<float>());
  } else if (is_ref()) {  // 16-bit: a permutation of 2-byte values
    ref::roll2d<uint16_t>(B, H, W, C, shift_h, shift_w, static_cast<const uint16_t*>(xc.raw_data()),
                          static_cast<uint16_t*>(y.raw_data()));
  } else {
    roll2d_cpu(B, H, W, C, shift_h, shift_w, dtype_size(x.dtype()), static_cast<const char*>(xc.raw_data()),
               static_cast<char*>(y.raw_data()));
  }
  return y;
}

Tensor swin_shift_mask(int64_t H, int64_t W, int64_t ws, int64_t shift) {
  BRIGADE_CHECK(ws > 0 && H > 0 && W > 0 && H % ws == 0 && W % ws == 0, ValueError,
                "swin_shift_mask: the {}x{} grid must be a positive multiple of the window size {}", H, W, ws);
  BRIGADE_CHECK(shift > 0 && shift < ws, ValueError, "swin_shift_mask: shift must be in (0, {}), got {}", ws,
                shift);
  auto region = [&](int64_t i, int64_t n) { return i < n - ws ? 0 : (i < n - shift ? 1 : 2); };
  std::vector<int64_t> img(size_t(H * W));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t w = 0; w < W; ++w) img[size_t(h * W + w)] = region(h, H) * 3 + region(w, W);
  const int64_t nh = H / ws, nw = W / ws, N = ws * ws;
  Tensor m = Tensor::zeros({nh * nw, N, N});  // (nW, N, N)
  float* p = m.data<float>();
  for (int64_t wh = 0; wh < nh; ++wh)
    for (int64_t ww = 0; ww < nw; ++ww) {
      auto id = [&](int64_t t) { return img[size_t((wh * ws + t / ws) * W + ww * ws + t % ws)]; };
      float* mw = p + (wh * nw + ww) * N * N;
      for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < N; ++j) mw[i * N + j] = id(i) != id(j) ? -100.0f : 0.0f;
    }
  return m;
}

Tensor relative_position_index(int64_t ws) {
  BRIGADE_CHECK(ws > 0, ValueError, "relative_position_index: window size must be positive, got {}", ws);
  const int64_t N = ws * ws;
  std::vector<int64_t> idx(size_t(N * N));
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < N; ++j)
      idx[size_t(i * N + j)] = (i / ws - j / ws + ws - 1) * (2 * ws - 1) + (i % ws - j % ws + ws - 1);
  return Tensor::from_vector_i64(idx, {N * N});
}

}  // namespace brigade::ops
