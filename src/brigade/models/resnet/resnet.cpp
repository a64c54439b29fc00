// ResNet; see resnet.h. Model code: fn:: and nn:: calls only.
#include "brigade/models/resnet/resnet.h"

#include <cmath>

#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"

namespace brigade::models {

namespace F = brigade::fn;

ResNetConfig resnet18_config(int64_t num_classes, int64_t in_channels, bool small_input) {
  ResNetConfig c;
  c.layers = {2, 2, 2, 2};
  c.bottleneck = false;
  c.num_classes = num_classes;
  c.in_channels = in_channels;
  c.small_input = small_input;
  return c;
}
ResNetConfig resnet50_config(int64_t num_classes, int64_t in_channels, bool small_input) {
  ResNetConfig c = resnet18_config(num_classes, in_channels, small_input);
  c.layers = {3, 4, 6, 3};
  c.bottleneck = true;
  return c;
}

Downsample::Downsample(int64_t in, int64_t out, int64_t stride, double eps, double momentum) {
  conv = register_module("0", std::make_shared<nn::Conv2d>(in, out, 1, stride, 0));
  bn = register_module("1", std::make_shared<nn::BatchNorm2d>(out, eps, momentum));
}
Tensor Downsample::forward(const Tensor& x) const { return bn->forward(conv->forward(x)); }

Tensor ResBlock::forward(const Tensor& x) const {
  return run({x}, [this](const std::vector<Tensor>& in) { return body(in[0]); });  // no dropout: nothing to replay
}

BasicBlock::BasicBlock(int64_t in, int64_t planes, int64_t stride, const ResNetConfig& c) {
  conv1 = register_module("conv1", std::make_shared<nn::Conv2d>(in, planes, 3, stride, 1));
  bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(planes, c.bn_eps, c.bn_momentum));
  conv2 = register_module("conv2", std::make_shared<nn::Conv2d>(planes, planes, 3, 1, 1));
  bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2d>(planes, c.bn_eps, c.bn_momentum));
  if (stride != 1 || in != planes * kExpansion)
    downsample = register_module(
        "downsample", std::make_shared<Downsample>(in, planes * kExpansion, stride, c.bn_eps, c.bn_momentum));
}
Tensor BasicBlock::body(const Tensor& x) const {
  Tensor out = F::relu(bn1->forward(conv1->forward(x)));  // (N, planes, H', W')
  out = bn2->forward(conv2->forward(out));                // (N, planes, H', W')
  const Tensor identity = downsample ? downsample->forward(x) : x;
  return F::add_relu(out, identity);  // relu(out + identity) in one pass
}

Bottleneck::Bottleneck(int64_t in, int64_t planes, int64_t stride, const ResNetConfig& c) {
  conv1 = register_module("conv1", std::make_shared<nn::Conv2d>(in, planes, 1, 1, 0));
  bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(planes, c.bn_eps, c.bn_momentum));
  conv2 = register_module("conv2", std::make_shared<nn::Conv2d>(planes, planes, 3, stride, 1));
  bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2d>(planes, c.bn_eps, c.bn_momentum));
  conv3 = register_module("conv3", std::make_shared<nn::Conv2d>(planes, planes * kExpansion, 1, 1, 0));
  bn3 = register_module("bn3", std::make_shared<nn::BatchNorm2d>(planes * kExpansion, c.bn_eps, c.bn_momentum));
  if (stride != 1 || in != planes * kExpansion)
    downsample = register_module(
        "downsample", std::make_shared<Downsample>(in, planes * kExpansion, stride, c.bn_eps, c.bn_momentum));
}
Tensor Bottleneck::body(const Tensor& x) const {
  Tensor out = F::relu(bn1->forward(conv1->forward(x)));  // (N, planes, H, W)
  out = F::relu(bn2->forward(conv2->forward(out)));       // (N, planes, H', W')
  out = bn3->forward(conv3->forward(out));                // (N, 4 planes, H', W')
  const Tensor identity = downsample ? downsample->forward(x) : x;
  return F::add_relu(out, identity);  // relu(out + identity) in one pass
}

