// Helpers shared by the model parity tests (tests/models/test_*.cpp) that compare a
// Brigade model with a PyTorch reference fixture (tests/reference/make_*_fixture.py): the
// error measures, loading and checking a model against a fixture, save -> load round trips.
// Also included by tests built without BRIGADE_SOURCE_DIR (the MPI ones): what needs the
// source tree is in support/fixture_configs.h.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "brigade/autograd/engine.h"
#include "brigade/ckpt/safetensors.h"
#include "brigade/core/rng.h"
#include "brigade/core/tensor.h"
#include "brigade/ops/ops.h"
#include "brigade/optim/optimizer.h"
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

// Same shape, dtype and bytes.
inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(), a.nbytes()) == 0;
}

// The names of `m`'s parameters.
template <class Model>
std::set<std::string> parameter_names(const Model& m) {
  std::set<std::string> names;
  for (auto& [name, p] : m.named_parameters()) names.insert(name);
  return names;
}

// Copies the fixture's tensor of each parameter's name (and shape) into `m`.
template <class Model>
void load_parameters(const ckpt::SafetensorsReader& r, Model& m) {
  for (auto& [name, p] : m.named_parameters()) {
    ASSERT_TRUE(r.contains(name)) << name;
    const Tensor t = r.get(name);
    ASSERT_EQ(t.shape(), p.shape()) << name;
    p.copy_(t);
  }
}

// Every parameter of `m` is in the fixture with its shape, and the fixture holds one gradient
// ("grad.<name>") per parameter.
template <class Model>
void expect_parameters_in_fixture(const Model& m, const ckpt::SafetensorsReader& r) {
  size_t n = 0;
  for (auto& [name, p] : m.named_parameters()) {
    ASSERT_TRUE(r.contains(name)) << "Brigade has " << name << ", the reference does not";
    EXPECT_EQ(p.shape(), r.info(name).shape) << name;
    ++n;
  }
  size_t ref_params = 0;
  for (const std::string& name : r.names()) ref_params += name.rfind("grad.", 0) == 0;
  EXPECT_EQ(n, ref_params);
}

// Every parameter of `m` has a gradient within `tol` of the fixture's (grad_err, with `key_bias`).
template <class Model>
void expect_gradients_match(const ckpt::SafetensorsReader& r, const Model& m, double tol = 1e-4,
                            const std::string& key_bias = "key.bias") {
  for (auto& [name, p] : m.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_LT(grad_err(r, name, p.grad(), key_bias), tol) << "gradient of " << name;
  }
}

// Moves every tensor off its structured init: adds N(0, sd^2) noise drawn from `g`.
inline void perturb(ckpt::NamedTensors params, Generator& g, double sd) {
  for (auto& [name, p] : params) {
    Tensor noise = Tensor::empty(p.shape());
    g.normal_(noise, 0.0, sd);
    p.copy_(ops::add(p, noise));
  }
}

// The value of the 0-d tensor `f()` computes, without recording a graph.
template <class F>
double item_without_grad(F f) {
  autograd::NoGradGuard ng;
  return f().item();
}

// A small-input image batch for the opt-in step benchmarks: `n` images of 1x28x28 drawn from
// `g` and the labels i % 10.
inline std::pair<Tensor, Tensor> bench_image_batch(int64_t n, Generator& g) {
  Tensor x = Tensor::empty({n, 1, 28, 28});  // (B, 1, 28, 28)
  g.normal_(x);
  std::vector<int64_t> lv(static_cast<size_t>(n));
  for (size_t i = 0; i < lv.size(); ++i) lv[i] = int64_t(i % 10);
  return {x, Tensor::from_vector_i64(lv, {n})};
}

// A language-model batch for a vocabulary of `vocab`: 2 rows of 20 ids and targets, arithmetic
// sequences modulo `vocab`.
inline std::pair<Tensor, Tensor> lm_batch(int64_t vocab) {
  std::vector<int64_t> idv, tgv;
  for (int i = 0; i < 2 * 20; ++i) {
    idv.push_back((i * 37 + 11) % vocab);
    tgv.push_back((i * 53 + 5) % vocab);
  }
  return {Tensor::from_vector_i64(idv, {2, 20}), Tensor::from_vector_i64(tgv, {2, 20})};
}

// Three steps of `opt` (over `m`'s parameters) at lr 1e-2 on (ids, targets), so the weights
// (norms included) leave their structured init.
template <class Model>
void take_adamw_steps(optim::AdamW& opt, const Model& m, const Tensor& ids, const Tensor& targets) {
  for (int s = 0; s < 3; ++s) {
    opt.zero_grad();
    autograd::backward(m.loss(ids, targets));
    opt.step(1e-2);
  }
}

// A safetensors file of `tensors` and `metadata` in the temp directory, named by `stem` and the
// pid, open for reading and removed at the end of its scope.
struct TempSafetensors {
  TempSafetensors(const std::string& stem, const ckpt::NamedTensors& tensors,
                  const std::map<std::string, std::string>& metadata)
      : path(std::filesystem::temp_directory_path() /
             ("brigade_" + stem + "_" + std::to_string(::getpid()) + ".safetensors")) {
    ckpt::save_safetensors(path.string(), tensors, metadata);
    reader.open(path.string());
  }
  ~TempSafetensors() { std::filesystem::remove(path); }
  TempSafetensors(const TempSafetensors&) = delete;
  TempSafetensors& operator=(const TempSafetensors&) = delete;
  std::filesystem::path path;
  ckpt::SafetensorsReader reader;
};

// A save -> load round trip: `file` holds exactly the `saved` tensors, and reading them by name
// into `loaded` (another model's) gives both bitwise the file's.
inline void expect_round_trip(const ckpt::SafetensorsReader& file, const ckpt::NamedTensors& saved,
                              const ckpt::NamedTensors& loaded) {
  EXPECT_EQ(file.size(), saved.size());
  for (auto& [name, t] : loaded) file.get_into(name, t);
  for (const ckpt::NamedTensors* state : {&saved, &loaded})
    for (auto& [name, t] : *state) EXPECT_TRUE(bitwise_equal(t, file.get(name))) << name;
}

}  // namespace brigade::test_support
