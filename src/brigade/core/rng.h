// Random numbers that reproduce PyTorch's CPU generator bit for bit:
// torch.manual_seed(s) followed by tensor.normal_(mean, std) / uniform_(a, b)
// yields the same f32 values here, so fixtures and models share initialisation.
// Reference: aten/src/ATen/core/MT19937RNGEngine.h, CPUGeneratorImpl.cpp,
// core/DistributionsHelper.h, native/cpu/DistributionTemplates.h and
// native/cpu/avx_mathfun.h (PyTorch 1.13, CPU capability AVX2). Not thread-safe.
#pragma once
#include <array>
#include <cstdint>
#include <string>

#include "brigade/core/tensor.h"

namespace brigade {

// Which of torch's CPU kernel builds to reproduce (torch picks one at start-up).
// Avx2 (default; torch 1.13 on AVX2 and AVX512 machines, both checked): contiguous f32
// normal_ with >= 16 elements uses Box-Muller with avx_mathfun's log256_ps and
// sincos256_ps (Cephes polynomials, FMA-contracted as GCC compiles them), and
// `x * std + mean` / `x * (to - from) + from` are fused multiply-adds.
// Default: torch run with ATEN_CPU_CAPABILITY=default: scalar normal_fill with
// std::log/cos/sin in float and no FMA anywhere.
enum class CpuCapability : uint8_t { Avx2, Default };

class Generator {
 public:
  static constexpr uint64_t kDefaultSeed = 67280421310721ull;  // torch's default_rng_seed_val

  explicit Generator(uint64_t seed = kDefaultSeed) { manual_seed(seed); }
  // As torch.Generator.manual_seed: reseeds mt19937 and drops cached normal samples.
  void manual_seed(uint64_t seed);
  uint64_t initial_seed() const { return seed_; }

  uint32_t random();    // next 32 bits of mt19937
  uint64_t random64();  // two draws, first one in the high half, as torch's random64()

  // One sample of torch's scalar distributions (at::uniform_real_distribution /
  // at::normal_distribution<double>), advancing the stream exactly as torch does.
  float uniform_float();                                      // [0, 1): (random() & (2^24-1)) * 2^-24 (dropout masks)
  double uniform_double();                                    // [0, 1): (random64() & (2^53-1)) * 2^-53
  double normal_double(double mean = 0.0, double std = 1.0);  // Box-Muller, caches the sine half

  // In-place fills matching torch.Tensor.normal_ / uniform_ on f32 tensors, bit for bit,
  // including non-contiguous views (filled in memory order, like TensorIterator).
  // BF16/F16 tensors are filled as a contiguous f32 tensor of the same shape, then
  // rounded (torch computes those in reduced precision: close, not bit-identical).
  // Integer tensors throw ValueError. Returns nothing; the tensor is modified.
  void normal_(const Tensor& t, double mean = 0.0, double std = 1.0);
  void uniform_(const Tensor& t, double from = 0.0, double to = 1.0);

  // Configuration, not state: state()/set_state() leave it alone.
  void set_cpu_capability(CpuCapability c) { capability_ = c; }
  CpuCapability cpu_capability() const { return capability_; }

  // Full state (mt19937 words and position, seed, cached normal samples) as one
  // printable ASCII line, for checkpoints; set_state(state()) resumes exactly.
  // set_state throws ValueError on a string it did not write.
  std::string state() const;
  void set_state(const std::string& s);

  bool operator==(const Generator& o) const;

 private:
  void twist();
  double scale_shift(double val, double std, double mean) const;
  void fill_normal_f32_(float* data, int64_t n, float mean, float std);

  std::array<uint32_t, 624> mt_{};
  int idx_ = 624;  // next word of mt_ to temper; 624 means "twist first"
  uint64_t seed_ = 0;
  // torch caches the second Box-Muller sample of normal_distribution<double>
  // (and of <float>, which nothing here draws; kept so state round-trips torch's).
  bool has_next_normal_ = false;
  double next_normal_ = 0.0;
  bool has_next_float_normal_ = false;
  float next_float_normal_ = 0.0f;
  CpuCapability capability_ = CpuCapability::Avx2;
};

// Process-wide default generator (like torch's default CPU generator).
Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace brigade
