// f32 matmul / linear through oneDNN's matmul primitive (the only file that
// includes <dnnl.hpp>). Transposes and batch broadcasting are expressed as memory
// strides (batch dims of size 1 broadcast), so views are not copied; primitives are
// cached by (dims, strides, bias). An operand with a zero stride inside its matrix,
// a layout oneDNN's GEMM path does not take (is_plain), or one it only serves with its slow reference kernel, is first gathered
// into a contiguous buffer. Maths and the scalar oracle: ops/ref/kernels.h.
#include <dnnl.hpp>

#include <algorithm>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/ops/cpu/kernels.h"

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

struct CacheEntry {
  dnnl::matmul prim;
  bool fast = true;  // false: oneDNN picked its reference implementation
};

std::mutex g_mu;
std::unordered_map<std::string, CacheEntry>& cache() {
  static std::unordered_map<std::string, CacheEntry> c;
  return c;
}

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
std::vector<float> gather(const MatDesc m, const float* p, MatDesc& out) {  // m by value: out may alias it
  out.dims = m.dims;
  out.strides.assign(m.dims.size(), 1);
  for (int64_t i = int64_t(m.dims.size()) - 2; i >= 0; --i)
    out.strides[size_t(i)] = out.strides[size_t(i + 1)] * std::max<int64_t>(m.dims[size_t(i + 1)], 1);
  const int nd = int(m.dims.size());
  const int64_t n = ref::numel_of(nd, m.dims.data());
  std::vector<float> buf(static_cast<size_t>(n));
#pragma omp parallel for schedule(static) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) buf[size_t(i)] = p[ref::strided_offset(i, nd, m.dims.data(), m.strides.data())];
  return buf;
}

const CacheEntry& get_primitive(const MatDesc& a, const MatDesc& b, const MatDesc& c, bool bias) {
  std::string key;
  append(key, a.dims), append(key, a.strides), append(key, b.dims), append(key, b.strides);
  append(key, c.dims), append(key, c.strides);
  key += bias ? 'b' : 'n';
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = cache().find(key);
  if (it != cache().end()) return it->second;
  const auto f32 = memory::data_type::f32;
  memory::desc amd(a.dims, f32, a.strides), bmd(b.dims, f32, b.strides), cmd(c.dims, f32, c.strides);
  CacheEntry e;
  if (bias) {
    memory::dims bd(c.dims.size(), 1);
    bd.back() = c.dims.back();
    memory::dims bs(c.dims.size(), bd.back());
    bs.back() = 1;
    memory::desc biasmd(bd, f32, bs);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(amd, bmd, biasmd, cmd), engine());
    e.fast = std::string(pd.impl_info_str()).find("ref") == std::string::npos;
    e.prim = dnnl::matmul(pd);
  } else {
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(amd, bmd, cmd), engine());
    e.fast = std::string(pd.impl_info_str()).find("ref") == std::string::npos;
    e.prim = dnnl::matmul(pd);
  }
  return cache().emplace(key, std::move(e)).first->second;
}

// c = a @ b (+ bias broadcast over rows); c must be a dense or row-strided matrix.
void run(MatDesc a, const float* ap, MatDesc b, const float* bp, const MatDesc& c, float* cp, const float* bias) {
  a = sanitize(a);
  b = sanitize(b);
  const MatDesc cs = sanitize(c);
  std::vector<float> abuf, bbuf;
  if (!is_plain(a)) abuf = gather(a, ap, a), ap = abuf.data();
  if (!is_plain(b)) bbuf = gather(b, bp, b), bp = bbuf.data();
  const CacheEntry* e = nullptr;
  try {
    e = &get_primitive(a, b, cs, bias != nullptr);
  } catch (const dnnl::error&) {
    e = nullptr;
  }
  if (!e || !e->fast) {  // retry with both inputs contiguous
    if (abuf.empty()) abuf = gather(a, ap, a), ap = abuf.data();
    if (bbuf.empty()) bbuf = gather(b, bp, b), bp = bbuf.data();
    e = &get_primitive(a, b, cs, bias != nullptr);
  }
  const auto f32 = memory::data_type::f32;
  dnnl::stream strm(engine());
  memory am({a.dims, f32, a.strides}, engine(), const_cast<float*>(ap));
  memory bm({b.dims, f32, b.strides}, engine(), const_cast<float*>(bp));
  memory cm({cs.dims, f32, cs.strides}, engine(), cp);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
  if (bias) {
    const size_t nd = cs.dims.size();
    memory::dims bd(nd, 1), bs(nd, cs.dims[nd - 1]);
    bd[nd - 1] = cs.dims[nd - 1];
    bs[nd - 1] = 1;
    args.emplace(DNNL_ARG_BIAS, memory({bd, f32, bs}, engine(), const_cast<float*>(bias)));
  }
  e->prim.execute(strm, args);
  strm.wait();
}

}  // namespace

