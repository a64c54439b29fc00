// Convolution-family layers (torch.nn names and parameter layout): Conv2d (weight (O, C, KH, KW),
// optional bias (O)), MaxPool2d, AvgPool2d, AdaptiveAvgPool2d(1), the layout views between NCHW
// and channels-last, and ViT's PatchEmbedding. Conv2d weights are zero here (the model
// initialises them).
#pragma once
#include <memory>
#include <string>

#include "brigade/autograd/functions.h"
#include "brigade/nn/module.h"

namespace brigade::nn {

class Conv2d : public Module {
 public:
  // `padding` on every side, groups 1 (bitwise the constructor below with
  // ops::Conv2dParams::symmetric(stride, padding)).
  Conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride = 1, int64_t padding = 0, bool bias = false);
  // Any geometry: stride, zero padding per side (torch's ZeroPad2d before a "valid" conv) and
  // groups (which divide in and out; groups == in == out is depthwise). ConfigError otherwise.
  Conv2d(int64_t in, int64_t out, int64_t kernel, const ops::Conv2dParams& p, bool bias);
  Tensor forward(const Tensor& x) const;  // (N, in, H, W) -> (N, out, OH, OW); params.channels_last: NHWC
  int64_t in_channels, out_channels, kernel;
  int64_t stride, padding;  // the symmetric constructor's; `params` holds the geometry either way
  ops::Conv2dParams params;
  Tensor weight, bias;  // (out, in / groups, kernel, kernel), (out) or undefined

 protected:
  void parameter_replaced(const std::string& name, const Tensor& t) override;
};

// Differentiable views between the layouts: (N, C, H, W) -> (N, H, W, C) and back (no copy; the
// next op that needs contiguous memory copies).
inline Tensor to_channels_last(const Tensor& x) { return fn::transpose(fn::transpose(x, 1, 2), 2, 3); }
inline Tensor to_channels_first(const Tensor& x) { return fn::transpose(fn::transpose(x, 2, 3), 1, 2); }

class MaxPool2d : public Module {
 public:
  MaxPool2d(int64_t kernel, int64_t stride, int64_t padding = 0) : kernel(kernel), stride(stride), padding(padding) {}
  Tensor forward(const Tensor& x) const { return fn::max_pool2d(x, kernel, stride, padding, channels_last); }
  int64_t kernel, stride, padding;
  bool channels_last = false;  // inputs are (N, H, W, C)
};

class AvgPool2d : public Module {
 public:
  AvgPool2d(int64_t kernel, int64_t stride, int64_t padding = 0) : kernel(kernel), stride(stride), padding(padding) {}
  Tensor forward(const Tensor& x) const { return fn::avg_pool2d(x, kernel, stride, padding); }
  int64_t kernel, stride, padding;
};

// AdaptiveAvgPool2d with output size 1 (the only size ResNet needs): (N, C, H, W) -> (N, C, 1, 1).
class AdaptiveAvgPool2d : public Module {
 public:
  Tensor forward(const Tensor& x) const { return fn::adaptive_avg_pool2d(x); }
};

class PatchEmbedding : public Module {
 public:
  PatchEmbedding(int64_t in_channels, int64_t D, int64_t patch);
  Tensor forward(const Tensor& images) const;  // (N, C, H, W) -> (N, (H/p) * (W/p), D)
  Tensor weight, bias;                         // (D, C, p, p), (D)
  int64_t in_channels, dim, patch;

 protected:
  void parameter_replaced(const std::string& name, const Tensor& t) override;
};

}  // namespace brigade::nn
