// The numerical checks shared by the op, autograd and model tests: one relative error (a result's
// error normalised by the scale of its reference) and one central finite difference (the numerical
// gradient a derivative rule is checked against). Header-only, on core tensors and the standard
// library; the op harness (tests/ops/harness.h) and the parity helpers (support/parity.h) build on it.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "brigade/core/tensor.h"

namespace brigade::test_support {

// max |a - b| / max(max |b|, floor): the error of a against the reference b, normalised by b's
// scale so that it does not depend on where the values sit. floor bounds the normaliser from below:
// 0 (the default) compares an all-zero reference in absolute terms (the result is max |a - b|);
// the op harness's 1e-3 does so for references below 1e-3; a tiny floor such as 1e-30 makes any
// difference from an all-zero reference fail. The error is NaN, which fails every comparison,
// when sizes differ or a difference is NaN.
template <class A, class B>
double rel_err(const std::vector<A>& a, const std::vector<B>& b, double floor = 0) {
  if (a.size() != b.size()) return std::numeric_limits<double>::quiet_NaN();
  double num = 0, den = floor;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (std::isnan(d)) return std::numeric_limits<double>::quiet_NaN();
    num = std::max(num, d);
    den = std::max(den, std::fabs(double(b[i])));
  }
  return den > 0 ? num / den : num;
}

// The same over two tensors of any float dtype (compared in f32) and the same shape (NaN otherwise).
inline double rel_err(const Tensor& a, const Tensor& b, double floor = 0) {
  if (a.shape() != b.shape()) return std::numeric_limits<double>::quiet_NaN();
  return rel_err(a.to(DType::F32).to_vector(), b.to(DType::F32).to_vector(), floor);
}

// The central differences (f(x + h e_j) - f(x - h e_j)) / 2h of a scalar function f for every
// coordinate j of x. f takes no arguments: it reads x, which is perturbed in place (x_j set to
// T(x_j + h) and T(x_j - h), then restored), so x may be a tensor's own storage. step is one h for
// every coordinate, or a function of x_j that gives its h (a relative step, for instance).
template <class T, class Fn, class Step>
std::vector<double> central_difference(const Fn& f, std::span<T> x, const Step& step) {
  std::vector<double> g(x.size());
  for (size_t j = 0; j < x.size(); ++j) {
    const T x0 = x[j];
    double h;
    if constexpr (std::is_invocable_v<const Step&, double>)
      h = step(double(x0));
    else
      h = step;
    x[j] = T(x0 + h);
    const double fp = f();
    x[j] = T(x0 - h);
    const double fm = f();
    x[j] = x0;
    g[j] = (fp - fm) / (2 * h);
  }
  return g;
}

}  // namespace brigade::test_support
