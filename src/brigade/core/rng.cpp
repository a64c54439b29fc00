// torch-compatible mt19937 generator and the normal_/uniform_ fills (see rng.h).
// Every floating-point step below mirrors one line of PyTorch 1.13; where torch's
// AVX2 build fuses a multiply-add (GCC contracts avx_mathfun's _mm256_mul_ps +
// _mm256_add_ps into FMA) we call std::fma explicitly, and contraction of our own
// arithmetic is switched off for this file so the compiler cannot add any more.
// Verified bitwise against torch 1.13 by tests/core/test_rng.cpp (fixture made by
// tests/reference/make_fixtures.py).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "brigade/core/rng.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>
#include <vector>

#include "brigade/core/error.h"

namespace brigade {

namespace {

constexpr int kN = 624;
constexpr int kM = 397;
constexpr uint32_t kMatrixA = 0x9908b0dfu;
constexpr uint32_t kUpperMask = 0x80000000u;
constexpr uint32_t kLowerMask = 0x7fffffffu;
constexpr double kPi = 3.14159265358979323846;

inline uint32_t twist_word(uint32_t u, uint32_t v) {
  return (((u & kUpperMask) | (v & kLowerMask)) >> 1) ^ ((v & 1u) ? kMatrixA : 0u);
}

inline float f32_from_bits(uint32_t u) { return std::bit_cast<float>(u); }
inline uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }

// ---- avx_mathfun.h (Pommier / Garberoglio), one lane, as torch's AVX2 build runs it ----

// log256_ps: natural log via Cephes logf; NaN for x <= 0.
float cephes_logf(float x) {
  const bool invalid = !(x > 0.0f);
  x = std::max(x, f32_from_bits(0x00800000u));  // cut off denormals
  int32_t imm0 = int32_t(bits_of(x) >> 23);
  x = f32_from_bits((bits_of(x) & ~0x7f800000u) | bits_of(0.5f));  // keep the mantissa
  imm0 -= 0x7f;
  float e = float(imm0);
  e = e + 1.0f;
  const bool mask = x < 0.707106781186547524f;  // SQRTHF
  float tmp = mask ? x : 0.0f;
  x = x - 1.0f;
  e = e - (mask ? 1.0f : 0.0f);
  x = x + tmp;
  const float z = x * x;
  static constexpr float p[9] = {7.0376836292E-2f,  -1.1514610310E-1f, 1.1676998740E-1f,
                                 -1.2420140846E-1f, 1.4249322787E-1f,  -1.6668057665E-1f,
                                 2.0000714765E-1f,  -2.4999993993E-1f, 3.3333331174E-1f};
  float y = p[0];
  for (int i = 1; i < 9; ++i) y = std::fma(y, x, p[i]);  // y = y*x + p[i] (contracted)
  y = y * x;
  tmp = e * -2.12194440e-4f;  // e * q1
  y = std::fma(y, z, tmp);    // y*z + tmp (contracted)
  y = std::fma(-z, 0.5f, y);  // y - z*0.5 (contracted)
  x = x + y;
  x = std::fma(e, 0.693359375f, x);  // x + e*q2 (contracted)
  if (invalid) x = f32_from_bits(0xffffffffu);
  return x;
}

// sincos256_ps: Cephes sinf/cosf with the 4/pi range reduction.
void cephes_sincosf(float x, float* s, float* c) {
  uint32_t sign_bit_sin = bits_of(x) & 0x80000000u;
  x = f32_from_bits(bits_of(x) & 0x7fffffffu);
  float y = x * 1.27323954473516f;  // 4/pi
  int32_t imm2 = int32_t(y);        // cvttps: truncation
  imm2 = (imm2 + 1) & ~1;
  y = float(imm2);
  int32_t imm4 = imm2;
  const uint32_t swap_sign_bit_sin = uint32_t(imm2 & 4) << 29;
  const bool poly_mask = (imm2 & 2) == 0;
  x = std::fma(y, -0.78515625f, x);  // extended precision modular arithmetic (contracted)
  x = std::fma(y, -2.4187564849853515625e-4f, x);
  x = std::fma(y, -3.77489497744594108e-8f, x);
  imm4 = imm4 - 2;
  imm4 = (~imm4) & 4;
  const uint32_t sign_bit_cos = uint32_t(imm4) << 29;
  sign_bit_sin ^= swap_sign_bit_sin;

  const float z = x * x;
  y = 2.443315711809948E-005f;  // cosine polynomial, 0 <= x <= pi/4
  y = std::fma(y, z, -1.388731625493765E-003f);
  y = std::fma(y, z, 4.166664568298827E-002f);
  y = y * z;
  const float half_z = z * 0.5f;
  y = std::fma(y, z, -half_z);  // y*z - z*0.5 (contracted on the first product)
  y = y + 1.0f;

  float y2 = -1.9515295891E-4f;  // sine polynomial
  y2 = std::fma(y2, z, 8.3321608736E-3f);
  y2 = std::fma(y2, z, -1.6666654611E-1f);
  y2 = y2 * z;
  y2 = std::fma(y2, x, x);

  const float ysin2 = poly_mask ? y2 : 0.0f;
  const float ysin1 = poly_mask ? 0.0f : y;
  y2 = y2 - ysin2;
  y = y - ysin1;
  const float xmm1 = ysin1 + ysin2;
  const float xmm2 = y + y2;
  *s = f32_from_bits(bits_of(xmm1) ^ sign_bit_sin);
  *c = f32_from_bits(bits_of(xmm2) ^ sign_bit_cos);
}

// normal_fill_16_AVX2: data[0..16) holds uniforms in [0,1); Box-Muller in place.
void normal_fill_16_avx2(float* data, float mean, float std) {
  const float two_pi = float(2.0 * kPi);
  float n1[8], n2[8];
  for (int j = 0; j < 8; ++j) {
    const float u1 = 1.0f - data[j];
    const float u2 = data[j + 8];
    const float radius = std::sqrt(-2.0f * cephes_logf(u1));
    const float theta = two_pi * u2;
    float sn, cs;
    cephes_sincosf(theta, &sn, &cs);
    n1[j] = radius * cs;
    n2[j] = radius * sn;
  }
  for (int j = 0; j < 8; ++j) {
    data[j] = std::fma(n1[j], std, mean);  // _mm256_fmadd_ps
    data[j + 8] = std::fma(n2[j], std, mean);
  }
}

// normal_fill_16<float>: the scalar (ATEN_CPU_CAPABILITY=default) version.
void normal_fill_16_scalar(float* data, float mean, float std) {
  for (int j = 0; j < 8; ++j) {
    const float u1 = 1 - data[j];  // [0, 1) -> (0, 1] for log
    const float u2 = data[j + 8];
    const float radius = std::sqrt(-2 * std::log(u1));
    const float theta = float(2.0f * kPi * double(u2));
    data[j] = radius * std::cos(theta) * std + mean;
    data[j + 8] = radius * std::sin(theta) * std + mean;
  }
}

// Element offsets of a strided view in TensorIterator order: dims sorted by
// stride (largest outermost), size-1 dims dropped, so memory order for dense views.
std::vector<int64_t> iteration_offsets(const Tensor& t) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) != 1) dims.push_back(d);
  for (int64_t d : dims)
    BRIGADE_CHECK(t.stride(d) != 0, ValueError,
                  "random fill of {}: the tensor is an expanded view (stride 0 in dim {}), so "
                  "elements overlap; fill a contiguous tensor and expand it afterwards",
                  t.str(), d);
  std::stable_sort(dims.begin(), dims.end(),
                   [&](int64_t a, int64_t b) { return std::llabs(t.stride(a)) > std::llabs(t.stride(b)); });
  std::vector<int64_t> offs;
  offs.reserve(size_t(t.numel()));
  std::vector<int64_t> idx(dims.size(), 0);
  const int64_t n = t.numel();
  int64_t off = 0;
  for (int64_t k = 0; k < n; ++k) {
    offs.push_back(off);
    for (int64_t i = int64_t(dims.size()) - 1; i >= 0; --i) {
      const int64_t d = dims[size_t(i)];
      off += t.stride(d);
      if (++idx[size_t(i)] < t.size(d)) break;
      off -= t.stride(d) * t.size(d);
      idx[size_t(i)] = 0;
    }
  }
  return offs;
}

