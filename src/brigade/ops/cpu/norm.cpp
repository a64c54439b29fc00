// Normalisation kernels: layer and RMS norm, batch norm (oracle: ops/ref/norm.h), f32 and native
// 16-bit. One row per iteration of a static `omp for`; weight gradients sum fixed row blocks, so
// results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "brigade/ops/cpu/io16.h"
#include "brigade/ops/cpu/workspace.h"

namespace brigade::ops::cpu {

namespace {
// One row of each kernel, shared by the f32 kernels and their native 16-bit variants (which
// call them on rows widened into per-thread buffers).
inline void layer_norm_row(int64_t C, const float* xr, const float* w, const float* b, float epsf, float* yr,
                           float* mean, float* rstd) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t c = 0; c < C; ++c) s += xr[c];
  const float m = s / float(C);
  float v = 0.f;
#pragma omp simd reduction(+ : v)
  for (int64_t c = 0; c < C; ++c) v += (xr[c] - m) * (xr[c] - m);
  const float rs = 1.0f / std::sqrt(v / float(C) + epsf);
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * rs * w[c] + b[c];
  *mean = m;
  *rstd = rs;
}

// gx of one row; adds the row's terms to the gw / gb partials pw, pb.
inline void layer_norm_backward_row(int64_t C, const float* gr, const float* xr, const float* w, float m, float rs,
                                    float* gxr, float* pw, float* pb) {
  float mg = 0.f, mgx = 0.f;
#pragma omp simd reduction(+ : mg, mgx)
  for (int64_t c = 0; c < C; ++c) {
    const float xh = (xr[c] - m) * rs;
    const float g = gr[c] * w[c];
    mg += g;
    mgx += g * xh;
    pw[c] += gr[c] * xh;
    pb[c] += gr[c];
  }
  mg /= float(C);
  mgx /= float(C);
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) {
    const float xh = (xr[c] - m) * rs;
    gxr[c] = rs * (gr[c] * w[c] - mg - xh * mgx);
  }
}

// The block structure of the layer-norm backward (f32 and native 16-bit): gx row by row, gw / gb
// partial sums per fixed block of kRows rows, then summed over the blocks in order (so the result
// does not depend on the thread count). make_row() runs once per thread and gives the function
// row(n, pw, pb) that writes gx row n and adds its terms into its block's partials pw, pb (C each).
template <class MakeRow>
void layer_norm_backward_blocks(int64_t N, int64_t C, float* gw, float* gb, MakeRow make_row) {
  constexpr int64_t kRows = 32;
  const int64_t nb = (N + kRows - 1) / kRows;
  std::vector<float> part(static_cast<size_t>(nb * 2 * C));  // (nb, 2, C): gw, gb partials
#pragma omp parallel if (N * C > kRowParallelMin)
  {
    auto row = make_row();
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < nb; ++blk) {
      float* pw = part.data() + blk * 2 * C;
      float* pb = pw + C;
      std::fill(pw, pw + 2 * C, 0.f);
      for (int64_t n = blk * kRows; n < std::min(N, (blk + 1) * kRows); ++n) row(n, pw, pb);
    }
#pragma omp for schedule(static)
    for (int64_t c = 0; c < C; ++c) {
      float sw = 0.f, sb = 0.f;
      for (int64_t blk = 0; blk < nb; ++blk) {
        sw += part[size_t(blk * 2 * C + c)];
        sb += part[size_t(blk * 2 * C + C + c)];
      }
      gw[c] = sw;
      gb[c] = sb;
    }
  }
}
}  // namespace

// ---------------------------------------------------------------- layer norm (Ba et al. 2016)

void layer_norm(int64_t N, int64_t C, const float* x, const float* w, const float* b, double eps, float* y, float* mean,
                float* rstd) {
  const float epsf = float(eps);
#pragma omp parallel for schedule(static) if (N * C > kRowParallelMin)
  for (int64_t n = 0; n < N; ++n) layer_norm_row(C, x + n * C, w, b, epsf, y + n * C, mean + n, rstd + n);
}

