// Whole numbers read from JSON files, checked. nlohmann's get<int64_t>() converts a float with a
// static_cast (undefined behaviour when it is out of range, e.g. 1e300, and a silent truncation of
// 2.5) and wraps an unsigned number above INT64_MAX to a negative one; the readers of outside
// files (state.json, optimizer.index.json, config.json, ...) use this instead and refuse such a
// value with their own error naming the file and the field. Header-only: for the modules that
// already read JSON (nlohmann_json is a header library).
#pragma once
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>

namespace brigade {

// The value of `j` as an int64_t: a JSON integer in range, or a float holding a whole number
// of magnitude <= 2^53 (exactly representable; some writers emit 4096.0); nullopt otherwise
// (not a number, a fraction, out of range).
inline std::optional<int64_t> json_int64(const nlohmann::json& j) {
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    if (u > uint64_t(INT64_MAX)) return std::nullopt;
    return int64_t(u);
  }
  if (j.is_number_integer()) return j.get<int64_t>();
  if (j.is_number_float()) {
    const double d = j.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9007199254740992.0) return std::nullopt;
    return int64_t(d);
  }
  return std::nullopt;
}

}  // namespace brigade