void matmul(int nbd, const int64_t* bshape, const float* a, const int64_t* a_bst, int64_t sam, int64_t sak,
            const float* b, const int64_t* b_bst, int64_t sbk, int64_t sbn, float* c, int64_t M, int64_t N,
            int64_t K) {
  const int64_t batch = ref::numel_of(nbd, bshape);
  if (batch == 0 || M == 0 || N == 0) return;
  if (K == 0) {
    std::fill(c, c + batch * M * N, 0.f);
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
  if (nbd == 0) {  // oneDNN wants at least 2 dims; 2-D is the plain GEMM
    run(A, a, B, b, C, c, nullptr);
    return;
  }
  // oneDNN matmul takes at most 12 dims; fold extra batch dims would need a copy, so
  // fall back to one call per leading index beyond that (never seen in practice).
  BRIGADE_ASSERT(C.dims.size() <= 12, "matmul with {} batch dims", nbd);
  run(A, a, B, b, C, c, nullptr);
}

void linear(int64_t N, int64_t IN, int64_t OUT, const float* x, int64_t sxn, int64_t sxi, const float* w,
            int64_t swo, int64_t swi, const float* bias, float* y) {
  if (N == 0 || OUT == 0) return;
  if (IN == 0) {  // y = bias
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < OUT; ++o) y[n * OUT + o] = bias ? bias[o] : 0.f;
    return;
  }
  // y (N, OUT) = x (N, IN) @ W^T, with W^T(i, o) = w[swi*i + swo*o]
  run({{N, IN}, {sxn, sxi}}, x, {{IN, OUT}, {swi, swo}}, w, {{N, OUT}, {OUT, 1}}, y, bias);
}

void linear_backward(int64_t N, int64_t IN, int64_t OUT, const float* gy, const float* x, int64_t sxn, int64_t sxi,
                     const float* w, int64_t swo, int64_t swi, float* gx, float* gw, int64_t sgo, int64_t sgi,
                     float* gb) {
  // Backward of `y = x @ W^T + bias`.
  if (gx) {  // gx (N, IN) = gy (N, OUT) @ W (OUT, IN)
    if (OUT == 0 || N == 0)
      std::fill(gx, gx + N * IN, 0.f);
    else if (IN > 0)
      run({{N, OUT}, {OUT, 1}}, gy, {{OUT, IN}, {swo, swi}}, w, {{N, IN}, {IN, 1}}, gx, nullptr);
  }
  if (gw) {  // gw(o, i) = sum_n gy(n, o) x(n, i)
    if (N == 0) {
      std::fill(gw, gw + OUT * IN, 0.f);
    } else if (OUT > 0 && IN > 0) {
      if (sgi == 1)  // (OUT, IN) row-major: gy^T @ x
        run({{OUT, N}, {1, OUT}}, gy, {{N, IN}, {sxn, sxi}}, x, {{OUT, IN}, {sgo, 1}}, gw, nullptr);
      else  // (IN, OUT) row-major (the InOut layout): x^T @ gy
        run({{IN, N}, {sxi, sxn}}, x, {{N, OUT}, {OUT, 1}}, gy, {{IN, OUT}, {sgi, 1}}, gw, nullptr);
    }
  }
  if (gb) column_sum(N, OUT, gy, gb);  // gb = sum_n gy(n, :)
}

}  // namespace brigade::ops::cpu