void layer_norm_backward(int64_t N, int64_t C, const float* gy, const float* x, const float* w, const float* mean,
                         const float* rstd, float* gx, float* gw, float* gb) {
  // Backward of `y = (x - mean) * rstd * w + b` (see ref): rows are independent for gx;
  // gw/gb through the fixed row blocks of layer_norm_backward_blocks.
  layer_norm_backward_blocks(N, C, gw, gb, [&] {
    return [&](int64_t n, float* pw, float* pb) {
      layer_norm_backward_row(C, gy + n * C, x + n * C, w, mean[n], rstd[n], gx + n * C, pw, pb);
    };
  });
}

// ---------------------------------------------------------------- native 16-bit variants (see kernels.h)
// Each row is widened into a per-thread f32 buffer, the f32 row function runs there, and the
// output row is rounded once as it is stored. Same thresholds, splits and sums as above.

void layer_norm16(int64_t N, int64_t C, const Strided& x, const float* w, const float* b, double eps, DType ot, void* y,
                  float* mean, float* rstd) {
  const float epsf = float(eps);
  map_rows16(
      N, C, ot, y,
      [&](int64_t n, const float* xr, float* yr) { layer_norm_row(C, xr, w, b, epsf, yr, mean + n, rstd + n); }, x);
}

void layer_norm_backward16(int64_t N, int64_t C, const Strided& gy, const Strided& x, const float* w, const float* mean,
                           const float* rstd, DType ot, void* gx, float* gw, float* gb) {
  const size_t eo = dtype_size(ot);
  layer_norm_backward_blocks(N, C, gw, gb, [&] {
    // a thread's f32 rows: gy, x and gx
    return [&, buf = std::vector<float>(static_cast<size_t>(3 * C))](int64_t n, float* pw, float* pb) mutable {
      float* gr = buf.data();
      float* xr = gr + C;
      float* gxr = xr + C;
      gather_f32(gy, n * C, C, gr);
      gather_f32(x, n * C, C, xr);
      layer_norm_backward_row(C, gr, xr, w, mean[n], rstd[n], gxr, pw, pb);
      store_f32(ot, C, gxr, static_cast<char*>(gx) + size_t(n * C) * eo);
    };
  });
}

// RMSNorm and its backward.
void rms_norm(int64_t N, int64_t C, const float* x, const float* w, double eps, float* y, float* rstd) {
  const float epsf = float(eps);
#pragma omp parallel for schedule(static) if (N * C >= (int64_t(1) << 14))
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
    const float rs = 1.0f / std::sqrt(ss / float(C) + epsf);
    float* yr = y + n * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * rs * w[c];
    rstd[n] = rs;
  }
}

void rms_norm_backward(int64_t N, int64_t C, const float* gy, const float* x, const float* w, const float* rstd,
                       float* gx, float* gw) {
  const bool par = N * C >= (int64_t(1) << 14);
#pragma omp parallel for schedule(static) if (par)
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    const float* gr = gy + n * C;
    const float rs = rstd[n];
    float mgx = 0.f;
#pragma omp simd reduction(+ : mgx)
    for (int64_t c = 0; c < C; ++c) mgx += gr[c] * w[c] * (xr[c] * rs);
    mgx /= float(C);
    float* gxr = gx + n * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) gxr[c] = rs * (gr[c] * w[c] - (xr[c] * rs) * mgx);
  }
  // gw: one column per iteration, rows summed in order (thread-count independent).
#pragma omp parallel for schedule(static) if (par)
  for (int64_t c = 0; c < C; ++c) {
    float acc = 0.f;
    for (int64_t n = 0; n < N; ++n) acc += gy[n * C + c] * (x[n * C + c] * rstd[n]);
    gw[c] = acc;
  }
}

