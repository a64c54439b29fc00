// Vision ops (NCHW): 2-D convolution, batch normalisation over (N, H, W) per channel,
// max / average pooling and ReLU, each with its backward as an op of its own.
// Layout letters: N batch, C channels (O output channels), H W spatial, KH KW kernel,
// OH OW output spatial. All tensors are NCHW; inputs may be strided views (they are made
// contiguous first), outputs are fresh contiguous tensors.
//
// Backends, as in ops.h: ref::vision (below, header-only templates on raw contiguous
// pointers, also run in double by the op harness) and cpu (ext_vision.cpp): oneDNN
// convolution forward / backward-data / backward-weights primitives, cached by shape, and
// OpenMP loops over channels or planes for the rest (static schedules, fixed reduction
// order per element, so results are bitwise reproducible for a thread count).
//
// Dtypes (the contract of ops.h): f32, bf16 and f16 inputs; compute is f32; 16-bit inputs
// are widened exactly (ops::cast) and each output is rounded once to its dtype:
//   conv2d: x's dtype when x and w agree, else f32. conv2d_backward: gx x's, gw w's, gb gy's.
//   batch_norm2d: y x's, mean and rstd always f32; running stats are f32 and updated in
//   place. batch_norm2d_backward: gx x's, gw gb w's.
//   max_pool2d: y x's, idx i64. avg_pool2d, relu: x's. Their backwards: gy's dtype.
// Native 16-bit path: on the cpu backend, conv2d and conv2d_backward with x, w (and gy) all
// bf16 run oneDNN's bf16 convolution primitives (AVX512-BF16 / AMX; f32 accumulation, like
// the bf16 GEMMs of ops.h): y and gx are rounded once to bf16 by oneDNN, gw and gb computed in
// f32 and rounded once; a bias is used in f32. This agrees with the widened definition within
// one bf16 rounding but is not bitwise it (oneDNN's accumulation order differs from its f32
// kernel's). Where oneDNN has no such kernel (conv2d_native_bf16() false), and for f16 and
// mixed dtypes, conv2d widens. Every other op here widens (that is what a native path would
// have to equal bitwise anyway); the ref backend always widens.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "brigade/core/tensor.h"

namespace brigade::ops {

// ---------------- conv2d (torch.nn.functional.conv2d, dilation 1, groups 1)
// x (N, C, H, W), w (O, C, KH, KW), bias (O) or undefined -> y (N, O, OH, OW) with
// OH = (H + 2 padding - KH) / stride + 1 (floor), likewise OW. ShapeError on mismatches.
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t stride, int64_t padding);
struct Conv2dGrads { Tensor gx, gw, gb; };  // each undefined when not asked for
Conv2dGrads conv2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, int64_t stride, int64_t padding,
                            bool need_gx = true, bool need_gw = true, bool need_gb = true);
// Whether bf16 convolutions on the cpu backend take oneDNN's bf16 primitives (probed once),
// and, for tests, "<oneDNN implementation> <f32|bf16>" of the latest cpu conv2d forward.
bool conv2d_native_bf16();
std::string last_conv2d_impl();

// ---------------- batch norm over (N, H, W) per channel (torch.nn.functional.batch_norm)
// x (N, C, H, W), w b (C) (b may be undefined: no shift). Training: normalises with the
// batch mean and biased variance; when running_mean / running_var (f32 (C)) are defined
// they are updated in place as torch does: r = (1 - momentum) r + momentum s with the
// batch mean and the unbiased variance (M / (M - 1), M = N H W). Eval: normalises with the
// running statistics (which must be defined). mean, rstd (C, f32): the statistics used,
// rstd = 1 / sqrt(var + eps), saved for the backward.
struct BatchNormOut { Tensor y, mean, rstd; };
BatchNormOut batch_norm2d(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& running_mean,
                          const Tensor& running_var, bool training, double momentum, double eps);
// Training: the backward of batch statistics (mean and variance depend on x); eval: an
// affine map, gx = gy w rstd. gw = sum gy xhat, gb = sum gy over (N, H, W).
struct BatchNormGrads { Tensor gx, gw, gb; };
BatchNormGrads batch_norm2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, const Tensor& mean,
                                     const Tensor& rstd, bool training);

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
// in the window (padding counts as -inf); NaN wins, as in torch.
struct MaxPoolOut { Tensor y, idx; };
MaxPoolOut max_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding);
// gx (x_shape) = gy routed to the argmax of each window (summed where windows overlap).
Tensor max_pool2d_backward(const Tensor& gy, const Tensor& idx, const Shape& x_shape);
// avg_pool2d with count_include_pad=True (torch's default): each window's sum divided by
// its extent clipped to the padded input.
Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding);
Tensor avg_pool2d_backward(const Tensor& gy, const Shape& x_shape, int64_t kernel, int64_t stride, int64_t padding);

