// Op-harness cases of the loss family (src/brigade/ops/loss.h): cross-entropy with ignored rows
// and cross-entropy with label smoothing (torch's F.cross_entropy(label_smoothing=eps); eps 0 is
// plain cross-entropy); the big cases above the OpenMP threshold; the in-place backward.
#include "ops/harness.h"

#include <gtest/gtest.h>

#include <tuple>
#include <utility>
#include <vector>

namespace brigade::optest {

std::vector<OpCase> loss_cases() {
  std::vector<OpCase> cs;
  // ---- cross-entropy with ignore_index rows
  for (auto [N, V, view] : {std::tuple{6, 11, false}, std::tuple{5, 40, true}}) {
    std::vector<int64_t> t;
    for (int64_t i = 0; i < N; ++i) t.push_back(i % 3 == 1 ? -100 : (i * 7 + 3) % V);
    OpCase c;
    c.name = fmt::format("cross_entropy_N{}_V{}{}", N, V, view ? "_view" : "");
    c.inputs = {view ? in({N, V}).Sliced().Range(-4, 4) : in({N, V}).Range(-4, 4)};
    c.fwd = [=](const TVec& v) -> TVec {
      ops::CrossEntropyOut o = ops::cross_entropy(v[0], Tensor::from_vector_i64(t, {N}), -100);
      return {o.loss, o.lse};
    };
    c.bwd = [=](const TVec& v, const TVec& o, const Tensor& g) -> TVec {
      return {ops::cross_entropy_backward(g.item(), v[0], Tensor::from_vector_i64(t, {N}, DType::I32), o[1], -100)};
    };
    c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
      DVec loss(1), lse(static_cast<size_t>(N));
      ref::cross_entropy<double>(N, V, v[0].data(), t.data(), -100, loss.data(), lse.data());
      return {loss, lse};
    };
    c.bwd_d = [=](const std::vector<DVec>& v, const DVec& g) -> std::vector<DVec> {
      DVec loss(1), lse(static_cast<size_t>(N)), gl(size_t(N * V));
      ref::cross_entropy<double>(N, V, v[0].data(), t.data(), -100, loss.data(), lse.data());
      ref::cross_entropy_backward<double>(N, V, g[0], v[0].data(), t.data(), lse.data(), -100, gl.data());
      return {gl};
    };
    c.tol_cpu = 1e-5;
    c.f32_outputs = {true, true};  // loss, lse
    cs.push_back(c);
  }

  // ---- cross-entropy with label smoothing (torch's F.cross_entropy(label_smoothing=eps)); every
  // third row ignored; eps 0 is plain cross-entropy
  for (auto [N, V, eps, view] :
       {std::tuple{6, 11, 0.1, false}, std::tuple{5, 40, 0.25, true}, std::tuple{4, 7, 0.0, false}}) {
    std::vector<int64_t> t;
    for (int64_t i = 0; i < N; ++i) t.push_back(i % 3 == 1 ? -100 : (i * 7 + 3) % V);
    OpCase c;
    c.name = fmt::format("cross_entropy_smoothed_N{}_V{}_eps{}{}", N, V, eps, view ? "_view" : "");
    c.inputs = {view ? in({N, V}).Sliced().Range(-4, 4) : in({N, V}).Range(-4, 4)};
    c.fwd = [=](const TVec& v) -> TVec {
      ops::CrossEntropyOut o = ops::cross_entropy_smoothed(v[0], Tensor::from_vector_i64(t, {N}), eps, -100);
      return {o.loss, o.lse};
    };
    c.bwd = [=](const TVec& v, const TVec& o, const Tensor& g) -> TVec {
      return {ops::cross_entropy_smoothed_backward(g.item(), v[0], Tensor::from_vector_i64(t, {N}, DType::I32), o[1],
                                                   eps, -100)};
    };
    c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
      DVec loss(1), lse(static_cast<size_t>(N));
      ref::cross_entropy_smoothed<double>(N, V, v[0].data(), t.data(), eps, -100, loss.data(), lse.data());
      return {loss, lse};
    };
    c.bwd_d = [=](const std::vector<DVec>& v, const DVec& g) -> std::vector<DVec> {
      DVec loss(1), lse(static_cast<size_t>(N)), gl(static_cast<size_t>(N * V));
      ref::cross_entropy_smoothed<double>(N, V, v[0].data(), t.data(), eps, -100, loss.data(), lse.data());
      ref::cross_entropy_smoothed_backward<double>(N, V, g[0], v[0].data(), t.data(), lse.data(), eps, -100, gl.data());
      return {gl};
    };
    c.tol_cpu = 1e-5;
    c.f32_outputs = {true, true};  // loss, lse
    cs.push_back(c);
  }
  return cs;
}

