// Matmul / linear on oneDNN's matmul primitive, f32 and bf16 (f32 accumulation; bf16 or f32
// destination and bias). Transposes and batch broadcasting are memory strides, so views are not
// copied; primitives are cached by (dims, strides, dtypes, bias). An operand oneDNN would serve
// only with its reference kernel (a zero stride inside a matrix, a non-plain layout) is gathered
// into a contiguous buffer first. 16-bit GEMMs exist only where oneDNN has a non-reference kernel
// for the dtype on this CPU (gemm16_available). Oracle: ops/ref/gemm.h.
#include <dnnl.hpp>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "brigade/core/allocator.h"
#include "brigade/core/error.h"
#include "brigade/ops/cpu/kernels.h"
#include "brigade/ops/cpu/workspace.h"

namespace brigade::ops::cpu {

namespace {

using dnnl::memory;

struct MatDesc {  // a strided (batch..., rows, cols) operand
  memory::dims dims, strides;
};

dnnl::engine& engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

// Element types of one GEMM: a and b share `ab`; c (the destination) and the bias may differ.
struct Types {
  memory::data_type ab = memory::data_type::f32, c = memory::data_type::f32, bias = memory::data_type::f32;
};

memory::data_type dnnl_type(DType t) {
  switch (t) {
    case DType::BF16: return memory::data_type::bf16;
    case DType::F16: return memory::data_type::f16;
    default: return memory::data_type::f32;
  }
}
const char* type_name(memory::data_type t) {
  switch (t) {
    case memory::data_type::bf16: return "bf16";
    case memory::data_type::f16: return "f16";
    case memory::data_type::f32: return "f32";
    default: return "?";
  }
}

struct CacheEntry {
  dnnl::matmul prim;
  bool fast = true;  // false: oneDNN picked its reference implementation
  std::string impl;  // "<oneDNN impl> <ab>-><c>"
};

std::mutex g_mu;
std::unordered_map<std::string, CacheEntry>& cache() {
  static std::unordered_map<std::string, CacheEntry> c;
  return c;
}
int64_t g_created = 0;    // primitives created (cache misses), under g_mu
std::string g_last_impl;  // impl of the last GEMM run, under g_mu

void append(std::string& key, const memory::dims& v) {
  for (auto x : v) {
    key += std::to_string(x);
    key += ',';
  }
  key += ';';
}

// Size-1 dims may carry any stride; give them one oneDNN is happy with (the extent).
MatDesc sanitize(MatDesc m) {
  int64_t span = 1;
  for (size_t i = 0; i < m.dims.size(); ++i) span += (m.dims[i] - 1) * m.strides[i];
  for (size_t i = 0; i < m.dims.size(); ++i)
    if (m.dims[i] == 1) m.strides[i] = span;
  return m;
}

// Layouts oneDNN's GEMM-based matmul computes correctly and fast: the matrix has a
// unit stride in one of its two dims and a leading dimension covering the other;
// batch dims lie outside the matrix, outermost first. Anything else is gathered.
bool is_plain(const MatDesc& m) {
  const size_t nd = m.dims.size();
  const int64_t r = m.dims[nd - 2], c = m.dims[nd - 1], sr = m.strides[nd - 2], sc = m.strides[nd - 1];
  const bool row_major = (c == 1 || sc == 1) && (r == 1 || sr >= c);
  const bool col_major = (r == 1 || sr == 1) && (c == 1 || sc >= r);
  if (!row_major && !col_major) return false;
  int64_t inner = 1 + (r - 1) * sr + (c - 1) * sc;  // extent of one matrix
  for (int64_t i = int64_t(nd) - 3; i >= 0; --i) {
    if (m.dims[size_t(i)] == 1) continue;
    if (m.strides[size_t(i)] < inner) return false;
    inner = 1 + (m.dims[size_t(i)] - 1) * m.strides[size_t(i)] + inner - 1;
  }
  return true;
}

// Contiguous copy of a strided operand (for layouts oneDNN does not take fast).
// T is the element type (float, or uint16_t holding bf16/f16 bits: a bit copy).
template <typename T>
Workspace<T> gather(const MatDesc m, const T* p, MatDesc& out) {  // m by value: out may alias it
  out.dims = m.dims;
  out.strides.assign(m.dims.size(), 1);
  for (int64_t i = int64_t(m.dims.size()) - 2; i >= 0; --i)
    out.strides[size_t(i)] = out.strides[size_t(i + 1)] * std::max<int64_t>(m.dims[size_t(i + 1)], 1);
  const int nd = int(m.dims.size());
  const int64_t n = ref::numel_of(nd, m.dims.data());
  Workspace<T> buf(n);
  T* const b = buf.data();
  // Row by row over the last dim: one offset computation (divisions) per row, not per element.
  const int64_t cols = std::max<int64_t>(m.dims.back(), 1), sc = m.strides.back(), rows = n / cols;
#pragma omp parallel for schedule(static) if (n > (1 << 15))
  for (int64_t r = 0; r < rows; ++r) {
    const T* src = p + ref::strided_offset(r, nd - 1, m.dims.data(), m.strides.data());
    T* dst = b + r * cols;
    if (sc == 1) {
      std::copy(src, src + cols, dst);
    } else {
      for (int64_t j = 0; j < cols; ++j) dst[j] = src[j * sc];
    }
  }
  return buf;
}

// Caller holds g_mu.
const CacheEntry& get_primitive_locked(const MatDesc& a, const MatDesc& b, const MatDesc& c, bool bias,
                                       const Types& t) {
  std::string key;
  append(key, a.dims), append(key, a.strides), append(key, b.dims), append(key, b.strides);
  append(key, c.dims), append(key, c.strides);
  key += bias ? 'b' : 'n';
  key += std::to_string(int(t.ab)) + ':' + std::to_string(int(t.c)) + ':' + std::to_string(int(bias ? t.bias : t.c));
  auto it = cache().find(key);
  if (it != cache().end()) return it->second;
  memory::desc amd(a.dims, t.ab, a.strides), bmd(b.dims, t.ab, b.strides), cmd(c.dims, t.c, c.strides);
  CacheEntry e;
  auto finish = [&](const dnnl::matmul::primitive_desc& pd) {
    e.impl = std::string(pd.impl_info_str()) + ' ' + type_name(t.ab) + "->" + type_name(t.c);
    e.fast = std::string(pd.impl_info_str()).find("ref") == std::string::npos;
    e.prim = dnnl::matmul(pd);
  };
  if (bias) {
    memory::dims bd(c.dims.size(), 1);
    bd.back() = c.dims.back();
    memory::dims bs(c.dims.size(), bd.back());
    bs.back() = 1;
    memory::desc biasmd(bd, t.bias, bs);
    finish(dnnl::matmul::primitive_desc(dnnl::matmul::desc(amd, bmd, biasmd, cmd), engine()));
  } else {
    finish(dnnl::matmul::primitive_desc(dnnl::matmul::desc(amd, bmd, cmd), engine()));
  }
  ++g_created;
  return cache().emplace(key, std::move(e)).first->second;
}

const CacheEntry& get_primitive(const MatDesc& a, const MatDesc& b, const MatDesc& c, bool bias, const Types& t) {
  std::lock_guard<std::mutex> lock(g_mu);
  return get_primitive_locked(a, b, c, bias, t);
}

// c = a @ b (+ bias broadcast over rows); c must be a dense or row-strided matrix.
// T is the storage type of a and b (float for f32, uint16_t for bf16/f16); c and bias
// have the dtypes in `t`.
template <typename T>
void run(MatDesc a, const T* ap, MatDesc b, const T* bp, const MatDesc& c, void* cp, const void* bias,
         const Types& t = {}) {
  a = sanitize(a);
  b = sanitize(b);
  const MatDesc cs = sanitize(c);
  Workspace<T> abuf, bbuf;
  if (!is_plain(a)) abuf = gather(a, ap, a), ap = abuf.data();
  if (!is_plain(b)) bbuf = gather(b, bp, b), bp = bbuf.data();
  const CacheEntry* e = nullptr;
  try {
    e = &get_primitive(a, b, cs, bias != nullptr, t);
  } catch (const dnnl::error&) {
    e = nullptr;
  }
  if (!e || !e->fast) {  // retry with both inputs contiguous
    if (abuf.empty()) abuf = gather(a, ap, a), ap = abuf.data();
    if (bbuf.empty()) bbuf = gather(b, bp, b), bp = bbuf.data();
    e = &get_primitive(a, b, cs, bias != nullptr, t);
  }
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_last_impl = e->impl;
  }
  dnnl::stream strm(engine());
  memory am({a.dims, t.ab, a.strides}, engine(), const_cast<T*>(ap));
  memory bm({b.dims, t.ab, b.strides}, engine(), const_cast<T*>(bp));
  memory cm({cs.dims, t.c, cs.strides}, engine(), cp);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
  if (bias) {
    const size_t nd = cs.dims.size();
    memory::dims bd(nd, 1), bs(nd, cs.dims[nd - 1]);
    bd[nd - 1] = cs.dims[nd - 1];
    bs[nd - 1] = 1;
    args.emplace(DNNL_ARG_BIAS, memory({bd, t.bias, bs}, engine(), const_cast<void*>(bias)));
  }
  e->prim.execute(strm, args);
  strm.wait();
}

template <typename T>
void matmul_impl(int nbd, const int64_t* bshape, const T* a, const int64_t* a_bst, int64_t sam, int64_t sak, const T* b,
                 const int64_t* b_bst, int64_t sbk, int64_t sbn, void* c, int64_t M, int64_t N, int64_t K,
                 const Types& t) {
  const int64_t batch = ref::numel_of(nbd, bshape);
  if (batch == 0 || M == 0 || N == 0) return;
  if (K == 0) {  // +0.0 is all-zero bits in every float dtype
    std::memset(c, 0, size_t(batch * M * N) * (t.c == memory::data_type::f32 ? 4 : 2));
    return;
  }
  MatDesc A, B, C;
  for (int i = 0; i < nbd; ++i) {
    // A broadcast batch dim (stride 0) becomes a size-1 dim, which oneDNN broadcasts.
    A.dims.push_back(a_bst[i] == 0 ? 1 : bshape[i]);
    A.strides.push_back(a_bst[i]);
    B.dims.push_back(b_bst[i] == 0 ? 1 : bshape[i]);
    B.strides.push_back(b_bst[i]);
    C.dims.push_back(bshape[i]);
  }
  A.dims.insert(A.dims.end(), {M, K});
  A.strides.insert(A.strides.end(), {sam, sak});
  B.dims.insert(B.dims.end(), {K, N});
  B.strides.insert(B.strides.end(), {sbk, sbn});
  C.dims.insert(C.dims.end(), {M, N});
  C.strides.assign(C.dims.size(), 1);
  for (int64_t i = int64_t(C.dims.size()) - 2; i >= 0; --i)
    C.strides[size_t(i)] = C.strides[size_t(i + 1)] * C.dims[size_t(i + 1)];
  // oneDNN matmul takes at most 12 dims (2-D is the plain GEMM).
  BRIGADE_ASSERT(C.dims.size() <= 12, "matmul with {} batch dims", nbd);
  if (nbd == 0 && t.c == memory::data_type::f32 && t.ab == memory::data_type::f32 && K >= 16 * std::max(M, N) &&
      sak == 1 && sbn == 1) {
    // A long-K f32 GEMM of two row-major operands (the LM head's input gradient: (B T, V) x
    // (V, C)) runs at ~275 GFLOP/s in oneDNN 2.6 on this CPU, and its transpose C^T = B^T A^T
    // (two column-major operands) at ~320: compute that into workspace, then transpose it
    // into C (M x N, a small fraction of the GEMM's traffic). Measured with both layouts.
    Workspace<float> ct(M * N);  // (N, M)
    run(MatDesc{{N, K}, {sbn, sbk}}, b, MatDesc{{K, M}, {sak, sam}}, a, MatDesc{{N, M}, {M, 1}}, ct.data(), nullptr, t);
    float* cf = static_cast<float*>(c);
    const float* src = ct.data();
#pragma omp parallel for schedule(static) if (M * N > (1 << 16))
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) cf[i * N + j] = src[j * M + i];
    return;
  }
  run(A, a, B, b, C, c, nullptr, t);
}

}  // namespace

