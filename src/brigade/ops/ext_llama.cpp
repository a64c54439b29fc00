// LLaMA ops (see ext_llama.h): the front-end (argument checks, output allocation, the
// widened 16-bit path, backend dispatch) and the optimised cpu kernels. The ref kernels are
// the templates in ext_llama.h. The cpu kernels are plain OpenMP loops with static
// schedules over rows (RMSNorm row sums use `omp simd` reductions, a fixed split; the
// column sums of gw run one column per iteration over all rows in order), so every result
// is independent of the thread count; none of them uses the approximate exp of
// cpu/vec_math.h (SiLU calls std::exp, so cpu and ref agree to a few ulp).
#include "brigade/ops/ext_llama.h"

#include <omp.h>

#include <initializer_list>
#include <optional>

#include "brigade/core/error.h"
#include "brigade/ops/ops.h"

namespace brigade::ops {

namespace {

constexpr int64_t kParallelMin = 1 << 14;  // elements below which the cpu kernels stay serial

// ---------------------------------------------------------------- cpu kernels (f32)

void cpu_rms_norm(int64_t N, int64_t C, const float* x, const float* w, double eps, float* y, float* rstd) {
  const float epsf = float(eps);
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
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

void cpu_rms_norm_backward(int64_t N, int64_t C, const float* gy, const float* x, const float* w, const float* rstd,
                           float* gx, float* gw) {
  const bool par = N * C >= kParallelMin;
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

void cpu_rope(int64_t BH, int64_t T, int64_t HS, const RopeSpec& spec, int64_t pos0, double sign, const float* x,
              float* y) {
  const int64_t h = HS / 2;
  std::vector<float> ct(size_t(T * h)), st(size_t(T * h));
  ref::llama::rope_table<float>(T, HS, spec, pos0, ct.data(), st.data());
  const float sg = float(sign);
#pragma omp parallel for schedule(static) if (BH * T * HS >= kParallelMin)
  for (int64_t r = 0; r < BH * T; ++r) {
    const int64_t t = r % T;
    const float* xr = x + r * HS;
    float* yr = y + r * HS;
    const float* c = ct.data() + t * h;
    const float* s = st.data() + t * h;
#pragma omp simd
    for (int64_t i = 0; i < h; ++i) {
      const float si = sg * s[i], x1 = xr[i], x2 = xr[i + h];
      yr[i] = x1 * c[i] - x2 * si;
      yr[i + h] = x2 * c[i] + x1 * si;
    }
  }
}

void cpu_silu(int64_t n, const float* x, float* y) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + std::exp(-x[i]));
}

void cpu_silu_backward(int64_t n, const float* gy, const float* x, float* gx) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + std::exp(-x[i]));
    gx[i] = gy[i] * s * (1.0f + x[i] * (1.0f - s));
  }
}

void cpu_repeat_kv_backward(int64_t B, int64_t NKV, int64_t n_rep, int64_t THS, const float* gy, float* gx) {
#pragma omp parallel for schedule(static) if (B * NKV * n_rep * THS >= kParallelMin)
  for (int64_t bk = 0; bk < B * NKV; ++bk) {
    float* dst = gx + bk * THS;
    for (int64_t e = 0; e < THS; ++e) dst[e] = 0.f;
    for (int64_t r = 0; r < n_rep; ++r) {
      const float* src = gy + (bk * n_rep + r) * THS;
#pragma omp simd
      for (int64_t e = 0; e < THS; ++e) dst[e] += src[e];
    }
  }
}

// ---------------------------------------------------------------- front-end helpers

bool cpu_backend() { return current_backend() == Backend::Cpu; }

void check_float(const Tensor& t, const char* op, const char* name) {
  BRIGADE_CHECK(t.defined(), ValueError, "{}: argument '{}' is an undefined tensor; pass a tensor created by a "
                "factory or another op", op, name);
  BRIGADE_CHECK(is_floating(t.dtype()), ShapeError,
                "{}: '{}' is {} but must be a floating tensor (f32, bf16 or f16); convert it with ops::cast", op,
                name, t.str());
}

void check_same_shape(const Tensor& a, const Tensor& b, const char* op, const char* an, const char* bn) {
  BRIGADE_CHECK(a.shape() == b.shape(), ShapeError, "{}: '{}' has shape {} but '{}' has shape {}; they must match",
                op, an, shape_str(a.shape()), bn, shape_str(b.shape()));
}

// The widened path of the contract (ops.h): true when the op must run on f32 copies because
// one of `ts` is 16-bit, or because they mix dtypes.
bool needs_widening(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->dtype() != DType::F32) return true;
  return false;
}
Tensor f32(const Tensor& t) { return t.dtype() == DType::F32 ? t : cast(t, DType::F32); }
Tensor rounded(const Tensor& t, DType dt) { return t.dtype() == dt ? t : cast(t, dt); }

void check_heads(const Tensor& x, const char* op, const char* name) {
  BRIGADE_CHECK(x.dim() == 4, ShapeError, "{}: '{}' must be (B, NH, T, HS), got {}", op, name, shape_str(x.shape()));
}

}  // namespace

