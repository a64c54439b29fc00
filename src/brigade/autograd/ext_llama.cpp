// Derivative rules of the LLaMA functions (see ext_llama.h). Same conventions as
// functions.cpp: backward returns fresh gradients in input order; nodes save only what
// their backward reads and drop it in release(). The autocast step is functions.cpp's:
// rules::policy_dtype, then a recorded fn::cast.
#include "brigade/autograd/ext_llama.h"

#include <memory>

#include "brigade/amp/policy.h"
#include "brigade/autograd/engine.h"
#include "brigade/autograd/rules.h"
#include "brigade/core/error.h"

namespace brigade::fn {

using autograd::needs_grad;
using autograd::Node;
using autograd::record;
using rules::policy_dtype;
using rules::wants;

namespace {

struct RMSNormBackward : Node {
  Tensor x, w, rstd;
  const char* name() const override { return "RMSNormBackward"; }
  // forward: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps)
  std::vector<Tensor> backward(const Tensor& g) override {
    ops::RMSNormGrads r = ops::rms_norm_backward(g, x, w, rstd);
    return {wants(*this, 0) ? r.gx : Tensor(), wants(*this, 1) ? r.gw : Tensor()};
  }
  void release() override { x = w = rstd = Tensor(); }
};

struct RopeBackward : Node {
  ops::RopeSpec spec;
  int64_t pos0 = 0;
  const char* name() const override { return "RopeBackward"; }
  // forward: y = rotate(x, +angle)  ->  gx = rotate(g, -angle)
  std::vector<Tensor> backward(const Tensor& g) override { return {ops::rope_backward(g, spec, pos0)}; }
};

struct RepeatKvBackward : Node {
  int64_t n_rep = 1;
  const char* name() const override { return "RepeatKvBackward"; }
  // forward: y[:, j] = x[:, j / n_rep]  ->  gx[:, kv] = sum_r g[:, kv * n_rep + r]
  std::vector<Tensor> backward(const Tensor& g) override { return {ops::repeat_kv_backward(g, n_rep)}; }
};

}  // namespace

Tensor rms_norm(const Tensor& x0, const Tensor& w0, double eps) {
  const DType dt = policy_dtype(amp::Op::LayerNorm, {&x0, &w0});
  const Tensor x = fn::cast(x0, dt), w = fn::cast(w0, dt);
  ops::RMSNormOut r = ops::rms_norm(x, w, eps);
  auto n = std::make_shared<RMSNormBackward>();
  if (needs_grad({x, w})) {
    n->x = x;
    n->w = w;
    n->rstd = r.rstd;
  }
  return record(r.y, n, {x, w});
}

Tensor rope(const Tensor& x0, const ops::RopeSpec& spec, int64_t pos0) {
  const Tensor x = fn::cast(x0, policy_dtype(amp::Op::Elementwise, {&x0}));
  auto n = std::make_shared<RopeBackward>();
  n->spec = spec;
  n->pos0 = pos0;
  return record(ops::rope(x, spec, pos0), n, {x});
}

Tensor rope(const Tensor& x, double theta, int64_t pos0) { return fn::rope(x, ops::RopeSpec{.theta = theta}, pos0); }

// forward: y = x * sigmoid(x); the node keeps x
Tensor silu(const Tensor& x0) {
  const Tensor x = fn::cast(x0, policy_dtype(amp::Op::Gelu, {&x0}));
  return rules::record_saving<ops::silu_backward>("SiluBackward", ops::silu(x), x, x);
}

Tensor repeat_kv(const Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  auto n = std::make_shared<RepeatKvBackward>();
  n->n_rep = n_rep;
  return record(ops::repeat_kv(x, n_rep), n, {x});
}

Tensor grouped_query_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  BRIGADE_CHECK(q.defined() && k.defined() && v.defined() && q.dim() == 4 && k.dim() == 4, ShapeError,
                "grouped_query_attention: q must be (B, NH, T, HS) and k, v (B, NKV, T, HS), got q {}, k {}",
                q.defined() ? shape_str(q.shape()) : "undefined", k.defined() ? shape_str(k.shape()) : "undefined");
  BRIGADE_CHECK(v.shape() == k.shape(), ShapeError, "grouped_query_attention: v {} must have k's shape {}",
                shape_str(v.shape()), shape_str(k.shape()));
  const int64_t NH = q.size(1), NKV = k.size(1);
  BRIGADE_CHECK(NKV > 0 && NH % NKV == 0, ShapeError,
                "grouped_query_attention: the {} kv heads of k {} must divide the {} query heads of q {}", NKV,
                shape_str(k.shape()), NH, shape_str(q.shape()));
  BRIGADE_CHECK(k.size(0) == q.size(0) && k.size(2) == q.size(2) && k.size(3) == q.size(3), ShapeError,
                "grouped_query_attention: k {} must match q {} in B, T and HS", shape_str(k.shape()),
                shape_str(q.shape()));
  const int64_t n_rep = NH / NKV;
  return attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), causal);  // (B, NH, T, HS)
}

}  // namespace brigade::fn
