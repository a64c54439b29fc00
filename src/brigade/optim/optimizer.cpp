// Optimizers; see optimizer.h.
#include "brigade/optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include "brigade/core/error.h"
#include "brigade/ops/ops.h"

namespace brigade::optim {

bool default_decay(const std::string&, const Tensor& p) { return p.dim() >= 2; }

void Optimizer::zero_grad() {
  for (auto& [n, p] : params_) {
    Tensor g = p.grad();
    if (g.defined()) g.zero_();
  }
}

void Optimizer::load_state(const std::map<std::string, Tensor>& tensors, int64_t steps) {
  for (auto& [name, dst] : state_tensors()) {
    auto it = tensors.find(name);
    BRIGADE_CHECK(it != tensors.end(), CheckpointError,
                  "optimizer state '{}' is missing from the checkpoint; it was saved with another optimizer "
                  "or model — start without --resume or use the matching recipe",
                  name);
    BRIGADE_CHECK(it->second.shape() == dst.shape(), CheckpointError,
                  "optimizer state '{}' has shape {} in the checkpoint but {} in this model", name,
                  shape_str(it->second.shape()), shape_str(dst.shape()));
    dst.copy_(it->second);
  }
  steps_ = steps;
}

static Tensor state_like(const Tensor& p) {
  Tensor t = Tensor::empty(p.shape(), DType::F32, MemTag::Optimizer);  // same shape as p
  t.zero_();
  return t;
}

// The state AdamW and LAMB share, per parameter: whether it gets weight decay (decay(name, p)) and
// its two moments m (exp_avg) and v (exp_avg_sq), zero f32 tensors of its shape.
static void init_moments(const NamedTensors& params,
                         const std::function<bool(const std::string&, const Tensor&)>& decay, std::vector<bool>& decays,
                         std::vector<Tensor>& m, std::vector<Tensor>& v) {
  for (auto& [n, p] : params) {
    decays.push_back(decay(n, p));
    m.push_back(state_like(p));
    v.push_back(state_like(p));
  }
}

// The moments under their checkpoint names "exp_avg.<param>" and "exp_avg_sq.<param>", in parameter order.
static NamedTensors moment_tensors(const NamedTensors& params, const std::vector<Tensor>& m,
                                   const std::vector<Tensor>& v) {
  NamedTensors out;
  for (size_t i = 0; i < params.size(); ++i) {
    out.emplace_back("exp_avg." + params[i].first, m[i]);
    out.emplace_back("exp_avg_sq." + params[i].first, v[i]);
  }
  return out;
}

AdamW::AdamW(NamedTensors params, AdamWOptions o, const std::function<bool(const std::string&, const Tensor&)>& decay)
    : Optimizer(std::move(params)), o_(o) {
  init_moments(params_, decay, decay_, m_, v_);
}

void AdamW::step(double lr) {
  ++steps_;
  // torch.optim.AdamW (single-tensor path), per element:
  //   p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
  //   p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
  const float b1 = float(o_.beta1), b2 = float(o_.beta2), eps = float(o_.eps);
  // 1 - beta in double, then rounded (as torch passes the Python float 1 - beta to its kernel);
  // 1.0f - float(beta) differs, e.g. by 2e-7 relative for beta = 0.95.
  const float omb1 = float(1.0 - o_.beta1), omb2 = float(1.0 - o_.beta2);
  const double bc1 = 1.0 - std::pow(o_.beta1, double(steps_));
  const double bc2 = 1.0 - std::pow(o_.beta2, double(steps_));
  const float step_size = float(lr / bc1);
  const float bc2_sqrt = float(std::sqrt(bc2));
  const float gs = float(grad_scale_);  // fused clipping (1 when off: an exact multiply)
  grad_scale_ = 1.0;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor p = params_[i].second;
    Tensor g = p.grad();
    if (!g.defined()) continue;
    const float decay = decay_[i] ? float(1.0 - lr * o_.weight_decay) : 1.0f;
    float* pp = p.data<float>();
    const float* gp = g.data<float>();
    float* mp = m_[i].data<float>();
    float* vp = v_[i].data<float>();
    const int64_t n = p.numel();
#pragma omp parallel for simd schedule(static) if (n > 16384)
    for (int64_t j = 0; j < n; ++j) {
      const float gj = gp[j] * gs;
      pp[j] *= decay;
      mp[j] = mp[j] * b1 + omb1 * gj;
      vp[j] = vp[j] * b2 + omb2 * gj * gj;
      const float denom = std::sqrt(vp[j]) / bc2_sqrt + eps;
      pp[j] -= step_size * (mp[j] / denom);
    }
  }
}

