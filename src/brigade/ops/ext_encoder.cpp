// Front-ends and cpu kernels of the encoder ops (ext_encoder.h): argument checks with
// user-facing messages, output allocation, the widened path for 16-bit inputs (cast to f32,
// the f32 op, one rounding of each output: bitwise what the contract in ops.h defines), and
// dispatch to the scalar oracle (ops::ref templates in the header, Backend::Ref) or the
// OpenMP kernels below (Backend::Cpu). The cpu kernels use static schedules and a fixed
// summation order per output, so they are bitwise reproducible for a given thread count.
#include "brigade/ops/ext_encoder.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "brigade/core/error.h"

#if defined(__AVX512F__) && defined(BRIGADE_HAVE_LIBMVEC)
#include <immintrin.h>
// glibc's libmvec (>= 2.35): 16-lane AVX-512 erff / expf (the vector ABI names GCC emits for
// `#pragma omp declare simd` math; within 4 ulp, like the scalar functions).
extern "C" __m512 _ZGVeN16v_erff(__m512);
extern "C" __m512 _ZGVeN16v_expf(__m512);
#define BRIGADE_GELU_AVX512 1
#endif

namespace brigade::ops {

namespace {

void check_float_arg(const Tensor& t, const char* op, const char* name) {
  BRIGADE_CHECK(t.defined(), ValueError, "{}: '{}' is an undefined tensor", op, name);
  BRIGADE_CHECK(is_floating(t.dtype()), ShapeError, "{}: '{}' must be f32, bf16 or f16, got {}", op, name, t.str());
}
bool half(const Tensor& t) { return t.dtype() == DType::BF16 || t.dtype() == DType::F16; }
Tensor widen(const Tensor& t) { return half(t) ? cast(t, DType::F32) : t; }
Tensor round_to(const Tensor& t, DType dt) { return t.dtype() == dt ? t : cast(t, dt); }
bool is_ref() { return current_backend() == Backend::Ref; }

// ------------------------------------------------------------------ cpu kernels

// GELU (exact): 0.5 x (1 + erf(x / sqrt 2)). With AVX-512 and libmvec, 16 lanes at a time through
// the vector erff / expf (the scalar loop finishes the tail); the result differs from the scalar
// erff path by at most a few ulp (the op harness bounds both against the double oracle).
void gelu_erf_cpu(int64_t n, const float* x, float* y) {
  const float r = 0.7071067811865476f;
#ifdef BRIGADE_GELU_AVX512
  const int64_t nv = n / 16;
#pragma omp parallel for schedule(static) if (n > (1 << 14))
  for (int64_t b = 0; b < nv; ++b) {
    const __m512 v = _mm512_loadu_ps(x + b * 16);
    const __m512 e = _ZGVeN16v_erff(_mm512_mul_ps(v, _mm512_set1_ps(r)));
    const __m512 h = _mm512_mul_ps(_mm512_set1_ps(0.5f), v);
    _mm512_storeu_ps(y + b * 16, _mm512_fmadd_ps(h, e, h));  // 0.5x + 0.5x erf
  }
  for (int64_t i = nv * 16; i < n; ++i) y[i] = 0.5f * x[i] * (1.f + std::erf(x[i] * r));
#else
#pragma omp parallel for schedule(static) if (n > (1 << 14))
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.f + std::erf(x[i] * r));
#endif
}

// d/dx GELU = Phi(x) + x phi(x), times gy.
void gelu_erf_backward_cpu(int64_t n, const float* gy, const float* x, float* gx) {
  const float r = 0.7071067811865476f, c = 0.3989422804014327f;
  auto one = [&](int64_t i) {
    const float cdf = 0.5f * (1.f + std::erf(x[i] * r));
    const float pdf = c * std::exp(-0.5f * x[i] * x[i]);
    gx[i] = gy[i] * (cdf + x[i] * pdf);
  };
#ifdef BRIGADE_GELU_AVX512
  const int64_t nv = n / 16;
#pragma omp parallel for schedule(static) if (n > (1 << 14))
  for (int64_t b = 0; b < nv; ++b) {
    const __m512 v = _mm512_loadu_ps(x + b * 16);
    const __m512 cdf = _mm512_fmadd_ps(_mm512_set1_ps(0.5f), _ZGVeN16v_erff(_mm512_mul_ps(v, _mm512_set1_ps(r))),
                                       _mm512_set1_ps(0.5f));
    const __m512 pdf = _mm512_mul_ps(
        _mm512_set1_ps(c), _ZGVeN16v_expf(_mm512_mul_ps(_mm512_set1_ps(-0.5f), _mm512_mul_ps(v, v))));
    _mm512_storeu_ps(gx + b * 16, _mm512_mul_ps(_mm512_loadu_ps(gy + b * 16), _mm512_fmadd_ps(v, pdf, cdf)));
  }
  for (int64_t i = nv * 16; i < n; ++i) one(i);
#else
#pragma omp parallel for schedule(static) if (n > (1 << 14))
  for (int64_t i = 0; i < n; ++i) one(i);
#endif
}

// One (head, query) row per iteration: scores over the unmasked keys (d in order), their
// max and sum of exponentials, then out = sum_j p_j v_j accumulated over j in order.
void attention_key_mask_cpu(int64_t B, int64_t NH, int64_t T, int64_t HS, const float* q, const float* k,
                            const float* v, const uint8_t* keep, double scale, float* out, float* lse) {
  const int64_t rows = B * NH * T;
  const float sc = float(scale);
#pragma omp parallel if (rows * T * HS > (1 << 15))
  {
    std::vector<float> s(static_cast<size_t>(T));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t bh = r / T;
      const uint8_t* kp = keep + (bh / NH) * T;
      const float* qi = q + r * HS;
      const float* kb = k + bh * T * HS;
      const float* vb = v + bh * T * HS;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < T; ++j) {
        if (!kp[j]) continue;
        float acc = 0.f;
        for (int64_t d = 0; d < HS; ++d) acc += qi[d] * kb[j * HS + d];
        s[size_t(j)] = acc * sc;
        m = std::max(m, s[size_t(j)]);
      }
      float sum = 0.f;
      for (int64_t j = 0; j < T; ++j)
        if (kp[j]) {
          s[size_t(j)] = std::exp(s[size_t(j)] - m);
          sum += s[size_t(j)];
        }
      lse[r] = m + std::log(sum);
      float* o = out + r * HS;
      std::fill(o, o + HS, 0.f);
      for (int64_t j = 0; j < T; ++j) {
        if (!kp[j]) continue;
        const float pj = s[size_t(j)] / sum;
        const float* vj = vb + j * HS;
#pragma omp simd
        for (int64_t d = 0; d < HS; ++d) o[d] += pj * vj[d];
      }
    }
  }
}

