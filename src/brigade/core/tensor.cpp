// Tensor metadata, views and copies; see tensor.h.
#include "brigade/core/tensor.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "brigade/core/error.h"

namespace brigade {

std::string shape_str(const Shape& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + ")";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (int64_t i = int64_t(s.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= std::max<int64_t>(s[i], 1);
  }
  return st;
}

Storage::Storage(size_t nbytes, MemTag t) : bytes(nbytes), tag(t) { data = Allocator::instance().allocate(nbytes, t); }
Storage::Storage(void* external, size_t nbytes, std::function<void()> release_fn)
    : data(external), bytes(nbytes), tag(MemTag::Other), release(std::move(release_fn)) {
  if (!release) release = [] {};
}
Storage::~Storage() {
  if (release)
    release();
  else if (data)
    Allocator::instance().deallocate(data, bytes, tag);
}
void Storage::free_data() {
  BRIGADE_CHECK(!release, InternalError, "free_data(): borrowed storage cannot be released");
  if (data) Allocator::instance().deallocate(data, bytes, tag);
  data = nullptr;
}
void Storage::materialize() {
  BRIGADE_CHECK(!release, InternalError, "materialize(): borrowed storage");
  if (!data && bytes) data = Allocator::instance().allocate(bytes, tag);
}

// ---------------------------------------------------------------- factories

Tensor Tensor::empty(const Shape& shape, DType dt) { return empty(shape, dt, MemTagScope::current()); }

Tensor Tensor::empty(const Shape& shape, DType dt, MemTag tag) {
  for (int64_t d : shape)
    BRIGADE_CHECK(d >= 0, ShapeError, "cannot create a tensor of shape {}: sizes must be >= 0", shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(size_t(shape_numel(shape)) * dtype_size(dt), tag);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dt;
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dt) {
  Tensor t = empty(shape, dt);
  std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}
Tensor Tensor::ones(const Shape& shape, DType dt) { return full(shape, 1.0, dt); }
Tensor Tensor::full(const Shape& shape, double value, DType dt) {
  Tensor t = empty(shape, dt);
  t.fill_(value);
  return t;
}

// A fresh tensor of dtype dt holding v (of dtype src_dt) in shape `shape`, for from_vector(_i64) (fn).
template <class V>
static Tensor tensor_of_values(const std::vector<V>& v, const Shape& shape, DType src_dt, DType dt, const char* fn) {
  BRIGADE_CHECK(int64_t(v.size()) == shape_numel(shape), ShapeError, "{}: {} values do not fill shape {}", fn, v.size(),
                shape_str(shape));
  Tensor src = Tensor::from_blob(const_cast<V*>(v.data()), shape, src_dt);
  Tensor t = Tensor::empty(shape, dt);
  copy_strided(t, src);
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& v, const Shape& shape, DType dt) {
  return tensor_of_values(v, shape, DType::F32, dt, "from_vector");
}

Tensor Tensor::from_vector_i64(const std::vector<int64_t>& v, const Shape& shape, DType dt) {
  return tensor_of_values(v, shape, DType::I64, dt, "from_vector_i64");
}

Tensor Tensor::arange(int64_t n, DType dt) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = i;
  return from_vector_i64(v, {n}, dt);
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dt, std::function<void()> release) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(data, size_t(shape_numel(shape)) * dtype_size(dt), std::move(release));
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dt;
  return Tensor(std::move(impl));
}

// ---------------------------------------------------------------- metadata

static int64_t wrap_dim(int64_t d, int64_t ndim, const char* what) {
  BRIGADE_CHECK(ndim > 0, ShapeError, "{}: a 0-d tensor has no dimension {}", what, d);
  int64_t r = d < 0 ? d + ndim : d;
  BRIGADE_CHECK(r >= 0 && r < ndim, ShapeError, "{}: dimension {} is out of range for a tensor with {} dimensions",
                what, d, ndim);
  return r;
}

int64_t Tensor::size(int64_t d) const { return impl_->shape[size_t(wrap_dim(d, dim(), "size"))]; }
int64_t Tensor::stride(int64_t d) const { return impl_->strides[size_t(wrap_dim(d, dim(), "stride"))]; }

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // as torch: nothing to lay out
  int64_t acc = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (impl_->shape[size_t(i)] == 1) continue;
    if (impl_->strides[size_t(i)] != acc) return false;
    acc *= impl_->shape[size_t(i)];
  }
  return true;
}

