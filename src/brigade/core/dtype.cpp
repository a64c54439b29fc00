// Scalar dtype helpers; see dtype.h.
#include "brigade/core/dtype.h"

#include "brigade/core/error.h"

namespace brigade {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
  }
  return "?";
}

DType dtype_from_name(std::string_view n) {
  if (n == "f32" || n == "fp32" || n == "float32") return DType::F32;
  if (n == "bf16" || n == "bfloat16") return DType::BF16;
  if (n == "f16" || n == "fp16" || n == "float16") return DType::F16;
  if (n == "i32" || n == "int32") return DType::I32;
  if (n == "i64" || n == "int64") return DType::I64;
  throw ValueError(fmt::format("unknown dtype '{}': use one of f32, bf16, f16, i32, i64", n));
}

// IEEE 754 binary16 <-> binary32, bit-exact, round-to-nearest-even.
float f16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // denormal: renormalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      man &= 0x3ffu;
      u = sign | (uint32_t(127 - 15 - e) << 23) | (man << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0u);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((absu >> 13) & 0x3ffu));  // NaN
  if (absu >= 0x477ff000u) return uint16_t(sign | 0x7c00u);                           // rounds to >= 65520: Inf
  if (absu < 0x38800000u) {                                                           // below the smallest normal half
    if (absu < 0x33000000u) return uint16_t(sign);                                    // < 2^-25 rounds to zero
    uint32_t e = absu >> 23;
    uint32_t man = (absu & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // 14..24 (value = man * 2^(e-150), half denorm unit 2^-24)
    uint32_t half_ulp = 1u << (shift - 1);
    uint32_t rest = man & ((1u << shift) - 1);
    uint32_t r = man >> shift;
    if (rest > half_ulp || (rest == half_ulp && (r & 1u))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t r = absu - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);   // round to nearest even
  return uint16_t(sign | (r >> 13));
}

}  // namespace brigade