void matmul(int nbd, const int64_t* bshape, const float* a, const int64_t* a_bst, int64_t sam, int64_t sak,
            const float* b, const int64_t* b_bst, int64_t sbk, int64_t sbn, float* c, int64_t M, int64_t N, int64_t K) {
  matmul_impl(nbd, bshape, a, a_bst, sam, sak, b, b_bst, sbk, sbn, c, M, N, K, Types{});
}

void linear(int64_t N, int64_t IN, int64_t OUT, const float* x, int64_t sxn, int64_t sxi, const float* w, int64_t swo,
            int64_t swi, const float* bias, float* y) {
  if (N == 0 || OUT == 0) return;
  if (IN == 0) {  // y = bias
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < OUT; ++o) y[n * OUT + o] = bias ? bias[o] : 0.f;
    return;
  }
  // y (N, OUT) = x (N, IN) @ W^T, with W^T(i, o) = w[swi*i + swo*o]
  run<float>({{N, IN}, {sxn, sxi}}, x, {{IN, OUT}, {swi, swo}}, w, {{N, OUT}, {OUT, 1}}, y, bias);
}

void linear_backward(int64_t N, int64_t IN, int64_t OUT, const float* gy, const float* x, int64_t sxn, int64_t sxi,
                     const float* w, int64_t swo, int64_t swi, float* gx, float* gw, int64_t sgo, int64_t sgi,
                     float* gb) {
  // Backward of `y = x @ W^T + bias`.
  if (gx) {  // gx (N, IN) = gy (N, OUT) @ W (OUT, IN)
    if (OUT == 0 || N == 0)
      std::fill(gx, gx + N * IN, 0.f);
    else if (IN > 0)
      run<float>({{N, OUT}, {OUT, 1}}, gy, {{OUT, IN}, {swo, swi}}, w, {{N, IN}, {IN, 1}}, gx, nullptr);
  }
  if (gw) {  // gw(o, i) = sum_n gy(n, o) x(n, i)
    if (N == 0) {
      std::fill(gw, gw + OUT * IN, 0.f);
    } else if (OUT > 0 && IN > 0) {
      if (sgi == 1)  // (OUT, IN) row-major: gy^T @ x
        run<float>({{OUT, N}, {1, OUT}}, gy, {{N, IN}, {sxn, sxi}}, x, {{OUT, IN}, {sgo, 1}}, gw, nullptr);
      else  // (IN, OUT) row-major (the InOut layout): x^T @ gy
        run<float>({{IN, N}, {sxi, sxn}}, x, {{N, OUT}, {OUT, 1}}, gy, {{IN, OUT}, {sgi, 1}}, gw, nullptr);
    }
  }
  if (gb) column_sum(N, OUT, gy, gb);  // gb = sum_n gy(n, :)
}

