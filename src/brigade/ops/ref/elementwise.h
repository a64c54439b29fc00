// Scalar oracle of the elementwise ops (ops/elementwise.h): broadcasting binary / unary ops,
// in-place axpy / scale, and the activations with their backwards.
#pragma once
#include "brigade/ops/ref/common.h"

namespace brigade::ops::ref {

template <typename S>
S apply_binary(BinaryOp op, S x, S y) {
  switch (op) {
    case BinaryOp::Add: return x + y;
    case BinaryOp::Sub: return x - y;
    case BinaryOp::Mul: return x * y;
    case BinaryOp::Div: return x / y;
  }
  return S(0);
}

template <typename S>
S apply_unary(UnaryOp op, S x, double s) {
  switch (op) {
    case UnaryOp::Neg: return -x;
    case UnaryOp::Exp: return std::exp(x);
    case UnaryOp::Log: return std::log(x);
    case UnaryOp::Tanh: return std::tanh(x);
    case UnaryOp::Sqrt: return std::sqrt(x);
    case UnaryOp::AddScalar: return x + S(s);
    case UnaryOp::MulScalar: return x * S(s);
  }
  return S(0);
}

// out (contiguous, shape) = a op b; a and b are read through strides over `shape`
// (stride 0 on broadcast dims).
template <typename S>
void binary(BinaryOp op, int nd, const int64_t* shape, const S* a, const int64_t* sa, const S* b, const int64_t* sb,
            S* out) {
  const int64_t n = numel_of(nd, shape);
  for (int64_t i = 0; i < n; ++i)
    out[i] = apply_binary(op, a[strided_offset(i, nd, shape, sa)], b[strided_offset(i, nd, shape, sb)]);
}

// out (contiguous) = f(a), a read through strides.
template <typename S>
void unary(UnaryOp op, double s, int nd, const int64_t* shape, const S* a, const int64_t* sa, S* out) {
  const int64_t n = numel_of(nd, shape);
  for (int64_t i = 0; i < n; ++i) out[i] = apply_unary(op, a[strided_offset(i, nd, shape, sa)], s);
}

// dst += alpha * src over `shape`, both strided (src may broadcast with stride 0).
template <typename S>
void axpy(int nd, const int64_t* shape, S* dst, const int64_t* sd, const S* src, const int64_t* ss, double alpha) {
  const int64_t n = numel_of(nd, shape);
  for (int64_t i = 0; i < n; ++i)
    dst[strided_offset(i, nd, shape, sd)] += S(alpha) * src[strided_offset(i, nd, shape, ss)];
}

// dst *= s over `shape`, strided.
template <typename S>
void scale(int nd, const int64_t* shape, S* dst, const int64_t* sd, double s) {
  const int64_t n = numel_of(nd, shape);
  for (int64_t i = 0; i < n; ++i) dst[strided_offset(i, nd, shape, sd)] *= S(s);
}

// GELU, tanh approximation (Hendrycks & Gimpel 2016; torch gelu(approximate='tanh')):
//   y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
template <typename S>
void gelu(int64_t n, const S* x, S* y) {
  const S k = S(0.7978845608028654), a = S(0.044715);
  for (int64_t i = 0; i < n; ++i) {
    const S u = k * (x[i] + a * x[i] * x[i] * x[i]);
    y[i] = S(0.5) * x[i] * (S(1) + std::tanh(u));
  }
}
// Backward of the line above: dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3a x^2), t = tanh(u).
template <typename S>
void gelu_backward(int64_t n, const S* gy, const S* x, S* gx) {
  const S k = S(0.7978845608028654), a = S(0.044715);
  for (int64_t i = 0; i < n; ++i) {
    const S xi = x[i];
    const S t = std::tanh(k * (xi + a * xi * xi * xi));
    const S d = S(0.5) * (S(1) + t) + S(0.5) * xi * (S(1) - t * t) * k * (S(1) + S(3) * a * xi * xi);
    gx[i] = gy[i] * d;
  }
}

// SiLU: y = x / (1 + exp(-x)).
template <typename S>
void silu(int64_t n, const S* x, S* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (S(1) + std::exp(-x[i]));
}
// gx = gy * s * (1 + x (1 - s)), s = 1 / (1 + exp(-x)).
template <typename S>
void silu_backward(int64_t n, const S* gy, const S* x, S* gx) {
  for (int64_t i = 0; i < n; ++i) {
    const S s = S(1) / (S(1) + std::exp(-x[i]));
    gx[i] = gy[i] * s * (S(1) + x[i] * (S(1) - s));
  }
}

template <class S>
void gelu_erf(int64_t n, const S* x, S* y) {
  const S r = S(0.7071067811865476);  // 1 / sqrt 2
  for (int64_t i = 0; i < n; ++i) y[i] = S(0.5) * x[i] * (S(1) + std::erf(x[i] * r));
}
template <class S>
void gelu_erf_backward(int64_t n, const S* gy, const S* x, S* gx) {
  const S r = S(0.7071067811865476), c = S(0.3989422804014327);  // 1 / sqrt 2, 1 / sqrt(2 pi)
  for (int64_t i = 0; i < n; ++i) {
    const S cdf = S(0.5) * (S(1) + std::erf(x[i] * r));
    const S pdf = c * std::exp(S(-0.5) * x[i] * x[i]);
    gx[i] = gy[i] * (cdf + x[i] * pdf);
  }
}

template <typename T>
void relu(int64_t n, const T* x, T* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > T(0) ? x[i] : (std::isnan(x[i]) ? x[i] : T(0));
}
template <typename T>
void add_relu(int64_t n, const T* a, const T* b, T* y) {
  for (int64_t i = 0; i < n; ++i) {
    const T s = a[i] + b[i];
    y[i] = s > T(0) ? s : (std::isnan(s) ? s : T(0));
  }
}
template <typename T>
void relu_backward(int64_t n, const T* gy, const T* y, T* gx) {
  for (int64_t i = 0; i < n; ++i) gx[i] = y[i] > T(0) ? gy[i] : T(0);
}

template <typename T>
void sigmoid(int64_t n, const T* x, T* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = T(1) / (T(1) + std::exp(-x[i]));
}
// gx = gy y (1 - y)
template <typename T>
void sigmoid_backward(int64_t n, const T* gy, const T* y, T* gx) {
  for (int64_t i = 0; i < n; ++i) gx[i] = gy[i] * y[i] * (T(1) - y[i]);
}

template <typename T>
void reciprocal(int64_t n, const T* x, T* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = T(1) / x[i];
}
// gx = -gy y^2
template <typename T>
void reciprocal_backward(int64_t n, const T* gy, const T* y, T* gx) {
  for (int64_t i = 0; i < n; ++i) gx[i] = -(gy[i] * y[i] * y[i]);
}

}  // namespace brigade::ops::ref
