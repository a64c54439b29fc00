// Op-harness cases of the attention family (src/brigade/ops/attention.h): causal and full
// attention on ragged tile sizes and (B, T, NH, HS) views, attention with a key padding mask,
// repeat_kv, and grouped-query attention composed as the autograd rule does it (attention on
// repeat_kv'd k and v; the backward sums each group's gradients with repeat_kv_backward); the big
// cases above attention.cpp's OpenMP thresholds. 16-bit roundings: one per output, except the
// GQA backward, whose gk and gv are attention_backward's rounded gradients summed over the group
// and rounded again (2); repeat_kv's forward is a bit copy. Swin's window attention and shift
// mask are tested in tests/ops/test_window_ops.cpp.
#include "ops/harness.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace brigade::optest {

namespace {

OpCase repeat_kv_case(Input x, int64_t n_rep) {
  const int64_t B = x.shape[0], NKV = x.shape[1], THS = x.shape[2] * x.shape[3];
  OpCase c;
  c.name = fmt::format("repeat_kv_{}{}_rep{}", shape_str(x.shape), layout_name(x.layout), n_rep);
  c.inputs = {x};
  c.fwd = [=](const TVec& v) -> TVec { return {ops::repeat_kv(v[0], n_rep)}; };
  c.bwd = [=](const TVec&, const TVec&, const Tensor& g) -> TVec { return {ops::repeat_kv_backward(g, n_rep)}; };
  c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
    DVec y(v[0].size() * size_t(n_rep));
    ref::repeat_kv<double>(B, NKV, n_rep, THS, v[0].data(), y.data());
    return {y};
  };
  c.bwd_d = [=](const std::vector<DVec>&, const DVec& g) -> std::vector<DVec> {
    DVec gx(g.size() / size_t(n_rep));
    ref::repeat_kv_backward<double>(B, NKV, n_rep, THS, g.data(), gx.data());
    return {gx};
  };
  return c;
}

// q (B, NH, T, HS), k and v (B, NKV, T, HS); view: all three stored (B, T, heads, HS).
OpCase gqa_case(int64_t B, int64_t NH, int64_t NKV, int64_t T, int64_t HS, bool causal, bool view) {
  const int64_t n_rep = NH / NKV;
  OpCase c;
  c.name = fmt::format("gqa_B{}_NH{}_NKV{}_T{}_HS{}_{}{}", B, NH, NKV, T, HS, causal ? "causal" : "full",
                       view ? "_view" : "");
  Input q = in({B, NH, T, HS}).Range(-2, 2), k = in({B, NKV, T, HS}).Range(-2, 2), v = in({B, NKV, T, HS});
  if (view) {
    q.Swap(1, 2);
    k.Swap(1, 2);
    v.Swap(1, 2);
  }
  c.inputs = {q, k, v};
  const double scale = 1.0 / std::sqrt(double(HS));
  c.fwd = [=](const TVec& x) -> TVec {
    ops::AttentionOut o = ops::attention(x[0], ops::repeat_kv(x[1], n_rep), ops::repeat_kv(x[2], n_rep), causal, scale);
    return {o.out, o.lse};
  };
  c.bwd = [=](const TVec& x, const TVec& o, const Tensor& g) -> TVec {
    ops::AttentionGrads r = ops::attention_backward(g, x[0], ops::repeat_kv(x[1], n_rep), ops::repeat_kv(x[2], n_rep),
                                                    o[0], o[1], causal, scale);
    return {r.gq, ops::repeat_kv_backward(r.gk, n_rep), ops::repeat_kv_backward(r.gv, n_rep)};
  };
  const int64_t BH = B * NH, THS = T * HS;
  auto expand = [=](const DVec& kv) {
    DVec r(kv.size() * size_t(n_rep));
    ref::repeat_kv<double>(B, NKV, n_rep, THS, kv.data(), r.data());
    return r;
  };
  c.fwd_d = [=](const std::vector<DVec>& x) -> std::vector<DVec> {
    const DVec kr = expand(x[1]), vr = expand(x[2]);
    DVec o(static_cast<size_t>(BH * THS)), l(static_cast<size_t>(BH * T));
    ref::attention<double>(BH, T, HS, x[0].data(), kr.data(), vr.data(), causal, scale, o.data(), l.data());
    return {o, l};
  };
  c.bwd_d = [=](const std::vector<DVec>& x, const DVec& g) -> std::vector<DVec> {
    const DVec kr = expand(x[1]), vr = expand(x[2]);
    DVec o(static_cast<size_t>(BH * THS)), l(static_cast<size_t>(BH * T)), gq(o.size()), gkr(o.size()), gvr(o.size());
    ref::attention<double>(BH, T, HS, x[0].data(), kr.data(), vr.data(), causal, scale, o.data(), l.data());
    ref::attention_backward<double>(BH, T, HS, g.data(), x[0].data(), kr.data(), vr.data(), o.data(), l.data(), causal,
                                    scale, gq.data(), gkr.data(), gvr.data());
    DVec gk(x[1].size()), gv(x[2].size());
    ref::repeat_kv_backward<double>(B, NKV, n_rep, THS, gkr.data(), gk.data());
    ref::repeat_kv_backward<double>(B, NKV, n_rep, THS, gvr.data(), gv.data());
    return {gq, gk, gv};
  };
  c.tol_cpu = 1e-5;
  c.tol_f32 = 1e-5;
  c.tol_fd_f = 2e-4;
  c.f32_outputs = {false, true};  // lse
  c.rounds16(2);                  // gk, gv: attention_backward's rounded outputs, summed and rounded again
  return c;
}

}  // namespace

