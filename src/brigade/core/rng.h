// Random numbers that reproduce PyTorch's CPU generator bit for bit:
// torch.manual_seed(s) followed by tensor.normal_(mean, std) / uniform_(a, b)
// yields the same values here, so fixtures and models can share initialisation.
// Reference: aten/src/ATen/core/MT19937RNGEngine.h, CPUGeneratorImpl.cpp and
// aten/src/ATen/native/cpu/DistributionTemplates.h (PyTorch 1.13).
#pragma once
#include <array>
#include <cstdint>
#include <string>

#include "brigade/core/tensor.h"

namespace brigade {

class Generator {
 public:
  explicit Generator(uint64_t seed = 67280421310721ull) { manual_seed(seed); }
  void manual_seed(uint64_t seed);
  uint32_t random();    // next 32 bits of mt19937
  uint64_t random64();  // two draws, as torch's random64()

  // In-place fills matching torch.Tensor.normal_ / uniform_ for f32 (and the
  // per-element double path torch uses for small or non-contiguous tensors).
  void normal_(const Tensor& t, double mean = 0.0, double std = 1.0);
  void uniform_(const Tensor& t, double from = 0.0, double to = 1.0);
  // Bernoulli(p) keep-mask helper for dropout: 1 with probability keep_prob.
  float uniform_float();

  // Full state, for checkpoints (exact resume).
  std::string state() const;
  void set_state(const std::string& s);

 private:
  std::array<uint32_t, 624> mt_{};
  int idx_ = 0;
  uint64_t seed_ = 0;
  // torch caches the second Box-Muller sample of its double normal distribution
  bool has_next_normal_ = false;
  double next_normal_ = 0.0;
};

// Process-wide default generator (like torch's default CPU generator).
Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace brigade
