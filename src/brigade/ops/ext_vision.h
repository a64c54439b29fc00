// Vision ops (NCHW): 2-D convolution (grouped / depthwise, padding per side), batch
// normalisation over (N, H, W) per channel, max / average pooling, ReLU, and the pieces of
// EfficientNet's squeeze-and-excitation and classifier (sigmoid, the spatial mean, cross-entropy
// with label smoothing), each with its backward as an op of its own.
// Layout letters: N batch, C channels (O output channels), H W spatial, KH KW kernel,
// OH OW output spatial, G groups. All tensors are NCHW; inputs may be strided views (they are
// made contiguous first), outputs are fresh contiguous tensors.
//
// Backends, as in ops.h: ref::vision (below, header-only templates on raw contiguous
// pointers, also run in double by the op harness) and cpu (ext_vision.cpp): oneDNN
// convolution forward / backward-data / backward-weights primitives, cached by shape, except
// depthwise convolutions (groups == C == O), which run a direct NCHW kernel of ours (on plain
// NCHW memory oneDNN 2.6 runs them as im2col + a GEMM per channel, "x64:gemm:jit", which the
// direct kernel matches or beats at ALIGN's shapes, most in the data gradient: timings in
// docs/architecture.md, "Depthwise convolutions"); OpenMP loops over channels or
// planes for the rest (static schedules, fixed reduction order per element, so results are
// bitwise reproducible for a thread count).
//
// Dtypes (the contract of ops.h): f32, bf16 and f16 inputs; compute is f32; 16-bit inputs
// are widened exactly (ops::cast) and each output is rounded once to its dtype:
//   conv2d: x's dtype when x and w agree, else f32. conv2d_backward: gx x's, gw w's, gb gy's.
//   batch_norm2d: y x's, mean and rstd always f32; running stats are f32 and updated in
//   place. batch_norm2d_backward: gx x's, gw gb w's.
//   max_pool2d: y x's, idx i64. avg_pool2d, relu, sigmoid, reciprocal, spatial_mean: x's.
//   Their backwards: gy's dtype. cross_entropy_smoothed: loss and lse
//   always f32; its backward: logits' dtype.
// Native 16-bit path: on the cpu backend, conv2d and conv2d_backward with x, w (and gy) all
// bf16 and groups == 1 run oneDNN's bf16 convolution primitives (AVX512-BF16 / AMX; f32
// accumulation, like the bf16 GEMMs of ops.h): y and gx are rounded once to bf16 by oneDNN, gw
// and gb computed in f32 and rounded once; a bias is used in f32. This agrees with the widened
// definition within one bf16 rounding but is not bitwise it (oneDNN's accumulation order
// differs from its f32 kernel's). Where oneDNN has no such kernel (conv2d_native_bf16()
// false), for grouped convolutions, and for f16 and mixed dtypes, conv2d widens. On the cpu
// backend batch_norm2d / batch_norm2d_backward read 16-bit x and gy and write 16-bit y and gx
// themselves (widening pieces into f32 buffers; f32 weights and statistics beside them), and
// relu / relu_backward work on the 16-bit bit patterns: both bitwise the widened definition.
// Every other op here widens (that is what a native path would have to equal bitwise anyway);
// the ref backend always widens.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "brigade/core/tensor.h"
#include "brigade/ops/ops.h"

namespace brigade::ops {

// ---------------- conv2d (torch.nn.functional.conv2d, dilation 1)
// Geometry of a convolution: stride, zero padding per side and groups. A call with separate
// sides is torch's F.conv2d(F.pad(x, (left, right, top, bottom)), w, bias, stride, groups=G)
// (HF EfficientNet pads its stride-2 depthwise convolutions this way, nn.ZeroPad2d with
// correct_pad's (k/2 - 1, k/2) per side pair). groups G divides C and O; output channel o
// reads input channels [g C/G, (g + 1) C/G) with g = o / (O/G). Depthwise: G == C == O.
struct Conv2dParams {
  int64_t stride = 1;
  int64_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  int64_t groups = 1;
  // Channels-last activations: x is (N, H, W, C), y and gy (N, OH, OW, O), gx (N, H, W, C)
  // (torch's channels_last memory format, as plain contiguous tensors); w stays (O, C/G, KH, KW).
  // The cpu backend runs oneDNN on NHWC memory (its direct / brgemm kernels: about 1.3x the
  // f32 and 2x the bf16 throughput of plain NCHW at ResNet-50's shapes, docs/performance.md)
  // and reorders only the weights; the ref backend permutes to NCHW and back.
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
struct Conv2dGrads { Tensor gx, gw, gb; };  // each undefined when not asked for
Conv2dGrads conv2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, const Conv2dParams& p,
                            bool need_gx = true, bool need_gw = true, bool need_gb = true);
Conv2dGrads conv2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, int64_t stride, int64_t padding,
                            bool need_gx = true, bool need_gw = true, bool need_gb = true);
