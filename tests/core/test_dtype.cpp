// Scalar dtype conversions (dtype.h) against torch-made values from
// tests/fixtures/dtype_conversions.safetensors and against algebra (every 16-bit
// pattern round-trips). NaN: torch canonicalises bf16 NaN to 0x7FC0 while Brigade
// keeps sign and payload (quietened), so NaN is compared as "is NaN" only.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "brigade/ckpt/safetensors.h"
#include "brigade/core/dtype.h"

using namespace brigade;

namespace {
struct Fixture {
  std::vector<uint32_t> src;
  std::vector<uint16_t> bf16, f16, h_src;
  std::vector<uint32_t> h_to_f32;
};
template <typename T>
std::vector<T> raw(const ckpt::SafetensorsReader& r, const std::string& name) {
  const std::string b = r.raw_bytes(name);
  std::vector<T> v(b.size() / sizeof(T));
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}
Fixture load() {
  ckpt::SafetensorsReader r(std::string(BRIGADE_FIXTURES_DIR) + "/dtype_conversions.safetensors");
  EXPECT_EQ(r.metadata("magic").value_or(""), "brigade-fixture");
  return {raw<uint32_t>(r, "f32_src"), raw<uint16_t>(r, "bf16"), raw<uint16_t>(r, "f16"), raw<uint16_t>(r, "f16_src"),
          raw<uint32_t>(r, "f16_to_f32")};
}
float f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
bool bf16_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu); }
bool f16_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu); }
}  // namespace

TEST(DType, F32ToBf16MatchesTorch) {
  const Fixture fx = load();
  ASSERT_EQ(fx.src.size(), fx.bf16.size());
  ASSERT_GT(fx.src.size(), 3000u);
  for (size_t i = 0; i < fx.src.size(); ++i) {
    const uint16_t got = float_to_bf16(f32(fx.src[i]));
    if (bf16_nan(fx.bf16[i]))
      EXPECT_TRUE(bf16_nan(got)) << std::hex << fx.src[i];
    else
      ASSERT_EQ(got, fx.bf16[i]) << "f32 bits 0x" << std::hex << fx.src[i];
  }
}

TEST(DType, F32ToF16MatchesTorch) {
  const Fixture fx = load();
  for (size_t i = 0; i < fx.src.size(); ++i) {
    const uint16_t got = float_to_f16(f32(fx.src[i]));
    if (f16_nan(fx.f16[i]))
      EXPECT_TRUE(f16_nan(got)) << std::hex << fx.src[i];
    else
      ASSERT_EQ(got, fx.f16[i]) << "f32 bits 0x" << std::hex << fx.src[i];
  }
}

TEST(DType, F16ToF32MatchesTorch) {
  const Fixture fx = load();
  for (size_t i = 0; i < fx.h_src.size(); ++i) {
    const float got = f16_to_float(fx.h_src[i]);
    if (f16_nan(fx.h_src[i]))
      EXPECT_TRUE(std::isnan(got));
    else
      ASSERT_EQ(bits_of(got), fx.h_to_f32[i]) << "f16 bits 0x" << std::hex << fx.h_src[i];
  }
}

TEST(DType, Every16BitPatternRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_float(uint16_t(h));
    if (f16_nan(uint16_t(h))) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_TRUE(f16_nan(float_to_f16(f)));
      continue;
    }
    ASSERT_EQ(float_to_f16(f), h) << std::hex << h;
    const float b = bf16_to_float(uint16_t(h));
    if (!bf16_nan(uint16_t(h))) {
      ASSERT_EQ(float_to_bf16(b), h) << std::hex << h;
    }
  }
}

TEST(DType, RoundsHalfwayToEven) {
  // bf16: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> even (1); 1 + 3*2^-8 -> 1 + 2^-6
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80u);
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82u);
  // f16: 1 + 2^-11 halfway -> 1; 65520 -> Inf; 2^-25 -> 0; 2^-25 + tiny -> smallest denormal
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00u);
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00u);
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -25)), 0x0000u);
  EXPECT_EQ(float_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001u);
  EXPECT_EQ(float_to_f16(-0.0f), 0x8000u);
}
