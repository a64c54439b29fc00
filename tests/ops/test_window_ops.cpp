// Swin's window ops through fn:: (autograd/functions.h): roll2d (ops/position.h), window
// partition and reverse, patch merging, the relative position bias and window attention
// (fn::attention with an additive mask); each forward against a scalar reference written here in
// double, and each backward against central finite differences (h = 1e-6) of that double
// reference: d/dx sum(G * f(x)) for a random G. Brigade runs in f32, so gradients agree to ~1e-6
// relative; the bound is 1e-4 (max-abs error normalised by max |fd|). Also: roll2d's cpu kernel
// equals the ref backend bitwise (f32, bf16, f16), the shift mask (ops::swin_shift_mask,
// ops/attention.h) equals Hugging Face's slice construction, the relative position index
// (ops::relative_position_index, ops/position.h) its meshgrid construction. roll2d's op-harness
// cases are in tests/ops/cases/position.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <span>

#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"
#include "brigade/ops/ops.h"
#include "support/numeric.h"

using namespace brigade;
using test_support::central_difference;
using test_support::rel_err;

namespace {

using Vec = std::vector<double>;
using BrigadeFn = std::function<Tensor(const std::vector<Tensor>&)>;
using RefFn = std::function<Vec(const std::vector<Vec>&)>;

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// inputs: shapes, which are differentiated, optional fixed values (else normal(0, 1)).
void check_op(const std::string& what, const std::vector<Shape>& shapes, const std::vector<bool>& diff,
              const BrigadeFn& bf, const RefFn& rf, const std::vector<std::vector<float>>& fixed = {}) {
  SCOPED_TRACE(what);
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<std::vector<float>> xs;
  std::vector<Tensor> ts;
  std::vector<Vec> xd;
  for (size_t i = 0; i < shapes.size(); ++i) {
    std::vector<float> v(size_t(numel(shapes[i])));
    if (i < fixed.size() && !fixed[i].empty())
      v = fixed[i];
    else
      for (float& x : v) x = nd(rng);
    xs.push_back(v);
    Tensor t = Tensor::from_vector(v, shapes[i]);
    if (diff[i]) t.set_requires_grad(true);
    ts.push_back(t);
    xd.emplace_back(v.begin(), v.end());
  }
  const Tensor y = bf(ts);
  const Vec yr = rf(xd);
  const std::vector<float> yv = y.to_vector();
  ASSERT_EQ(yv.size(), yr.size());
  EXPECT_LT(rel_err(yv, yr, 1e-30), 1e-5) << "forward";
  std::vector<float> g(yv.size());
  for (float& x : g) x = nd(rng);
  autograd::backward(fn::sum_all(fn::mul(y, Tensor::from_vector(g, y.shape()))));
  auto objective = [&](const std::vector<Vec>& in) {
    const Vec out = rf(in);
    double s = 0;
    for (size_t i = 0; i < out.size(); ++i) s += double(g[i]) * out[i];
    return s;
  };
  const double h = 1e-6;
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (!diff[i]) continue;
    ASSERT_TRUE(ts[i].grad().defined()) << "input " << i;
    const Vec fd = central_difference([&] { return objective(xd); }, std::span(xd[i]), h);
    EXPECT_LT(rel_err(ts[i].grad().to_vector(), fd, 1e-30), 1e-4) << "gradient of input " << i;
  }
}

int64_t wrap(int64_t i, int64_t n) { return ((i % n) + n) % n; }

Vec ref_roll(const Vec& x, int64_t B, int64_t H, int64_t W, int64_t C, int64_t sh, int64_t sw) {
  Vec y(x.size());  // torch.roll: y[i] = x[(i - s) mod n]
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t w = 0; w < W; ++w)
        for (int64_t c = 0; c < C; ++c)
          y[size_t(((b * H + h) * W + w) * C + c)] =
              x[size_t(((b * H + wrap(h - sh, H)) * W + wrap(w - sw, W)) * C + c)];
  return y;
}

