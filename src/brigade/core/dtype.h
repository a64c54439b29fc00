// Element types and the scalar conversions between them (round-to-nearest-even
// for bf16/f16, NaN kept quiet, Inf and denormals preserved).
// Vectorised bulk conversions live in ops/cpu.
#pragma once
#include <cstdint>
#include <cstring>
#include <string_view>

namespace brigade {

enum class DType : uint8_t { F32, BF16, F16, I32, I64 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
  }
  return 0;
}
constexpr bool is_floating(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }
std::string_view dtype_name(DType t);          // "f32", "bf16", ...
DType dtype_from_name(std::string_view name);  // throws ValueError naming the accepted values

// Storage types for the 16-bit floats (bit patterns only; arithmetic goes via float).
struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};

inline float bf16_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // NaN stays (quiet) NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                          // round to nearest even
  return uint16_t(u >> 16);
}
float f16_to_float(uint16_t h);
uint16_t float_to_f16(float f);

}  // namespace brigade
