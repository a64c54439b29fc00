// Masked-language-model inputs (BERT, Devlin et al. 2019; as Hugging Face's
// DataCollatorForLanguageModeling): mask_tokens chooses each maskable position independently
// with `probability` (15% by default); of the chosen ones 80% become mask_id, 10% a token drawn
// uniformly from [0, vocab_size) (which may be any id, even the original or a special one, as in
// HF), 10% stay unchanged. labels hold the original id at chosen positions and -100 elsewhere
// (cross-entropy's ignore_index). Positions holding one of `special_ids` are never chosen.
// Deterministic: per position in row-major order one uniform u (chosen iff u < probability),
// then for a chosen position one uniform v (v < 0.8: mask, v < 0.9: random, else unchanged)
// and for a random replacement one more uniform w (id = floor(w * vocab_size)); all from
// `gen`, as doubles (Generator::uniform_double). The same generator state gives the same batch.
#pragma once
#include <cstdint>
#include <vector>

#include "brigade/core/rng.h"
#include "brigade/core/tensor.h"

namespace brigade::data {

struct MlmBatch {
  Tensor inputs;  // ids with the chosen positions replaced; ids' shape and dtype
  Tensor labels;  // original ids at chosen positions, -100 elsewhere; ids' shape and dtype
};

// ids: any shape, i32 or i64, every id in [0, vocab_size) (ValueError naming the first bad one);
// mask_id in [0, vocab_size); probability in [0, 1].
MlmBatch mask_tokens(const Tensor& ids, int64_t vocab_size, int64_t mask_id, const std::vector<int64_t>& special_ids,
                     double probability, Generator& gen);

}  // namespace brigade::data