// Whether bf16 convolutions on the cpu backend take oneDNN's bf16 primitives (probed once),
// and, for tests, "<oneDNN implementation> <f32|bf16>" of the latest cpu conv2d forward
// ("direct_depthwise f32" for the depthwise kernel of ext_vision.cpp).
bool conv2d_native_bf16();
std::string last_conv2d_impl();

// ---------------- batch norm over (N, H, W) per channel (torch.nn.functional.batch_norm)
// x (N, C, H, W), w b (C) (b may be undefined: no shift). Training: normalises with the
// batch mean and biased variance; when running_mean / running_var (f32 (C)) are defined
// they are updated in place as torch does: r = (1 - momentum) r + momentum s with the
// batch mean and the unbiased variance (M / (M - 1), M = N H W). Eval: normalises with the
// running statistics (which must be defined). mean, rstd (C, f32): the statistics used,
// rstd = 1 / sqrt(var + eps), saved for the backward.
// channels_last: x, y (and gy, gx) are (N, H, W, C); the same statistics per channel (C the last
// dim). The ref backend runs the NCHW oracle on it as (N H W, C, 1) (the same bytes); the cpu
// kernels accumulate fixed blocks of rows in double, vectorised over channels, and add the
// blocks in order: bitwise reproducible for any thread count, like the NCHW kernels.
struct BatchNormOut { Tensor y, mean, rstd; };
BatchNormOut batch_norm2d(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& running_mean,
                          const Tensor& running_var, bool training, double momentum, double eps,
                          bool channels_last = false);
// Training: the backward of batch statistics (mean and variance depend on x); eval: an
// affine map, gx = gy w rstd. gw = sum gy xhat, gb = sum gy over (N, H, W).
struct BatchNormGrads { Tensor gx, gw, gb; };
BatchNormGrads batch_norm2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, const Tensor& mean,
                                     const Tensor& rstd, bool training, bool channels_last = false);

// ---------------- the pieces of synchronised batch norm (statistics over a process group)
// fn::sync_batch_norm2d computes per-channel sums locally, sums them over the group (a
// BatchNormSync reducer), normalises with batch_norm2d in eval form (the global mean and
// biased variance given as the "running" statistics) and updates the running statistics
// with the global unbiased variance; its backward sums the gradient sums over the group the
// same way. Every sum accumulates in double, in a fixed order per channel (reproducible for
// any thread count); 16-bit inputs are widened exactly.
struct ChannelSums {
  std::vector<double> s1, s2;  // (C) each
};
// x (N, C, H, W): s1[c] = sum x, s2[c] = sum x^2 over (N, H, W).
ChannelSums batch_norm2d_sums(const Tensor& x);
// gy, x (N, C, H, W), mean, rstd (C): s1[c] = sum gy, s2[c] = sum gy xhat with xhat = (x - mean) rstd.
// (The local gw is s2 and gb is s1.)
ChannelSums batch_norm2d_grad_sums(const Tensor& gy, const Tensor& x, const Tensor& mean, const Tensor& rstd);
// The input gradient of a training batch norm whose statistics came from M values per channel
// (the whole group's batch) and whose gradient sums are `sums` (batch_norm2d_grad_sums summed
// over the group): gx = w rstd (gy - s1 / M - xhat s2 / M), in x's dtype. With this rank's own
// sums and M = N H W it is batch_norm2d_backward's gx.
Tensor batch_norm2d_backward_input(const Tensor& gy, const Tensor& x, const Tensor& w, const Tensor& mean,
                                   const Tensor& rstd, const ChannelSums& sums, double M);
