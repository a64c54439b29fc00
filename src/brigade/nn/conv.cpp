// Convolution-family layers (nn/conv.h).
#include "brigade/nn/conv.h"

#include "brigade/autograd/engine.h"
#include "brigade/core/error.h"

namespace brigade::nn {

Conv2d::Conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding, bool has_bias)
    : Conv2d(in, out, kernel, ops::Conv2dParams::symmetric(stride, padding), has_bias) {}

Conv2d::Conv2d(int64_t in, int64_t out, int64_t kernel, const ops::Conv2dParams& p, bool has_bias)
    : in_channels(in), out_channels(out), kernel(kernel), stride(p.stride), padding(p.pad_top), params(p) {
  BRIGADE_CHECK(in >= 1 && out >= 1 && kernel >= 1 && p.stride >= 1 && p.pad_top >= 0 && p.pad_bottom >= 0 &&
                    p.pad_left >= 0 && p.pad_right >= 0 && p.groups >= 1 && in % p.groups == 0 && out % p.groups == 0,
                ConfigError,
                "Conv2d({}, {}, kernel={}, stride={}, padding (top {}, bottom {}, left {}, right {}), groups={}): "
                "channels, kernel, stride and groups must be >= 1, padding >= 0, and groups must divide both "
                "channel counts",
                in, out, kernel, p.stride, p.pad_top, p.pad_bottom, p.pad_left, p.pad_right, p.groups);
  weight = register_parameter("weight", {out, in / p.groups, kernel, kernel});
  if (has_bias) bias = register_parameter("bias", {out});
}
Tensor Conv2d::forward(const Tensor& x) const { return fn::conv2d(x, weight, bias, params); }
void Conv2d::parameter_replaced(const std::string& name, const Tensor& t) { (name == "weight" ? weight : bias) = t; }

PatchEmbedding::PatchEmbedding(int64_t in_channels, int64_t D, int64_t patch)
    : in_channels(in_channels), dim(D), patch(patch) {
  BRIGADE_CHECK(in_channels > 0 && D > 0 && patch > 0, ConfigError,
                "PatchEmbedding: channels {}, width {} and patch size {} must be positive", in_channels, D, patch);
  weight = register_parameter("weight", {D, in_channels, patch, patch});
  bias = register_parameter("bias", {D});
}

Tensor PatchEmbedding::forward(const Tensor& images) const {
  BRIGADE_CHECK(images.dim() == 4 && images.size(1) == in_channels, ShapeError,
                "PatchEmbedding: images must be (N, C={}, H, W), got {}", in_channels, shape_str(images.shape()));
  const Tensor patches = fn::patchify(images, patch);                        // (N, P, C*p*p)
  const Tensor w = fn::reshape(weight, {dim, in_channels * patch * patch});  // (D, C*p*p)
  return fn::linear(patches, w, bias, ops::WeightLayout::OutIn);             // (N, P, D)
}

void PatchEmbedding::parameter_replaced(const std::string& name, const Tensor& t) {
  if (name == "weight") weight = t;
  if (name == "bias") bias = t;
}

}  // namespace brigade::nn
