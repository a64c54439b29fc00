// Normalisations: layer norm and RMSNorm over the last dim, batch norm over (N, H, W) per
// channel (with the pieces of its synchronised form).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "brigade/core/tensor.h"

namespace brigade::ops {

// ---------------- layer norm over the last dim (Ba et al. 2016; torch.nn.LayerNorm)
struct LayerNormOut {
  Tensor y, mean, rstd;
};  // mean, rstd: (N) with N = numel / C
LayerNormOut layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps);
struct LayerNormGrads {
  Tensor gx, gw, gb;
};
LayerNormGrads layer_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& w, const Tensor& mean,
                                   const Tensor& rstd);

// ---------------- RMSNorm over the last dim (Zhang & Sennrich 2019; HF LlamaRMSNorm):
//   rstd = 1 / sqrt(mean_c(x^2) + eps); y = x * rstd * w.   x (..., C), w (C).
struct RMSNormOut {
  Tensor y, rstd;
};  // rstd: (N) with N = numel / C, f32
RMSNormOut rms_norm(const Tensor& x, const Tensor& w, double eps);
struct RMSNormGrads {
  Tensor gx, gw;
};
RMSNormGrads rms_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& w, const Tensor& rstd);

// ---------------- batch norm over (N, H, W) per channel (torch.nn.functional.batch_norm)
// x (N, C, H, W) (channels_last: (N, H, W, C), likewise y, gy, gx), w b (C) (b may be undefined).
// Training: the batch mean and biased variance; defined running_mean / running_var (f32 (C)) are
// updated in place, r = (1 - momentum) r + momentum s with the unbiased variance (torch's rule).
// Eval: the running statistics (required). mean, rstd = 1 / sqrt(var + eps): (C) f32, the
// statistics used, saved for the backward.
struct BatchNormOut {
  Tensor y, mean, rstd;
};
BatchNormOut batch_norm2d(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& running_mean,
                          const Tensor& running_var, bool training, double momentum, double eps,
                          bool channels_last = false);
// Training: the backward of batch statistics (mean and variance depend on x); eval: an
// affine map, gx = gy w rstd. gw = sum gy xhat, gb = sum gy over (N, H, W).
struct BatchNormGrads {
  Tensor gx, gw, gb;
};
BatchNormGrads batch_norm2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, const Tensor& mean,
                                     const Tensor& rstd, bool training, bool channels_last = false);

// ---------------- the pieces of synchronised batch norm (statistics over a process group)
// fn::sync_batch_norm2d sums these over the group and normalises with batch_norm2d in eval form
// (the global statistics given as the "running" ones). Sums are double, in a fixed order.
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
void batch_norm2d_update_running(const Tensor& running_mean, const Tensor& running_var, const std::vector<double>& mean,
                                 const std::vector<double>& var_unbiased, double momentum);

}  // namespace brigade::ops
