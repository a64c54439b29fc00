// The dual-encoder interface's shared pieces; see dual_encoder.h.
#include "brigade/models/dual_encoder.h"

#include "brigade/core/error.h"

namespace brigade::models {

Tensor DualEncoder::contrastive_loss(const Tensor& images, const Tensor& ids, const Tensor& lengths) const {
  BRIGADE_CHECK(images.dim() >= 1 && ids.dim() >= 1 && images.size(0) == ids.size(0), ShapeError,
                "contrastive_loss: images {} and captions {} must pair up one to one", shape_str(images.shape()),
                shape_str(ids.shape()));
  return contrastive_loss_from_logits(logits(images, ids, lengths));
}

}  // namespace brigade::models