// y[(b nW + win) N + t][c] = x[b][wh ws + t / ws][ww ws + t % ws][c]; partition when !rev, else the inverse
Vec ref_windows(const Vec& x, int64_t B, int64_t H, int64_t W, int64_t C, int64_t ws, bool rev) {
  Vec y(x.size());
  const int64_t nh = H / ws, nw = W / ws, N = ws * ws;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t wh = 0; wh < nh; ++wh)
      for (int64_t ww = 0; ww < nw; ++ww)
        for (int64_t t = 0; t < N; ++t)
          for (int64_t c = 0; c < C; ++c) {
            const size_t img = size_t(((b * H + wh * ws + t / ws) * W + ww * ws + t % ws) * C + c);
            const size_t win = size_t((((b * nh + wh) * nw + ww) * N + t) * C + c);
            if (rev)
              y[img] = x[win];
            else
              y[win] = x[img];
          }
  return y;
}

int64_t rel_index(int64_t i, int64_t j, int64_t ws) {
  const int64_t dh = i / ws - j / ws, dw = i % ws - j % ws;
  return (dh + ws - 1) * (2 * ws - 1) + (dw + ws - 1);
}

TEST(SwinOps, Roll2dForwardBackward) {
  for (auto [sh, sw] : {std::pair<int64_t, int64_t>{-2, -2}, {2, 2}, {1, -3}, {0, 5}, {7, 0}}) {
    check_op(
        "roll2d " + std::to_string(sh) + "," + std::to_string(sw), {{2, 4, 6, 3}}, {true},
        [&](const std::vector<Tensor>& t) { return fn::roll2d(t[0], sh, sw); },
        [&](const std::vector<Vec>& x) { return ref_roll(x[0], 2, 4, 6, 3, sh, sw); });
  }
}

TEST(SwinOps, Roll2dCpuEqualsRefBitwiseAndInverse) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> v(size_t(3 * 16 * 16 * 8));
  for (float& x : v) x = nd(rng);
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    const Tensor x = ops::cast(Tensor::from_vector(v, {3, 16, 16, 8}), dt);
    const Tensor a = ops::roll2d(x, -3, 5);
    Tensor b;
    {
      ops::BackendScope s(ops::Backend::Ref);
      b = ops::roll2d(x, -3, 5);
    }
    EXPECT_EQ(a.dtype(), dt);
    EXPECT_EQ(a.to_vector(), b.to_vector()) << dtype_name(dt);
    EXPECT_EQ(ops::roll2d(a, 3, -5).to_vector(), x.to_vector()) << dtype_name(dt);
  }
  // a non-contiguous input rolls its logical values
  const Tensor x = Tensor::from_vector(v, {3, 16, 16, 8}).transpose(1, 2);
  EXPECT_EQ(ops::roll2d(x, 1, 2).to_vector(), ops::roll2d(x.contiguous(), 1, 2).to_vector());
  EXPECT_THROW(ops::roll2d(Tensor::zeros({4, 4}), 1, 1), ShapeError);
}

TEST(SwinOps, WindowPartitionAndReverse) {
  const int64_t B = 2, H = 4, W = 6, C = 3, ws = 2;
  check_op(
      "window_partition", {{B, H, W, C}}, {true},
      [&](const std::vector<Tensor>& t) { return fn::window_partition(t[0], ws); },
      [&](const std::vector<Vec>& x) { return ref_windows(x[0], B, H, W, C, ws, false); });
  check_op(
      "window_reverse", {{B * 6, ws * ws, C}}, {true},
      [&](const std::vector<Tensor>& t) { return fn::window_reverse(t[0], ws, H, W); },
      [&](const std::vector<Vec>& x) { return ref_windows(x[0], B, H, W, C, ws, true); });
  const Tensor x = Tensor::arange(B * H * W * C).reshape({B, H, W, C});
  EXPECT_EQ(fn::window_partition(x, ws).shape(), Shape({B * 6, 4, C}));
  EXPECT_EQ(fn::window_reverse(fn::window_partition(x, ws), ws, H, W).to_vector(), x.to_vector());
  EXPECT_THROW(fn::window_partition(x, 4), ShapeError);  // 4 does not divide W = 6
}

