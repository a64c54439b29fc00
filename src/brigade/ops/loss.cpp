// Cross-entropy front-ends (ops/loss.h).
#include "brigade/ops/loss.h"

#include "brigade/ops/detail.h"

namespace brigade::ops {

using namespace detail;

// ---------------------------------------------------------------- cross-entropy

namespace {
std::vector<int64_t> checked_targets(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                     const char* op) {
  check_float(logits, op, "logits");
  check_ids(targets, op, "targets");
  BRIGADE_CHECK(logits.dim() == 2, ShapeError, "{}: logits must be (N, V), got {}; flatten (B, T, V) to (B*T, V)", op,
                shape_str(logits.shape()));
  BRIGADE_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0), ShapeError,
                "{}: targets must be (N) = ({}) to match logits {}, got {}", op, logits.size(0),
                shape_str(logits.shape()), shape_str(targets.shape()));
  const int64_t V = logits.size(1);
  std::vector<int64_t> t = ids_vector(targets);
  for (size_t i = 0; i < t.size(); ++i)
    BRIGADE_CHECK(t[i] == ignore_index || (t[i] >= 0 && t[i] < V), ValueError,
                  "{}: target {} at row {} is outside [0, V) with V = {} and is not ignore_index ({})", op, t[i], i, V,
                  ignore_index);
  return t;
}
}  // namespace

CrossEntropyOut cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  const std::vector<int64_t> t = checked_targets(logits, targets, ignore_index, "cross_entropy");
  if (native16({&logits})) {
    const int64_t N = logits.size(0), V = logits.size(1);
    CrossEntropyOut o;
    o.loss = Tensor::empty({});  // ()
    o.lse = Tensor::empty({N});  // (N)
    cpu::cross_entropy16(N, V, strided(logits), t.data(), ignore_index, o.loss.data<float>(), o.lse.data<float>());
    return o;
  }
  if (auto r = via_f32(
          {DType::F32, DType::F32}, [&](const Tensor& l_) { return cross_entropy(l_, targets, ignore_index); }, logits))
    return *r;
  const int64_t N = logits.size(0), V = logits.size(1);
  Tensor lc = logits.contiguous();
  CrossEntropyOut o;
  o.loss = Tensor::empty({});  // ()
  o.lse = Tensor::empty({N});  // (N)
  BRIGADE_DISPATCH(cross_entropy, N, V, lc.data<float>(), t.data(), ignore_index, o.loss.data<float>(),
                   o.lse.data<float>());
  return o;
}

namespace {
// The gradient into a new tensor, or, with in_place (the cpu backend, contiguous f32 or
// native 16-bit logits), over the logits: each row is read before it is written (the cpu
// kernels work per element, or on a row widened into a buffer).
Tensor cross_entropy_backward_impl(double gloss, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                   int64_t ignore_index, bool in_place) {
  const std::vector<int64_t> t = checked_targets(logits, targets, ignore_index, "cross_entropy_backward");
  const int64_t N = logits.size(0), V = logits.size(1);
  check_float(lse, "cross_entropy_backward", "lse");
  BRIGADE_CHECK(lse.shape() == Shape({N}), ShapeError, "cross_entropy_backward: lse must be ({}), got {}", N,
                shape_str(lse.shape()));
  if (native16({&logits}) && lse.dtype() == DType::F32) {
    const Tensor sc = lse.contiguous();
    Tensor g = in_place ? logits : Tensor::empty({N, V}, logits.dtype());  // (N, V)
    cpu::cross_entropy_backward16(N, V, gloss, strided(logits), t.data(), sc.data<float>(), ignore_index,
                                  logits.dtype(), g.raw_data());
    return g;
  }
  if (auto r = via_f32(
          {logits.dtype()},
          [&](const Tensor& l_, const Tensor& s_) {
            return cross_entropy_backward(gloss, l_, targets, s_, ignore_index);
          },
          logits, lse))
    return *r;
  Tensor lc = logits.contiguous(), sc = lse.contiguous();
  Tensor g = in_place ? logits : Tensor::empty({N, V});  // (N, V)
  BRIGADE_DISPATCH(cross_entropy_backward, N, V, gloss, lc.data<float>(), t.data(), sc.data<float>(), ignore_index,
                   g.data<float>());
  return g;
}
}  // namespace

Tensor cross_entropy_backward(double gloss, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              int64_t ignore_index) {
  return cross_entropy_backward_impl(gloss, logits, targets, lse, ignore_index, false);
}

Tensor cross_entropy_backward_(double gloss, Tensor logits, const Tensor& targets, const Tensor& lse,
                               int64_t ignore_index) {
  const bool in_place = on_cpu() && logits.defined() && logits.dim() == 2 && logits.is_contiguous() &&
                        logits.sole_owner() && lse.dtype() == DType::F32 &&
                        (logits.dtype() == DType::F32 || native16({&logits}));
  return cross_entropy_backward_impl(gloss, logits, targets, lse, ignore_index, in_place);
}

