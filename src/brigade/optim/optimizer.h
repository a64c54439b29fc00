// Optimizers over named parameters: AdamW (Loshchilov & Hutter 2019, decoupled
// weight decay; torch.optim.AdamW numerics) and SGD with momentum (torch.optim.SGD).
// State tensors are allocated under MemTag::Optimizer and exported by name for
// checkpoints. Gradient clipping by global L2 norm (torch.nn.utils.clip_grad_norm_).
// Update loops run one pass per parameter with OpenMP; a flat-buffer fused
// version belongs to the CPU performance work.
#pragma once
#include <functional>
#include <map>
#include <string>

#include "brigade/nn/module.h"

namespace brigade::optim {

using nn::NamedTensors;

// Default decay rule: weight decay on matrices (dim >= 2: linear weights and
// embeddings), none on biases and norm weights (dim 1).
bool default_decay(const std::string& name, const Tensor& p);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual void step(double lr) = 0;  // uses p.grad(); parameters without grad are skipped
  void zero_grad();
  int64_t steps() const { return steps_; }
  // State for checkpoints: tensors named "<state>.<param name>", plus the step count.
  virtual NamedTensors state_tensors() const = 0;
  void load_state(const std::map<std::string, Tensor>& tensors, int64_t steps);
  void set_steps(int64_t steps) { steps_ = steps; }  // after filling state_tensors() directly
  const NamedTensors& params() const { return params_; }

 protected:
  explicit Optimizer(NamedTensors params) : params_(std::move(params)) {}
  NamedTensors params_;
  int64_t steps_ = 0;
};

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
};

class AdamW final : public Optimizer {
 public:
  // decay(name, p) selects the parameters that get weight decay.
  AdamW(NamedTensors params, AdamWOptions o,
        const std::function<bool(const std::string&, const Tensor&)>& decay = &default_decay);
  void step(double lr) override;
  NamedTensors state_tensors() const override;

 private:
  AdamWOptions o_;
  std::vector<bool> decay_;
  std::vector<Tensor> m_, v_;  // exp_avg, exp_avg_sq: same shapes as the parameters
};

struct SGDOptions {
  double momentum = 0.9, weight_decay = 0.0;
  bool nesterov = false;
};

class SGD final : public Optimizer {
 public:
  SGD(NamedTensors params, SGDOptions o);
  void step(double lr) override;
  NamedTensors state_tensors() const override;

 private:
  SGDOptions o_;
  std::vector<Tensor> buf_;  // momentum buffers (undefined until the first step)
};

// Scales all gradients so their global L2 norm is at most max_norm; returns the
// norm before clipping. Deterministic: sums per parameter in a fixed order.
double clip_grad_norm(const NamedTensors& params, double max_norm);
double grad_norm(const NamedTensors& params);

}  // namespace brigade::optim