TEST(SwinOps, PatchMergeIsHuggingFacesX0X1X2X3) {
  const int64_t B = 2, H = 4, W = 6, C = 3;
  check_op(
      "patch_merge", {{B, H, W, C}}, {true}, [&](const std::vector<Tensor>& t) { return fn::patch_merge(t[0]); },
      [&](const std::vector<Vec>& x) {
        Vec y(x[0].size());
        for (int64_t b = 0; b < B; ++b)
          for (int64_t i = 0; i < H / 2; ++i)
            for (int64_t j = 0; j < W / 2; ++j)
              for (int64_t k = 0; k < 4; ++k)  // x0 (0,0), x1 (1,0), x2 (0,1), x3 (1,1) as (row, col)
                for (int64_t c = 0; c < C; ++c)
                  y[size_t(((b * (H / 2) + i) * (W / 2) + j) * 4 * C + k * C + c)] =
                      x[0][size_t(((b * H + 2 * i + k % 2) * W + 2 * j + k / 2) * C + c)];
        return y;
      });
  EXPECT_THROW(fn::patch_merge(Tensor::zeros({1, 3, 4, 2})), ShapeError);
}

TEST(SwinOps, RelativePositionIndexAndBias) {
  for (int64_t ws : {1, 2, 3, 7}) {
    const std::vector<int64_t> idx = ops::relative_position_index(ws).to_vector_i64();
    const int64_t N = ws * ws;
    ASSERT_EQ(int64_t(idx.size()), N * N);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < N; ++j) EXPECT_EQ(idx[size_t(i * N + j)], rel_index(i, j, ws));
    if (ws > 1) {  // range and centre: index 0 offset is the middle of the table
      EXPECT_EQ(idx[0], (ws - 1) * (2 * ws - 1) + ws - 1);
      EXPECT_EQ(*std::max_element(idx.begin(), idx.end()), (2 * ws - 1) * (2 * ws - 1) - 1);
    }
  }
  const int64_t ws = 3, N = 9, NH = 2, R = 25;
  const Tensor index = ops::relative_position_index(ws);
  check_op(
      "relative_position_bias", {{R, NH}}, {true},
      [&](const std::vector<Tensor>& t) { return fn::relative_position_bias(t[0], index); },
      [&](const std::vector<Vec>& x) {
        Vec y(size_t(NH * N * N));
        for (int64_t h = 0; h < NH; ++h)
          for (int64_t i = 0; i < N; ++i)
            for (int64_t j = 0; j < N; ++j) y[size_t((h * N + i) * N + j)] = x[0][size_t(rel_index(i, j, ws) * NH + h)];
        return y;
      });
}

// HF's get_attn_mask: img_mask regions by slices (0, -ws), (-ws, -shift), (-shift, None).
std::vector<float> hf_mask(int64_t H, int64_t W, int64_t ws, int64_t s) {
  std::vector<int> img(size_t(H * W));
  const int64_t hb[4] = {0, H - ws, H - s, H}, wb[4] = {0, W - ws, W - s, W};
  int cnt = 0;
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 3; ++b) {
      for (int64_t h = hb[a]; h < hb[a + 1]; ++h)
        for (int64_t w = wb[b]; w < wb[b + 1]; ++w) img[size_t(h * W + w)] = cnt;
      ++cnt;
    }
  const Vec mw = ref_windows(Vec(img.begin(), img.end()), 1, H, W, 1, ws, false);  // (nW, N)
  const int64_t N = ws * ws, nW = (H / ws) * (W / ws);
  std::vector<float> m(size_t(nW * N * N));
  for (int64_t w = 0; w < nW; ++w)
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < N; ++j) {
        const double d = mw[size_t(w * N + j)] - mw[size_t(w * N + i)];  // unsqueeze(1) - unsqueeze(2)
        m[size_t((w * N + i) * N + j)] = d != 0 ? -100.f : 0.f;
      }
  return m;
}