// One head per iteration (gk, gv sum over the head's queries, in query order).
void attention_key_mask_backward_cpu(int64_t B, int64_t NH, int64_t T, int64_t HS, const float* gout,
                                     const float* q, const float* k, const float* v, const float* out,
                                     const float* lse, const uint8_t* keep, double scale, float* gq, float* gk,
                                     float* gv) {
  const float sc = float(scale);
#pragma omp parallel for schedule(static) if (B * NH * T * T * HS > (1 << 15))
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const uint8_t* kp = keep + (bh / NH) * T;
    const int64_t o = bh * T * HS;
    std::fill(gq + o, gq + o + T * HS, 0.f);
    std::fill(gk + o, gk + o + T * HS, 0.f);
    std::fill(gv + o, gv + o + T * HS, 0.f);
    for (int64_t i = 0; i < T; ++i) {
      const float* gi = gout + o + i * HS;
      const float* qi = q + o + i * HS;
      float D = 0.f;
      for (int64_t d = 0; d < HS; ++d) D += gi[d] * out[o + i * HS + d];
      const float l = lse[bh * T + i];
      float* gqi = gq + o + i * HS;
      for (int64_t j = 0; j < T; ++j) {
        if (!kp[j]) continue;
        const float* kj = k + o + j * HS;
        const float* vj = v + o + j * HS;
        float sij = 0.f, gp = 0.f;
        for (int64_t d = 0; d < HS; ++d) {
          sij += qi[d] * kj[d];
          gp += gi[d] * vj[d];
        }
        const float p = std::exp(sij * sc - l);
        const float gs = p * (gp - D) * sc;
        float* gvj = gv + o + j * HS;
        float* gkj = gk + o + j * HS;
#pragma omp simd
        for (int64_t d = 0; d < HS; ++d) {
          gvj[d] += p * gi[d];
          gqi[d] += gs * kj[d];
          gkj[d] += gs * qi[d];
        }
      }
    }
  }
}

