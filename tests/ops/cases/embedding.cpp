// Op-harness cases of the embedding family (src/brigade/ops/embedding.h): the lookup and its
// scatter-add backward with repeated ids; the big cases above the OpenMP thresholds.
#include "ops/harness.h"

#include <vector>

namespace brigade::optest {

std::vector<OpCase> embedding_cases() {
  std::vector<OpCase> cs;
  // ---- embedding (repeated ids exercise the scatter-add)
  {
    const std::vector<int64_t> ids{3, 0, 6, 3, 3, 1};
    const int64_t V = 7, C = 5;
    OpCase c;
    c.name = "embedding";
    c.inputs = {in({V, C}).T()};
    c.fwd = [=](const TVec& x) -> TVec {
      return {ops::embedding(x[0], Tensor::from_vector_i64(ids, {2, 3}, DType::I32))};
    };
    c.bwd = [=](const TVec&, const TVec&, const Tensor& g) -> TVec {
      return {ops::embedding_backward(g, Tensor::from_vector_i64(ids, {2, 3}), V)};
    };
    c.fwd_d = [=](const std::vector<DVec>& x) -> std::vector<DVec> {
      DVec y(ids.size() * size_t(C));
      ref::embedding<double>(int64_t(ids.size()), C, x[0].data(), C, 1, ids.data(), y.data());
      return {y};
    };
    c.bwd_d = [=](const std::vector<DVec>&, const DVec& g) -> std::vector<DVec> {
      DVec gw(static_cast<size_t>(V * C));
      ref::embedding_backward<double>(int64_t(ids.size()), C, V, g.data(), ids.data(), gw.data());
      return {gw};
    };
    cs.push_back(c);
  }
  return cs;
}

std::vector<BigCase> embedding_big_cases() {
  std::vector<BigCase> cs;
  {  // embedding: N * C = 600 * 70 > 1 << 15 (C not a multiple of the 16-column chunks),
     // V * C = 500 * 70 > 1 << 15; ids repeat, some rows of V are never used.
    const int64_t N = 600, V = 500, EC = 70;
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < N; ++i) ids.push_back((i * i * 7 + 3) % 311);
    const Tensor w = randn({V, EC}, 108), gy = randn({N, EC}, 109), idt = Tensor::from_vector_i64(ids, {N});
    const Tensor wt = randn({EC, V}, 110).transpose(0, 1);  // (V, EC) strided
    cs.push_back({"embedding", [=] {
                    return TVec{ops::embedding(w, idt), ops::embedding(wt, idt), ops::embedding_backward(gy, idt, V)};
                  }});
  }
  return cs;
}

std::vector<Big16Case> embedding_big16_cases() {
  std::vector<Big16Case> cs;
  cs.push_back({"embedding_backward", [=](DType dt) {
                  const int64_t N = 600, V = 500, EC = 70;  // N * C, V * C > 1 << 15
                  std::vector<int64_t> ids;
                  for (int64_t i = 0; i < N; ++i) ids.push_back((i * i * 7 + 3) % 311);
                  const Tensor idt = Tensor::from_vector_i64(ids, {N});
                  return TVec{ops::embedding_backward(randn({N, EC}, 111).to(dt), idt, V),
                              ops::embedding_backward(randn({EC, N}, 112).to(dt).transpose(0, 1), idt, V)};
                }});
  return cs;
}

}  // namespace brigade::optest