std::string Tensor::str() const {
  if (!defined()) return "undefined";
  return std::string(dtype_name(dtype())) + shape_str(shape());
}

void* Tensor::raw_data() const {
  BRIGADE_ASSERT(impl_->storage->materialized(),
                 "tensor {} '{}' used while its storage is released (a sharded "
                 "parameter read outside its gather)",
                 str(), impl_->meta ? impl_->meta->name : std::string());
  return static_cast<char*>(impl_->storage->data) + impl_->offset * int64_t(element_size());
}

template <typename T>
static constexpr bool dtype_matches(DType d) {
  if constexpr (std::is_same_v<T, float>) return d == DType::F32;
  if constexpr (std::is_same_v<T, bf16>) return d == DType::BF16;
  if constexpr (std::is_same_v<T, f16>) return d == DType::F16;
  if constexpr (std::is_same_v<T, uint16_t>) return d == DType::BF16 || d == DType::F16;
  if constexpr (std::is_same_v<T, int32_t>) return d == DType::I32;
  if constexpr (std::is_same_v<T, int64_t>) return d == DType::I64;
  return false;
}

template <typename T>
T* Tensor::data() const {
  BRIGADE_CHECK(defined(), ValueError, "data(): the tensor is undefined");
  BRIGADE_CHECK(dtype_matches<T>(dtype()), ShapeError, "data(): tensor {} accessed with the wrong element type", str());
  return static_cast<T*>(raw_data());
}
template float* Tensor::data<float>() const;
template bf16* Tensor::data<bf16>() const;
template f16* Tensor::data<f16>() const;
template uint16_t* Tensor::data<uint16_t>() const;
template int32_t* Tensor::data<int32_t>() const;
template int64_t* Tensor::data<int64_t>() const;

// ---------------------------------------------------------------- views

static Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.impl()->storage;
  impl->offset = offset;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

static Shape infer_shape(const Shape& shape, int64_t numel, const Shape& from) {
  Shape s = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      BRIGADE_CHECK(infer < 0, ShapeError, "reshape {} -> {}: only one dimension can be -1", shape_str(from),
                    shape_str(shape));
      infer = int64_t(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    BRIGADE_CHECK(known > 0 && numel % known == 0, ShapeError, "reshape {} -> {}: sizes do not divide", shape_str(from),
                  shape_str(shape));
    s[size_t(infer)] = numel / known;
  }
  BRIGADE_CHECK(shape_numel(s) == numel, ShapeError, "reshape {} -> {}: element counts differ ({} vs {})",
                shape_str(from), shape_str(shape), numel, shape_numel(s));
  return s;
}