// One (image, patch) per iteration: C*p runs of p contiguous values. kToPatches: src is the
// image (N, C, H, W) and dst the patches (N, P, C*p*p); otherwise the inverse.
template <bool kToPatches>
void patch_copy_cpu(int64_t N, int64_t C, int64_t H, int64_t W, int64_t p, const float* src, float* dst) {
  const int64_t PW = W / p, P = (H / p) * PW, F = C * p * p;
#pragma omp parallel for schedule(static) if (N * P * F > (1 << 16))
  for (int64_t r = 0; r < N * P; ++r) {
    const int64_t n = r / P, pi = r % P, h0 = (pi / PW) * p, w0 = (pi % PW) * p;
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < p; ++i) {
        const int64_t prow = r * F + (c * p + i) * p, irow = ((n * C + c) * H + h0 + i) * W + w0;
        if constexpr (kToPatches)
          std::copy(src + irow, src + irow + p, dst + prow);
        else
          std::copy(src + prow, src + prow + p, dst + irow);
      }
  }
}

// ------------------------------------------------------------------ checks

void check_qkv_shapes(const Tensor& q, const Tensor& k, const Tensor& v, const char* op) {
  check_float_arg(q, op, "q");
  check_float_arg(k, op, "k");
  check_float_arg(v, op, "v");
  BRIGADE_CHECK(q.dim() == 4, ShapeError, "{}: q must be (B, NH, T, HS), got {}", op, shape_str(q.shape()));
  BRIGADE_CHECK(k.shape() == q.shape(), ShapeError, "{}: 'k' has shape {} but 'q' has shape {}; they must match", op,
                shape_str(k.shape()), shape_str(q.shape()));
  BRIGADE_CHECK(v.shape() == q.shape(), ShapeError, "{}: 'v' has shape {} but 'q' has shape {}; they must match", op,
                shape_str(v.shape()), shape_str(q.shape()));
}

struct PatchDims {
  int64_t N, C, H, W, P, F;
};
PatchDims patch_dims(const Shape& s, int64_t p, const char* op) {
  BRIGADE_CHECK(s.size() == 4, ShapeError, "{}: x must be (N, C, H, W), got {}", op, shape_str(s));
  BRIGADE_CHECK(p >= 1, ValueError, "{}: patch size must be >= 1, got {}", op, p);
  BRIGADE_CHECK(s[2] % p == 0 && s[3] % p == 0, ShapeError,
                "{}: image height and width {}x{} must be multiples of the patch size {}", op, s[2], s[3], p);
  return {s[0], s[1], s[2], s[3], (s[2] / p) * (s[3] / p), s[1] * p * p};
}

}  // namespace

// ------------------------------------------------------------------ gelu (erf)

Tensor gelu_erf(const Tensor& x) {
  check_float_arg(x, "gelu_erf", "x");
  if (half(x)) return round_to(gelu_erf(widen(x)), x.dtype());
  Tensor xc = x.contiguous();
  Tensor y = Tensor::empty(x.shape());  // same as x
  if (is_ref())
    ref::gelu_erf<float>(x.numel(), xc.data<float>(), y.data<float>());
  else
    gelu_erf_cpu(x.numel(), xc.data<float>(), y.data<float>());
  return y;
}