// ---------------------------------------------------------------- RMSNorm

RMSNormOut rms_norm(const Tensor& x, const Tensor& w, double eps) {
  check_float(x, "rms_norm", "x");
  check_float(w, "rms_norm", "w");
  BRIGADE_CHECK(x.dim() >= 1, ShapeError, "rms_norm: x must have at least 1 dim, got a 0-d tensor");
  const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
  BRIGADE_CHECK(w.dim() == 1 && w.size(0) == C, ShapeError, "rms_norm: w must be ({}) to match x {}, got {}", C,
                shape_str(x.shape()), shape_str(w.shape()));
  BRIGADE_CHECK(eps >= 0.0, ValueError, "rms_norm: eps must be >= 0, got {}", eps);
  if (needs_widening({&x, &w})) {
    RMSNormOut o = rms_norm(f32(x), f32(w), eps);
    o.y = rounded(o.y, x.dtype());
    return o;
  }
  const Tensor xc = x.contiguous(), wc = w.contiguous();
  RMSNormOut o;
  o.y = Tensor::empty(x.shape());  // (..., C)
  o.rstd = Tensor::empty({N});     // (N)
  if (cpu_backend())
    cpu_rms_norm(N, C, xc.data<float>(), wc.data<float>(), eps, o.y.data<float>(), o.rstd.data<float>());
  else
    ref::llama::rms_norm<float>(N, C, xc.data<float>(), wc.data<float>(), eps, o.y.data<float>(), o.rstd.data<float>());
  return o;
}

RMSNormGrads rms_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& w, const Tensor& rstd) {
  check_float(gy, "rms_norm_backward", "gy");
  check_float(x, "rms_norm_backward", "x");
  check_float(w, "rms_norm_backward", "w");
  check_float(rstd, "rms_norm_backward", "rstd");
  check_same_shape(gy, x, "rms_norm_backward", "gy", "x");
  BRIGADE_CHECK(x.dim() >= 1, ShapeError, "rms_norm_backward: x must have at least 1 dim");
  const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
  BRIGADE_CHECK(w.dim() == 1 && w.size(0) == C, ShapeError, "rms_norm_backward: w must be ({}), got {}", C,
                shape_str(w.shape()));
  BRIGADE_CHECK(rstd.dim() == 1 && rstd.size(0) == N, ShapeError,
                "rms_norm_backward: rstd must be ({}) (one per row of x {}), got {}", N, shape_str(x.shape()),
                shape_str(rstd.shape()));
  if (needs_widening({&gy, &x, &w, &rstd})) {
    RMSNormGrads g = rms_norm_backward(f32(gy), f32(x), f32(w), f32(rstd));
    g.gx = rounded(g.gx, x.dtype());
    g.gw = rounded(g.gw, w.dtype());
    return g;
  }
  const Tensor gc = gy.contiguous(), xc = x.contiguous(), wc = w.contiguous(), rc = rstd.contiguous();
  RMSNormGrads g;
  g.gx = Tensor::empty(x.shape());  // (..., C)
  g.gw = Tensor::empty({C});        // (C)
  if (cpu_backend())
    cpu_rms_norm_backward(N, C, gc.data<float>(), xc.data<float>(), wc.data<float>(), rc.data<float>(),
                          g.gx.data<float>(), g.gw.data<float>());
  else
    ref::llama::rms_norm_backward<float>(N, C, gc.data<float>(), xc.data<float>(), wc.data<float>(), rc.data<float>(),
                                  g.gx.data<float>(), g.gw.data<float>());
  return g;
}

// ---------------------------------------------------------------- RoPE

const char* rope_scaling_name(RopeScaling s) {
  switch (s) {
    case RopeScaling::None: return "none";
    case RopeScaling::Linear: return "linear";
    case RopeScaling::Llama3: return "llama3";
  }
  return "?";
}

void check_rope_spec(const RopeSpec& r, const char* op) {
  BRIGADE_CHECK(r.theta > 0.0, ValueError, "{}: theta must be > 0, got {}", op, r.theta);
  if (r.scaling == RopeScaling::None) return;
  const char* name = rope_scaling_name(r.scaling);
  BRIGADE_CHECK(r.factor > 0.0 && std::isfinite(r.factor), ValueError,
                "{}: the {} RoPE scaling's factor must be > 0, got {}", op, name, r.factor);
  if (r.scaling != RopeScaling::Llama3) return;
  BRIGADE_CHECK(r.low_freq_factor > 0.0 && r.high_freq_factor > r.low_freq_factor &&
                    std::isfinite(r.high_freq_factor),
                ValueError,
                "{}: the llama3 RoPE scaling needs 0 < low_freq_factor < high_freq_factor, got {} and {}", op,
                r.low_freq_factor, r.high_freq_factor);
  BRIGADE_CHECK(r.original_max_positions > 0.0 && std::isfinite(r.original_max_positions), ValueError,
                "{}: the llama3 RoPE scaling's original_max_positions must be > 0, got {}", op,
                r.original_max_positions);
}