// Strides for viewing `t` as `shape` without a copy, or empty if impossible
// (the algorithm of PyTorch's computeStride: match chunks of contiguous dims).
static bool view_strides(const Tensor& t, const Shape& shape, Shape& out) {
  const Shape& os = t.shape();
  const Shape& ost = t.strides();
  out.assign(shape.size(), 0);
  if (t.numel() == 0 || t.dim() == 0) {
    out = contiguous_strides(shape);
    return true;
  }
  int64_t view_d = int64_t(shape.size()) - 1;
  int64_t chunk_base_stride = ost.empty() ? 1 : ost.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t td = int64_t(os.size()) - 1; td >= 0; --td) {
    tensor_numel *= os[size_t(td)];
    if (td == 0 || (os[size_t(td - 1)] != 1 && ost[size_t(td - 1)] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[size_t(view_d)] == 1)) {
        out[size_t(view_d)] = view_numel * chunk_base_stride;
        view_numel *= shape[size_t(view_d)];
        view_d--;
      }
      if (view_numel != tensor_numel) return false;
      if (td > 0) {
        chunk_base_stride = ost[size_t(td - 1)];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

Tensor Tensor::view(const Shape& shape) const {
  Shape s = infer_shape(shape, numel(), this->shape());
  Shape st;
  BRIGADE_CHECK(view_strides(*this, s, st), ShapeError,
                "view {} -> {}: the strides of this tensor do not allow a view; use reshape()",
                shape_str(this->shape()), shape_str(s));
  return make_view(*this, s, st, offset());
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape s = infer_shape(shape, numel(), this->shape());
  Shape st;
  if (view_strides(*this, s, st)) return make_view(*this, s, st, offset());
  return contiguous().view(s);
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  d0 = wrap_dim(d0, dim(), "transpose");
  d1 = wrap_dim(d1, dim(), "transpose");
  Shape s = shape(), st = strides();
  std::swap(s[size_t(d0)], s[size_t(d1)]);
  std::swap(st[size_t(d0)], st[size_t(d1)]);
  return make_view(*this, s, st, offset());
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  BRIGADE_CHECK(int64_t(dims.size()) == dim(), ShapeError, "permute: {} dims given for a tensor of shape {}",
                dims.size(), shape_str(shape()));
  Shape s(dims.size()), st(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], dim(), "permute");
    BRIGADE_CHECK(!seen[size_t(d)], ShapeError, "permute: dimension {} repeated", d);
    seen[size_t(d)] = true;
    s[i] = shape()[size_t(d)];
    st[i] = strides()[size_t(d)];
  }
  return make_view(*this, s, st, offset());
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  d = wrap_dim(d, dim(), "slice");
  const int64_t n = shape()[size_t(d)];
  BRIGADE_CHECK(step > 0, ShapeError, "slice: step must be positive, got {}", step);
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape s = shape(), st = strides();
  s[size_t(d)] = (end - start + step - 1) / step;
  st[size_t(d)] *= step;
  return make_view(*this, s, st, offset() + start * strides()[size_t(d)]);
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  d = wrap_dim(d, dim(), "narrow");
  BRIGADE_CHECK(start >= 0 && length >= 0 && start + length <= shape()[size_t(d)], ShapeError,
                "narrow: [{}, {}) is outside dimension {} of size {}", start, start + length, d, shape()[size_t(d)]);
  return slice(d, start, start + length);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = wrap_dim(d, dim(), "select");
  const int64_t n = shape()[size_t(d)];
  if (index < 0) index += n;
  BRIGADE_CHECK(index >= 0 && index < n, ShapeError, "select: index {} out of range for size {}", index, n);
  Shape s = shape(), st = strides();
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return make_view(*this, s, st, offset() + index * strides()[size_t(d)]);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  if (d < 0) d += dim() + 1;
  BRIGADE_CHECK(d >= 0 && d <= dim(), ShapeError, "unsqueeze: dimension {} out of range", d);
  Shape s = shape(), st = strides();
  int64_t stv = d < dim() ? strides()[size_t(d)] * shape()[size_t(d)] : 1;
  s.insert(s.begin() + d, 1);
  st.insert(st.begin() + d, stv);
  return make_view(*this, s, st, offset());
}

Tensor Tensor::squeeze(int64_t d) const {
  d = wrap_dim(d, dim(), "squeeze");
  if (shape()[size_t(d)] != 1) return *this;
  Shape s = shape(), st = strides();
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return make_view(*this, s, st, offset());
}

Tensor Tensor::expand(const Shape& shape) const {
  BRIGADE_CHECK(int64_t(shape.size()) >= dim(), ShapeError, "expand {} -> {}: too few dimensions",
                shape_str(this->shape()), shape_str(shape));
  const size_t lead = shape.size() - size_t(dim());
  Shape s(shape.size()), st(shape.size(), 0);
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      BRIGADE_CHECK(shape[i] >= 0, ShapeError,
                    "expand {} -> {}: new leading dimension {} must be >= 0 (-1 only "
                    "keeps an existing dimension)",
                    shape_str(this->shape()), shape_str(shape), i);
      s[i] = shape[i];
      continue;
    }
    int64_t cur = this->shape()[i - lead];
    int64_t want = shape[i] == -1 ? cur : shape[i];
    BRIGADE_CHECK(cur == want || cur == 1, ShapeError, "expand {} -> {}: dimension {} of size {} cannot become {}",
                  shape_str(this->shape()), shape_str(shape), i, cur, want);
    s[i] = want;
    st[i] = (cur == want) ? strides()[i - lead] : 0;
  }
  return make_view(*this, s, st, offset());
}

