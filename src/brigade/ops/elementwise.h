// Elementwise ops with numpy/torch broadcasting, in-place updates, and the activations.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "brigade/core/tensor.h"

namespace brigade::ops {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add_scalar(const Tensor& a, double s);
Tensor mul_scalar(const Tensor& a, double s);
Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor sqrt(const Tensor& a);
// In place, same shape (or src broadcastable to dst): dst += alpha * src.
void add_(const Tensor& dst, const Tensor& src, double alpha = 1.0);
void mul_scalar_(const Tensor& dst, double s);
Shape broadcast_shapes(const Shape& a, const Shape& b);  // ShapeError if incompatible
// Sums g (shape broadcast_shapes(shape, ...)) down to `shape`: the backward of broadcasting.
Tensor sum_to(const Tensor& g, const Shape& shape);

// ---------------- GELU, tanh approximation (Hendrycks & Gimpel 2016; torch approximate='tanh')
Tensor gelu(const Tensor& x);
Tensor gelu_backward(const Tensor& gy, const Tensor& x);

// ---------------- exact GELU: y = 0.5 x (1 + erf(x / sqrt 2)), same shape and dtype as x.
Tensor gelu_erf(const Tensor& x);
// gx = gy * (Phi(x) + x phi(x)), Phi the standard normal cdf, phi its density.
Tensor gelu_erf_backward(const Tensor& gy, const Tensor& x);

// ---------------- SiLU / swish (Elfwing et al. 2017): y = x * sigmoid(x). SwiGLU is
// silu(gate) * up, composed from silu and mul.
Tensor silu(const Tensor& x);
// gx = gy * s * (1 + x (1 - s)), s = sigmoid(x).
Tensor silu_backward(const Tensor& gy, const Tensor& x);

// ---------------- ReLU: y = max(x, 0); relu_backward(gy, y) = gy where y > 0, else 0.
Tensor relu(const Tensor& x);
Tensor relu_backward(const Tensor& gy, const Tensor& y);
// The residual add and ReLU of a ResNet block in one pass: y = max(a + b, 0) (NaN passes) on a and
// b of one shape, in the dtype an add of them gives. Bitwise relu(add(a, b)): the sum is rounded
// once and rounding keeps the sign. Its backward is relu_backward(gy, y), the same for a and b.
Tensor add_relu(const Tensor& a, const Tensor& b);

// ---------------- sigmoid (torch.sigmoid): y = 1 / (1 + exp(-x)); the gate of
// squeeze-and-excitation. sigmoid_backward(gy, y) = gy y (1 - y) (from the output).
Tensor sigmoid(const Tensor& x);
Tensor sigmoid_backward(const Tensor& gy, const Tensor& y);

// ---------------- reciprocal (torch.reciprocal): y = 1 / x; ALIGN divides its logits by the
// learned temperature. reciprocal_backward(gy, y) = -gy y^2 (from the output).
Tensor reciprocal(const Tensor& x);
Tensor reciprocal_backward(const Tensor& gy, const Tensor& y);

}  // namespace brigade::ops
