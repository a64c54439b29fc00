// A dual-encoder image-text model trained contrastively (CLIP, ALIGN): what the contrastive task
// (train/tasks/contrastive.cpp) needs of it. Both encoders return unit-norm rows of width
// embed_dim(); the logits are a scaled cosine similarity whose scale is one learned 0-d
// parameter (CLIP's logit_scale, a log-scale; ALIGN's temperature, a divisor).
#pragma once
#include <string>

#include "brigade/nn/module.h"

namespace brigade::models {

class DualEncoder : public nn::Module {
 public:
  // (N, C, H, W) -> (N, E), unit rows.
  virtual Tensor encode_image(const Tensor& images) const = 0;
  // ids (M, T) and lengths (M) -> (M, E), unit rows.
  virtual Tensor encode_text(const Tensor& ids, const Tensor& lengths) const = 0;
  // logits_per_image (N, M) from unit embeddings (N, E), (M, E) and the model's own scale.
  virtual Tensor logits_from_embeds(const Tensor& image_embeds, const Tensor& text_embeds) const = 0;
  // The same with the scale parameter's value given as a 0-d tensor: the contrastive task
  // differentiates the global batch's loss with respect to a leaf copy of it.
  virtual Tensor logits_with_scale(const Tensor& image_embeds, const Tensor& text_embeds,
                                   const Tensor& scale) const = 0;
  // The loss of N matching pairs from their (N, N) logits_per_image, 0-d.
  virtual Tensor contrastive_loss_from_logits(const Tensor& logits_per_image) const = 0;
  // logits(images, ids, lengths): the text tower first, then the image tower, as the towers are
  // registered (the order ZeRO-3 prefetches their blocks in).
  Tensor logits(const Tensor& images, const Tensor& ids, const Tensor& lengths) const {
    const Tensor txt = encode_text(ids, lengths);
    const Tensor img = encode_image(images);
    return logits_from_embeds(img, txt);
  }
  // ShapeError unless images and captions pair up one to one.
  Tensor contrastive_loss(const Tensor& images, const Tensor& ids, const Tensor& lengths) const;
  // The learned scale (0-d), its parameter name, and the range the task keeps it in after each
  // optimizer update (a value outside is moved to the nearest bound).
  virtual Tensor& scale_parameter() = 0;
  virtual const Tensor& scale_parameter() const = 0;
  virtual std::string scale_name() const = 0;
  virtual double clamp_scale(double s) const = 0;
  virtual int64_t embed_dim() const = 0;
  // Tensors outside the parameters that training changes (BatchNorm running statistics), under
  // their checkpoint names; none by default.
  virtual nn::NamedTensors named_buffers() const { return {}; }
  // Model FLOPs of one training step per (image, caption) pair.
  virtual double flops_per_pair() const = 0;
  // One line for the run header: "CLIP, image tower ..." (the caller adds the tokenizer).
  virtual std::string describe() const = 0;
};

}  // namespace brigade::models
