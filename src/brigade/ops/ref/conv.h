// Scalar oracle of the convolution-family ops (ops/conv.h): conv2d, pooling and patchify.
#pragma once
#include "brigade/ops/ref/common.h"

namespace brigade::ops::ref {

// A convolution's sizes: C input channels in all, w (O, C / groups, KH, KW), padding pt pb pl pr
// (top, bottom, left, right).
struct ConvGeom {
  int64_t N, C, H, W, O, KH, KW, stride, pt, pb, pl, pr, groups, OH, OW;
  int64_t Cg() const { return C / groups; }  // input channels per group
  int64_t Og() const { return O / groups; }  // output channels per group
};
inline bool is_depthwise(const ConvGeom& g) { return g.groups > 1 && g.groups == g.C && g.O == g.C; }

// y (N, O, OH, OW) = sum_{cg, kh, kw} x[n, c0 + cg, oh s - pt + kh, ow s - pl + kw] w[o, cg, kh, kw] + b[o]
// with c0 = (o / Og) Cg the first input channel of o's group.
template <typename T>
void conv2d(const ConvGeom& g, const T* x, const T* w, const T* b, T* y) {
  const int64_t Cg = g.Cg(), Og = g.Og();
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t o = 0; o < g.O; ++o)
      for (int64_t oh = 0; oh < g.OH; ++oh)
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          const int64_t c0 = (o / Og) * Cg;
          double acc = b ? double(b[o]) : 0.0;
          for (int64_t cg = 0; cg < Cg; ++cg)
            for (int64_t kh = 0; kh < g.KH; ++kh) {
              const int64_t ih = oh * g.stride - g.pt + kh;
              if (ih < 0 || ih >= g.H) continue;
              for (int64_t kw = 0; kw < g.KW; ++kw) {
                const int64_t iw = ow * g.stride - g.pl + kw;
                if (iw < 0 || iw >= g.W) continue;
                acc += double(x[((n * g.C + c0 + cg) * g.H + ih) * g.W + iw]) *
                       double(w[((o * Cg + cg) * g.KH + kh) * g.KW + kw]);
              }
            }
          y[((n * g.O + o) * g.OH + oh) * g.OW + ow] = T(acc);
        }
}

// gx (N, C, H, W), gw (O, C / groups, KH, KW), gb (O); any may be null.
template <typename T>
void conv2d_backward(const ConvGeom& g, const T* gy, const T* x, const T* w, T* gx, T* gw, T* gb) {
  const int64_t Cg = g.Cg(), Og = g.Og();
  auto GY = [&](int64_t n, int64_t o, int64_t oh, int64_t ow) {
    return double(gy[((n * g.O + o) * g.OH + oh) * g.OW + ow]);
  };
  if (gx) {
    for (int64_t n = 0; n < g.N; ++n)
      for (int64_t c = 0; c < g.C; ++c)
        for (int64_t ih = 0; ih < g.H; ++ih)
          for (int64_t iw = 0; iw < g.W; ++iw) {
            const int64_t grp = c / Cg, cg = c % Cg;
            double acc = 0;
            for (int64_t o = grp * Og; o < (grp + 1) * Og; ++o)
              for (int64_t kh = 0; kh < g.KH; ++kh) {
                const int64_t th = ih + g.pt - kh;
                if (th < 0 || th % g.stride != 0 || th / g.stride >= g.OH) continue;
                for (int64_t kw = 0; kw < g.KW; ++kw) {
                  const int64_t tw = iw + g.pl - kw;
                  if (tw < 0 || tw % g.stride != 0 || tw / g.stride >= g.OW) continue;
                  acc += GY(n, o, th / g.stride, tw / g.stride) * double(w[((o * Cg + cg) * g.KH + kh) * g.KW + kw]);
                }
              }
            gx[((n * g.C + c) * g.H + ih) * g.W + iw] = T(acc);
          }
  }
  if (gw) {
    for (int64_t o = 0; o < g.O; ++o)
      for (int64_t cg = 0; cg < Cg; ++cg)
        for (int64_t kh = 0; kh < g.KH; ++kh)
          for (int64_t kw = 0; kw < g.KW; ++kw) {
            const int64_t c = (o / Og) * Cg + cg;
            double acc = 0;
            for (int64_t n = 0; n < g.N; ++n)
              for (int64_t oh = 0; oh < g.OH; ++oh) {
                const int64_t ih = oh * g.stride - g.pt + kh;
                if (ih < 0 || ih >= g.H) continue;
                for (int64_t ow = 0; ow < g.OW; ++ow) {
                  const int64_t iw = ow * g.stride - g.pl + kw;
                  if (iw < 0 || iw >= g.W) continue;
                  acc += GY(n, o, oh, ow) * double(x[((n * g.C + c) * g.H + ih) * g.W + iw]);
                }
              }
            gw[((o * Cg + cg) * g.KH + kh) * g.KW + kw] = T(acc);
          }
  }
  if (gb) {
    for (int64_t o = 0; o < g.O; ++o) {
      double acc = 0;
      for (int64_t n = 0; n < g.N; ++n)
        for (int64_t i = 0; i < g.OH * g.OW; ++i) acc += double(gy[(n * g.O + o) * g.OH * g.OW + i]);
      gb[o] = T(acc);
    }
  }
}