// ---------------------------------------------------------------- copies

namespace {

template <typename T>
inline float load_f(const T* p);
template <>
inline float load_f(const float* p) {
  return *p;
}
template <>
inline float load_f(const bf16* p) {
  return bf16_to_float(p->bits);
}
template <>
inline float load_f(const f16* p) {
  return f16_to_float(p->bits);
}

template <typename D, typename S>
inline D convert(const S& s) {
  if constexpr (std::is_same_v<D, S>) {
    return s;
  } else if constexpr (std::is_same_v<D, bf16>) {
    if constexpr (std::is_same_v<S, f16>)
      return bf16{float_to_bf16(f16_to_float(s.bits))};
    else
      return bf16{float_to_bf16(float(s))};
  } else if constexpr (std::is_same_v<D, f16>) {
    if constexpr (std::is_same_v<S, bf16>)
      return f16{float_to_f16(bf16_to_float(s.bits))};
    else
      return f16{float_to_f16(float(s))};
  } else if constexpr (std::is_same_v<S, bf16>) {
    return D(bf16_to_float(s.bits));
  } else if constexpr (std::is_same_v<S, f16>) {
    return D(f16_to_float(s.bits));
  } else {
    return D(s);
  }
}

template <typename D, typename S>
void copy_kernel(const Tensor& dst, const Tensor& src) {
  D* dp = static_cast<D*>(dst.raw_data());
  const S* sp = static_cast<const S*>(src.raw_data());
  const int64_t n = dst.numel();
  if (n == 0) return;
  if (dst.is_contiguous() && src.is_contiguous()) {
#pragma omp parallel for if (n > (1 << 16)) schedule(static)
    for (int64_t i = 0; i < n; ++i) dp[i] = convert<D>(sp[i]);
    return;
  }
  const int64_t nd = dst.dim();
  if (nd == 0) {
    dp[0] = convert<D>(sp[0]);
    return;
  }
  const Shape& sh = dst.shape();
  const int64_t inner = sh[size_t(nd - 1)];
  const int64_t dsi = dst.strides()[size_t(nd - 1)], ssi = src.strides()[size_t(nd - 1)];
  const int64_t rows = n / inner;
#pragma omp parallel for if (n > (1 << 16)) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t rem = r, doff = 0, soff = 0;
    for (int64_t d = nd - 2; d >= 0; --d) {
      int64_t i = rem % sh[size_t(d)];
      rem /= sh[size_t(d)];
      doff += i * dst.strides()[size_t(d)];
      soff += i * src.strides()[size_t(d)];
    }
    D* drow = dp + doff;
    const S* srow = sp + soff;
    for (int64_t j = 0; j < inner; ++j) drow[j * dsi] = convert<D>(srow[j * ssi]);
  }
}

template <typename D>
void copy_from(const Tensor& dst, const Tensor& src) {
  switch (src.dtype()) {
    case DType::F32: return copy_kernel<D, float>(dst, src);
    case DType::BF16: return copy_kernel<D, bf16>(dst, src);
    case DType::F16: return copy_kernel<D, f16>(dst, src);
    case DType::I32: return copy_kernel<D, int32_t>(dst, src);
    case DType::I64: return copy_kernel<D, int64_t>(dst, src);
  }
}

}  // namespace