// running = (1 - momentum) running + momentum stat, per channel (torch's rule), for f32 (C)
// running_mean / running_var given the batch mean and the unbiased batch variance.
void batch_norm2d_update_running(const Tensor& running_mean, const Tensor& running_var,
                                 const std::vector<double>& mean, const std::vector<double>& var_unbiased,
                                 double momentum);

// ---------------- pooling (ceil_mode false, dilation 1; padding <= kernel / 2 as torch)
// max_pool2d: y (N, C, OH, OW), idx (N, C, OH, OW) i64 = h * W + w of the first maximum
// in the window (padding counts as -inf); NaN wins, as in torch. channels_last: x (N, H, W, C),
// y and idx (N, OH, OW, C), idx still h * W + w (bitwise the NCHW op on the same values; the cpu
// kernel reads and writes 16-bit x and y itself).
struct MaxPoolOut { Tensor y, idx; };
MaxPoolOut max_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding, bool channels_last = false);
// gx (x_shape) = gy routed to the argmax of each window (summed where windows overlap, in output
// order). channels_last: gy, idx (N, OH, OW, C), x_shape (N, H, W, C).
Tensor max_pool2d_backward(const Tensor& gy, const Tensor& idx, const Shape& x_shape, bool channels_last = false);
// avg_pool2d with count_include_pad=True (torch's default): each window's sum divided by
// its extent clipped to the padded input.
Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding);
Tensor avg_pool2d_backward(const Tensor& gy, const Shape& x_shape, int64_t kernel, int64_t stride, int64_t padding);

// ---------------- ReLU: y = max(x, 0); relu_backward(gy, y) = gy where y > 0, else 0.
Tensor relu(const Tensor& x);
Tensor relu_backward(const Tensor& gy, const Tensor& y);

// ---------------- sigmoid (torch.sigmoid): y = 1 / (1 + exp(-x)); the gate of
// squeeze-and-excitation. sigmoid_backward(gy, y) = gy y (1 - y) (from the output).
Tensor sigmoid(const Tensor& x);
Tensor sigmoid_backward(const Tensor& gy, const Tensor& y);

// ---------------- reciprocal (torch.reciprocal): y = 1 / x; ALIGN divides its logits by the
// learned temperature. reciprocal_backward(gy, y) = -gy y^2 (from the output).
Tensor reciprocal(const Tensor& x);
Tensor reciprocal_backward(const Tensor& gy, const Tensor& y);

// ---------------- spatial mean: x (N, C, H, W) -> the mean over (H, W) of each plane,
// (N, C), or (N, C, 1, 1) with keepdim (torch's x.mean((2, 3), keepdim)). Summed in double
// in plane order. Its backward: gx (x_shape) = gy / (H W) over each plane; gy (N, C) or
// (N, C, 1, 1).
Tensor spatial_mean(const Tensor& x, bool keepdim = false);
Tensor spatial_mean_backward(const Tensor& gy, const Shape& x_shape);

// ---------------- cross-entropy with label smoothing (torch's F.cross_entropy(logits,
// target, ignore_index, label_smoothing=eps), reduction 'mean'): over the rows whose target
// is not ignore_index (count of them),
//   loss = (1 - eps) mean(lse - logits[t]) + eps mean(lse - mean_v logits[v])
// i.e. (1 - eps) nll + eps times the mean over classes of -log p. logits (N, V), targets (N)
// i32/i64; eps in [0, 1]. loss 0-d, NaN when count == 0 (as torch); lse (N) for the backward.
// glogits = gloss (softmax - (1 - eps) onehot(t) - eps / V) / count, zero rows where ignored.
CrossEntropyOut cross_entropy_smoothed(const Tensor& logits, const Tensor& targets, double eps,
                                       int64_t ignore_index = -100);
Tensor cross_entropy_smoothed_backward(double gloss, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                       double eps, int64_t ignore_index = -100);

// Output spatial size of a window op: (in + 2 pad - k) / stride + 1; ShapeError when < 1.
int64_t conv_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, const char* op);

