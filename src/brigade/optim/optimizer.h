// Optimizers over named parameters: AdamW (Loshchilov & Hutter 2019, decoupled
// weight decay; torch.optim.AdamW numerics), LAMB (You et al. 2019, layer-wise
// trust ratio) and SGD with momentum / Nesterov momentum (torch.optim.SGD).
// State tensors are allocated under MemTag::Optimizer and exported by name for
// checkpoints. Gradient clipping by global L2 norm (torch.nn.utils.clip_grad_norm_)
// and by value (torch.nn.utils.clip_grad_value_). docs/optimizers.md says when to
// use which.
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
  // Gradient clipping fused into the update: an optimizer that says fuses_grad_scale() reads
  // every gradient times set_grad_scale()'s factor in its next step() (the gradients
  // themselves are left as they are), bitwise as if they had been scaled in place first
  // (ops::mul_scalar_: a float multiply), and saves that extra pass over them. The factor
  // resets to 1 after the step. The others: the caller scales the gradients itself.
  virtual bool fuses_grad_scale() const { return false; }
  void set_grad_scale(double s) { grad_scale_ = s; }

 protected:
  explicit Optimizer(NamedTensors params) : params_(std::move(params)) {}
  NamedTensors params_;
  int64_t steps_ = 0;
  double grad_scale_ = 1.0;
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
  bool fuses_grad_scale() const override { return true; }

 private:
  AdamWOptions o_;
  std::vector<bool> decay_;
  std::vector<Tensor> m_, v_;  // exp_avg, exp_avg_sq: same shapes as the parameters
};

struct LAMBOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-6, weight_decay = 0.01;
};

// LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning", Algorithm 2,
// with Adam's bias correction as commonly implemented). Per parameter, in fp32:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   r = (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd w      (wd only where decay(name, p))
//   ratio = ||w|| / ||r||, or 1 when either norm is 0;   w -= lr ratio r
// Every parameter (biases and norm weights too) gets its own trust ratio. The norms
// are summed in double in fixed blocks, so the result does not depend on the thread
// count. State: "exp_avg.<name>", "exp_avg_sq.<name>" (as AdamW).
//
// Sharded parameters (ZeRO >= 1). The trust ratio needs the norms of the WHOLE
// parameter, but under ZeRO the optimizer holds 1-D views of this rank's shard, and
// a parameter may be split across ranks. set_norm_reduction() makes the norms
// global: optimizer parameter i is (part of) global parameter global_index[i] in
// [0, num_global); each step fills a vector of 2 x num_global partial sums
// (||w||^2, ||r||^2 of each global parameter, zero where this rank holds none of it),
// calls allreduce_sum(data, 2 x num_global) once (every rank must call step() so
// the collective matches), and takes the ratios from the summed norms. Without it
// (one process, or ZeRO 0 where every rank holds whole parameters) each optimizer
// parameter is its own global parameter and nothing is communicated. Two shards of
// one parameter on different ranks then update exactly as the whole parameter would
// (up to the order of the norm sums).
class LAMB final : public Optimizer {
 public:
  using AllreduceSum = std::function<void(double* data, int64_t n)>;
  LAMB(NamedTensors params, LAMBOptions o,
       const std::function<bool(const std::string&, const Tensor&)>& decay = &default_decay);
  void step(double lr) override;
  NamedTensors state_tensors() const override;
  // See above. ValueError when global_index has the wrong size or an index out of range.
  void set_norm_reduction(std::vector<int> global_index, int num_global, AllreduceSum allreduce_sum);
  // Trust ratio of each global parameter at the last step (1 before the first step).
  const std::vector<double>& trust_ratios() const { return ratios_; }

 private:
  LAMBOptions o_;
  std::vector<bool> decay_;
  std::vector<Tensor> m_, v_;  // exp_avg, exp_avg_sq: same shapes as the parameters
  std::vector<int> global_;    // global parameter of each optimizer parameter
  int num_global_ = 0;
  AllreduceSum allreduce_;
  std::vector<double> ratios_;  // (num_global)
};

struct SGDOptions {
  double momentum = 0.9, weight_decay = 0.0;
  bool nesterov = false;  // needs momentum > 0 (ValueError otherwise), as torch
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
// torch's clip_coef: max_norm / (norm + 1e-6) when max_norm > 0 and norm > max_norm, else 1.
double clip_coefficient(double norm, double max_norm);
// Clamps every gradient element to [-clip_value, clip_value] (torch.nn.utils.clip_grad_value_);
// clip_value <= 0 is off. Elementwise, so it gives the same result on whole parameters and on
// ZeRO shard views. The trainer applies it after global-norm clipping (the reported norm is the
// one before either). Gradients must be contiguous f32 (InternalError otherwise).
void clip_grad_value(const NamedTensors& params, double clip_value);

}  // namespace brigade::optim