ResNet::ResNet(const ResNetConfig& c) : cfg_(c) {
  BRIGADE_CHECK(c.layers.size() == 4, ConfigError, "ResNet: layers must list 4 stages, got {}", c.layers.size());
  for (int64_t n : c.layers) BRIGADE_CHECK(n >= 1, ConfigError, "ResNet: every stage needs >= 1 block, got {}", n);
  BRIGADE_CHECK(c.num_classes >= 1 && c.in_channels >= 1 && c.width >= 1, ConfigError,
                "ResNet: num_classes {}, in_channels {} and width {} must be >= 1", c.num_classes, c.in_channels,
                c.width);
  if (c.small_input)
    conv1 = register_module("conv1", std::make_shared<nn::Conv2d>(c.in_channels, c.width, 3, 1, 1));
  else
    conv1 = register_module("conv1", std::make_shared<nn::Conv2d>(c.in_channels, c.width, 7, 2, 3));
  bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(c.width, c.bn_eps, c.bn_momentum));
  bns_.emplace_back("bn1.", bn1);
  convs_.push_back(conv1);
  if (!c.small_input) {
    maxpool = register_module("maxpool", std::make_shared<nn::MaxPool2d>(3, 2, 1));
    maxpool->channels_last = c.channels_last;
  }
  const int64_t expansion = c.bottleneck ? Bottleneck::kExpansion : BasicBlock::kExpansion;
  int64_t in = c.width;
  for (int64_t s = 0; s < 4; ++s) {
    const std::string name = "layer" + std::to_string(s + 1);
    auto stage = register_module(name, std::make_shared<nn::ModuleList<ResBlock>>());
    const int64_t planes = c.width << s;
    for (int64_t j = 0; j < c.layers[size_t(s)]; ++j) {
      const int64_t stride = (j == 0 && s > 0) ? 2 : 1;
      const std::string p = name + "." + std::to_string(j) + ".";
      std::shared_ptr<Downsample> ds;
      if (c.bottleneck) {
        auto b = std::make_shared<Bottleneck>(in, planes, stride, c);
        convs_.insert(convs_.end(), {b->conv1, b->conv2, b->conv3});
        bns_.insert(bns_.end(), {{p + "bn1.", b->bn1}, {p + "bn2.", b->bn2}, {p + "bn3.", b->bn3}});
        ds = b->downsample;
        stage->push_back(b);
      } else {
        auto b = std::make_shared<BasicBlock>(in, planes, stride, c);
        convs_.insert(convs_.end(), {b->conv1, b->conv2});
        bns_.insert(bns_.end(), {{p + "bn1.", b->bn1}, {p + "bn2.", b->bn2}});
        ds = b->downsample;
        stage->push_back(b);
      }
      if (ds) {
        convs_.push_back(ds->conv);
        bns_.emplace_back(p + "downsample.1.", ds->bn);
      }
      in = planes * expansion;
    }
    stages.push_back(stage);
  }
  avgpool = register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2d>());
  fc = register_module("fc", std::make_shared<nn::Linear>(in, c.num_classes));
  name_parameters();
  for (const auto& conv : convs_) conv->params.channels_last = c.channels_last;
  for (const auto& [p, bn] : bns_) bn->channels_last = c.channels_last;
}

void ResNet::init_weights(Generator& gen) {
  for (const auto& conv : convs_) {
    const int64_t fan_out = conv->out_channels * conv->kernel * conv->kernel;
    gen.normal_(conv->weight, 0.0, std::sqrt(2.0 / double(fan_out)));
  }
  for (const auto& [p, bn] : bns_) {
    bn->weight.fill_(1.0);
    bn->bias.zero_();
    bn->running_mean.zero_();
    bn->running_var.fill_(1.0);
    bn->num_batches_tracked.zero_();
  }
  const double bound = 1.0 / std::sqrt(double(fc->weight.size(1)));
  gen.uniform_(fc->weight, -bound, bound);
  gen.uniform_(fc->bias, -bound, bound);
}

