// Derivative rules of the convolution family: conv2d (a GEMM for selective recompute), pooling,
// patchify.
#include "brigade/autograd/rules.h"

namespace brigade::fn {

namespace {

struct Conv2dBackward : Node {
  Tensor x, w;
  ops::Conv2dParams p;
  bool has_bias = false;
  const char* name() const override { return "Conv2dBackward"; }
  // forward: y = conv2d(x, w) + bias
  std::vector<Tensor> backward(const Tensor& g) override {
    ops::Conv2dGrads r =
        ops::conv2d_backward(g, x, w, p, wants(*this, 0), wants(*this, 1), has_bias && wants(*this, 2));
    std::vector<Tensor> out{r.gx, r.gw};
    if (has_bias) out.push_back(r.gb);
    return out;
  }
  void release() override { x = w = Tensor(); }
};

struct MaxPool2dBackward : Node {
  Tensor idx;
  Shape x_shape;
  bool channels_last = false;
  const char* name() const override { return "MaxPool2dBackward"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    return {ops::max_pool2d_backward(g, idx, x_shape, channels_last)};
  }
  void release() override { idx = Tensor(); }
};

struct AvgPool2dBackward : Node {
  Shape x_shape;
  int64_t kernel = 1, stride = 1, padding = 0;
  const char* name() const override { return "AvgPool2dBackward"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    return {ops::avg_pool2d_backward(g, x_shape, kernel, stride, padding)};
  }
};

struct GlobalAvgPoolBackward : Node {
  Shape x_shape;
  const char* name() const override { return "GlobalAvgPoolBackward"; }
  // forward: y[n, c] = mean over (H, W) of x[n, c]   -> gx = g / (H W) broadcast over (H, W)
  std::vector<Tensor> backward(const Tensor& g) override {
    const double inv = 1.0 / double(x_shape[2] * x_shape[3]);
    Tensor gx = ops::add(Tensor::zeros(x_shape, g.dtype()), g);  // (N, C, H, W)
    return {ops::mul_scalar(gx, inv)};
  }
};

struct PatchifyBackward : Node {
  Shape x_shape;
  int64_t p = 1;
  const char* name() const override { return "PatchifyBackward"; }
  // forward: out = patchify(x, p), a permutation of x
  std::vector<Tensor> backward(const Tensor& g) override { return {ops::patchify_backward(g, x_shape, p)}; }
};

}  // namespace

Tensor conv2d(const Tensor& x0, const Tensor& w0, const Tensor& b0, int64_t stride, int64_t padding) {
  return fn::conv2d(x0, w0, b0, ops::Conv2dParams::symmetric(stride, padding));
}

Tensor conv2d(const Tensor& x0, const Tensor& w0, const Tensor& b0, const ops::Conv2dParams& p) {
  const DType dt = policy_dtype(amp::Op::Conv, {&x0, &w0});
  const Tensor x = cast(x0, dt), w = cast(w0, dt), bias = cast(b0, dt);
  std::vector<Tensor> inputs{x, w};
  if (bias.defined()) inputs.push_back(bias);
  auto n = std::make_shared<Conv2dBackward>();
  if (needs_grad(inputs)) {
    n->x = x;
    n->w = w;
    n->p = p;
    n->has_bias = bias.defined();
  }
  // a GEMM: a selective recompute keeps its output (fn::gemm_output)
  return record(gemm_output([&] { return ops::conv2d(x, w, bias, p); }), n, inputs);
}

Tensor max_pool2d(const Tensor& x0, int64_t kernel, int64_t stride, int64_t padding, bool channels_last) {
  const Tensor x = cast(x0, policy_dtype(amp::Op::Pool, {&x0}));
  ops::MaxPoolOut r = ops::max_pool2d(x, kernel, stride, padding, channels_last);
  auto n = std::make_shared<MaxPool2dBackward>();
  if (needs_grad({x})) {
    n->idx = r.idx;
    n->x_shape = x.shape();
    n->channels_last = channels_last;
  }
  return record(r.y, n, {x});
}

Tensor avg_pool2d(const Tensor& x0, int64_t kernel, int64_t stride, int64_t padding) {
  const Tensor x = cast(x0, policy_dtype(amp::Op::Pool, {&x0}));
  auto n = std::make_shared<AvgPool2dBackward>();
  n->x_shape = x.shape();
  n->kernel = kernel;
  n->stride = stride;
  n->padding = padding;
  return record(ops::avg_pool2d(x, kernel, stride, padding), n, {x});
}

Tensor adaptive_avg_pool2d(const Tensor& x0) {
  BRIGADE_CHECK(x0.defined() && x0.dim() == 4, ShapeError, "adaptive_avg_pool2d: x must be 4-D (N, C, H, W), got {}",
                x0.defined() ? x0.str() : "undefined");
  const Tensor x = cast(x0, policy_dtype(amp::Op::Reduction, {&x0}));
  auto n = std::make_shared<GlobalAvgPoolBackward>();
  n->x_shape = x.shape();
  Tensor y = ops::mean(x, {2, 3}, true);  // (N, C, 1, 1)
  return record(y, n, {x});
}

Tensor patchify(const Tensor& x, int64_t p) {
  auto n = std::make_shared<PatchifyBackward>();
  n->x_shape = x.shape();
  n->p = p;
  return record(ops::patchify(x, p), n, {x});
}

}  // namespace brigade::fn