// ---------------------------------------------------------------- scalar oracle
// Contiguous NCHW raw pointers; T = float (the Ref backend) or double (the harness).
// Accumulations run in double whatever T (so ref<float> and ref<double> differ only by
// input/output rounding).
namespace ref::vision {

// A convolution's sizes: C input channels in all, w (O, C / groups, KH, KW), padding pt pb pl pr
// (top, bottom, left, right).
struct ConvGeom {
  int64_t N, C, H, W, O, KH, KW, stride, pt, pb, pl, pr, groups, OH, OW;
  int64_t Cg() const { return C / groups; }  // input channels per group
  int64_t Og() const { return O / groups; }  // output channels per group
};

// y (N, O, OH, OW) = sum_{cg, kh, kw} x[n, c0 + cg, oh s - pt + kh, ow s - pl + kw] w[o, cg, kh, kw] + b[o]
// with c0 = (o / Og) Cg the first input channel of o's group.
template <typename T>
void conv2d(const ConvGeom& g, const T* x, const T* w, const T* b, T* y) {
  const int64_t Cg = g.Cg(), Og = g.Og();
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t o = 0; o < g.O; ++o)
      for (int64_t oh = 0; oh < g.OH; ++oh)
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          const int64_t c0 = (o / Og) * Cg;
          double acc = b ? double(b[o]) : 0.0;
          for (int64_t cg = 0; cg < Cg; ++cg)
            for (int64_t kh = 0; kh < g.KH; ++kh) {
              const int64_t ih = oh * g.stride - g.pt + kh;
              if (ih < 0 || ih >= g.H) continue;
              for (int64_t kw = 0; kw < g.KW; ++kw) {
                const int64_t iw = ow * g.stride - g.pl + kw;
                if (iw < 0 || iw >= g.W) continue;
                acc += double(x[((n * g.C + c0 + cg) * g.H + ih) * g.W + iw]) *
                       double(w[((o * Cg + cg) * g.KH + kh) * g.KW + kw]);
              }
            }
          y[((n * g.O + o) * g.OH + oh) * g.OW + ow] = T(acc);
        }
}

// gx (N, C, H, W), gw (O, C / groups, KH, KW), gb (O); any may be null.
template <typename T>
void conv2d_backward(const ConvGeom& g, const T* gy, const T* x, const T* w, T* gx, T* gw, T* gb) {
  const int64_t Cg = g.Cg(), Og = g.Og();
  auto GY = [&](int64_t n, int64_t o, int64_t oh, int64_t ow) {
    return double(gy[((n * g.O + o) * g.OH + oh) * g.OW + ow]);
  };
  if (gx) {
    for (int64_t n = 0; n < g.N; ++n)
      for (int64_t c = 0; c < g.C; ++c)
        for (int64_t ih = 0; ih < g.H; ++ih)
          for (int64_t iw = 0; iw < g.W; ++iw) {
            const int64_t grp = c / Cg, cg = c % Cg;
            double acc = 0;
            for (int64_t o = grp * Og; o < (grp + 1) * Og; ++o)
              for (int64_t kh = 0; kh < g.KH; ++kh) {
                const int64_t th = ih + g.pt - kh;
                if (th < 0 || th % g.stride != 0 || th / g.stride >= g.OH) continue;
                for (int64_t kw = 0; kw < g.KW; ++kw) {
                  const int64_t tw = iw + g.pl - kw;
                  if (tw < 0 || tw % g.stride != 0 || tw / g.stride >= g.OW) continue;
                  acc += GY(n, o, th / g.stride, tw / g.stride) * double(w[((o * Cg + cg) * g.KH + kh) * g.KW + kw]);
                }
              }
            gx[((n * g.C + c) * g.H + ih) * g.W + iw] = T(acc);
          }
  }
  if (gw) {
    for (int64_t o = 0; o < g.O; ++o)
      for (int64_t cg = 0; cg < Cg; ++cg)
        for (int64_t kh = 0; kh < g.KH; ++kh)
          for (int64_t kw = 0; kw < g.KW; ++kw) {
            const int64_t c = (o / Og) * Cg + cg;
            double acc = 0;
            for (int64_t n = 0; n < g.N; ++n)
              for (int64_t oh = 0; oh < g.OH; ++oh) {
                const int64_t ih = oh * g.stride - g.pt + kh;
                if (ih < 0 || ih >= g.H) continue;
                for (int64_t ow = 0; ow < g.OW; ++ow) {
                  const int64_t iw = ow * g.stride - g.pl + kw;
                  if (iw < 0 || iw >= g.W) continue;
                  acc += GY(n, o, oh, ow) * double(x[((n * g.C + c) * g.H + ih) * g.W + iw]);
                }
              }
            gw[((o * Cg + cg) * g.KH + kh) * g.KW + kw] = T(acc);
          }
  }
  if (gb) {
    for (int64_t o = 0; o < g.O; ++o) {
      double acc = 0;
      for (int64_t n = 0; n < g.N; ++n)
        for (int64_t i = 0; i < g.OH * g.OW; ++i) acc += double(gy[(n * g.O + o) * g.OH * g.OW + i]);
      gb[o] = T(acc);
    }
  }
}