void check_fillable(const Tensor& t, const char* what) {
  BRIGADE_CHECK(t.defined(), ValueError, "Generator::{}: the tensor is undefined", what);
  BRIGADE_CHECK(is_floating(t.dtype()), ValueError,
                "Generator::{}: tensor {} has integer dtype; random fills need f32, bf16 or f16", what, t.str());
}

}  // namespace

// ---------------------------------------------------------------- mt19937

void Generator::manual_seed(uint64_t seed) {
  seed_ = seed;
  mt_[0] = uint32_t(seed & 0xffffffffu);
  for (int j = 1; j < kN; ++j)
    mt_[size_t(j)] = 1812433253u * (mt_[size_t(j - 1)] ^ (mt_[size_t(j - 1)] >> 30)) + uint32_t(j);
  idx_ = kN;
  has_next_normal_ = false;
  next_normal_ = 0.0;
  has_next_float_normal_ = false;
  next_float_normal_ = 0.0f;
}

void Generator::twist() {
  for (int j = 0; j < kN - kM; ++j)
    mt_[size_t(j)] = mt_[size_t(j + kM)] ^ twist_word(mt_[size_t(j)], mt_[size_t(j + 1)]);
  for (int j = kN - kM; j < kN - 1; ++j)
    mt_[size_t(j)] = mt_[size_t(j + kM - kN)] ^ twist_word(mt_[size_t(j)], mt_[size_t(j + 1)]);
  mt_[kN - 1] = mt_[kM - 1] ^ twist_word(mt_[kN - 1], mt_[0]);
  idx_ = 0;
}