Tensor gelu_erf_backward(const Tensor& gy, const Tensor& x) {
  check_float_arg(gy, "gelu_erf_backward", "gy");
  check_float_arg(x, "gelu_erf_backward", "x");
  BRIGADE_CHECK(gy.shape() == x.shape(), ShapeError,
                "gelu_erf_backward: 'gy' has shape {} but 'x' has shape {}; they must match", shape_str(gy.shape()),
                shape_str(x.shape()));
  if (half(gy) || half(x)) return round_to(gelu_erf_backward(widen(gy), widen(x)), x.dtype());
  Tensor gyc = gy.contiguous(), xc = x.contiguous();
  Tensor gx = Tensor::empty(x.shape());  // same as x
  if (is_ref())
    ref::gelu_erf_backward<float>(x.numel(), gyc.data<float>(), xc.data<float>(), gx.data<float>());
  else
    gelu_erf_backward_cpu(x.numel(), gyc.data<float>(), xc.data<float>(), gx.data<float>());
  return gx;
}

// ------------------------------------------------------------------ attention with a key mask

std::vector<uint8_t> key_mask_bytes(const Tensor& key_mask, int64_t B, int64_t T, const char* op) {
  BRIGADE_CHECK(key_mask.defined(), ValueError, "{}: 'key_mask' is an undefined tensor", op);
  BRIGADE_CHECK(key_mask.shape() == Shape({B, T}), ShapeError, "{}: key_mask must be (B, T) = {}, got {}", op,
                shape_str({B, T}), shape_str(key_mask.shape()));
  std::vector<uint8_t> keep(static_cast<size_t>(B * T));
  if (key_mask.dtype() == DType::I32 || key_mask.dtype() == DType::I64) {
    const std::vector<int64_t> m = key_mask.to_vector_i64();
    for (size_t i = 0; i < m.size(); ++i) {
      BRIGADE_CHECK(m[i] == 0 || m[i] == 1, ValueError, "{}: key_mask must hold 0 or 1, got {} at index {}", op,
                    m[i], i);
      keep[i] = uint8_t(m[i]);
    }
  } else {
    const std::vector<float> m = key_mask.to_vector();
    for (size_t i = 0; i < m.size(); ++i) {
      BRIGADE_CHECK(m[i] == 0.f || m[i] == 1.f, ValueError, "{}: key_mask must hold 0 or 1, got {} at index {}", op,
                    m[i], i);
      keep[i] = uint8_t(m[i]);
    }
  }
  for (int64_t b = 0; b < B; ++b) {
    bool any = false;
    for (int64_t j = 0; j < T; ++j) any = any || keep[size_t(b * T + j)];
    BRIGADE_CHECK(any || T == 0, ValueError,
                  "{}: row {} of key_mask masks every key, so its softmax is undefined; give each row at least "
                  "one key with mask 1",
                  op, b);
  }
  return keep;
}

AttentionOut attention_key_mask(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_mask,
                                double scale) {
  const char* op = "attention_key_mask";
  check_qkv_shapes(q, k, v, op);
  const int64_t B = q.size(0), NH = q.size(1), T = q.size(2), HS = q.size(3);
  const std::vector<uint8_t> keep = key_mask_bytes(key_mask, B, T, op);
  if (half(q) || half(k) || half(v)) {
    AttentionOut o = attention_key_mask(widen(q), widen(k), widen(v), key_mask, scale);
    o.out = round_to(o.out, q.dtype());
    return o;
  }
  Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  AttentionOut o;
  o.out = Tensor::empty({B, NH, T, HS});  // (B, NH, T, HS)
  o.lse = Tensor::empty({B, NH, T});      // (B, NH, T)
  if (is_ref())
    ref::attention_key_mask<float>(B, NH, T, HS, qc.data<float>(), kc.data<float>(), vc.data<float>(), keep.data(),
                                   scale, o.out.data<float>(), o.lse.data<float>());
  else
    attention_key_mask_cpu(B, NH, T, HS, qc.data<float>(), kc.data<float>(), vc.data<float>(), keep.data(), scale,
                           o.out.data<float>(), o.lse.data<float>());
  return o;
}

