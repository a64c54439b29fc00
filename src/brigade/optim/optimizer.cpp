// Optimizers; see optimizer.h.
#include "brigade/optim/optimizer.h"

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

AdamW::AdamW(NamedTensors params, AdamWOptions o, const std::function<bool(const std::string&, const Tensor&)>& decay)
    : Optimizer(std::move(params)), o_(o) {
  for (auto& [n, p] : params_) {
    decay_.push_back(decay(n, p));
    m_.push_back(state_like(p));
    v_.push_back(state_like(p));
  }
}

void AdamW::step(double lr) {
  ++steps_;
  // torch.optim.AdamW (single-tensor path), per element:
  //   p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
  //   p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
  const float b1 = float(o_.beta1), b2 = float(o_.beta2), eps = float(o_.eps);
  const double bc1 = 1.0 - std::pow(o_.beta1, double(steps_));
  const double bc2 = 1.0 - std::pow(o_.beta2, double(steps_));
  const float step_size = float(lr / bc1);
  const float bc2_sqrt = float(std::sqrt(bc2));
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
      const float gj = gp[j];
      pp[j] *= decay;
      mp[j] = mp[j] * b1 + (1.0f - b1) * gj;
      vp[j] = vp[j] * b2 + (1.0f - b2) * gj * gj;
      const float denom = std::sqrt(vp[j]) / bc2_sqrt + eps;
      pp[j] -= step_size * (mp[j] / denom);
    }
  }
}

NamedTensors AdamW::state_tensors() const {
  NamedTensors out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back("exp_avg." + params_[i].first, m_[i]);
    out.emplace_back("exp_avg_sq." + params_[i].first, v_[i]);
  }
  return out;
}

SGD::SGD(NamedTensors params, SGDOptions o) : Optimizer(std::move(params)), o_(o) {
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

double clip_grad_norm(const NamedTensors& params, double max_norm) {
  const double norm = grad_norm(params);
  if (max_norm > 0.0 && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);  // torch: clip_coef = max_norm / (total_norm + 1e-6)
    for (auto& [n, p] : params) {
      Tensor g = p.grad();
      if (g.defined()) ops::mul_scalar_(g, scale);
    }
  }
  return norm;
}

}  // namespace brigade::optim