NamedTensors AdamW::state_tensors() const { return moment_tensors(params_, m_, v_); }

// ---------------------------------------------------------------- LAMB

LAMB::LAMB(NamedTensors params, LAMBOptions o, const std::function<bool(const std::string&, const Tensor&)>& decay)
    : Optimizer(std::move(params)), o_(o) {
  init_moments(params_, decay, decay_, m_, v_);
  num_global_ = int(params_.size());
  for (int i = 0; i < num_global_; ++i) global_.push_back(i);
  ratios_.assign(size_t(num_global_), 1.0);
}

void LAMB::set_norm_reduction(std::vector<int> global_index, int num_global, AllreduceSum allreduce_sum) {
  BRIGADE_CHECK(global_index.size() == params_.size(), ValueError,
                "LAMB::set_norm_reduction: {} global indices for {} optimizer parameters; pass one per parameter, "
                "in the optimizer's order",
                global_index.size(), params_.size());
  for (size_t i = 0; i < global_index.size(); ++i)
    BRIGADE_CHECK(global_index[i] >= 0 && global_index[i] < num_global, ValueError,
                  "LAMB::set_norm_reduction: parameter '{}' has global index {}, outside [0, {}); indices come from "
                  "the full parameter list",
                  params_[i].first, global_index[i], num_global);
  global_ = std::move(global_index);
  num_global_ = num_global;
  allreduce_ = std::move(allreduce_sum);
  ratios_.assign(size_t(num_global_), 1.0);
}

void LAMB::step(double lr) {
  ++steps_;
  // 1 - beta in double, then rounded (as torch's alpha=1-beta): 1.0f - 0.999f is 1.3e-5 off
  const float b1 = float(o_.beta1), b2 = float(o_.beta2), eps = float(o_.eps);
  const float c1 = float(1.0 - o_.beta1), c2 = float(1.0 - o_.beta2);
  const float bc1 = float(1.0 - std::pow(o_.beta1, double(steps_)));
  const float bc2 = float(1.0 - std::pow(o_.beta2, double(steps_)));
  // Pass 1: moments, and the partial sums ||w||^2, ||r||^2 per global parameter (in
  // blocks of kBlock added serially: the same bits for any thread count).
  constexpr int64_t kBlock = 4096;
  std::vector<double> sums(2 * size_t(num_global_), 0.0);
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor p = params_[i].second;
    Tensor g = p.grad();
    if (!g.defined()) continue;
    const float wd = decay_[i] ? float(o_.weight_decay) : 0.0f;
    const float* pp = p.data<float>();
    const float* gp = g.data<float>();
    float* mp = m_[i].data<float>();
    float* vp = v_[i].data<float>();
    const int64_t n = p.numel(), nb = (n + kBlock - 1) / kBlock;
    std::vector<double> wsq(static_cast<size_t>(nb)), rsq(static_cast<size_t>(nb));
#pragma omp parallel for schedule(static) if (n > 16384)
    for (int64_t b = 0; b < nb; ++b) {
      double ws = 0.0, rs = 0.0;
      for (int64_t j = b * kBlock, e = std::min(n, j + kBlock); j < e; ++j) {
        const float gj = gp[j];
        mp[j] = mp[j] * b1 + c1 * gj;
        vp[j] = vp[j] * b2 + c2 * gj * gj;
        const float r = (mp[j] / bc1) / (std::sqrt(vp[j] / bc2) + eps) + wd * pp[j];
        ws += double(pp[j]) * double(pp[j]);
        rs += double(r) * double(r);
      }
      wsq[size_t(b)] = ws;
      rsq[size_t(b)] = rs;
    }
    double& w_total = sums[2 * size_t(global_[i])];
    double& r_total = sums[2 * size_t(global_[i]) + 1];
    for (int64_t b = 0; b < nb; ++b) w_total += wsq[size_t(b)], r_total += rsq[size_t(b)];
  }
  if (allreduce_) allreduce_(sums.data(), int64_t(sums.size()));
  for (int k = 0; k < num_global_; ++k) {
    const double w = std::sqrt(sums[2 * size_t(k)]), r = std::sqrt(sums[2 * size_t(k) + 1]);
    ratios_[size_t(k)] = (w > 0.0 && r > 0.0) ? w / r : 1.0;
  }
  // Pass 2: w -= lr ratio r, with r recomputed from the updated moments (the same expression).
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor p = params_[i].second;
    if (!p.grad().defined()) continue;
    const float wd = decay_[i] ? float(o_.weight_decay) : 0.0f;
    const float scale = float(lr * ratios_[size_t(global_[i])]);
    float* pp = p.data<float>();
    const float* mp = m_[i].data<float>();
    const float* vp = v_[i].data<float>();
    const int64_t n = p.numel();