AttentionGrads attention_key_mask_backward(const Tensor& gout, const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& out, const Tensor& lse, const Tensor& key_mask,
                                           double scale) {
  const char* op = "attention_key_mask_backward";
  check_qkv_shapes(q, k, v, op);
  check_float_arg(gout, op, "gout");
  check_float_arg(out, op, "out");
  check_float_arg(lse, op, "lse");
  BRIGADE_CHECK(gout.shape() == q.shape() && out.shape() == q.shape(), ShapeError,
                "{}: gout {} and out {} must have q's shape {}", op, shape_str(gout.shape()), shape_str(out.shape()),
                shape_str(q.shape()));
  const int64_t B = q.size(0), NH = q.size(1), T = q.size(2), HS = q.size(3);
  BRIGADE_CHECK(lse.shape() == Shape({B, NH, T}), ShapeError, "{}: lse must be (B, NH, T) = {}, got {}", op,
                shape_str({B, NH, T}), shape_str(lse.shape()));
  const std::vector<uint8_t> keep = key_mask_bytes(key_mask, B, T, op);
  if (half(gout) || half(q) || half(k) || half(v) || half(out) || half(lse)) {
    AttentionGrads g = attention_key_mask_backward(widen(gout), widen(q), widen(k), widen(v), widen(out),
                                                   widen(lse), key_mask, scale);
    g.gq = round_to(g.gq, q.dtype());
    g.gk = round_to(g.gk, k.dtype());
    g.gv = round_to(g.gv, v.dtype());
    return g;
  }
  Tensor gc = gout.contiguous(), qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous(),
         oc = out.contiguous(), lc = lse.contiguous();
  AttentionGrads g = AttentionGrads::empty(q.shape());  // each (B, NH, T, HS)
  if (is_ref())
    ref::attention_key_mask_backward<float>(B, NH, T, HS, gc.data<float>(), qc.data<float>(), kc.data<float>(),
                                            vc.data<float>(), oc.data<float>(), lc.data<float>(), keep.data(), scale,
                                            g.gq.data<float>(), g.gk.data<float>(), g.gv.data<float>());
  else
    attention_key_mask_backward_cpu(B, NH, T, HS, gc.data<float>(), qc.data<float>(), kc.data<float>(),
                                    vc.data<float>(), oc.data<float>(), lc.data<float>(), keep.data(), scale,
                                    g.gq.data<float>(), g.gk.data<float>(), g.gv.data<float>());
  return g;
}

// ------------------------------------------------------------------ patchify

Tensor patchify(const Tensor& x, int64_t p) {
  check_float_arg(x, "patchify", "x");
  const PatchDims d = patch_dims(x.shape(), p, "patchify");
  if (half(x)) return round_to(patchify(widen(x), p), x.dtype());
  Tensor xc = x.contiguous();
  Tensor y = Tensor::empty({d.N, d.P, d.F});  // (N, P, C*p*p)
  if (is_ref())
    ref::patchify<float>(d.N, d.C, d.H, d.W, p, xc.data<float>(), y.data<float>());
  else
    patch_copy_cpu<true>(d.N, d.C, d.H, d.W, p, xc.data<float>(), y.data<float>());
  return y;
}

Tensor patchify_backward(const Tensor& g, const Shape& x_shape, int64_t p) {
  check_float_arg(g, "patchify_backward", "g");
  const PatchDims d = patch_dims(x_shape, p, "patchify_backward");
  BRIGADE_CHECK(g.shape() == Shape({d.N, d.P, d.F}), ShapeError,
                "patchify_backward: g must be (N, P, C*p*p) = {} for x {}, got {}", shape_str({d.N, d.P, d.F}),
                shape_str(x_shape), shape_str(g.shape()));
  if (half(g)) return round_to(patchify_backward(widen(g), x_shape, p), g.dtype());
  Tensor gc = g.contiguous();
  Tensor gx = Tensor::empty(x_shape);  // (N, C, H, W)
  if (is_ref())
    ref::patchify_backward<float>(d.N, d.C, d.H, d.W, p, gc.data<float>(), gx.data<float>());
  else
    patch_copy_cpu<false>(d.N, d.C, d.H, d.W, p, gc.data<float>(), gx.data<float>());
  return gx;
}

}  // namespace brigade::ops
