// Checks that an alpha-beta fit is the least-squares one over alpha, beta >= 0, from the
// optimality (KKT) conditions of that convex problem rather than by refitting: with residuals
// r_i = y_i - alpha - beta x_i, sum(r) must be 0 where alpha > 0 and <= 0 where alpha = 0 (the
// error cannot drop by raising alpha), and likewise sum(r x) for beta.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace brigade::plan::testing {

inline void expect_constrained_least_squares(const std::vector<std::pair<int64_t, double>>& pts, double alpha,
                                             double beta, const std::string& what) {
  double ga = 0, gb = 0, scale_a = 0, scale_b = 0;
  for (const auto& [xi, y] : pts) {
    const double x = double(xi), r = y - alpha - beta * x;
    ga += r, gb += r * x;
    scale_a += std::fabs(y) + alpha + beta * x;
    scale_b += (std::fabs(y) + alpha + beta * x) * x;
  }
  const double ta = 1e-9 * scale_a + 1e-300, tb = 1e-9 * scale_b + 1e-300;
  EXPECT_GE(alpha, 0.0) << what;
  EXPECT_GE(beta, 0.0) << what;
  if (alpha > 0)
    EXPECT_NEAR(ga, 0.0, ta) << what << ": sum of residuals with alpha > 0";
  else
    EXPECT_LE(ga, ta) << what << ": alpha clamped at 0 although raising it lowers the error";
  if (beta > 0)
    EXPECT_NEAR(gb, 0.0, tb) << what << ": sum of residuals x bytes with beta > 0";
  else
    EXPECT_LE(gb, tb) << what << ": beta clamped at 0 although raising it lowers the error";
}

}  // namespace brigade::plan::testing