// ---------------------------------------------------------------- 16-bit operands

bool gemm16_available(DType dt) {
  if (dt != DType::BF16 && dt != DType::F16) return false;
  static std::once_flag once;
  static bool avail[2] = {false, false};
  std::call_once(once, [] {
    // Probe a plain 64x64x64 GEMM: a non-reference kernel here means oneDNN has a real one.
    for (int k = 0; k < 2; ++k) {
      const memory::data_type t = k == 0 ? memory::data_type::bf16 : memory::data_type::f16;
      try {
        memory::desc md({64, 64}, t, memory::dims{64, 1});
        dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(md, md, md), engine());
        avail[k] = std::string(pd.impl_info_str()).find("ref") == std::string::npos;
      } catch (const dnnl::error&) {
        avail[k] = false;  // oneDNN has no matmul at all for this dtype on this CPU
      }
    }
  });
  return avail[dt == DType::BF16 ? 0 : 1];
}

void matmul16(DType ab, DType cd, int nbd, const int64_t* bshape, const uint16_t* a, const int64_t* a_bst, int64_t sam,
              int64_t sak, const uint16_t* b, const int64_t* b_bst, int64_t sbk, int64_t sbn, void* c, int64_t M,
              int64_t N, int64_t K) {
  Types t;
  t.ab = dnnl_type(ab);
  t.c = dnnl_type(cd);
  matmul_impl(nbd, bshape, a, a_bst, sam, sak, b, b_bst, sbk, sbn, c, M, N, K, t);
}