// ---------------- ReLU: y = max(x, 0); relu_backward(gy, y) = gy where y > 0, else 0.
Tensor relu(const Tensor& x);
Tensor relu_backward(const Tensor& gy, const Tensor& y);

// Output spatial size of a window op: (in + 2 pad - k) / stride + 1; ShapeError when < 1.
int64_t conv_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, const char* op);

// ---------------------------------------------------------------- scalar oracle
// Contiguous NCHW raw pointers; T = float (the Ref backend) or double (the harness).
// Accumulations run in double whatever T (so ref<float> and ref<double> differ only by
// input/output rounding).
namespace ref::vision {

struct ConvGeom {
  int64_t N, C, H, W, O, KH, KW, stride, pad, OH, OW;
};

// y (N, O, OH, OW) = sum_{c, kh, kw} x[n, c, oh s - p + kh, ow s - p + kw] w[o, c, kh, kw] + b[o]
template <typename T>
void conv2d(const ConvGeom& g, const T* x, const T* w, const T* b, T* y) {
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t o = 0; o < g.O; ++o)
      for (int64_t oh = 0; oh < g.OH; ++oh)
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          double acc = b ? double(b[o]) : 0.0;
          for (int64_t c = 0; c < g.C; ++c)
            for (int64_t kh = 0; kh < g.KH; ++kh) {
              const int64_t ih = oh * g.stride - g.pad + kh;
              if (ih < 0 || ih >= g.H) continue;
              for (int64_t kw = 0; kw < g.KW; ++kw) {
                const int64_t iw = ow * g.stride - g.pad + kw;
                if (iw < 0 || iw >= g.W) continue;
                acc += double(x[((n * g.C + c) * g.H + ih) * g.W + iw]) *
                       double(w[((o * g.C + c) * g.KH + kh) * g.KW + kw]);
              }
            }
          y[((n * g.O + o) * g.OH + oh) * g.OW + ow] = T(acc);
        }
}

// gx (N, C, H, W), gw (O, C, KH, KW), gb (O); any may be null.
template <typename T>
void conv2d_backward(const ConvGeom& g, const T* gy, const T* x, const T* w, T* gx, T* gw, T* gb) {
  auto GY = [&](int64_t n, int64_t o, int64_t oh, int64_t ow) {
    return double(gy[((n * g.O + o) * g.OH + oh) * g.OW + ow]);
  };
  if (gx) {
    for (int64_t n = 0; n < g.N; ++n)
      for (int64_t c = 0; c < g.C; ++c)
        for (int64_t ih = 0; ih < g.H; ++ih)
          for (int64_t iw = 0; iw < g.W; ++iw) {
            double acc = 0;
            for (int64_t o = 0; o < g.O; ++o)
              for (int64_t kh = 0; kh < g.KH; ++kh) {
                const int64_t th = ih + g.pad - kh;
                if (th < 0 || th % g.stride != 0 || th / g.stride >= g.OH) continue;
                for (int64_t kw = 0; kw < g.KW; ++kw) {
                  const int64_t tw = iw + g.pad - kw;
                  if (tw < 0 || tw % g.stride != 0 || tw / g.stride >= g.OW) continue;
                  acc += GY(n, o, th / g.stride, tw / g.stride) * double(w[((o * g.C + c) * g.KH + kh) * g.KW + kw]);
                }
              }
            gx[((n * g.C + c) * g.H + ih) * g.W + iw] = T(acc);
          }
  }
  if (gw) {
    for (int64_t o = 0; o < g.O; ++o)
      for (int64_t c = 0; c < g.C; ++c)
        for (int64_t kh = 0; kh < g.KH; ++kh)
          for (int64_t kw = 0; kw < g.KW; ++kw) {
            double acc = 0;
            for (int64_t n = 0; n < g.N; ++n)
              for (int64_t oh = 0; oh < g.OH; ++oh) {
                const int64_t ih = oh * g.stride - g.pad + kh;
                if (ih < 0 || ih >= g.H) continue;
                for (int64_t ow = 0; ow < g.OW; ++ow) {
                  const int64_t iw = ow * g.stride - g.pad + kw;
                  if (iw < 0 || iw >= g.W) continue;
                  acc += GY(n, o, oh, ow) * double(x[((n * g.C + c) * g.H + ih) * g.W + iw]);
                }
              }
            gw[((o * g.C + c) * g.KH + kh) * g.KW + kw] = T(acc);
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

}  // namespace ref::vision
}  // namespace brigade::ops