uint32_t Generator::random() {
  if (idx_ >= kN) twist();
  uint32_t y = mt_[size_t(idx_++)];
  y ^= (y >> 11);
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= (y >> 18);
  return y;
}

uint64_t Generator::random64() {
  const uint32_t hi = random();
  const uint32_t lo = random();
  return (uint64_t(hi) << 32) | lo;
}

// ---------------------------------------------------------------- scalar distributions

// at::uniform_real_distribution<float>(0, 1): x * (to - from) + from with to=1, from=0.
float Generator::uniform_float() { return float(random() & ((1u << 24) - 1)) * (1.0f / float(1u << 24)); }

double Generator::uniform_double() {
  return double(random64() & ((uint64_t(1) << 53) - 1)) * (1.0 / double(uint64_t(1) << 53));
}

// transformation::normal: val * std + mean, contracted to an FMA in torch's AVX2 build.
double Generator::scale_shift(double val, double std, double mean) const {
  if (capability_ == CpuCapability::Avx2) return std::fma(val, std, mean);
  const double scaled = val * std;
  return scaled + mean;
}

// at::normal_distribution<double>::operator(): draws u1 then u2, returns r*cos(theta)
// and caches r*sin(theta) (unscaled) for the next call.
double Generator::normal_double(double mean, double std) {
  if (has_next_normal_) {
    has_next_normal_ = false;
    return scale_shift(next_normal_, std, mean);
  }
  const double u1 = uniform_double();
  const double u2 = uniform_double();
  const double r = std::sqrt(-2.0 * std::log(1.0 - u2));
  const double theta = 2.0 * kPi * u1;
  next_normal_ = r * std::sin(theta);
  has_next_normal_ = true;
  const double ret = r * std::cos(theta);
  return scale_shift(ret, std, mean);
}

// ---------------------------------------------------------------- tensor fills

void Generator::fill_normal_f32_(float* data, int64_t n, float mean, float std) {
  // normal_fill / normal_fill_AVX2: uniforms for everything, Box-Muller per 16;
  // a partial tail redraws 16 fresh uniforms into the last 16 slots and transforms them.
  auto fill16 = capability_ == CpuCapability::Avx2 ? normal_fill_16_avx2 : normal_fill_16_scalar;
  for (int64_t i = 0; i < n; ++i) data[i] = uniform_float();
  for (int64_t i = 0; i + 16 <= n; i += 16) fill16(data + i, mean, std);
  if (n % 16 != 0) {
    float* tail = data + n - 16;
    for (int j = 0; j < 16; ++j) tail[j] = uniform_float();
    fill16(tail, mean, std);
  }
}

