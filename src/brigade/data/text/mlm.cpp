// mask_tokens (text/mlm.h): one serial pass over the ids with the documented draw order.
#include "brigade/data/text/mlm.h"

#include <algorithm>
#include <cmath>

#include "brigade/core/error.h"

namespace brigade::data {

MlmBatch mask_tokens(const Tensor& ids, int64_t vocab_size, int64_t mask_id, const std::vector<int64_t>& special_ids,
                     double probability, Generator& gen) {
  BRIGADE_CHECK(ids.defined() && (ids.dtype() == DType::I32 || ids.dtype() == DType::I64), ShapeError,
                "mask_tokens: ids must be an i32 or i64 tensor, got {}", ids.defined() ? ids.str() : "undefined");
  BRIGADE_CHECK(vocab_size > 0, ValueError, "mask_tokens: vocab_size must be positive, got {}", vocab_size);
  BRIGADE_CHECK(mask_id >= 0 && mask_id < vocab_size, ValueError,
                "mask_tokens: mask_id {} is outside the vocabulary [0, {})", mask_id, vocab_size);
  BRIGADE_CHECK(probability >= 0.0 && probability <= 1.0, ValueError,
                "mask_tokens: probability must be in [0, 1], got {}", probability);
  std::vector<int64_t> in = ids.to_vector_i64();
  std::vector<int64_t> labels(in.size(), -100);
  for (size_t i = 0; i < in.size(); ++i) {
    const int64_t id = in[i];
    BRIGADE_CHECK(id >= 0 && id < vocab_size, ValueError,
                  "mask_tokens: id {} at flat index {} is outside the vocabulary [0, {})", id, i, vocab_size);
    if (std::find(special_ids.begin(), special_ids.end(), id) != special_ids.end()) continue;
    if (!(gen.uniform_double() < probability)) continue;
    labels[i] = id;
    const double v = gen.uniform_double();
    if (v < 0.8) {
      in[i] = mask_id;
    } else if (v < 0.9) {
      const int64_t r = int64_t(std::floor(gen.uniform_double() * double(vocab_size)));
      in[i] = std::min(r, vocab_size - 1);
    }
  }
  MlmBatch b;
  b.inputs = Tensor::from_vector_i64(in, ids.shape(), ids.dtype());      // ids' shape
  b.labels = Tensor::from_vector_i64(labels, ids.shape(), ids.dtype());  // ids' shape
  return b;
}

}  // namespace brigade::data