namespace {
Tensor rope_impl(const Tensor& x, const RopeSpec& spec, int64_t pos0, double sign, const char* op) {
  check_float(x, op, "x");
  check_heads(x, op, "x");
  const int64_t B = x.size(0), NH = x.size(1), T = x.size(2), HS = x.size(3);
  BRIGADE_CHECK(HS % 2 == 0, ShapeError, "{}: the head size HS = {} of x {} must be even (RoPE rotates pairs)", op,
                HS, shape_str(x.shape()));
  check_rope_spec(spec, op);
  BRIGADE_CHECK(pos0 >= 0, ValueError, "{}: the first position pos0 must be >= 0, got {}", op, pos0);
  if (needs_widening({&x})) return rounded(rope_impl(f32(x), spec, pos0, sign, op), x.dtype());
  const Tensor xc = x.contiguous();
  Tensor y = Tensor::empty({B, NH, T, HS});  // (B, NH, T, HS)
  if (cpu_backend())
    cpu_rope(B * NH, T, HS, spec, pos0, sign, xc.data<float>(), y.data<float>());
  else
    ref::llama::rope<float>(B * NH, T, HS, spec, pos0, sign, xc.data<float>(), y.data<float>());
  return y;
}
}  // namespace

Tensor rope(const Tensor& x, const RopeSpec& spec, int64_t pos0) { return rope_impl(x, spec, pos0, 1.0, "rope"); }
Tensor rope_backward(const Tensor& gy, const RopeSpec& spec, int64_t pos0) {
  return rope_impl(gy, spec, pos0, -1.0, "rope_backward");
}
Tensor rope(const Tensor& x, double theta, int64_t pos0) { return rope(x, RopeSpec{.theta = theta}, pos0); }
Tensor rope_backward(const Tensor& gy, double theta, int64_t pos0) {
  return rope_backward(gy, RopeSpec{.theta = theta}, pos0);
}

// ---------------------------------------------------------------- SiLU

Tensor silu(const Tensor& x) {
  check_float(x, "silu", "x");
  if (needs_widening({&x})) return rounded(silu(f32(x)), x.dtype());
  const Tensor xc = x.contiguous();
  Tensor y = Tensor::empty(x.shape());  // same as x
  if (cpu_backend())
    cpu_silu(x.numel(), xc.data<float>(), y.data<float>());
  else
    ref::llama::silu<float>(x.numel(), xc.data<float>(), y.data<float>());
  return y;
}

Tensor silu_backward(const Tensor& gy, const Tensor& x) {
  check_float(gy, "silu_backward", "gy");
  check_float(x, "silu_backward", "x");
  check_same_shape(gy, x, "silu_backward", "gy", "x");
  if (needs_widening({&gy, &x})) return rounded(silu_backward(f32(gy), f32(x)), x.dtype());
  const Tensor gc = gy.contiguous(), xc = x.contiguous();
  Tensor gx = Tensor::empty(x.shape());  // same as x
  if (cpu_backend())
    cpu_silu_backward(x.numel(), gc.data<float>(), xc.data<float>(), gx.data<float>());
  else
    ref::llama::silu_backward<float>(x.numel(), gc.data<float>(), xc.data<float>(), gx.data<float>());
  return gx;
}

// ---------------------------------------------------------------- repeat_kv (GQA)

Tensor repeat_kv(const Tensor& x, int64_t n_rep) {
  check_float(x, "repeat_kv", "x");
  check_heads(x, "repeat_kv", "x");
  BRIGADE_CHECK(n_rep >= 1, ValueError, "repeat_kv: n_rep must be >= 1, got {}", n_rep);
  const int64_t B = x.size(0), NKV = x.size(1), T = x.size(2), HS = x.size(3);
  // A bit copy of each kv head into its n_rep query heads (any dtype, both backends).
  return x.unsqueeze(2).expand({B, NKV, n_rep, T, HS}).contiguous().view({B, NKV * n_rep, T, HS});  // (B, NH, T, HS)
}

Tensor repeat_kv_backward(const Tensor& gy, int64_t n_rep) {
  check_float(gy, "repeat_kv_backward", "gy");
  check_heads(gy, "repeat_kv_backward", "gy");
  BRIGADE_CHECK(n_rep >= 1 && gy.size(1) % n_rep == 0, ShapeError,
                "repeat_kv_backward: the head count {} of gy {} is not a multiple of n_rep = {}", gy.size(1),
                shape_str(gy.shape()), n_rep);
  if (needs_widening({&gy})) return rounded(repeat_kv_backward(f32(gy), n_rep), gy.dtype());
  const int64_t B = gy.size(0), NKV = gy.size(1) / n_rep, T = gy.size(2), HS = gy.size(3);
  const Tensor gc = gy.contiguous();
  Tensor gx = Tensor::empty({B, NKV, T, HS});  // (B, NKV, T, HS)
  if (cpu_backend())
    cpu_repeat_kv_backward(B, NKV, n_rep, T * HS, gc.data<float>(), gx.data<float>());
  else
    ref::llama::repeat_kv_backward<float>(B, NKV, n_rep, T * HS, gc.data<float>(), gx.data<float>());
  return gx;
}

}  // namespace brigade::ops