std::vector<OpCase> attention_cases() {
  std::vector<OpCase> cs;
  // ---- attention: causal and not; T not a multiple of any tile size; (B, T, NH, HS) views
  struct AttnShape {
    int64_t B, NH, T, HS;
    bool causal;
    bool view;
  };
  for (auto s : {AttnShape{2, 2, 7, 5, true, false}, AttnShape{1, 3, 9, 4, false, true},
                 AttnShape{2, 1, 70, 3, true, true}, AttnShape{1, 2, 67, 6, false, false},
                 // several query and key tiles (cpu kernel: 64 queries x 128 keys), ragged last tiles
                 AttnShape{1, 2, 150, 4, true, false}, AttnShape{1, 1, 133, 3, false, true}}) {
    OpCase c;
    c.name = fmt::format("attention_B{}_NH{}_T{}_HS{}_{}{}", s.B, s.NH, s.T, s.HS, s.causal ? "causal" : "full",
                         s.view ? "_view" : "");
    const Shape sh{s.B, s.NH, s.T, s.HS};
    Input q = in(sh).Range(-2, 2);
    if (s.view) q.Swap(1, 2);
    c.inputs = {q, in(sh).Range(-2, 2), s.view ? in(sh).Swap(1, 2) : in(sh).T()};
    const double scale = 1.0 / std::sqrt(double(s.HS));
    const bool causal = s.causal;
    c.fwd = [=](const TVec& v) -> TVec {
      ops::AttentionOut o = ops::attention(v[0], v[1], v[2], causal, scale);
      return {o.out, o.lse};
    };
    c.bwd = [=](const TVec& v, const TVec& o, const Tensor& g) -> TVec {
      ops::AttentionGrads r = ops::attention_backward(g, v[0], v[1], v[2], o[0], o[1], causal, scale);
      return {r.gq, r.gk, r.gv};
    };
    const int64_t BH = s.B * s.NH, T = s.T, HS = s.HS;
    c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
      DVec o(static_cast<size_t>(BH * T * HS)), l(static_cast<size_t>(BH * T));
      ref::attention<double>(BH, T, HS, v[0].data(), v[1].data(), v[2].data(), causal, scale, o.data(), l.data());
      return {o, l};
    };
    c.bwd_d = [=](const std::vector<DVec>& v, const DVec& g) -> std::vector<DVec> {
      DVec o(static_cast<size_t>(BH * T * HS)), l(static_cast<size_t>(BH * T)), gq(o.size()), gk(o.size()),
          gv(o.size());
      ref::attention<double>(BH, T, HS, v[0].data(), v[1].data(), v[2].data(), causal, scale, o.data(), l.data());
      ref::attention_backward<double>(BH, T, HS, g.data(), v[0].data(), v[1].data(), v[2].data(), o.data(), l.data(),
                                      causal, scale, gq.data(), gk.data(), gv.data());
      return {gq, gk, gv};
    };
    c.tol_cpu = 1e-5;
    c.tol_f32 = 1e-5;
    c.tol_fd_f = 2e-4;
    c.f32_outputs = {false, true};  // lse
    cs.push_back(c);
  }

  // ---- attention with a key padding mask: padded tails, a masked key in the middle, an
  // all-ones row, (B, T, NH, HS) views, a mask in f32 instead of i64, T above the cpu
  // kernels' OpenMP threshold.
  struct MaskShape {
    int64_t B, NH, T, HS;
    bool view;
    bool float_mask;
  };
  for (auto s :
       {MaskShape{2, 2, 7, 5, false, false}, MaskShape{3, 3, 9, 4, true, true}, MaskShape{2, 2, 70, 3, false, false}}) {
    std::vector<int64_t> mask(static_cast<size_t>(s.B * s.T), 1);
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t j = 0; j < s.T; ++j) {
        if (b == 0 && j >= s.T - 2) mask[size_t(b * s.T + j)] = 0;                    // padded tail
        if (b == 1 && (j == 1 || j >= s.T - s.T / 3)) mask[size_t(b * s.T + j)] = 0;  // a hole and a tail
      }                                                                               // b == 2: all ones
    OpCase c;
    c.name = fmt::format("attention_key_mask_B{}_NH{}_T{}_HS{}{}{}", s.B, s.NH, s.T, s.HS, s.view ? "_view" : "",
                         s.float_mask ? "_f32mask" : "");
    const Shape sh{s.B, s.NH, s.T, s.HS};
    Input q = in(sh).Range(-2, 2);
    if (s.view) q.Swap(1, 2);
    c.inputs = {q, in(sh).Range(-2, 2), s.view ? in(sh).Swap(1, 2) : in(sh).T()};
    const double scale = 1.0 / std::sqrt(double(s.HS));
    const int64_t B = s.B, NH = s.NH, T = s.T, HS = s.HS;
    const bool fm = s.float_mask;
    auto mask_tensor = [=] {
      if (!fm) return Tensor::from_vector_i64(mask, {B, T});
      return Tensor::from_vector(std::vector<float>(mask.begin(), mask.end()), {B, T});
    };
    c.fwd = [=](const TVec& v) -> TVec {
      ops::AttentionOut o = ops::attention(v[0], v[1], v[2], false, scale, mask_tensor());
      return {o.out, o.lse};
    };
    c.bwd = [=](const TVec& v, const TVec& o, const Tensor& g) -> TVec {
      ops::AttentionGrads r = ops::attention_backward(g, v[0], v[1], v[2], o[0], o[1], false, scale, mask_tensor());
      return {r.gq, r.gk, r.gv};
    };
    std::vector<uint8_t> keep(mask.begin(), mask.end());
    c.fwd_d = [=](const std::vector<DVec>& v) -> std::vector<DVec> {
      DVec o(static_cast<size_t>(B * NH * T * HS)), l(static_cast<size_t>(B * NH * T));
      ref::attention_key_mask<double>(B, NH, T, HS, v[0].data(), v[1].data(), v[2].data(), keep.data(), scale, o.data(),
                                      l.data());
      return {o, l};
    };
    c.bwd_d = [=](const std::vector<DVec>& v, const DVec& g) -> std::vector<DVec> {
      DVec o(static_cast<size_t>(B * NH * T * HS)), l(static_cast<size_t>(B * NH * T)), gq(o.size()), gk(o.size()),
          gv(o.size());
      ref::attention_key_mask<double>(B, NH, T, HS, v[0].data(), v[1].data(), v[2].data(), keep.data(), scale, o.data(),
                                      l.data());
      ref::attention_key_mask_backward<double>(B, NH, T, HS, g.data(), v[0].data(), v[1].data(), v[2].data(), o.data(),
                                               l.data(), keep.data(), scale, gq.data(), gk.data(), gv.data());
      return {gq, gk, gv};
    };
    c.tol_cpu = 1e-5;
    c.tol_f32 = 1e-5;
    c.tol_fd_f = 2e-4;
    c.f32_outputs = {false, true};  // lse
    cs.push_back(c);
  }

  // ---- repeat_kv, and grouped-query attention on repeat_kv'd k and v
  cs.push_back(repeat_kv_case(in({2, 2, 5, 3}), 3));
  cs.push_back(repeat_kv_case(in({1, 3, 4, 2}).Swap(1, 2), 2));
  cs.push_back(repeat_kv_case(in({2, 2, 3, 4}), 1));
  cs.push_back(gqa_case(2, 6, 2, 7, 4, true, false));
  cs.push_back(gqa_case(1, 4, 1, 9, 6, true, true));  // multi-query attention, (B, T, heads, HS) views
  cs.push_back(gqa_case(1, 4, 2, 5, 3, false, false));
  return cs;
}