void linear16(DType ab, DType yd, int64_t N, int64_t IN, int64_t OUT, const uint16_t* x, int64_t sxn, int64_t sxi,
              const uint16_t* w, int64_t swo, int64_t swi, const void* bias, DType bd, void* y) {
  BRIGADE_ASSERT(N > 0 && IN > 0 && OUT > 0, "linear16 with an empty dim ({}, {}, {})", N, IN, OUT);
  Types t;
  t.ab = dnnl_type(ab);
  t.c = dnnl_type(yd);
  t.bias = dnnl_type(bd);
  run<uint16_t>({{N, IN}, {sxn, sxi}}, x, {{IN, OUT}, {swi, swo}}, w, {{N, OUT}, {OUT, 1}}, y, bias, t);
}

void linear_backward16(DType dt, int64_t N, int64_t IN, int64_t OUT, const uint16_t* gy, const uint16_t* x, int64_t sxn,
                       int64_t sxi, const uint16_t* w, int64_t swo, int64_t swi, uint16_t* gx, uint16_t* gw,
                       int64_t sgo, int64_t sgi) {
  BRIGADE_ASSERT(N > 0 && IN > 0 && OUT > 0, "linear_backward16 with an empty dim ({}, {}, {})", N, IN, OUT);
  Types t;
  t.ab = t.c = dnnl_type(dt);
  if (gx) run<uint16_t>({{N, OUT}, {OUT, 1}}, gy, {{OUT, IN}, {swo, swi}}, w, {{N, IN}, {IN, 1}}, gx, nullptr, t);
  if (gw) {
    if (sgi == 1)
      run<uint16_t>({{OUT, N}, {1, OUT}}, gy, {{N, IN}, {sxn, sxi}}, x, {{OUT, IN}, {sgo, 1}}, gw, nullptr, t);
    else
      run<uint16_t>({{IN, N}, {sxi, sxn}}, x, {{N, OUT}, {OUT, 1}}, gy, {{IN, OUT}, {sgi, 1}}, gw, nullptr, t);
  }
}

std::string last_matmul_impl() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_last_impl;
}

int64_t matmul_primitives_created() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_created;
}

}  // namespace brigade::ops::cpu
