// Attention front-ends (ops/attention.h).
#include "brigade/ops/attention.h"

#include "brigade/ops/detail.h"

namespace brigade::ops {

using namespace detail;

int64_t attention_workspace_per_thread(int64_t T, int64_t HS) { return cpu::attention_workspace_per_thread(T, HS); }

// ---------------------------------------------------------------- attention

namespace {
void check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, const char* op) {
  check_float(q, op, "q");
  check_float(k, op, "k");
  check_float(v, op, "v");
  BRIGADE_CHECK(q.dim() == 4, ShapeError, "{}: q must be (B, NH, T, HS), got {}", op, shape_str(q.shape()));
  check_same_shape(k, q, op, "k", "q");
  check_same_shape(v, q, op, "v", "q");
}
}  // namespace

AttentionOut attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                       const Tensor& key_mask) {
  check_qkv(q, k, v, "attention");
  const bool masked = key_mask.defined();
  BRIGADE_CHECK(!(masked && causal), ValueError,
                "attention: a key padding mask is for bidirectional attention; pass causal = false or no key_mask");
  if (!masked && native16({&q, &k, &v})) {
    const int64_t B = q.size(0), NH = q.size(1), T = q.size(2), HS = q.size(3);
    AttentionOut o;
    o.out = Tensor::empty({B, NH, T, HS}, q.dtype());  // (B, NH, T, HS)
    o.lse = Tensor::empty({B, NH, T});                 // (B, NH, T)
    cpu::attention16(B * NH, T, HS, strided(q), strided(k), strided(v), causal, scale, q.dtype(), o.out.raw_data(),
                     o.lse.data<float>());
    return o;
  }
  if (auto r = via_f32(
          {q.dtype(), DType::F32},
          [&](const Tensor& q_, const Tensor& k_, const Tensor& v_) {
            return attention(q_, k_, v_, causal, scale, key_mask);
          },
          q, k, v))
    return *r;
  const int64_t B = q.size(0), NH = q.size(1), T = q.size(2), HS = q.size(3);
  Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  AttentionOut o;
  o.out = Tensor::empty({B, NH, T, HS});  // (B, NH, T, HS)
  o.lse = Tensor::empty({B, NH, T});      // (B, NH, T)
  if (masked)
    BRIGADE_DISPATCH(attention_key_mask, B, NH, T, HS, qc.data<float>(), kc.data<float>(), vc.data<float>(),
                     key_mask_bytes(key_mask, B, T, "attention").data(), scale, o.out.data<float>(),
                     o.lse.data<float>());
  else
    BRIGADE_DISPATCH(attention, B * NH, T, HS, qc.data<float>(), kc.data<float>(), vc.data<float>(), causal, scale,
                     o.out.data<float>(), o.lse.data<float>());
  return o;
}

AttentionGrads AttentionGrads::empty(const Shape& s, DType dt) {
  return {Tensor::empty(s, dt), Tensor::empty(s, dt), Tensor::empty(s, dt)};
}

AttentionGrads attention_backward(const Tensor& gout, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, bool causal, double scale,
                                  const Tensor& key_mask) {
  check_qkv(q, k, v, "attention_backward");
  check_float(gout, "attention_backward", "gout");
  check_float(out, "attention_backward", "out");
  check_float(lse, "attention_backward", "lse");
  check_same_shape(gout, q, "attention_backward", "gout", "q");
  check_same_shape(out, q, "attention_backward", "out", "q");
  const int64_t B = q.size(0), NH = q.size(1), T = q.size(2), HS = q.size(3);
  BRIGADE_CHECK(lse.shape() == Shape({B, NH, T}), ShapeError, "attention_backward: lse must be (B, NH, T) = {}, got {}",
                shape_str({B, NH, T}), shape_str(lse.shape()));
  const bool masked = key_mask.defined();
  BRIGADE_CHECK(!(masked && causal), ValueError,
                "attention_backward: a key padding mask is for bidirectional attention; pass causal = false or no "
                "key_mask");
  if (!masked && native16({&gout, &q, &k, &v, &out}) && lse.dtype() == DType::F32) {
    const Tensor lc = lse.contiguous();
    AttentionGrads g = AttentionGrads::empty(q.shape(), q.dtype());  // each (B, NH, T, HS)
    cpu::attention_backward16(B * NH, T, HS, strided(gout), strided(q), strided(k), strided(v), strided(out),
                              lc.data<float>(), causal, scale, q.dtype(), g.gq.raw_data(), g.gk.raw_data(),
                              g.gv.raw_data());
    return g;
  }
  if (auto r = via_f32(
          {q.dtype(), k.dtype(), v.dtype()},
          [&](const Tensor& g_, const Tensor& q_, const Tensor& k_, const Tensor& v_, const Tensor& o_,
              const Tensor& l_) { return attention_backward(g_, q_, k_, v_, o_, l_, causal, scale, key_mask); },
          gout, q, k, v, out, lse))
    return *r;
  Tensor gc = gout.contiguous(), qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous(), oc = out.contiguous(),
         lc = lse.contiguous();
  AttentionGrads g = AttentionGrads::empty(q.shape());  // each (B, NH, T, HS)
  if (masked)
    BRIGADE_DISPATCH(attention_key_mask_backward, B, NH, T, HS, gc.data<float>(), qc.data<float>(), kc.data<float>(),
                     vc.data<float>(), oc.data<float>(), lc.data<float>(),
                     key_mask_bytes(key_mask, B, T, "attention_backward").data(), scale, g.gq.data<float>(),
                     g.gk.data<float>(), g.gv.data<float>());
  else
    BRIGADE_DISPATCH(attention_backward, B * NH, T, HS, gc.data<float>(), qc.data<float>(), kc.data<float>(),
                     vc.data<float>(), oc.data<float>(), lc.data<float>(), causal, scale, g.gq.data<float>(),
                     g.gk.data<float>(), g.gv.data<float>());
  return g;
}