// Channels [c0, c1) of batch norm over x (N, C, HW). Training: mean, var (biased) of the
// batch, two passes; eval: mean = rmean, var = rvar. rstd = 1 / sqrt(var + eps);
// y = (x - mean) rstd w + b (b may be null). var_out (C) receives the variance used.
template <typename T, typename S>
void batch_norm2d(int64_t N, int64_t C, int64_t HW, int64_t c0, int64_t c1, const T* x, const T* w, const T* b,
                  bool training, const S* rmean, const S* rvar, double eps, T* y, S* mean, S* rstd, S* var_out) {
  const double M = double(N * HW);
  for (int64_t c = c0; c < c1; ++c) {
    double m, v;
    if (training) {
      double s = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < HW; ++i) s += double(x[(n * C + c) * HW + i]);
      m = s / M;
      double q = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < HW; ++i) {
          const double d = double(x[(n * C + c) * HW + i]) - m;
          q += d * d;
        }
      v = q / M;
    } else {
      m = double(rmean[c]);
      v = double(rvar[c]);
    }
    const double r = 1.0 / std::sqrt(v + eps);
    mean[c] = S(m);
    rstd[c] = S(r);
    if (var_out) var_out[c] = S(v);
    const double wc = double(w[c]), bc = b ? double(b[c]) : 0.0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) {
        const int64_t k = (n * C + c) * HW + i;
        y[k] = T((double(x[k]) - m) * r * wc + bc);
      }
  }
}

// Channels [c0, c1) of the batch-norm backward (see ops::batch_norm2d_backward).
template <typename T, typename S>
void batch_norm2d_backward(int64_t N, int64_t C, int64_t HW, int64_t c0, int64_t c1, const T* gy, const T* x,
                           const T* w, const S* mean, const S* rstd, bool training, T* gx, T* gw, T* gb) {
  const double M = double(N * HW);
  for (int64_t c = c0; c < c1; ++c) {
    const double m = double(mean[c]), r = double(rstd[c]), wc = double(w[c]);
    double sg = 0, sgx = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) {
        const int64_t k = (n * C + c) * HW + i;
        sg += double(gy[k]);
        sgx += double(gy[k]) * (double(x[k]) - m) * r;
      }
    gw[c] = T(sgx);
    gb[c] = T(sg);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) {
        const int64_t k = (n * C + c) * HW + i;
        const double xh = (double(x[k]) - m) * r;
        gx[k] = training ? T(wc * r * (double(gy[k]) - sg / M - xh * sgx / M)) : T(double(gy[k]) * wc * r);
      }
  }
}

// Channels [c0, c1) of the synchronised batch norm's sums (see ops::batch_norm2d_sums and
// batch_norm2d_grad_sums), in double, n then hw order.
template <typename T>
void batch_norm2d_sums(int64_t N, int64_t C, int64_t HW, int64_t c0, int64_t c1, const T* x, double* s1,
                       double* s2) {
  for (int64_t c = c0; c < c1; ++c) {
    double a = 0, b = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) {
        const double v = double(x[(n * C + c) * HW + i]);
        a += v;
        b += v * v;
      }
    s1[c] = a;
    s2[c] = b;
  }
}
template <typename T, typename S>
void batch_norm2d_grad_sums(int64_t N, int64_t C, int64_t HW, int64_t c0, int64_t c1, const T* gy, const T* x,
                            const S* mean, const S* rstd, double* s1, double* s2) {
  for (int64_t c = c0; c < c1; ++c) {
    const double m = double(mean[c]), r = double(rstd[c]);
    double a = 0, b = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) {
        const int64_t k = (n * C + c) * HW + i;
        a += double(gy[k]);
        b += double(gy[k]) * (double(x[k]) - m) * r;
      }
    s1[c] = a;
    s2[c] = b;
  }
}
// gx = w r (gy - s1 / M - xhat s2 / M)
template <typename T, typename S>
void batch_norm2d_backward_input(int64_t N, int64_t C, int64_t HW, int64_t c0, int64_t c1, const T* gy, const T* x,
                                 const T* w, const S* mean, const S* rstd, const double* s1, const double* s2,
                                 double M, T* gx) {
  for (int64_t c = c0; c < c1; ++c) {
    const double m = double(mean[c]), r = double(rstd[c]), wc = double(w[c]);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) {
        const int64_t k = (n * C + c) * HW + i;
        const double xh = (double(x[k]) - m) * r;
        gx[k] = T(wc * r * (double(gy[k]) - s1[c] / M - xh * s2[c] / M));
      }
  }
}

