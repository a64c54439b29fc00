// Tensor: a shared, strided view of a Storage (shape, strides and offset in
// elements), with a dtype and optional autograd metadata. Views (reshape,
// transpose, permute, slice, narrow, select, expand) share storage; contiguous()
// copies only when needed. Not an op library: arithmetic lives in ops/ (raw,
// no autograd) and autograd/functions.h (differentiable).
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "brigade/core/allocator.h"
#include "brigade/core/dtype.h"

namespace brigade {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "(2, 3, 4)"
int64_t shape_numel(const Shape& s);
Shape contiguous_strides(const Shape& s);

// Owns (or borrows) one buffer. Owned buffers come from the caching Allocator.
struct Storage {
  void* data = nullptr;
  size_t bytes = 0;
  MemTag tag = MemTag::Other;
  std::function<void()> release;  // set for borrowed memory (e.g. an mmap); empty when owned
  Storage(size_t nbytes, MemTag t);
  Storage(void* external, size_t nbytes, std::function<void()> release_fn);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  // Sharded parameters (ZeRO-3): give the buffer back to the allocator while the
  // Storage, and every view of it, stays alive; materialize() allocates it again
  // (contents undefined) so the views see the new buffer. Owned storage only.
  void free_data();
  void materialize();
  bool materialized() const { return data != nullptr || bytes == 0; }
};

class Tensor;
namespace autograd {
struct Node;
}

// Autograd state of a tensor (defined here so Tensor can expose grad(); the
// engine that uses it lives in autograd/).
struct AutogradMeta {
  bool requires_grad = false;
  std::shared_ptr<struct TensorImpl> grad;           // accumulated gradient (leaves), same shape
  std::shared_ptr<autograd::Node> grad_fn;           // producer (non-leaves)
  std::shared_ptr<autograd::Node> grad_accumulator;  // cached AccumulateGrad node (leaves)
  std::string name;                                  // parameter name, for messages
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape shape;
  Shape strides;  // in elements
  DType dtype = DType::F32;
  std::unique_ptr<AutogradMeta> meta;  // null until autograd touches the tensor
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- factories (allocations are tagged with MemTagScope::current() unless given) ----
  static Tensor empty(const Shape& shape, DType dt = DType::F32);
  static Tensor empty(const Shape& shape, DType dt, MemTag tag);
  static Tensor zeros(const Shape& shape, DType dt = DType::F32);
  static Tensor ones(const Shape& shape, DType dt = DType::F32);
  static Tensor full(const Shape& shape, double value, DType dt = DType::F32);
  static Tensor from_vector(const std::vector<float>& v, const Shape& shape, DType dt = DType::F32);
  static Tensor from_vector_i64(const std::vector<int64_t>& v, const Shape& shape, DType dt = DType::I64);
  static Tensor arange(int64_t n, DType dt = DType::F32);
  // Wraps memory the caller owns; `release` runs when the last view dies.
  static Tensor from_blob(void* data, const Shape& shape, DType dt, std::function<void()> release = {});

  // ---- metadata ----
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  const Shape& strides() const { return impl_->strides; }
  int64_t dim() const { return int64_t(impl_->shape.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t stride(int64_t d) const;
  int64_t numel() const { return shape_numel(impl_->shape); }
  DType dtype() const { return impl_->dtype; }
  size_t element_size() const { return dtype_size(impl_->dtype); }
  size_t nbytes() const { return size_t(numel()) * element_size(); }
  int64_t offset() const { return impl_->offset; }
  bool is_contiguous() const;
  bool same_storage(const Tensor& o) const { return impl_->storage == o.impl_->storage; }
  // No other handle or view shares this tensor's data: an op may overwrite it in place.
  bool sole_owner() const { return impl_ && impl_.use_count() == 1 && impl_->storage.use_count() == 1; }
  std::string str() const;  // "f32(2, 3)"
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  MemTag tag() const { return impl_->storage->tag; }
  // False while a plan has released the storage (a ZeRO-3 parameter between its gathers).
  bool materialized() const { return impl_ && impl_->storage && impl_->storage->materialized(); }

  // Pointer to the first element of this view. T must match dtype (checked).
  template <typename T>
  T* data() const;
  void* raw_data() const;

  // ---- views (share storage) ----
  Tensor view(const Shape& shape) const;     // requires compatible strides; -1 infers one dim
  Tensor reshape(const Shape& shape) const;  // view if possible, else contiguous copy
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor slice(int64_t d, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor narrow(int64_t d, int64_t start, int64_t length) const;
  Tensor select(int64_t d, int64_t index) const;  // drops dim d
  Tensor unsqueeze(int64_t d) const;
  Tensor squeeze(int64_t d) const;
  Tensor expand(const Shape& shape) const;  // broadcast view (stride 0)
  Tensor flatten() const { return reshape({numel()}); }

  // ---- copies ----
  Tensor contiguous() const;         // self if already contiguous
  Tensor clone() const;              // always a fresh contiguous copy
  Tensor to(DType dt) const;         // self if same dtype
  Tensor& copy_(const Tensor& src);  // elementwise copy with dtype conversion; shapes must match
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }

  // ---- scalar access (slow; for tests, logging and small tensors) ----
  double item() const;  // numel must be 1
  double at(const std::vector<int64_t>& idx) const;
  std::vector<float> to_vector() const;  // any float/int dtype, in logical order
  std::vector<int64_t> to_vector_i64() const;

  // ---- autograd (the engine lives in autograd/) ----
  bool requires_grad() const { return impl_ && impl_->meta && impl_->meta->requires_grad; }
  Tensor& set_requires_grad(bool r);
  Tensor grad() const;  // undefined tensor if none
  void set_grad(const Tensor& g);
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  bool is_leaf() const { return !impl_ || !impl_->meta || !impl_->meta->grad_fn; }
  AutogradMeta& meta() const;       // creates on first use
  const std::string& name() const;  // set by nn::Module for parameters
  Tensor detach() const;            // same storage, no autograd history

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// Strided elementwise copy with conversion between any two dtypes (same shape).
void copy_strided(const Tensor& dst, const Tensor& src);

}  // namespace brigade
