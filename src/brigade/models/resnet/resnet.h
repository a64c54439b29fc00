// ResNet (He et al. 2016, "Deep Residual Learning") as single-device model code with
// torchvision's module tree, so parameter and buffer names match torchvision.models.resnet
// exactly: conv1, bn1, layer{1-4}.{j}.conv{1,2,3}, .bn{1,2,3}, layer{k}.0.downsample.{0,1},
// fc; BatchNorm buffers running_mean, running_var, num_batches_tracked. Basic blocks
// (ResNet-18/34) or bottlenecks (ResNet-50/101/152, torchvision's "v1.5": the stride sits on
// the 3x3 conv). `small_input` swaps the ImageNet stem (7x7 stride-2 conv + 3x3 stride-2
// max-pool) for a 3x3 stride-1 conv and no pool, for 28x28 / 32x32 images; the names do not
// change (conv1.weight is then (width, C, 3, 3)).
// Initialisation as torchvision: convs kaiming-normal with fan_out and the ReLU gain
// (std = sqrt(2 / (out * k * k))), BatchNorm weight 1 / bias 0, fc torch's default Linear
// init (weight and bias uniform in +-1 / sqrt(in)). Drawn from a Generator in a documented
// order (every conv in parameter order, then fc.weight, fc.bias): not bitwise torch's order
// (torch first runs every layer's own reset and then overwrites the convs), which the
// parity test does not need since it loads fixture weights.
// Training vs eval: Module::train(bool) reaches every BatchNorm2d.
// Plans from outside: the residual blocks (layer{k}.{j}) are nn::Blocks, so nn::find_blocks
// lists them ("layer1.0" ... "layer4.1" for ResNet-18) and a plan sets their `recompute` or
// forward hooks without this file knowing. BatchNorm under recompute updates its running
// statistics once per real forward (see nn::BatchNorm2d).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "brigade/core/rng.h"
#include "brigade/nn/conv.h"
#include "brigade/nn/layers.h"
#include "brigade/nn/norm.h"

namespace brigade::models {

struct ResNetConfig {
  std::vector<int64_t> layers = {2, 2, 2, 2};  // blocks per stage (4 stages)
  bool bottleneck = false;                     // Bottleneck (expansion 4) instead of BasicBlock
  int64_t num_classes = 10;
  int64_t in_channels = 1;  // 1 for Fashion-MNIST, 3 for RGB
  int64_t width = 64;       // channels of the stem and of stage 1 (planes)
  bool small_input = true;  // 3x3 stride-1 stem, no max-pool
  // Activations in channels-last (N, H, W, C) between the stem and the pooling: every conv and
  // batch norm runs its NHWC form (ops::Conv2dParams::channels_last), the max-pool and the
  // average pool see NCHW views. Same parameters, buffers and outputs (to rounding).
  bool channels_last = false;
  double bn_eps = 1e-5;
  double bn_momentum = 0.1;
};
ResNetConfig resnet18_config(int64_t num_classes = 10, int64_t in_channels = 1, bool small_input = true);
ResNetConfig resnet50_config(int64_t num_classes = 10, int64_t in_channels = 1, bool small_input = true);

// A residual block: BasicBlock or Bottleneck. An nn::Block: forward runs the plans' hooks and
// the body directly or through fn::checkpoint (Block::run); the body draws no random numbers.
class ResBlock : public nn::Block {
 public:
  // (N, in, H, W) -> (N, out, H / s, W / s), through Block::run
  Tensor forward(const Tensor& x) const;

 protected:
  virtual Tensor body(const Tensor& x) const = 0;
};

// downsample.0 (1x1 conv with the block's stride) and downsample.1 (BatchNorm2d).
class Downsample : public nn::Module {
 public:
  Downsample(int64_t in, int64_t out, int64_t stride, double eps, double momentum);
  Tensor forward(const Tensor& x) const;
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::BatchNorm2d> bn;
};

class BasicBlock : public ResBlock {
 public:
  static constexpr int64_t kExpansion = 1;
  BasicBlock(int64_t in, int64_t planes, int64_t stride, const ResNetConfig& c);
  std::shared_ptr<nn::Conv2d> conv1, conv2;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2;
  std::shared_ptr<Downsample> downsample;  // null when the shapes already match

 protected:
  Tensor body(const Tensor& x) const override;
};

class Bottleneck : public ResBlock {
 public:
  static constexpr int64_t kExpansion = 4;
  Bottleneck(int64_t in, int64_t planes, int64_t stride, const ResNetConfig& c);
  std::shared_ptr<nn::Conv2d> conv1, conv2, conv3;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2, bn3;
  std::shared_ptr<Downsample> downsample;

 protected:
  Tensor body(const Tensor& x) const override;
};

class ResNet : public nn::Module {
 public:
  explicit ResNet(const ResNetConfig& c);
  void init_weights(Generator& gen);                              // see the file comment
  Tensor forward(const Tensor& images) const;                     // (N, C, H, W) -> logits (N, classes)
  Tensor loss(const Tensor& images, const Tensor& labels) const;  // mean cross-entropy, 0-d; labels (N) i32/i64
  // BatchNorm buffers with torchvision names ("bn1.running_mean", "layer1.0.bn1.running_var",
  // "layer2.0.downsample.1.num_batches_tracked", ...), in module order. The tensors are the
  // live buffers: copy_ into them to load a checkpoint.
  nn::NamedTensors named_buffers() const;
  // named_parameters() followed by named_buffers(): a torchvision state_dict's keys.
  nn::NamedTensors state_dict() const;
  const ResNetConfig& config() const { return cfg_; }
  // FLOPs of one training step per image of side x side pixels: 3 x the forward's 2 FLOPs per
  // multiply-add of every convolution and the classifier (BatchNorm, ReLU, pooling and the
  // residual adds left out).
  double flops_per_image(int64_t side) const;

  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::BatchNorm2d> bn1;
  std::shared_ptr<nn::MaxPool2d> maxpool;                         // null with small_input
  std::vector<std::shared_ptr<nn::ModuleList<ResBlock>>> stages;  // layer1..layer4
  std::shared_ptr<nn::AdaptiveAvgPool2d> avgpool;
  std::shared_ptr<nn::Linear> fc;

 private:
  ResNetConfig cfg_;
  std::vector<std::pair<std::string, std::shared_ptr<nn::BatchNorm2d>>> bns_;  // name prefix, layer
  std::vector<std::shared_ptr<nn::Conv2d>> convs_;                             // parameter order
};

// torchvision.models.resnet18 / resnet50 with this project's defaults (see ResNetConfig).
std::shared_ptr<ResNet> resnet18(int64_t num_classes = 10, int64_t in_channels = 1, bool small_input = true);
std::shared_ptr<ResNet> resnet50(int64_t num_classes = 10, int64_t in_channels = 1, bool small_input = true);

}  // namespace brigade::models
