// The op front-ends' shared helpers (internal to src/brigade/ops/*.cpp; not installed API):
// argument checks with user-facing messages, backend dispatch, and the 16-bit routes of the
// dtype contract in ops.h. Each family's front-end (ops/<family>.cpp) uses these and no copies.
#pragma once
#include <algorithm>
#include <initializer_list>
#include <optional>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/ops/cpu/kernels.h"
#include "brigade/ops/ops.h"
#include "brigade/ops/ref/kernels.h"

// Call kernel `fn` of the active backend with the same arguments (f32 everywhere).
#define BRIGADE_DISPATCH(fn, ...)                                                           \
  (::brigade::ops::current_backend() == ::brigade::ops::Backend::Cpu ? cpu::fn(__VA_ARGS__) \
                                                                     : ref::fn<float>(__VA_ARGS__))

namespace brigade::ops::detail {

inline bool on_cpu() { return current_backend() == Backend::Cpu; }

// ---------------------------------------------------------------- argument checks

inline void check_defined(const Tensor& t, const char* op, const char* name) {
  BRIGADE_CHECK(t.defined(), ValueError,
                "{}: argument '{}' is an undefined tensor; pass a tensor created by a "
                "factory or another op",
                op, name);
}

inline void check_float(const Tensor& t, const char* op, const char* name) {
  check_defined(t, op, name);
  BRIGADE_CHECK(is_floating(t.dtype()), ShapeError,
                "{}: '{}' is {} but must be a floating tensor (f32, bf16 or f16); convert it with ops::cast", op, name,
                t.str());
}

inline void check_ids(const Tensor& t, const char* op, const char* name) {
  check_defined(t, op, name);
  BRIGADE_CHECK(t.dtype() == DType::I32 || t.dtype() == DType::I64, ShapeError,
                "{}: '{}' holds indices and must be i32 or i64, got {}", op, name, t.str());
}

inline void check_same_shape(const Tensor& a, const Tensor& b, const char* op, const char* an, const char* bn) {
  BRIGADE_CHECK(a.shape() == b.shape(), ShapeError, "{}: '{}' has shape {} but '{}' has shape {}; they must match", op,
                an, shape_str(a.shape()), bn, shape_str(b.shape()));
}

// (B, NH, T, HS) head tensors.
inline void check_heads(const Tensor& x, const char* op, const char* name) {
  BRIGADE_CHECK(x.dim() == 4, ShapeError, "{}: '{}' must be (B, NH, T, HS), got {}", op, name, shape_str(x.shape()));
}

// A writable destination must not alias itself (expanded views have stride 0).
inline void check_writable(const Tensor& t, const char* op) {
  for (int64_t i = 0; i < t.dim(); ++i)
    BRIGADE_CHECK(t.shape()[size_t(i)] <= 1 || t.strides()[size_t(i)] != 0, ValueError,
                  "{}: the destination {} is an expanded (stride 0) view and cannot be written in place; "
                  "write into a contiguous tensor (e.g. .clone()) instead",
                  op, t.str());
}

inline int64_t wrap_dim(int64_t d, int64_t nd, const char* op) {
  const int64_t r = d < 0 ? d + nd : d;
  BRIGADE_CHECK(r >= 0 && r < std::max<int64_t>(nd, 1), ShapeError,
                "{}: dimension {} is out of range for a tensor with {} dimensions (valid: [{}, {}])", op, d, nd,
                -std::max<int64_t>(nd, 1), std::max<int64_t>(nd, 1) - 1);
  return r;
}

// NCHW (or channels-last NHWC) activations, per-channel vectors and pooling windows.
inline void check_nchw(const Tensor& t, const char* op, const char* name) {
  check_float(t, op, name);
  BRIGADE_CHECK(t.dim() == 4, ShapeError, "{}: '{}' must be 4-D (N, C, H, W), got {}", op, name, shape_str(t.shape()));
}
inline void check_per_channel(const Tensor& t, int64_t C, const char* op, const char* name) {
  check_float(t, op, name);
  BRIGADE_CHECK(t.dim() == 1 && t.size(0) == C, ShapeError, "{}: '{}' must be ({}) (one value per channel), got {}", op,
                name, C, shape_str(t.shape()));
}
inline void check_window(int64_t k, int64_t s, int64_t p, const char* op) {
  BRIGADE_CHECK(k >= 1 && s >= 1 && p >= 0, ValueError, "{}: kernel {} and stride {} must be >= 1 and padding {} >= 0",
                op, k, s, p);
}

inline std::vector<int64_t> ids_vector(const Tensor& ids) { return ids.to_vector_i64(); }

// ---------------------------------------------------------------- broadcasting

// Strides that read `t` over the (broadcast) shape `out`: dims are right-aligned,
// missing leading dims and size-1 dims that broadcast get stride 0.
inline Shape broadcast_strides(const Tensor& t, const Shape& out) {
  Shape st(out.size(), 0);
  const size_t lead = out.size() - size_t(t.dim());
  for (size_t i = 0; i < size_t(t.dim()); ++i)
    st[lead + i] = (t.shape()[i] == 1 && out[lead + i] != 1) ? 0 : t.strides()[i];
  return st;
}

inline Shape broadcast_named(const Shape& a, const Shape& b, const char* op) {
  const size_t nd = std::max(a.size(), b.size());
  Shape out(nd);
  for (size_t i = 0; i < nd; ++i) {
    const int64_t da = i < nd - a.size() ? 1 : a[i - (nd - a.size())];
    const int64_t db = i < nd - b.size() ? 1 : b[i - (nd - b.size())];
    BRIGADE_CHECK(da == db || da == 1 || db == 1, ShapeError,
                  "{}: shapes {} and {} do not broadcast: dimension {} (from the right) is {} vs {}; sizes must "
                  "match or one of them must be 1",
                  op, shape_str(a), shape_str(b), int64_t(nd - i), da, db);
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// ---------------------------------------------------------------- the 16-bit routes (ops.h)

inline bool is_half(const Tensor& t) { return t.defined() && (t.dtype() == DType::BF16 || t.dtype() == DType::F16); }
// t widened exactly to f32 when it is 16-bit; f32 (or undefined) tensors as they are.
inline Tensor f32_of(const Tensor& t) { return is_half(t) ? cast(t, DType::F32) : t; }
// t rounded once to dt (undefined stays undefined).
inline Tensor round_to(const Tensor& t, DType dt) { return t.defined() && t.dtype() != dt ? cast(t, dt) : t; }
// Output dtype of an op of two floating operands: theirs when equal, else f32.
inline DType same_or_f32(const Tensor& a, const Tensor& b) { return a.dtype() == b.dtype() ? a.dtype() : DType::F32; }
// Some defined tensor of `ts` is not f32: the op runs its f32 path on f32_of copies.
inline bool any_not_f32(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->defined() && t->dtype() != DType::F32) return true;
  return false;
}
inline Tensor contig(const Tensor& t) { return t.defined() ? t.contiguous() : t; }
inline const float* fptr(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }
inline float* fptr_mut(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }
// f32 contents of a small side input (a layer-norm weight or bias: (C)).
inline Tensor f32_contiguous(const Tensor& t) { return t.dtype() == DType::F32 ? t.contiguous() : cast(t, DType::F32); }

// The output tensors of each op result type, in declaration order (for via_f32).
inline std::vector<Tensor*> outputs_of(Tensor& t) { return {&t}; }
inline std::vector<Tensor*> outputs_of(LinearGrads& g) { return {&g.gx, &g.gw, &g.gb}; }
inline std::vector<Tensor*> outputs_of(LayerNormOut& o) { return {&o.y, &o.mean, &o.rstd}; }
inline std::vector<Tensor*> outputs_of(LayerNormGrads& g) { return {&g.gx, &g.gw, &g.gb}; }
inline std::vector<Tensor*> outputs_of(AttentionOut& o) { return {&o.out, &o.lse}; }
inline std::vector<Tensor*> outputs_of(AttentionGrads& g) { return {&g.gq, &g.gk, &g.gv}; }
inline std::vector<Tensor*> outputs_of(CrossEntropyOut& o) { return {&o.loss, &o.lse}; }

// When any of `in` is bf16/f16: runs `op` (the calling op itself, which then takes its f32
// path) on the inputs widened exactly to f32 and rounds its outputs once to `out` (one dtype
// per output, in declaration order; undefined outputs stay undefined). Returns nullopt when
// every input is f32 or undefined, so the f32 path runs untouched.
template <class F, class... T>
auto via_f32(std::initializer_list<DType> out, F&& op, const T&... in) -> std::optional<decltype(op(in...))> {
  if (!(is_half(in) || ...)) return std::nullopt;
  auto r = op(f32_of(in)...);
  std::vector<Tensor*> outs = outputs_of(r);
  BRIGADE_ASSERT(outs.size() == out.size(), "via_f32: {} output dtypes for {} outputs", out.size(), outs.size());
  size_t k = 0;
  for (DType dt : out) {
    *outs[k] = round_to(*outs[k], dt);
    ++k;
  }
  return r;
}

// The native 16-bit cpu kernels take these tensors: cpu backend, the test hook on
// (cpu::native16_enabled), and all of them of one 16-bit dtype.
inline bool native16(std::initializer_list<const Tensor*> ts) {
  if (!on_cpu() || !cpu::native16_enabled()) return false;
  const DType dt = (*ts.begin())->dtype();
  if (dt != DType::BF16 && dt != DType::F16) return false;
  for (const Tensor* t : ts)
    if (t->dtype() != dt) return false;
  return true;
}
// A tensor as the native kernels read it: its own shape and strides, or (broadcast operands)
// the op's shape with the strides that read it over that shape.
inline cpu::Strided strided(const Tensor& t) {
  return {t.dtype(), t.raw_data(), int(t.dim()), t.shape().data(), t.strides().data()};
}
inline cpu::Strided strided(const Tensor& t, const Shape& shape, const Shape& st) {
  return {t.dtype(), t.raw_data(), int(shape.size()), shape.data(), st.data()};
}

// The bf16 GEMM fast path of the cpu backend applies to these operands (all one 16-bit dtype).
inline bool gemm16(std::initializer_list<const Tensor*> ops) {
  if (!on_cpu()) return false;
  const DType dt = (*ops.begin())->dtype();
  for (const Tensor* t : ops)
    if (t->dtype() != dt) return false;
  return (dt == DType::BF16 || dt == DType::F16) && cpu::gemm16_available(dt);
}

// plane(p) for each of the P (N * C) planes of HW input values of a per-plane op (pooling, the
// spatial mean): in parallel on the cpu backend above 2^15 input values (planes are
// independent: the thread count changes nothing).
template <class F>
void for_each_plane(int64_t P, int64_t HW, F plane) {
  const bool par = on_cpu() && P * HW > (1 << 15);
#pragma omp parallel for schedule(static) if (par)
  for (int64_t p = 0; p < P; ++p) plane(p);
}

// The f32 path of a per-plane op of one input and one output (pooling, the spatial mean): y
// (shape: N, C, ...) = plane(p, in's plane p, y's plane p) over the N C planes of in's contiguous
// values, through for_each_plane (HW: the values of an input image's plane).
template <class F>
Tensor map_planes(const Tensor& in, const Shape& shape, int64_t HW, F plane) {
  const Tensor ic = in.contiguous();
  Tensor y = Tensor::empty(shape);  // shape
  const int64_t P = shape[0] * shape[1], in_size = P ? in.numel() / P : 0, out_size = P ? y.numel() / P : 0;
  const float* ip = ic.data<float>();
  float* yp = y.data<float>();
  for_each_plane(P, HW, [&](int64_t p) { plane(p, ip + p * in_size, yp + p * out_size); });
  return y;
}

}  // namespace brigade::ops::detail
