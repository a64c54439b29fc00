// Helpers shared by the model parity tests (tests/models/test_*.cpp) that compare a
// Brigade model with a PyTorch reference fixture (tests/reference/make_*_fixture.py).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "brigade/ckpt/safetensors.h"
#include "brigade/core/tensor.h"
#include "support/numeric.h"  // rel_err

namespace brigade::test_support {

// Gradient error of parameter `name` against the fixture's "grad.<name>": rel_err, except for
// an attention key bias (a name ending in `key_bias`, e.g. "key.bias" or "k_proj.bias"):
// softmax is invariant to adding q . b_k to every score of a row, so that gradient is exactly 0
// and both sides hold rounding noise (~1e-10); it is normalised by the whole key projection's
// reference gradient (weight and bias), i.e. checked as the error of that layer.
inline double grad_err(const ckpt::SafetensorsReader& r, const std::string& name, const Tensor& got,
                       const std::string& key_bias = "key.bias") {
  const Tensor want = r.get("grad." + name);
  const std::string& kb = key_bias;
  if (name.size() < kb.size() || name.compare(name.size() - kb.size(), kb.size(), kb) != 0) return rel_err(got, want);
  std::vector<float> a = got.to_vector(), b = want.to_vector();
  std::vector<float> w = r.get("grad." + name.substr(0, name.size() - 4) + "weight").to_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num = std::max(num, std::abs(double(a[i]) - double(b[i])));
  for (float x : b) den = std::max(den, std::abs(double(x)));
  for (float x : w) den = std::max(den, std::abs(double(x)));
  return num / den;
}

// Whether Debian's python3-torch answers (/usr/bin/python3: the python3 first on PATH may lack it).
inline bool have_torch() { return std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0; }

}  // namespace brigade::test_support