TEST(SwinOps, ShiftMaskIsHuggingFaces) {
  for (auto [H, W, ws, s] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t>{8, 8, 4, 2}, {6, 9, 3, 1}, {14, 14, 7, 3}}) {
    const Tensor m = ops::swin_shift_mask(H, W, ws, s);
    EXPECT_EQ(m.shape(), Shape({(H / ws) * (W / ws), ws * ws, ws * ws}));
    EXPECT_EQ(m.to_vector(), hf_mask(H, W, ws, s));
  }
  // the first window is never split; the last (bottom-right) is split in four
  const std::vector<float> m = ops::swin_shift_mask(8, 8, 4, 2).to_vector();
  for (int i = 0; i < 256; ++i) EXPECT_EQ(m[size_t(i)], 0.f);
  int masked = 0;
  for (int i = 0; i < 256; ++i) masked += m[size_t(3 * 256 + i)] != 0;
  EXPECT_EQ(masked, 256 - 4 * 16);
  EXPECT_THROW(ops::swin_shift_mask(8, 8, 3, 1), ValueError);
  EXPECT_THROW(ops::swin_shift_mask(8, 8, 4, 4), ValueError);
}

TEST(SwinOps, WindowAttentionWithBiasAndMask) {
  const int64_t B = 2, nW = 2, NH = 2, N = 4, HS = 3, BW = B * nW;
  const double scale = 1.0 / std::sqrt(double(HS));
  // mask: 0 / -100 pattern (window 0 all visible, window 1 two groups)
  std::vector<float> mask(size_t(nW * N * N), 0.f);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < N; ++j) mask[size_t((N + i) * N + j)] = (i < 2) != (j < 2) ? -100.f : 0.f;
  for (bool with_mask : {false, true}) {
    auto ref = [&](const std::vector<Vec>& x) {
      const Vec &q = x[0], &k = x[1], &v = x[2], &bias = x[3];
      Vec y(size_t(BW * NH * N * HS), 0.0);
      for (int64_t r = 0; r < BW; ++r)
        for (int64_t h = 0; h < NH; ++h)
          for (int64_t i = 0; i < N; ++i) {
            Vec s(static_cast<size_t>(N));
            double mx = -1e300;
            for (int64_t j = 0; j < N; ++j) {
              double d = 0;
              for (int64_t c = 0; c < HS; ++c)
                d += q[size_t(((r * NH + h) * N + i) * HS + c)] * k[size_t(((r * NH + h) * N + j) * HS + c)];
              s[size_t(j)] = d * scale + bias[size_t((h * N + i) * N + j)] +
                             (with_mask ? double(mask[size_t(((r % nW) * N + i) * N + j)]) : 0.0);
              mx = std::max(mx, s[size_t(j)]);
            }
            double z = 0;
            for (double& e : s) z += (e = std::exp(e - mx));
            for (int64_t j = 0; j < N; ++j)
              for (int64_t c = 0; c < HS; ++c)
                y[size_t(((r * NH + h) * N + i) * HS + c)] +=
                    s[size_t(j)] / z * v[size_t(((r * NH + h) * N + j) * HS + c)];
          }
      return y;
    };
    check_op(
        with_mask ? "window_attention masked" : "window_attention",
        {{BW, NH, N, HS}, {BW, NH, N, HS}, {BW, NH, N, HS}, {NH, N, N}, {nW, N, N}}, {true, true, true, true, false},
        [&](const std::vector<Tensor>& t) {
          return fn::attention(t[0], t[1], t[2], fn::AttentionMask::additive(t[3], with_mask ? t[4] : Tensor()), scale);
        },
        ref, {{}, {}, {}, {}, mask});
  }
  EXPECT_THROW(fn::attention(Tensor::zeros({3, 2, 4, 3}), Tensor::zeros({3, 2, 4, 3}), Tensor::zeros({3, 2, 4, 3}),
                             fn::AttentionMask::additive(Tensor::zeros({2, 4, 4}), Tensor::zeros({2, 4, 4})), 1.0),
               ShapeError);  // 2 windows per image do not divide 3 rows
}

}  // namespace