// ---------------------------------------------------------------- batch norm
// Branch-free and vectorisable; statistics accumulate each (n, c) row of HW values in float
// (16-lane partial sums), then the rows in double, in a fixed order per channel: bitwise
// reproducible for any thread count (one channel per iteration). The templates of ref/norm.h are
// the double oracle the op harness compares against.
namespace {

// Sum of a row, and sum of (x - m)^2 when `m` is given, as float partial sums in lane order.
inline float row_sum(const float* x, int64_t n) {
  float acc[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
#pragma omp simd
    for (int l = 0; l < 16; ++l) acc[l] += x[i + l];
  float s = 0;
  for (; i < n; ++i) s += x[i];
  for (int l = 0; l < 16; ++l) s += acc[l];
  return s;
}
inline float row_sq_dev(const float* x, int64_t n, float m) {
  float acc[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
#pragma omp simd
    for (int l = 0; l < 16; ++l) {
      const float d = x[i + l] - m;
      acc[l] += d * d;
    }
  float s = 0;
  for (; i < n; ++i) s += (x[i] - m) * (x[i] - m);
  for (int l = 0; l < 16; ++l) s += acc[l];
  return s;
}
// sum(gy) and sum(gy * (x - m)) of a row.
inline void row_grad_sums(const float* gy, const float* x, int64_t n, float m, float& sg, float& sgx) {
  float a[16] = {0}, b[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
#pragma omp simd
    for (int l = 0; l < 16; ++l) {
      a[l] += gy[i + l];
      b[l] += gy[i + l] * (x[i + l] - m);
    }
  float s0 = 0, s1 = 0;
  for (; i < n; ++i) s0 += gy[i], s1 += gy[i] * (x[i] - m);
  for (int l = 0; l < 16; ++l) s0 += a[l], s1 += b[l];
  sg = s0, sgx = s1;
}

}  // namespace

// NCHW batch norm; x and y of dtype dt (f32, bf16 or f16), everything else f32.
void batch_norm_planes(int64_t N, int64_t C, int64_t HW, DType dt, const void* x, const float* w, const float* b,
                       bool training, const float* rmean, const float* rvar, double eps, void* y, float* mean,
                       float* rstd, float* var_out) {
#pragma omp parallel if (N * C * HW > (1 << 15))
  {
    std::vector<float> xb = scratch_row(dt, HW), yb = scratch_row(dt, HW);
#pragma omp for schedule(static)
    for (int64_t c = 0; c < C; ++c) {
      double m, v;
      if (training) {
        const double M = double(N * HW);
        double s = 0;
        for (int64_t n = 0; n < N; ++n) s += double(row_sum(f32_view(dt, x, (n * C + c) * HW, HW, xb.data()), HW));
        m = s / M;
        double q = 0;
        for (int64_t n = 0; n < N; ++n)
          q += double(row_sq_dev(f32_view(dt, x, (n * C + c) * HW, HW, xb.data()), HW, float(m)));
        v = q / M;
      } else {
        m = double(rmean[c]);
        v = double(rvar[c]);
      }
      const double r = 1.0 / std::sqrt(v + eps);
      mean[c] = float(m);
      rstd[c] = float(r);
      var_out[c] = float(v);
      const float scale = float(r * double(w[c])), shift = float((b ? double(b[c]) : 0.0) - m * r * double(w[c]));
      for (int64_t n = 0; n < N; ++n) {
        const int64_t off = (n * C + c) * HW;
        const float* xr = f32_view(dt, x, off, HW, xb.data());
        float* yr = f32_out(dt, y, off, yb.data());
#pragma omp simd
        for (int64_t i = 0; i < HW; ++i) yr[i] = xr[i] * scale + shift;
        store_out(dt, y, off, HW, yr);
      }
    }
  }
}

// NCHW backward; gy of dtype dg, x and gx of dtype dx, the rest f32.
void batch_norm_planes_backward(int64_t N, int64_t C, int64_t HW, DType dg, const void* gy, DType dx, const void* x,
                                const float* w, const float* mean, const float* rstd, bool training, void* gx,
                                float* gw, float* gb) {
  const double M = double(N * HW);
#pragma omp parallel if (N * C * HW > (1 << 15))
  {
    std::vector<float> gbuf = scratch_row(dg, HW), xb = scratch_row(dx, HW), ob = scratch_row(dx, HW);
#pragma omp for schedule(static)
    for (int64_t c = 0; c < C; ++c) {
      const float m = mean[c];
      const double r = double(rstd[c]), wc = double(w[c]);
      double sg = 0, sgxm = 0;  // sum gy, sum gy (x - m)
      for (int64_t n = 0; n < N; ++n) {
        const int64_t off = (n * C + c) * HW;
        float a, bsum;
        row_grad_sums(f32_view(dg, gy, off, HW, gbuf.data()), f32_view(dx, x, off, HW, xb.data()), HW, m, a, bsum);
        sg += double(a), sgxm += double(bsum);
      }
      const double sgx = sgxm * r;  // sum gy * xhat
      gw[c] = float(sgx);
      gb[c] = float(sg);
      // training: gx = w r (gy - sg/M - xhat sgx/M) = k1 gy + k2 (x - m) + k3; eval: gx = w r gy
      const float k1 = float(wc * r);
      const float k2 = training ? float(-wc * r * r * sgx / M) : 0.f;
      const float k3 = training ? float(-wc * r * sg / M) : 0.f;
      for (int64_t n = 0; n < N; ++n) {
        const int64_t off = (n * C + c) * HW;
        const float* g = f32_view(dg, gy, off, HW, gbuf.data());
        const float* xr = f32_view(dx, x, off, HW, xb.data());
        float* o = f32_out(dx, gx, off, ob.data());
#pragma omp simd
        for (int64_t i = 0; i < HW; ++i) o[i] = k1 * g[i] + k2 * (xr[i] - m) + k3;
        store_out(dx, gx, off, HW, o);
      }
    }
  }
}

// Channels-last batch norm: x is M = N H W rows of C channels. Per-channel sums run over fixed

namespace {

// blocks of kRowBlock rows (one double per channel per block, vectorised along the row), then
// the blocks are added in order: the same order for any thread count.
constexpr int64_t kRowBlock = 64;

// out[k] = sum over the M rows of what add_row(r, acc) adds into acc[0, K), in a fixed order.
template <class RowFn>
void column_sums_blocked(int64_t M, int64_t K, double* out, RowFn&& add_row) {
  const int64_t nb = (M + kRowBlock - 1) / kRowBlock;
  const WorkspaceBuffer buf(size_t(nb * K) * sizeof(double));
  double* part = buf.as<double>();
#pragma omp parallel for schedule(static) if (M * K > (1 << 15))
  for (int64_t blk = 0; blk < nb; ++blk) {
    double* acc = part + blk * K;
    for (int64_t k = 0; k < K; ++k) acc[k] = 0;
    const int64_t r1 = std::min(M, (blk + 1) * kRowBlock);
    for (int64_t r = blk * kRowBlock; r < r1; ++r) add_row(r, acc);
  }
  for (int64_t k = 0; k < K; ++k) out[k] = 0;
  for (int64_t blk = 0; blk < nb; ++blk) {
    const double* acc = part + blk * K;
#pragma omp simd
    for (int64_t k = 0; k < K; ++k) out[k] += acc[k];
  }
}

}  // namespace

// Channels-last batch norm; x and y of dtype dt, the rest f32.
void batch_norm_rows(int64_t M, int64_t C, DType dt, const void* x, const float* w, const float* b, bool training,
                     const float* rmean, const float* rvar, double eps, void* y, float* mean, float* rstd,
                     float* var_out) {
  std::vector<double> m(static_cast<size_t>(C)), v(static_cast<size_t>(C));
  std::vector<float> mf(static_cast<size_t>(C));
  if (training) {
    column_sums_blocked(M, C, m.data(), [&](int64_t r, double* acc) {
      for_chunks(C, [&](int64_t c0, int64_t n) {
        alignas(64) float buf[kWidenChunk];
        const float* xr = f32_view(dt, x, r * C + c0, n, buf);
        double* a = acc + c0;
#pragma omp simd
        for (int64_t c = 0; c < n; ++c) a[c] += double(xr[c]);
      });
    });
    for (int64_t c = 0; c < C; ++c) m[size_t(c)] /= double(M), mf[size_t(c)] = float(m[size_t(c)]);
    const float* mp = mf.data();
    column_sums_blocked(M, C, v.data(), [&](int64_t r, double* acc) {
      for_chunks(C, [&](int64_t c0, int64_t n) {
        alignas(64) float buf[kWidenChunk];
        const float* xr = f32_view(dt, x, r * C + c0, n, buf);
        const float* mc = mp + c0;
        double* a = acc + c0;
#pragma omp simd
        for (int64_t c = 0; c < n; ++c) {
          const float d = xr[c] - mc[c];
          a[c] += double(d * d);
        }
      });
    });
    for (int64_t c = 0; c < C; ++c) v[size_t(c)] /= double(M);
  } else {
    for (int64_t c = 0; c < C; ++c) m[size_t(c)] = double(rmean[c]), v[size_t(c)] = double(rvar[c]);
  }
  std::vector<float> scale(static_cast<size_t>(C)), shift(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    const double r = 1.0 / std::sqrt(v[size_t(c)] + eps);
    mean[c] = float(m[size_t(c)]);
    rstd[c] = float(r);
    var_out[c] = float(v[size_t(c)]);
    scale[size_t(c)] = float(r * double(w[c]));
    shift[size_t(c)] = float((b ? double(b[c]) : 0.0) - m[size_t(c)] * r * double(w[c]));
  }
  const float *sc = scale.data(), *sh = shift.data();
#pragma omp parallel for schedule(static) if (M * C > (1 << 15))
  for (int64_t r = 0; r < M; ++r) {
    for_chunks(C, [&](int64_t c0, int64_t n) {
      alignas(64) float xb[kWidenChunk], yb[kWidenChunk];
      const int64_t off = r * C + c0;
      const float* xr = f32_view(dt, x, off, n, xb);
      float* yr = f32_out(dt, y, off, yb);
      const float *s0 = sc + c0, *s1 = sh + c0;
#pragma omp simd
      for (int64_t c = 0; c < n; ++c) yr[c] = xr[c] * s0[c] + s1[c];
      store_out(dt, y, off, n, yr);
    });
  }
}

// Channels-last backward; gy of dtype dg, x and gx of dtype dx, the rest f32.
void batch_norm_rows_backward(int64_t M, int64_t C, DType dg, const void* gy, DType dx, const void* x, const float* w,
                              const float* mean, const float* rstd, bool training, void* gx, float* gw, float* gb) {
  // sums[c] = sum gy, sums[C + c] = sum gy (x - m), in one pass over gy and x
  std::vector<double> sums(static_cast<size_t>(2 * C));
  column_sums_blocked(M, 2 * C, sums.data(), [&](int64_t r, double* acc) {
    for_chunks(C, [&](int64_t c0, int64_t n) {
      alignas(64) float gbuf[kWidenChunk], xbuf[kWidenChunk];
      const float *g = f32_view(dg, gy, r * C + c0, n, gbuf), *xr = f32_view(dx, x, r * C + c0, n, xbuf);
      const float* mc = mean + c0;
      double *a0 = acc + c0, *a1 = acc + C + c0;
#pragma omp simd
      for (int64_t c = 0; c < n; ++c) {
        a0[c] += double(g[c]);
        a1[c] += double(g[c] * (xr[c] - mc[c]));
      }
    });
  });
  const double *sg = sums.data(), *sgxm = sums.data() + C;
  std::vector<float> k1(static_cast<size_t>(C)), k2(static_cast<size_t>(C)), k3(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    const double r = double(rstd[c]), wc = double(w[c]), sgx = sgxm[c] * r;  // sum gy * xhat
    gw[c] = float(sgx);
    gb[c] = float(sg[c]);
    // training: gx = w r (gy - sg/M - xhat sgx/M) = k1 gy + k2 (x - m) + k3; eval: gx = w r gy
    k1[size_t(c)] = float(wc * r);
    k2[size_t(c)] = training ? float(-wc * r * r * sgx / double(M)) : 0.f;
    k3[size_t(c)] = training ? float(-wc * r * sg[c] / double(M)) : 0.f;
  }
  const float *ka = k1.data(), *kb = k2.data(), *kc = k3.data();
#pragma omp parallel for schedule(static) if (M * C > (1 << 15))
  for (int64_t r = 0; r < M; ++r) {
    for_chunks(C, [&](int64_t c0, int64_t n) {
      alignas(64) float gbuf[kWidenChunk], xbuf[kWidenChunk], obuf[kWidenChunk];
      const int64_t off = r * C + c0;
      const float *g = f32_view(dg, gy, off, n, gbuf), *xr = f32_view(dx, x, off, n, xbuf);
      float* o = f32_out(dx, gx, off, obuf);
      const float *a = ka + c0, *bb = kb + c0, *cc = kc + c0, *mc = mean + c0;
#pragma omp simd
      for (int64_t c = 0; c < n; ++c) o[c] = a[c] * g[c] + bb[c] * (xr[c] - mc[c]) + cc[c];
      store_out(dx, gx, off, n, o);
    });
  }
}

}  // namespace brigade::ops::cpu