// One (H, W) plane -> (OH, OW): max and the flat index of the first maximum (NaN wins).
template <typename T>
void max_pool2d_plane(int64_t H, int64_t W, int64_t k, int64_t s, int64_t p, int64_t OH, int64_t OW, const T* x,
                      T* y, int64_t* idx) {
  for (int64_t oh = 0; oh < OH; ++oh)
    for (int64_t ow = 0; ow < OW; ++ow) {
      T best = -std::numeric_limits<T>::infinity();
      int64_t bi = -1;
      for (int64_t kh = 0; kh < k; ++kh) {
        const int64_t ih = oh * s - p + kh;
        if (ih < 0 || ih >= H) continue;
        for (int64_t kw = 0; kw < k; ++kw) {
          const int64_t iw = ow * s - p + kw;
          if (iw < 0 || iw >= W) continue;
          const T v = x[ih * W + iw];
          if (bi < 0 || v > best || std::isnan(v)) {
            best = v;
            bi = ih * W + iw;
            if (std::isnan(v)) break;
          }
        }
        if (bi >= 0 && std::isnan(best)) break;
      }
      y[oh * OW + ow] = best;
      idx[oh * OW + ow] = bi;
    }
}
template <typename T>
void max_pool2d_backward_plane(int64_t HW, int64_t OHW, const T* gy, const int64_t* idx, T* gx) {
  std::fill(gx, gx + HW, T(0));
  for (int64_t i = 0; i < OHW; ++i)
    if (idx[i] >= 0) gx[idx[i]] += gy[i];
}

// torch's avg_pool2d divisor with count_include_pad: the window clipped to [-p, H + p).
inline int64_t avg_pool_divisor(int64_t oh, int64_t ow, int64_t H, int64_t W, int64_t k, int64_t s, int64_t p) {
  const int64_t hs = oh * s - p, ws = ow * s - p;
  const int64_t he = std::min(hs + k, H + p), we = std::min(ws + k, W + p);
  return (he - hs) * (we - ws);
}
template <typename T>
void avg_pool2d_plane(int64_t H, int64_t W, int64_t k, int64_t s, int64_t p, int64_t OH, int64_t OW, const T* x,
                      T* y) {
  for (int64_t oh = 0; oh < OH; ++oh)
    for (int64_t ow = 0; ow < OW; ++ow) {
      double acc = 0;
      for (int64_t kh = 0; kh < k; ++kh) {
        const int64_t ih = oh * s - p + kh;
        if (ih < 0 || ih >= H) continue;
        for (int64_t kw = 0; kw < k; ++kw) {
          const int64_t iw = ow * s - p + kw;
          if (iw >= 0 && iw < W) acc += double(x[ih * W + iw]);
        }
      }
      y[oh * OW + ow] = T(acc / double(avg_pool_divisor(oh, ow, H, W, k, s, p)));
    }
}
template <typename T>
void avg_pool2d_backward_plane(int64_t H, int64_t W, int64_t k, int64_t s, int64_t p, int64_t OH, int64_t OW,
                               const T* gy, T* gx) {
  for (int64_t ih = 0; ih < H; ++ih)
    for (int64_t iw = 0; iw < W; ++iw) {
      double acc = 0;
      for (int64_t oh = 0; oh < OH; ++oh) {
        const int64_t kh = ih - (oh * s - p);
        if (kh < 0 || kh >= k) continue;
        for (int64_t ow = 0; ow < OW; ++ow) {
          const int64_t kw = iw - (ow * s - p);
          if (kw < 0 || kw >= k) continue;
          acc += double(gy[oh * OW + ow]) / double(avg_pool_divisor(oh, ow, H, W, k, s, p));
        }
      }
      gx[ih * W + iw] = T(acc);
    }
}