// ------------------------------------------------------------------ the key padding mask

std::vector<uint8_t> key_mask_bytes(const Tensor& key_mask, int64_t B, int64_t T, const char* op) {
  BRIGADE_CHECK(key_mask.defined(), ValueError, "{}: 'key_mask' is an undefined tensor", op);
  BRIGADE_CHECK(key_mask.shape() == Shape({B, T}), ShapeError, "{}: key_mask must be (B, T) = {}, got {}", op,
                shape_str({B, T}), shape_str(key_mask.shape()));
  std::vector<uint8_t> keep(static_cast<size_t>(B * T));
  if (key_mask.dtype() == DType::I32 || key_mask.dtype() == DType::I64) {
    const std::vector<int64_t> m = key_mask.to_vector_i64();
    for (size_t i = 0; i < m.size(); ++i) {
      BRIGADE_CHECK(m[i] == 0 || m[i] == 1, ValueError, "{}: key_mask must hold 0 or 1, got {} at index {}", op, m[i],
                    i);
      keep[i] = uint8_t(m[i]);
    }
  } else {
    const std::vector<float> m = key_mask.to_vector();
    for (size_t i = 0; i < m.size(); ++i) {
      BRIGADE_CHECK(m[i] == 0.f || m[i] == 1.f, ValueError, "{}: key_mask must hold 0 or 1, got {} at index {}", op,
                    m[i], i);
      keep[i] = uint8_t(m[i]);
    }
  }
  for (int64_t b = 0; b < B; ++b) {
    bool any = false;
    for (int64_t j = 0; j < T; ++j) any = any || keep[size_t(b * T + j)];
    BRIGADE_CHECK(any || T == 0, ValueError,
                  "{}: row {} of key_mask masks every key, so its softmax is undefined; give each row at least "
                  "one key with mask 1",
                  op, b);
  }
  return keep;
}

// ---------------------------------------------------------------- repeat_kv (GQA)

Tensor repeat_kv(const Tensor& x, int64_t n_rep) {
  check_float(x, "repeat_kv", "x");
  check_heads(x, "repeat_kv", "x");
  BRIGADE_CHECK(n_rep >= 1, ValueError, "repeat_kv: n_rep must be >= 1, got {}", n_rep);
  const int64_t B = x.size(0), NKV = x.size(1), T = x.size(2), HS = x.size(3);
  // A bit copy of each kv head into its n_rep query heads (any dtype, both backends).
  return x.unsqueeze(2).expand({B, NKV, n_rep, T, HS}).contiguous().view({B, NKV * n_rep, T, HS});  // (B, NH, T, HS)
}

Tensor repeat_kv_backward(const Tensor& gy, int64_t n_rep) {
  check_float(gy, "repeat_kv_backward", "gy");
  check_heads(gy, "repeat_kv_backward", "gy");
  BRIGADE_CHECK(n_rep >= 1 && gy.size(1) % n_rep == 0, ShapeError,
                "repeat_kv_backward: the head count {} of gy {} is not a multiple of n_rep = {}", gy.size(1),
                shape_str(gy.shape()), n_rep);
  if (any_not_f32({&gy})) return round_to(repeat_kv_backward(f32_of(gy), n_rep), gy.dtype());
  const int64_t B = gy.size(0), NKV = gy.size(1) / n_rep, T = gy.size(2), HS = gy.size(3);
  const Tensor gc = gy.contiguous();
  Tensor gx = Tensor::empty({B, NKV, T, HS});  // (B, NKV, T, HS)
  BRIGADE_DISPATCH(repeat_kv_backward, B, NKV, n_rep, T * HS, gc.data<float>(), gx.data<float>());
  return gx;
}

Tensor swin_shift_mask(int64_t H, int64_t W, int64_t ws, int64_t shift) {
  BRIGADE_CHECK(ws > 0 && H > 0 && W > 0 && H % ws == 0 && W % ws == 0, ValueError,
                "swin_shift_mask: the {}x{} grid must be a positive multiple of the window size {}", H, W, ws);
  BRIGADE_CHECK(shift > 0 && shift < ws, ValueError, "swin_shift_mask: shift must be in (0, {}), got {}", ws, shift);
  auto region = [&](int64_t i, int64_t n) { return i < n - ws ? 0 : (i < n - shift ? 1 : 2); };
  std::vector<int64_t> img(size_t(H * W));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t w = 0; w < W; ++w) img[size_t(h * W + w)] = region(h, H) * 3 + region(w, W);
  const int64_t nh = H / ws, nw = W / ws, N = ws * ws;
  Tensor m = Tensor::zeros({nh * nw, N, N});  // (nW, N, N)
  float* p = m.data<float>();
  for (int64_t wh = 0; wh < nh; ++wh)
    for (int64_t ww = 0; ww < nw; ++ww) {
      auto id = [&](int64_t t) { return img[size_t((wh * ws + t / ws) * W + ww * ws + t % ws)]; };
      float* mw = p + (wh * nw + ww) * N * N;
      for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < N; ++j) mw[i * N + j] = id(i) != id(j) ? -100.0f : 0.0f;
    }
  return m;
}

}  // namespace brigade::ops