Tensor ResNet::forward(const Tensor& images) const {
  BRIGADE_CHECK(images.defined() && images.dim() == 4 && images.size(1) == cfg_.in_channels, ShapeError,
                "ResNet: images must be (N, {}, H, W), got {}", cfg_.in_channels,
                images.defined() ? shape_str(images.shape()) : "undefined");
  // channels-last: the images and the average pool go through NCHW <-> NHWC views
  const bool cl = cfg_.channels_last;
  Tensor x = F::relu(bn1->forward(conv1->forward(cl ? nn::to_channels_last(images) : images)));  // (N, width, H', W')
  if (maxpool) x = maxpool->forward(x);  // (N, width, H' / 2, W' / 2)
  for (const auto& stage : stages)
    for (const auto& block : *stage) x = block->forward(x);  // (N, 8 width expansion, h, w) at the end
  x = avgpool->forward(cl ? nn::to_channels_first(x) : x);   // (N, F, 1, 1)
  x = F::reshape(x, {x.size(0), x.size(1)});                 // (N, F)
  return fc->forward(x);                                     // (N, classes)
}

Tensor ResNet::loss(const Tensor& images, const Tensor& labels) const {
  BRIGADE_CHECK(labels.defined() && labels.dim() == 1 && labels.size(0) == images.size(0), ShapeError,
                "ResNet::loss: labels must be (N) with N = {} images, got {}", images.size(0),
                labels.defined() ? shape_str(labels.shape()) : "undefined");
  return F::cross_entropy(forward(images), labels);
}

nn::NamedTensors ResNet::named_buffers() const {
  nn::NamedTensors out;
  for (const auto& [p, bn] : bns_)
    for (auto& nt : bn->named_buffers(p)) out.push_back(std::move(nt));
  return out;
}

nn::NamedTensors ResNet::state_dict() const {
  nn::NamedTensors out = named_parameters();
  for (auto& nt : named_buffers()) out.push_back(std::move(nt));
  return out;
}

std::shared_ptr<ResNet> resnet18(int64_t num_classes, int64_t in_channels, bool small_input) {
  return std::make_shared<ResNet>(resnet18_config(num_classes, in_channels, small_input));
}
std::shared_ptr<ResNet> resnet50(int64_t num_classes, int64_t in_channels, bool small_input) {
  return std::make_shared<ResNet>(resnet50_config(num_classes, in_channels, small_input));
}

double ResNet::flops_per_image(int64_t side) const {
  const ResNetConfig& c = cfg_;
  double macs = 0.0;
  auto conv = [&](int64_t in, int64_t out, int64_t k, int64_t stride) {
    side = (side + stride - 1) / stride;  // "same" padding
    macs += double(in) * double(out) * double(k * k) * double(side * side);
  };
  int64_t ch = c.width;
  if (c.small_input) {
    conv(c.in_channels, ch, 3, 1);
  } else {
    conv(c.in_channels, ch, 7, 2);
    side = (side + 1) / 2;  // 3x3 stride-2 max-pool
  }
  const int64_t expansion = c.bottleneck ? 4 : 1;
  for (size_t stage = 0; stage < c.layers.size(); ++stage) {
    const int64_t planes = c.width << stage;
    for (int64_t b = 0; b < c.layers[stage]; ++b) {
      const int64_t stride = stage > 0 && b == 0 ? 2 : 1;
      if (c.bottleneck) {
        conv(ch, planes, 1, 1);
        conv(planes, planes, 3, stride);
        conv(planes, planes * expansion, 1, 1);
      } else {
        conv(ch, planes, 3, stride);
        conv(planes, planes, 3, 1);
      }
      if (stride != 1 || ch != planes * expansion)  // downsample: 1x1 conv with the block's stride
        macs += double(ch) * double(planes * expansion) * double(side * side);
      ch = planes * expansion;
    }
  }
  macs += double(ch) * double(c.num_classes);
  return 3.0 * 2.0 * macs;
}

}  // namespace brigade::models