template <typename T>
void relu(int64_t n, const T* x, T* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > T(0) ? x[i] : (std::isnan(x[i]) ? x[i] : T(0));
}
template <typename T>
void relu_backward(int64_t n, const T* gy, const T* y, T* gx) {
  for (int64_t i = 0; i < n; ++i) gx[i] = y[i] > T(0) ? gy[i] : T(0);
}

template <typename T>
void sigmoid(int64_t n, const T* x, T* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = T(1) / (T(1) + std::exp(-x[i]));
}
// gx = gy y (1 - y)
template <typename T>
void sigmoid_backward(int64_t n, const T* gy, const T* y, T* gx) {
  for (int64_t i = 0; i < n; ++i) gx[i] = gy[i] * y[i] * (T(1) - y[i]);
}

template <typename T>
void reciprocal(int64_t n, const T* x, T* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = T(1) / x[i];
}
// gx = -gy y^2
template <typename T>
void reciprocal_backward(int64_t n, const T* gy, const T* y, T* gx) {
  for (int64_t i = 0; i < n; ++i) gx[i] = -(gy[i] * y[i] * y[i]);
}

// P planes of HW values: y[p] = sum of plane p (double, in order) / HW.
template <typename T>
void spatial_mean(int64_t P, int64_t HW, const T* x, T* y) {
  for (int64_t p = 0; p < P; ++p) {
    double s = 0;
    for (int64_t i = 0; i < HW; ++i) s += double(x[p * HW + i]);
    y[p] = T(s / double(HW));
  }
}
template <typename T>
void spatial_mean_backward(int64_t P, int64_t HW, const T* gy, T* gx) {
  for (int64_t p = 0; p < P; ++p) {
    const T g = T(double(gy[p]) / double(HW));
    for (int64_t i = 0; i < HW; ++i) gx[p * HW + i] = g;
  }
}

// Cross-entropy with label smoothing (see ops::cross_entropy_smoothed), in double:
//   lse[n] = log sum_v exp(x[n, v]); row loss = (1 - eps)(lse - x[t]) + eps (lse - sum_v x[n, v] / V).
// Returns count; loss NaN when count == 0. lse is written for every row.
template <typename T>
int64_t cross_entropy_smoothed(int64_t N, int64_t V, const T* logits, const int64_t* targets, double eps,
                               int64_t ignore_index, T* loss, T* lse) {
  double total = 0;
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = logits + n * V;
    double m = -std::numeric_limits<double>::infinity(), sx = 0;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, double(xr[j])), sx += double(xr[j]);
    double s = 0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(double(xr[j]) - m);
    const double l = m + std::log(s);
    lse[n] = T(l);
    if (targets[n] == ignore_index) continue;
    total += (1 - eps) * (l - double(xr[targets[n]])) + eps * (l - sx / double(V));
    ++count;
  }
  *loss = count ? T(total / double(count)) : std::numeric_limits<T>::quiet_NaN();
  return count;
}
// glogits[n, v] = gloss (exp(x - lse[n]) - (1 - eps) [v == t] - eps / V) / count; zero rows where ignored.
template <typename T>
void cross_entropy_smoothed_backward(int64_t N, int64_t V, double gloss, const T* logits, const int64_t* targets,
                                     const T* lse, double eps, int64_t ignore_index, T* glogits) {
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) count += targets[n] != ignore_index;
  for (int64_t n = 0; n < N; ++n) {
    const bool skip = targets[n] == ignore_index || count == 0;
    const double g = skip ? 0.0 : gloss / double(count);
    for (int64_t j = 0; j < V; ++j) {
      const double p = std::exp(double(logits[n * V + j]) - double(lse[n]));
      glogits[n * V + j] = skip ? T(0) : T(g * (p - (j == targets[n] ? 1 - eps : 0.0) - eps / double(V)));
    }
  }
}

}  // namespace ref::vision
}  // namespace brigade::ops