// ---------------------------------------------------------------- cross-entropy with label smoothing

namespace {

std::vector<int64_t> smoothed_targets(const Tensor& logits, const Tensor& targets, double eps, int64_t ignore_index,
                                      const char* op) {
  BRIGADE_CHECK(eps >= 0 && eps <= 1, ValueError, "{}: label smoothing {} must be in [0, 1]", op, eps);
  return checked_targets(logits, targets, ignore_index, op);
}

}  // namespace

CrossEntropyOut cross_entropy_smoothed(const Tensor& logits, const Tensor& targets, double eps, int64_t ignore_index) {
  const char* op = "cross_entropy_smoothed";
  const std::vector<int64_t> t = smoothed_targets(logits, targets, eps, ignore_index, op);
  if (is_half(logits)) return cross_entropy_smoothed(f32_of(logits), targets, eps, ignore_index);
  const int64_t N = logits.size(0), V = logits.size(1);
  const Tensor lc = logits.contiguous();
  CrossEntropyOut o;
  o.loss = Tensor::empty({});  // ()
  o.lse = Tensor::empty({N});  // (N)
  const float* xp = lc.data<float>();
  float* lp = o.lse.data<float>();
  if (!on_cpu()) {
    ref::cross_entropy_smoothed<float>(N, V, xp, t.data(), eps, ignore_index, o.loss.data<float>(), lp);
    return o;
  }
  // Rows in parallel: max, then sum exp(x - max) and sum x in float lanes (omp simd), each row's
  // smoothed term in double; the rows' terms summed serially in row order.
  std::vector<double> row(static_cast<size_t>(N));
#pragma omp parallel for schedule(static) if (N * V > (1 << 14))
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = xp + n * V;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < V; ++j) m = std::max(m, xr[j]);
    float se = 0.f, sx = 0.f;
#pragma omp simd reduction(+ : se, sx)
    for (int64_t j = 0; j < V; ++j) {
      se += std::exp(xr[j] - m);
      sx += xr[j];
    }
    const double l = double(m) + std::log(double(se));
    lp[n] = float(l);
    if (t[size_t(n)] != ignore_index)
      row[size_t(n)] = (1 - eps) * (l - double(xr[t[size_t(n)]])) + eps * (l - double(sx) / double(V));
  }
  double total = 0;
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (t[size_t(n)] == ignore_index) continue;
    total += row[size_t(n)];
    ++count;
  }
  o.loss.data<float>()[0] = count ? float(total / double(count)) : std::numeric_limits<float>::quiet_NaN();
  return o;
}

Tensor cross_entropy_smoothed_backward(double gloss, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                       double eps, int64_t ignore_index) {
  const char* op = "cross_entropy_smoothed_backward";
  const std::vector<int64_t> t = smoothed_targets(logits, targets, eps, ignore_index, op);
  const int64_t N = logits.size(0), V = logits.size(1);
  check_float(lse, op, "lse");
  BRIGADE_CHECK(lse.shape() == Shape({N}), ShapeError, "{}: lse must be ({}), got {}", op, N, shape_str(lse.shape()));
  if (is_half(logits) || is_half(lse))
    return round_to(cross_entropy_smoothed_backward(gloss, f32_of(logits), targets, f32_of(lse), eps, ignore_index),
                    logits.dtype());
  const Tensor lc = logits.contiguous(), sc = lse.contiguous();
  Tensor g = Tensor::empty({N, V});  // (N, V)
  const float *xp = lc.data<float>(), *sp = sc.data<float>();
  float* gp = g.data<float>();
  if (!on_cpu()) {
    ref::cross_entropy_smoothed_backward<float>(N, V, gloss, xp, t.data(), sp, eps, ignore_index, gp);
    return g;
  }
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) count += t[size_t(n)] != ignore_index;
    // forward: row loss = (1 - eps)(lse - x[t]) + eps (lse - mean_v x[v])
    //   -> d/dx[v] = softmax[v] - (1 - eps) [v == t] - eps / V, times gloss / count
#pragma omp parallel for schedule(static) if (N * V > (1 << 14))
  for (int64_t n = 0; n < N; ++n) {
    float* gr = gp + n * V;
    const int64_t tn = t[size_t(n)];
    if (tn == ignore_index || count == 0) {
      std::fill(gr, gr + V, 0.f);
      continue;
    }
    const float* xr = xp + n * V;
    const float gs = float(gloss / double(count)), l = sp[n], off = float(eps / double(V));
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) gr[j] = gs * (std::exp(xr[j] - l) - off);
    gr[tn] -= gs * float(1 - eps);
  }
  return g;
}

}  // namespace brigade::ops