void copy_strided(const Tensor& dst, const Tensor& src) {
  BRIGADE_CHECK(dst.shape() == src.shape(), ShapeError, "copy: shapes differ, destination {} vs source {}", dst.str(),
                src.str());
  switch (dst.dtype()) {
    case DType::F32: return copy_from<float>(dst, src);
    case DType::BF16: return copy_from<bf16>(dst, src);
    case DType::F16: return copy_from<f16>(dst, src);
    case DType::I32: return copy_from<int32_t>(dst, src);
    case DType::I64: return copy_from<int64_t>(dst, src);
  }
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape(), dtype());
  copy_strided(t, *this);
  return t;
}

Tensor Tensor::to(DType dt) const {
  if (dt == dtype()) return *this;
  Tensor t = empty(shape(), dt);
  copy_strided(t, *this);
  return t;
}

Tensor& Tensor::copy_(const Tensor& src) {
  copy_strided(*this, src);
  return *this;
}

Tensor& Tensor::fill_(double value) {
  float fv = float(value);
  int64_t iv = int64_t(value);
  Tensor src = (dtype() == DType::I32 || dtype() == DType::I64) ? Tensor::from_blob(&iv, {}, DType::I64)
                                                                : Tensor::from_blob(&fv, {}, DType::F32);
  copy_strided(*this, src.expand(shape()));
  return *this;
}

double Tensor::at(const std::vector<int64_t>& idx) const {
  BRIGADE_CHECK(int64_t(idx.size()) == dim(), ShapeError, "at: {} indices for tensor {}", idx.size(), str());
  int64_t off = 0;
  for (size_t i = 0; i < idx.size(); ++i) {
    BRIGADE_CHECK(idx[i] >= 0 && idx[i] < shape()[i], ShapeError, "at: index {} out of range in dim {} of {}", idx[i],
                  i, str());
    off += idx[i] * strides()[i];
  }
  const char* base = static_cast<const char*>(raw_data()) + off * int64_t(element_size());
  switch (dtype()) {
    case DType::F32: return *reinterpret_cast<const float*>(base);
    case DType::BF16: return bf16_to_float(*reinterpret_cast<const uint16_t*>(base));
    case DType::F16: return f16_to_float(*reinterpret_cast<const uint16_t*>(base));
    case DType::I32: return *reinterpret_cast<const int32_t*>(base);
    case DType::I64: return double(*reinterpret_cast<const int64_t*>(base));
  }
  return 0;
}

double Tensor::item() const {
  BRIGADE_CHECK(numel() == 1, ShapeError, "item(): tensor {} has {} elements, expected 1", str(), numel());
  return at(std::vector<int64_t>(size_t(dim()), 0));
}

std::vector<float> Tensor::to_vector() const {
  std::vector<float> v(static_cast<size_t>(numel()));
  Tensor dst = from_blob(v.data(), shape(), DType::F32);
  copy_strided(dst, *this);
  return v;
}

std::vector<int64_t> Tensor::to_vector_i64() const {
  std::vector<int64_t> v(static_cast<size_t>(numel()));
  Tensor dst = from_blob(v.data(), shape(), DType::I64);
  copy_strided(dst, *this);
  return v;
}

// ---------------------------------------------------------------- autograd metadata

AutogradMeta& Tensor::meta() const {
  if (!impl_->meta) impl_->meta = std::make_unique<AutogradMeta>();
  return *impl_->meta;
}

Tensor& Tensor::set_requires_grad(bool r) {
  BRIGADE_CHECK(!r || is_floating(dtype()), ValueError, "requires_grad: tensor {} is not floating point", str());
  meta().requires_grad = r;
  return *this;
}

Tensor Tensor::grad() const {
  if (!impl_ || !impl_->meta || !impl_->meta->grad) return Tensor();
  return Tensor(impl_->meta->grad);
}

void Tensor::set_grad(const Tensor& g) { meta().grad = g.impl_ptr(); }

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<autograd::Node> none;
  if (!impl_ || !impl_->meta) return none;
  return impl_->meta->grad_fn;
}

const std::string& Tensor::name() const {
  static const std::string empty_name;
  if (!impl_ || !impl_->meta) return empty_name;
  return impl_->meta->name;
}

Tensor Tensor::detach() const { return make_view(*this, shape(), strides(), offset()); }

}  // namespace brigade
