// Embedding front-end (ops/embedding.h).
#include "brigade/ops/embedding.h"

#include "brigade/ops/detail.h"

namespace brigade::ops {

using namespace detail;

// ---------------------------------------------------------------- embedding

namespace {
std::vector<int64_t> checked_ids(const Tensor& ids, int64_t V, const char* op) {
  check_ids(ids, op, "ids");
  std::vector<int64_t> v = ids_vector(ids);
  for (size_t i = 0; i < v.size(); ++i)
    BRIGADE_CHECK(v[i] >= 0 && v[i] < V, ValueError,
                  "{}: id {} at flat position {} is outside [0, V) with V = {}; check the tokenizer's vocabulary "
                  "size against the model's vocab_size",
                  op, v[i], i, V);
  return v;
}
}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  check_float(weight, "embedding", "weight");
  BRIGADE_CHECK(weight.dim() == 2, ShapeError, "embedding: weight must be (V, C), got {}", shape_str(weight.shape()));
  const int64_t V = weight.size(0), C = weight.size(1);
  const std::vector<int64_t> v = checked_ids(ids, V, "embedding");
  Shape out = ids.shape();
  out.push_back(C);
  if (is_half(weight) && on_cpu()) {                // a bit copy of 16-bit rows (no rounding involved)
    Tensor y = Tensor::empty(out, weight.dtype());  // (..., C)
    cpu::embedding16(int64_t(v.size()), C, weight.data<uint16_t>(), weight.stride(0), weight.stride(1), v.data(),
                     y.data<uint16_t>());
    return y;
  }
  if (auto r = via_f32(
          {weight.dtype()}, [&](const Tensor& w) { return embedding(w, ids); }, weight))
    return *r;
  Tensor y = Tensor::empty(out);  // (..., C)
  BRIGADE_DISPATCH(embedding, int64_t(v.size()), C, weight.data<float>(), weight.stride(0), weight.stride(1), v.data(),
                   y.data<float>());
  return y;
}

Tensor embedding_backward(const Tensor& gy, const Tensor& ids, int64_t V) {
  check_float(gy, "embedding_backward", "gy");
  BRIGADE_CHECK(V > 0, ValueError, "embedding_backward: V must be positive, got {}", V);
  const std::vector<int64_t> v = checked_ids(ids, V, "embedding_backward");
  BRIGADE_CHECK(gy.dim() == ids.dim() + 1 && Shape(gy.shape().begin(), gy.shape().end() - 1) == ids.shape(), ShapeError,
                "embedding_backward: gy {} must be ids.shape + (C) with ids {}", shape_str(gy.shape()),
                shape_str(ids.shape()));
  const int64_t C = gy.size(-1);
  if (native16({&gy})) {
    Tensor gw = Tensor::empty({V, C}, gy.dtype());  // (V, C)
    cpu::embedding_backward16(int64_t(v.size()), C, V, strided(gy), v.data(), gy.dtype(), gw.raw_data());
    return gw;
  }
  if (auto r = via_f32(
          {gy.dtype()}, [&](const Tensor& g) { return embedding_backward(g, ids, V); }, gy))
    return *r;
  Tensor gyc = gy.contiguous();
  Tensor gw = Tensor::empty({V, C});  // (V, C)
  BRIGADE_DISPATCH(embedding_backward, int64_t(v.size()), C, V, gyc.data<float>(), v.data(), gw.data<float>());
  return gw;
}

}  // namespace brigade::ops
