// The convolution family: 2-D convolution (grouped / depthwise, padding per side, NCHW or
// channels-last), max / average pooling, and ViT's patch extraction.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "brigade/core/tensor.h"

namespace brigade::ops {

// ---------------- conv2d (torch.nn.functional.conv2d, dilation 1)
// Stride, zero padding per side (torch's F.conv2d(F.pad(x, (left, right, top, bottom)), ...), as HF
// EfficientNet pads its stride-2 depthwise convolutions) and groups G, dividing C and O: output
// channel o reads input channels [g C/G, (g + 1) C/G), g = o / (O/G). Depthwise: G == C == O.
struct Conv2dParams {
  int64_t stride = 1;
  int64_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  int64_t groups = 1;
  // Channels-last activations: x, gx (N, H, W, C), y, gy (N, OH, OW, O) as plain contiguous
  // tensors; w stays (O, C/G, KH, KW). Faster on the cpu backend (docs/performance.md).
  bool channels_last = false;
  // `padding` on every side (torch's padding=p).
  static Conv2dParams symmetric(int64_t stride, int64_t padding, int64_t groups = 1) {
    return {stride, padding, padding, padding, padding, groups};
  }
};
// x (N, C, H, W), w (O, C / G, KH, KW), bias (O) or undefined -> y (N, O, OH, OW) with
// OH = (H + pad_top + pad_bottom - KH) / stride + 1 (floor), likewise OW (channels-last:
// (N, H, W, C) -> (N, OH, OW, O)). ShapeError on mismatches.
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p);
// The same with `padding` on every side and groups 1 (bitwise the call above with
// Conv2dParams::symmetric(stride, padding)).
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t stride, int64_t padding);
struct Conv2dGrads {
  Tensor gx, gw, gb;
};  // each undefined when not asked for
Conv2dGrads conv2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, const Conv2dParams& p,
                            bool need_gx = true, bool need_gw = true, bool need_gb = true);
Conv2dGrads conv2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, int64_t stride, int64_t padding,
                            bool need_gx = true, bool need_gw = true, bool need_gb = true);
// Whether bf16 convolutions on the cpu backend take oneDNN's bf16 primitives (probed once),
// and, for tests, "<oneDNN implementation> <f32|bf16>" of the latest cpu conv2d forward
// ("direct_depthwise f32" for the direct depthwise kernel of cpu/conv.cpp).
bool conv2d_native_bf16();
std::string last_conv2d_impl();

// ---------------- pooling (ceil_mode false, dilation 1; padding <= kernel / 2 as torch)
// max_pool2d: y (N, C, OH, OW), idx (N, C, OH, OW) i64 = h * W + w of the first maximum
// in the window (padding counts as -inf); NaN wins, as in torch. channels_last: x (N, H, W, C),
// y and idx (N, OH, OW, C), idx still h * W + w (bitwise the NCHW op on the same values; the cpu
// kernel reads and writes 16-bit x and y itself).
struct MaxPoolOut {
  Tensor y, idx;
};
MaxPoolOut max_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding, bool channels_last = false);
// gx (x_shape) = gy routed to the argmax of each window (summed where windows overlap, in output
// order). channels_last: gy, idx (N, OH, OW, C), x_shape (N, H, W, C).
Tensor max_pool2d_backward(const Tensor& gy, const Tensor& idx, const Shape& x_shape, bool channels_last = false);
// avg_pool2d with count_include_pad=True (torch's default): each window's sum divided by
// its extent clipped to the padded input.
Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding);
Tensor avg_pool2d_backward(const Tensor& gy, const Shape& x_shape, int64_t kernel, int64_t stride, int64_t padding);

// ---------------- patch extraction
// x (N, C, H, W), H and W multiples of p -> (N, (H/p) * (W/p), C*p*p), x's dtype:
// out[n, ph * (W/p) + pw, (c * p + i) * p + j] = x[n, c, ph * p + i, pw * p + j].
Tensor patchify(const Tensor& x, int64_t p);
// The inverse permutation: g (N, (H/p) * (W/p), C*p*p) -> (N, C, H, W) for x_shape (N, C, H, W).
Tensor patchify_backward(const Tensor& g, const Shape& x_shape, int64_t p);

// Output spatial size of a window op: (in + 2 pad - k) / stride + 1; ShapeError when < 1.
int64_t conv_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, const char* op);

}  // namespace brigade::ops