void Generator::normal_(const Tensor& t, double mean, double std) {
  check_fillable(t, "normal_");
  BRIGADE_CHECK(std >= 0.0, ValueError, "Generator::normal_: std must be >= 0 (got {}) for tensor {}", std, t.str());
  if (t.dtype() != DType::F32) {
    Tensor tmp = Tensor::empty(t.shape(), DType::F32);  // same shape, contiguous
    normal_(tmp, mean, std);
    copy_strided(t, tmp);
    return;
  }
  const int64_t n = t.numel();
  if (n >= 16 && t.is_contiguous()) {
    fill_normal_f32_(t.data<float>(), n, float(mean), float(std));
    return;
  }
  // cpu_serial_kernel with normal_distribution<double>, cast to float, memory order.
  float* base = t.data<float>();
  for (int64_t off : iteration_offsets(t)) base[off] = float(normal_double(mean, std));
}

void Generator::uniform_(const Tensor& t, double from, double to) {
  check_fillable(t, "uniform_");
  BRIGADE_CHECK(from <= to, ValueError, "Generator::uniform_: expects from <= to, got from={} to={} for tensor {}",
                from, to, t.str());
  if (t.dtype() != DType::F32) {
    Tensor tmp = Tensor::empty(t.shape(), DType::F32);
    uniform_(tmp, from, to);
    copy_strided(t, tmp);
    return;
  }
  // uniform_real_distribution<float>(from, to): x * (to - from) + from in float,
  // contracted to an FMA in torch's AVX2 build.
  const float f = float(from), range = float(to) - float(from);
  const bool fused = capability_ == CpuCapability::Avx2;
  float* base = t.data<float>();
  auto draw = [&] {
    const float x = float(random() & ((1u << 24) - 1)) * (1.0f / float(1u << 24));
    if (fused) return std::fma(x, range, f);
    const float scaled = x * range;
    return scaled + f;
  };
  if (t.is_contiguous()) {
    const int64_t n = t.numel();
    for (int64_t i = 0; i < n; ++i) base[i] = draw();
  } else {
    for (int64_t off : iteration_offsets(t)) base[off] = draw();
  }
}

// ---------------------------------------------------------------- state

std::string Generator::state() const {
  std::ostringstream os;
  os << "brigade-rng-v1 " << seed_ << ' ' << idx_;
  for (uint32_t w : mt_) os << ' ' << w;
  uint64_t db;
  std::memcpy(&db, &next_normal_, 8);
  os << ' ' << int(has_next_normal_) << ' ' << db << ' ' << int(has_next_float_normal_) << ' '
     << bits_of(next_float_normal_);
  return os.str();
}

void Generator::set_state(const std::string& s) {
  std::istringstream is(s);
  std::string magic;
  is >> magic;
  BRIGADE_CHECK(magic == "brigade-rng-v1", ValueError,
                "Generator::set_state: not a Brigade RNG state (starts with '{}', expected 'brigade-rng-v1'); "
                "pass a string returned by Generator::state()",
                magic.substr(0, 32));
  Generator g;
  uint64_t seed = 0, db = 0;
  int64_t idx = -1;
  int hd = -1, hf = -1;
  uint32_t fb = 0;
  is >> seed >> idx;
  for (auto& w : g.mt_) is >> w;
  is >> hd >> db >> hf >> fb;
  std::string rest;
  BRIGADE_CHECK(!is.fail() && !(is >> rest) && idx >= 0 && idx <= kN && (hd == 0 || hd == 1) && (hf == 0 || hf == 1),
                ValueError,
                "Generator::set_state: the RNG state string is truncated or corrupt; "
                "pass an unmodified string returned by Generator::state()");
  seed_ = seed;
  idx_ = int(idx);
  mt_ = g.mt_;
  has_next_normal_ = hd == 1;
  std::memcpy(&next_normal_, &db, 8);
  has_next_float_normal_ = hf == 1;
  next_float_normal_ = f32_from_bits(fb);
}

bool Generator::operator==(const Generator& o) const {
  return mt_ == o.mt_ && idx_ == o.idx_ && seed_ == o.seed_ && has_next_normal_ == o.has_next_normal_ &&
         std::memcmp(&next_normal_, &o.next_normal_, 8) == 0 && has_next_float_normal_ == o.has_next_float_normal_ &&
         bits_of(next_float_normal_) == bits_of(o.next_float_normal_);
}

Generator& default_generator() {
  static Generator g;
  return g;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace brigade