std::vector<BigCase> loss_big_cases() {
  std::vector<BigCase> cs;
  {  // cross-entropy: N * V = 64 * 300 > 1 << 14, every third row ignored
    const int64_t N = 64, V = 300;
    std::vector<int64_t> t;
    for (int64_t i = 0; i < N; ++i) t.push_back(i % 3 == 1 ? -100 : (i * 37 + 5) % V);
    const Tensor logits = randn({N, V}, 117, -4, 4), tt = Tensor::from_vector_i64(t, {N});
    cs.push_back({"cross_entropy",
                  [=] {
                    ops::CrossEntropyOut o = ops::cross_entropy(logits, tt, -100);
                    return TVec{o.loss, o.lse, ops::cross_entropy_backward(0.7, logits, tt, o.lse, -100)};
                  },
                  1e-5});
  }
  return cs;
}

std::vector<Big16Case> loss_big16_cases() {
  std::vector<Big16Case> cs;
  cs.push_back({"cross_entropy", [=](DType dt) {
                  const int64_t N = 64, V = 300;  // N * V > 1 << 14
                  std::vector<int64_t> t;
                  for (int64_t i = 0; i < N; ++i) t.push_back(i % 3 == 1 ? -100 : (i * 37 + 5) % V);
                  const Tensor logits = randn({N, V}, 121, -4, 4).to(dt), tt = Tensor::from_vector_i64(t, {N});
                  const ops::CrossEntropyOut o = ops::cross_entropy(logits, tt, -100);
                  return TVec{o.loss, o.lse, ops::cross_entropy_backward(0.7, logits, tt, o.lse, -100)};
                }});
  return cs;
}

namespace {

TEST(Ops, CrossEntropyBackwardInPlaceWhenItHoldsTheLogitsAlone) {
  // cross_entropy_backward_: the gradient written over the logits when the call holds the
  // only reference, bitwise the out-of-place result; a shared tensor is left untouched.
  const int64_t N = 5, V = 37;
  std::vector<int64_t> tv{3, 36, -100, 0, 17};
  const Tensor targets = Tensor::from_vector_i64(tv, {N});
  for (DType dt : {DType::F32, DType::BF16}) {
    const Tensor base = randn({N, V}, 211).to(dt);
    const ops::CrossEntropyOut ce = ops::cross_entropy(base, targets);
    const Tensor want = ops::cross_entropy_backward(0.7, base, targets, ce.lse);
    Tensor mine = base.clone();
    const void* buffer = mine.raw_data();
    const Tensor got = ops::cross_entropy_backward_(0.7, std::move(mine), targets, ce.lse);
    EXPECT_EQ(got.raw_data(), buffer) << dtype_name(dt) << ": the sole owner's buffer is reused";
    EXPECT_EQ(got.to(DType::F32).to_vector(), want.to(DType::F32).to_vector()) << dtype_name(dt);
    // another handle shares the logits: a new buffer, the logits unchanged
    Tensor shared = base.clone();
    const Tensor keep = shared;
    const Tensor got2 = ops::cross_entropy_backward_(0.7, shared, targets, ce.lse);
    EXPECT_NE(got2.raw_data(), keep.raw_data()) << dtype_name(dt);
    EXPECT_EQ(keep.to(DType::F32).to_vector(), base.to(DType::F32).to_vector()) << dtype_name(dt);
    EXPECT_EQ(got2.to(DType::F32).to_vector(), want.to(DType::F32).to_vector()) << dtype_name(dt);
  }
}

}  // namespace

}  // namespace brigade::optest
