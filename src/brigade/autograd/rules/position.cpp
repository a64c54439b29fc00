// Derivative rules of the position functions: RoPE, roll2d and Swin's relative position bias.
#include "brigade/autograd/rules.h"

namespace brigade::fn {

namespace {

struct RopeBackward : Node {
  ops::RopeSpec spec;
  int64_t pos0 = 0;
  const char* name() const override { return "RopeBackward"; }
  // forward: y = rotate(x, +angle)  ->  gx = rotate(g, -angle)
  std::vector<Tensor> backward(const Tensor& g) override { return {ops::rope_backward(g, spec, pos0)}; }
};

struct Roll2dBackward : Node {
  int64_t sh = 0, sw = 0;
  const char* name() const override { return "Roll2dBackward"; }
  // forward: out = roll(x, (sh, sw)), a permutation; its inverse is the opposite roll
  std::vector<Tensor> backward(const Tensor& g) override { return {ops::roll2d(g, -sh, -sw)}; }
};

}  // namespace

Tensor rope(const Tensor& x0, const ops::RopeSpec& spec, int64_t pos0) {
  const Tensor x = fn::cast(x0, policy_dtype(amp::Op::Elementwise, {&x0}));
  auto n = std::make_shared<RopeBackward>();
  n->spec = spec;
  n->pos0 = pos0;
  return record(ops::rope(x, spec, pos0), n, {x});
}

Tensor rope(const Tensor& x, double theta, int64_t pos0) { return fn::rope(x, ops::RopeSpec{.theta = theta}, pos0); }

Tensor roll2d(const Tensor& x, int64_t shift_h, int64_t shift_w) {
  auto n = std::make_shared<Roll2dBackward>();
  n->sh = shift_h;
  n->sw = shift_w;
  return record(ops::roll2d(x, shift_h, shift_w), n, {x});
}

Tensor relative_position_bias(const Tensor& table, const Tensor& index) {
  BRIGADE_CHECK(table.defined() && table.dim() == 2 && index.defined() && index.dim() == 1, ShapeError,
                "relative_position_bias: table must be ((2ws-1)^2, NH) and index (N*N), got {} and {}", shape_of(table),
                shape_of(index));
  int64_t N = 0;
  while (N * N < index.size(0)) ++N;
  BRIGADE_CHECK(N * N == index.size(0), ShapeError, "relative_position_bias: index length {} is not N*N",
                index.size(0));
  const int64_t NH = table.size(1);
  const Tensor e = reshape(embedding(table, index), {N, N, NH});  // (N, N, NH)
  return transpose(transpose(e, 1, 2), 0, 1);                     // (NH, N, N)
}

}  // namespace brigade::fn