std::vector<BigCase> attention_big_cases() {
  std::vector<BigCase> cs;
  // attention: BH * T * HS = 4 * 130 * 64 = 33280 > 1 << 15, BH * T * T * HS = 4.3e6 > 1 << 16;
  // T = 130 spans three 64-key blocks. Not claimed thread-independent: tolerance only.
  for (bool causal : {true, false}) {
    const Shape sh{2, 2, 130, 64};
    const Tensor q = randn(sh, 118, -2, 2), k = randn(sh, 119, -2, 2), v = randn(sh, 120), g = randn(sh, 121);
    const double scale = 0.125;
    cs.push_back({causal ? "attention_causal" : "attention_full",
                  [=] {
                    ops::AttentionOut o = ops::attention(q, k, v, causal, scale);
                    ops::AttentionGrads r = ops::attention_backward(g, q, k, v, o.out, o.lse, causal, scale);
                    return TVec{o.out, o.lse, r.gq, r.gk, r.gv};
                  },
                  1e-5,
                  {false, false, false, false, false}});
  }
  return cs;
}

std::vector<Big16Case> attention_big16_cases() {
  std::vector<Big16Case> cs;
  for (bool causal : {true, false})  // BH * T * T * HS > 1 << 16; T = 130 spans three key blocks
    cs.push_back({causal ? "attention_causal" : "attention_full", [=](DType dt) {
                    const Shape sh{2, 2, 130, 64};
                    const Tensor q = randn(sh, 122, -2, 2).to(dt), k = randn(sh, 123, -2, 2).to(dt);
                    const Tensor v = randn({2, 130, 2, 64}, 124).to(dt).transpose(1, 2);  // (B, NH, T, HS) view
                    const Tensor g = randn(sh, 125).to(dt);
                    const ops::AttentionOut o = ops::attention(q, k, v, causal, 0.125);
                    const ops::AttentionGrads r = ops::attention_backward(g, q, k, v, o.out, o.lse, causal, 0.125);
                    return TVec{o.out, o.lse, r.gq, r.gk, r.gv};
                  }});
  return cs;
}

namespace {

// The all-ones mask is exactly the non-causal attention of ops.h (same maths, other kernel).
TEST(EncoderOps, AllOnesKeyMaskIsFullAttention) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> U(-2, 2);
  std::vector<float> v(2 * 3 * 11 * 8);
  auto fill = [&] {
    for (auto& e : v) e = U(rng);
    return Tensor::from_vector(v, {2, 3, 11, 8});
  };
  const Tensor q = fill(), k = fill(), val = fill();
  for (auto be : {ops::Backend::Ref, ops::Backend::Cpu}) {
    ops::BackendScope s(be);
    const ops::AttentionOut a = ops::attention(q, k, val, false, 0.3, Tensor::ones({2, 11}, DType::I32));
    const ops::AttentionOut b = ops::attention(q, k, val, false, 0.3);
    EXPECT_LE(rel_err(to_d(a.out), to_d(b.out)), 1e-6);
    EXPECT_LE(rel_err(to_d(a.lse), to_d(b.lse)), 1e-6);
  }
}

}  // namespace

}  // namespace brigade::optest