// One (H, W) plane -> (OH, OW): max and the flat index of the first maximum (NaN wins).
template <typename T>
void max_pool2d_plane(int64_t H, int64_t W, int64_t k, int64_t s, int64_t p, int64_t OH, int64_t OW, const T* x, T* y,
                      int64_t* idx) {
  for (int64_t oh = 0; oh < OH; ++oh)
    for (int64_t ow = 0; ow < OW; ++ow) {
      T best = -std::numeric_limits<T>::infinity();
      int64_t bi = -1;
      for (int64_t kh = 0; kh < k; ++kh) {
        const int64_t ih = oh * s - p + kh;
        if (ih < 0 || ih >= H) continue;
        for (int64_t kw = 0; kw < k; ++kw) {
          const int64_t iw = ow * s - p + kw;
          if (iw < 0 || iw >= W) continue;
          const T v = x[ih * W + iw];
          if (bi < 0 || v > best || std::isnan(v)) {
            best = v;
            bi = ih * W + iw;
            if (std::isnan(v)) break;
          }
        }
        if (bi >= 0 && std::isnan(best)) break;
      }
      y[oh * OW + ow] = best;
      idx[oh * OW + ow] = bi;
    }
}
template <typename T>
void max_pool2d_backward_plane(int64_t HW, int64_t OHW, const T* gy, const int64_t* idx, T* gx) {
  std::fill(gx, gx + HW, T(0));
  for (int64_t i = 0; i < OHW; ++i)
    if (idx[i] >= 0) gx[idx[i]] += gy[i];
}

// torch's avg_pool2d divisor with count_include_pad: the window clipped to [-p, H + p).
inline int64_t avg_pool_divisor(int64_t oh, int64_t ow, int64_t H, int64_t W, int64_t k, int64_t s, int64_t p) {
  const int64_t hs = oh * s - p, ws = ow * s - p;
  const int64_t he = std::min(hs + k, H + p), we = std::min(ws + k, W + p);
  return (he - hs) * (we - ws);
}
template <typename T>
void avg_pool2d_plane(int64_t H, int64_t W, int64_t k, int64_t s, int64_t p, int64_t OH, int64_t OW, const T* x, T* y) {
  for (int64_t oh = 0; oh < OH; ++oh)
    for (int64_t ow = 0; ow < OW; ++ow) {
      double acc = 0;
      for (int64_t kh = 0; kh < k; ++kh) {
        const int64_t ih = oh * s - p + kh;
        if (ih < 0 || ih >= H) continue;
        for (int64_t kw = 0; kw < k; ++kw) {
          const int64_t iw = ow * s - p + kw;
          if (iw >= 0 && iw < W) acc += double(x[ih * W + iw]);
        }
      }
      y[oh * OW + ow] = T(acc / double(avg_pool_divisor(oh, ow, H, W, k, s, p)));
    }
}
template <typename T>
void avg_pool2d_backward_plane(int64_t H, int64_t W, int64_t k, int64_t s, int64_t p, int64_t OH, int64_t OW,
                               const T* gy, T* gx) {
  for (int64_t ih = 0; ih < H; ++ih)
    for (int64_t iw = 0; iw < W; ++iw) {
      double acc = 0;
      for (int64_t oh = 0; oh < OH; ++oh) {
        const int64_t kh = ih - (oh * s - p);
        if (kh < 0 || kh >= k) continue;
        for (int64_t ow = 0; ow < OW; ++ow) {
          const int64_t kw = iw - (ow * s - p);
          if (kw < 0 || kw >= k) continue;
          acc += double(gy[oh * OW + ow]) / double(avg_pool_divisor(oh, ow, H, W, k, s, p));
        }
      }
      gx[ih * W + iw] = T(acc);
    }
}

// x (N, C, H, W) contiguous -> y (N, P, C*p*p); patchify_backward runs the inverse (y -> x).
// patchify_map calls move(x index, y index) for every element, in y's order.
template <class Move>
void patchify_map(int64_t N, int64_t C, int64_t H, int64_t W, int64_t p, Move move) {
  const int64_t PW = W / p, P = (H / p) * PW, F = C * p * p;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t pi = 0; pi < P; ++pi)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t i = 0; i < p; ++i)
          for (int64_t j = 0; j < p; ++j)
            move(((n * C + c) * H + (pi / PW) * p + i) * W + (pi % PW) * p + j, (n * P + pi) * F + (c * p + i) * p + j);
}
template <class S>
void patchify(int64_t N, int64_t C, int64_t H, int64_t W, int64_t p, const S* x, S* y) {
  patchify_map(N, C, H, W, p, [=](int64_t xi, int64_t yi) { y[yi] = x[xi]; });
}
template <class S>
void patchify_backward(int64_t N, int64_t C, int64_t H, int64_t W, int64_t p, const S* g, S* gx) {
  patchify_map(N, C, H, W, p, [=](int64_t xi, int64_t yi) { gx[xi] = g[yi]; });
}

}  // namespace brigade::ops::ref
