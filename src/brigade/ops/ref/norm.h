// Scalar oracle of the normalisations (ops/norm.h): layer norm, RMSNorm and batch norm.
#pragma once
#include "brigade/ops/ref/common.h"

namespace brigade::ops::ref {

// Layer norm over rows of x (N, C) (Ba et al. 2016; torch.nn.LayerNorm, biased variance):
//   mean = sum(x)/C; rstd = 1/sqrt(sum((x-mean)^2)/C + eps); y = (x-mean)*rstd*w + b.
template <typename S>
void layer_norm(int64_t N, int64_t C, const S* x, const S* w, const S* b, double eps, S* y, S* mean, S* rstd) {
  for (int64_t n = 0; n < N; ++n) {
    const S* xr = x + n * C;
    S m = S(0);
    for (int64_t c = 0; c < C; ++c) m += xr[c];
    m /= S(C);
    S v = S(0);
    for (int64_t c = 0; c < C; ++c) v += (xr[c] - m) * (xr[c] - m);
    v /= S(C);
    const S rs = S(1) / std::sqrt(v + S(eps));
    for (int64_t c = 0; c < C; ++c) y[n * C + c] = (xr[c] - m) * rs * w[c] + b[c];
    mean[n] = m;
    rstd[n] = rs;
  }
}
// Backward of `y = (x - mean) * rstd * w + b` with xhat = (x - mean) * rstd:
//   gb = sum_n gy; gw = sum_n gy * xhat; g = gy * w;
//   gx = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)).
template <typename S>
void layer_norm_backward(int64_t N, int64_t C, const S* gy, const S* x, const S* w, const S* mean, const S* rstd, S* gx,
                         S* gw, S* gb) {
  for (int64_t c = 0; c < C; ++c) gw[c] = gb[c] = S(0);
  for (int64_t n = 0; n < N; ++n) {
    const S* xr = x + n * C;
    const S* gr = gy + n * C;
    S mg = S(0), mgx = S(0);
    for (int64_t c = 0; c < C; ++c) {
      const S xh = (xr[c] - mean[n]) * rstd[n];
      const S g = gr[c] * w[c];
      mg += g;
      mgx += g * xh;
      gw[c] += gr[c] * xh;
      gb[c] += gr[c];
    }
    mg /= S(C);
    mgx /= S(C);
    for (int64_t c = 0; c < C; ++c) {
      const S xh = (xr[c] - mean[n]) * rstd[n];
      gx[n * C + c] = rstd[n] * (gr[c] * w[c] - mg - xh * mgx);
    }
  }
}

// RMSNorm over rows of x (N, C), contiguous: rstd[n] = 1/sqrt(sum_c x^2 / C + eps);
// y = x * rstd * w. Sums run over c in order.
template <typename S>
void rms_norm(int64_t N, int64_t C, const S* x, const S* w, double eps, S* y, S* rstd) {
  for (int64_t n = 0; n < N; ++n) {
    const S* xr = x + n * C;
    S ss = S(0);
    for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
    const S rs = S(1) / std::sqrt(ss / S(C) + S(eps));
    for (int64_t c = 0; c < C; ++c) y[n * C + c] = xr[c] * rs * w[c];
    rstd[n] = rs;
  }
}
// Backward of `y = x * rstd * w` with xhat = x * rstd:
//   gw = sum_n gy * xhat; g = gy * w; gx = rstd * (g - xhat * mean_c(g * xhat)).
template <typename S>
void rms_norm_backward(int64_t N, int64_t C, const S* gy, const S* x, const S* w, const S* rstd, S* gx, S* gw) {
  for (int64_t c = 0; c < C; ++c) gw[c] = S(0);
  for (int64_t n = 0; n < N; ++n) {
    const S* xr = x + n * C;
    const S* gr = gy + n * C;
    S mgx = S(0);
    for (int64_t c = 0; c < C; ++c) {
      const S xh = xr[c] * rstd[n];
      mgx += gr[c] * w[c] * xh;
      gw[c] += gr[c] * xh;
    }
    mgx /= S(C);
    for (int64_t c = 0; c < C; ++c) {
      const S xh = xr[c] * rstd[n];
      gx[n * C + c] = rstd[n] * (gr[c] * w[c] - xh * mgx);
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

// sum gy and sum gy xhat (xhat = (x - m) r) over channel c, in n then hw order.
template <typename T>
void grad_sums_channel(int64_t N, int64_t C, int64_t HW, int64_t c, const T* gy, const T* x, double m, double r,
                       double& sg, double& sgx) {
  sg = 0, sgx = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < HW; ++i) {
      const int64_t k = (n * C + c) * HW + i;
      sg += double(gy[k]);
      sgx += double(gy[k]) * (double(x[k]) - m) * r;
    }
}

// Channels [c0, c1) of the batch-norm backward (see ops::batch_norm2d_backward).
template <typename T, typename S>
void batch_norm2d_backward(int64_t N, int64_t C, int64_t HW, int64_t c0, int64_t c1, const T* gy, const T* x,
                           const T* w, const S* mean, const S* rstd, bool training, T* gx, T* gw, T* gb) {
  const double M = double(N * HW);
  for (int64_t c = c0; c < c1; ++c) {
    const double m = double(mean[c]), r = double(rstd[c]), wc = double(w[c]);
    double sg, sgx;
    grad_sums_channel(N, C, HW, c, gy, x, m, r, sg, sgx);
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
void batch_norm2d_sums(int64_t N, int64_t C, int64_t HW, int64_t c0, int64_t c1, const T* x, double* s1, double* s2) {
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
  for (int64_t c = c0; c < c1; ++c)
    grad_sums_channel(N, C, HW, c, gy, x, double(mean[c]), double(rstd[c]), s1[c], s2[c]);
}
// gx = w r (gy - s1 / M - xhat s2 / M)
template <typename T, typename S>
void batch_norm2d_backward_input(int64_t N, int64_t C, int64_t HW, int64_t c0, int64_t c1, const T* gy, const T* x,
                                 const T* w, const S* mean, const S* rstd, const double* s1, const double* s2, double M,
                                 T* gx) {
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

}  // namespace brigade::ops::ref