#pragma omp parallel for simd schedule(static) if (n > 16384)
    for (int64_t j = 0; j < n; ++j) {
      const float r = (mp[j] / bc1) / (std::sqrt(vp[j] / bc2) + eps) + wd * pp[j];
      pp[j] -= scale * r;
    }
  }
}

NamedTensors LAMB::state_tensors() const { return moment_tensors(params_, m_, v_); }

// ---------------------------------------------------------------- SGD

SGD::SGD(NamedTensors params, SGDOptions o) : Optimizer(std::move(params)), o_(o) {
  BRIGADE_CHECK(!o_.nesterov || o_.momentum > 0.0, ValueError,
                "SGD with Nesterov momentum needs momentum > 0 (got {}); set optim.momentum (e.g. 0.9) or turn "
                "optim.nesterov off",
                o_.momentum);
  for (auto& [n, p] : params_) buf_.push_back(o_.momentum != 0.0 ? state_like(p) : Tensor());
}

void SGD::step(double lr) {
  ++steps_;
  // torch.optim.SGD: d = g + wd p; b = mu b + d (b = d at the first step);
  // d = nesterov ? d + mu b : b; p -= lr d
  const float mu = float(o_.momentum), wd = float(o_.weight_decay), flr = float(lr);
  const bool first = steps_ == 1;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor p = params_[i].second;
    Tensor g = p.grad();
    if (!g.defined()) continue;
    float* pp = p.data<float>();
    const float* gp = g.data<float>();
    float* bp = buf_[i].defined() ? buf_[i].data<float>() : nullptr;
    const int64_t n = p.numel();
#pragma omp parallel for simd schedule(static) if (n > 16384)
    for (int64_t j = 0; j < n; ++j) {
      float d = gp[j] + wd * pp[j];
      if (bp) {
        bp[j] = first ? d : mu * bp[j] + d;
        d = o_.nesterov ? d + mu * bp[j] : bp[j];
      }
      pp[j] -= flr * d;
    }
  }
}

NamedTensors SGD::state_tensors() const {
  NamedTensors out;
  for (size_t i = 0; i < params_.size(); ++i)
    if (buf_[i].defined()) out.emplace_back("momentum_buffer." + params_[i].first, buf_[i]);
  return out;
}

double grad_norm(const NamedTensors& params) {
  double total = 0.0;
  for (auto& [n, p] : params) {
    Tensor g = p.grad();
    if (g.defined()) total += ops::sum_squares(g);
  }
  return std::sqrt(total);
}

double clip_coefficient(double norm, double max_norm) {
  return max_norm > 0.0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;  // torch's clip_coef
}

double clip_grad_norm(const NamedTensors& params, double max_norm) {
  const double norm = grad_norm(params);
  if (max_norm > 0.0 && norm > max_norm) {
    const double scale = clip_coefficient(norm, max_norm);
    for (auto& [n, p] : params) {
      Tensor g = p.grad();
      if (g.defined()) ops::mul_scalar_(g, scale);
    }
  }
  return norm;
}

void clip_grad_value(const NamedTensors& params, double clip_value) {
  if (!(clip_value > 0.0)) return;
  const float c = float(clip_value);
  for (auto& [n, p] : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    BRIGADE_CHECK(g.dtype() == DType::F32 && g.is_contiguous(), InternalError,
                  "clip_grad_value: gradient of '{}' is not contiguous f32", n);
    float* gp = g.data<float>();
    const int64_t m = g.numel();
#pragma omp parallel for simd schedule(static) if (m > 16384)
    for (int64_t j = 0; j < m; ++j) gp[j] = std::clamp(gp[j], -c, c);
  }
}

}  // namespace brigade::optim
