// Data parallelism and ZeRO; see data_parallel.h.
#include "brigade/parallel/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <set>

#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"
#include "brigade/ops/ops.h"
#include "brigade/optim/optimizer.h"

namespace brigade::parallel {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kAlign = 16;  // floats: every parameter starts on a 64-byte boundary
// Deterministic mode: shards start on multiples of this many floats, the blocks of the gradient
// norm, so a block never straddles two ranks' shards whatever the dp size.
constexpr int64_t kNormBlock = 4096;

int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

float* fptr(const std::shared_ptr<Storage>& s) { return static_cast<float*>(s->data); }

// A contiguous f32 view of `shape` at element `offset` of a storage.
Tensor view_of(const std::shared_ptr<Storage>& st, int64_t offset, const Shape& shape) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = st;
  impl->offset = offset;
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = DType::F32;
  return Tensor(impl);
}

// Points parameter `p` (every holder shares its TensorImpl) at a new storage.
void rebind(const Tensor& p, const std::shared_ptr<Storage>& st, int64_t offset) {
  p.impl()->storage = st;
  p.impl()->offset = offset;
}

std::shared_ptr<Storage> zeroed_storage(int64_t floats, MemTag tag) {
  auto s = std::make_shared<Storage>(size_t(floats) * sizeof(float), tag);
  if (floats) std::memset(s->data, 0, size_t(floats) * sizeof(float));
  return s;
}

void scale(float* p, int64_t n, float s) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) p[i] *= s;
}

void add_into(float* acc, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) acc[i] = acc[i] + x[i];
}

// "exp_avg.transformer.h.0.ln_1.weight" -> {"exp_avg", "transformer.h.0.ln_1.weight"}
std::pair<std::string, std::string> split_state_name(const std::string& n) {
  const size_t dot = n.find('.');
  BRIGADE_ASSERT(dot != std::string::npos, "optimizer state name '{}' has no '<state>.' prefix", n);
  return {n.substr(0, dot), n.substr(dot + 1)};
}

}  // namespace

DataParallel::DataParallel(std::vector<ParamUnit> units, std::shared_ptr<dist::ProcessGroup> group,
                           DataParallelOptions o)
    : pg_(std::move(group)), o_(o) {
  BRIGADE_CHECK(o_.zero >= 0 && o_.zero <= 3, ConfigError, "parallel.zero = {}: use 0, 1, 2 or 3", o_.zero);
  BRIGADE_CHECK(o_.accumulation >= 1, ConfigError, "train.accumulation = {} must be >= 1", o_.accumulation);
  const int P = pg_->size();

  // ---- flat layout, unit by unit
  std::set<TensorImpl*> seen;
  int64_t off = 0;
  for (auto& pu : units) {
    Unit u;
    u.name = pu.name;
    u.module = pu.module;
    u.begin = off;
    for (auto& [name, p] : pu.params) {
      BRIGADE_CHECK(p.dtype() == DType::F32 && p.is_contiguous() && p.requires_grad(), ValueError,
                    "data parallel: parameter '{}' ({}) must be a contiguous f32 tensor that requires grad", name,
                    p.str());
      BRIGADE_CHECK(seen.insert(p.impl()).second, ValueError,
                    "data parallel: parameter '{}' appears twice in the units (tied weights belong to one unit)", name);
      u.params.push_back(params_.size());
      unit_of_param_.push_back(int(units_.size()));
      params_.emplace_back(name, p);
      layout_.push_back({name, off, p.numel(), p.dim() >= 2});
      decay_[name] = p.dim() >= 2;
      off = round_up(off + p.numel(), kAlign);
    }
    u.end = off;
    units_.push_back(std::move(u));
  }
  numel_ = layout_.empty() ? 0 : layout_.back().offset + layout_.back().numel;
  S_ = round_up((off + P - 1) / P, o_.deterministic ? kNormBlock : kAlign);
  padded_ = S_ * P;
  lo_ = int64_t(pg_->rank()) * S_;
  hi_ = lo_ + S_;

  // ---- parameter storage
  if (o_.zero < 3) {
    flat_params_ = zeroed_storage(padded_, MemTag::Params);
    for (size_t i = 0; i < params_.size(); ++i) {
      const Tensor& p = params_[i].second;
      std::memcpy(fptr(flat_params_) + layout_[i].offset, p.data<float>(), size_t(p.numel()) * sizeof(float));
      rebind(p, flat_params_, layout_[i].offset);
    }
  } else {
    param_shard_ = zeroed_storage(S_, MemTag::Params);
    for (size_t i = 0; i < params_.size(); ++i) {
      const int64_t a = std::max(layout_[i].offset, lo_), b = std::min(layout_[i].offset + layout_[i].numel, hi_);
      if (a < b)
        std::memcpy(fptr(param_shard_) + (a - lo_), params_[i].second.data<float>() + (a - layout_[i].offset),
                    size_t(b - a) * sizeof(float));
    }
    for (Unit& u : units_) {
      u.storage = zeroed_storage(u.end - u.begin, MemTag::Params);
      for (size_t i : u.params) {
        const Tensor& p = params_[i].second;
        std::memcpy(fptr(u.storage) + (layout_[i].offset - u.begin), p.data<float>(),
                    size_t(p.numel()) * sizeof(float));
        rebind(p, u.storage, layout_[i].offset - u.begin);
      }
      u.storage->free_data();  // gathered on demand from the shards
      u.state = Unit::Released;
    }
  }

  // ---- gradient storage
  if (o_.zero < 2) {
    flat_grads_ = zeroed_storage(padded_, MemTag::Grads);
    for (size_t i = 0; i < params_.size(); ++i)
      params_[i].second.set_grad(view_of(flat_grads_, layout_[i].offset, params_[i].second.shape()));
  } else {
    grad_shard_ = zeroed_storage(S_, MemTag::Grads);
    for (auto& [n, p] : params_) p.set_grad(Tensor());
  }

  // ---- buckets: reverse parameter order (the order gradients become ready)
  if (o_.zero == 3) {
    for (int u = int(units_.size()) - 1; u >= 0; --u) {
      Bucket b;
      b.params = units_[size_t(u)].params;
      b.begin = units_[size_t(u)].begin;
      b.end = units_[size_t(u)].end;
      b.unit = u;
      if (!b.params.empty()) buckets_.push_back(std::move(b));
    }
  } else {
    Bucket cur;
    for (size_t k = params_.size(); k-- > 0;) {
      if (cur.params.empty()) cur.end = round_up(layout_[k].offset + layout_[k].numel, kAlign);
      cur.params.push_back(k);
      cur.begin = layout_[k].offset;
      if ((cur.end - cur.begin) * int64_t(sizeof(float)) >= o_.bucket_bytes) {
        buckets_.push_back(std::move(cur));
        cur = Bucket();
      }
    }
    if (!cur.params.empty()) buckets_.push_back(std::move(cur));
  }
  BRIGADE_CHECK(!o_.deterministic || o_.communicate_in_backward, ConfigError,
                "parallel.deterministic = true needs gradients reduced as the backward produces them; it does not "
                "combine with pipeline parallelism");
  BRIGADE_CHECK(o_.communicate_in_backward || o_.zero <= 1, ConfigError,
                "ZeRO-{} reduces gradients during the backward; it cannot wait for the step's end (use zero 0 or 1)",
                o_.zero);
  if (o_.communicate_in_backward)
    for (size_t b = 0; b < buckets_.size(); ++b)
      for (size_t i : buckets_[b].params)
        autograd::set_grad_ready_hook(params_[i].second, [this, b] { on_grad_ready(b); });

  // ---- ZeRO-3: gather before each unit's forward, release after; gather again in the backward
  if (o_.zero == 3) {
    std::vector<size_t> module_units;
    for (size_t u = 0; u < units_.size(); ++u)
      if (units_[u].module) module_units.push_back(u);
    for (size_t k = 0; k < module_units.size(); ++k) {
      const size_t u = module_units[k];
      const long next = k + 1 < module_units.size() ? long(module_units[k + 1]) : -1;
      const long prev = k > 0 ? long(module_units[k - 1]) : -1;
      // Activation recompute (fn::checkpoint): a TransformerBlock checkpoints inside its hooks, so
      // they run once, in the real forward. A checkpoint around a whole unit re-runs them in the
      // backward (autograd::recomputing()); then the next unit, already backpropagated, is not
      // prefetched (it would stay gathered), and the unit is not released after its recomputed
      // forward, since the backward through that graph reads it next (the backward hook would
      // gather it again at once); it is released when its gradients are handed off.
      units_[u].module->pre_forward_hook = [this, u, next] {
        ensure_gathered(u);
        if (next >= 0 && !autograd::recomputing()) prefetch(size_t(next));
      };
      units_[u].module->post_forward_hook = [this, u, prev](const Tensor& out) -> Tensor {
        if (!keep_all_ && !autograd::recomputing()) release_unit(u);
        if (!out.requires_grad()) return out;
        return fn::backward_hook(out, [this, u, prev] {
          ensure_gathered(u);
          if (prev >= 0) prefetch(size_t(prev));
        });
      };
    }
  }

  // ---- what the optimizer sees
  if (o_.zero == 0) {
    opt_params_ = params_;
    for (const FlatEntry& e : layout_) opt_ranges_.emplace_back(e.offset, e.offset + e.numel);
  } else {
    for (size_t i = 0; i < params_.size(); ++i) {
      const int64_t a = std::max(layout_[i].offset, lo_), b = std::min(layout_[i].offset + layout_[i].numel, hi_);
      if (a >= b) continue;
      Tensor pv = o_.zero == 3 ? view_of(param_shard_, a - lo_, {b - a}) : view_of(flat_params_, a, {b - a});
      Tensor gv = o_.zero >= 2 ? view_of(grad_shard_, a - lo_, {b - a}) : view_of(flat_grads_, a, {b - a});
      pv.set_grad(gv);
      opt_params_.emplace_back(params_[i].first, pv);
      opt_ranges_.emplace_back(a, b);
    }
  }

  queue_ = std::make_unique<CommQueue>(o_.overlap && P > 1);
}

DataParallel::~DataParallel() {
  try {
    queue_->wait_all();
  } catch (...) {
  }
  for (auto& [n, p] : params_) autograd::set_grad_ready_hook(p, {});
  for (Unit& u : units_)
    if (u.module) {
      u.module->pre_forward_hook = nullptr;
      u.module->post_forward_hook = nullptr;
    }
}

bool DataParallel::decays(const std::string& name) const {
  auto it = decay_.find(name);
  BRIGADE_ASSERT(it != decay_.end(), "unknown parameter '{}'", name);
  return it->second;
}

std::vector<int64_t> DataParallel::counts_in(int64_t begin, int64_t end) const {
  std::vector<int64_t> c(size_t(pg_->size()));
  for (int r = 0; r < pg_->size(); ++r)
    c[size_t(r)] = std::max<int64_t>(0, std::min(end, (r + 1) * S_) - std::max(begin, r * S_));
  return c;
}

void DataParallel::reset_stats() {
  queue_->reset_wait_seconds();
  queue_->reset_task_seconds();
  queue_->reset_peak_pending();
  direct_s_ = 0.0;
  pg_->reset_bytes_sent();
}

// ---------------------------------------------------------------- the step

void DataParallel::begin_step() {
  queue_->wait_all();
  if (o_.zero < 2)
    std::memset(flat_grads_->data, 0, size_t(padded_) * sizeof(float));
  else
    std::memset(grad_shard_->data, 0, size_t(S_) * sizeof(float));
  if (o_.zero == 3) gather_persistent();
}

void DataParallel::set_accumulation(int64_t micro_steps) {
  BRIGADE_CHECK(micro_steps >= 1, ValueError, "accumulation must be >= 1, got {}", micro_steps);
  o_.accumulation = micro_steps;
}

double DataParallel::local_grad_sq() const {
  BRIGADE_CHECK(o_.zero < 2, ValueError, "local_grad_sq(): ZeRO-{} keeps no local gradient", o_.zero);
  return ops::sum_squares(view_of(flat_grads_, 0, {padded_}));
}

void DataParallel::begin_micro_step(int64_t micro) {
  BRIGADE_ASSERT(micro >= 0 && micro < o_.accumulation, "micro-step {} of {}", micro, o_.accumulation);
  if (micro > 0 && (o_.zero >= 2 || o_.deterministic))  // gradients of parameters the last backward did not reach
    for (size_t b = 0; b < buckets_.size(); ++b)
      if (!buckets_[b].fired) fire_bucket(b);
  last_micro_ = micro == o_.accumulation - 1;
  micro_ = micro;
  for (Bucket& b : buckets_) {
    b.ready = 0;
    b.fired = false;
  }
  if (o_.zero >= 2 && !buckets_.empty()) arm_bucket(0);
}

// ZeRO-2/3: gives the bucket a contiguous gradient buffer and points its parameters'
// gradients into it, so the backward accumulates straight into what is reduce-scattered.
// Armed one bucket ahead (when the previous one fires), so only the buckets being filled
// or communicated hold gradient memory. A parameter whose gradient already exists (the tied
// embedding's, produced early by the head) keeps it and is copied in when the bucket fires.
void DataParallel::arm_bucket(size_t b) {
  Bucket& bk = buckets_[b];
  if (bk.buffer.defined()) return;
  {
    MemTagScope tag(MemTag::Grads);
    bk.buffer = Tensor::empty({bk.end - bk.begin}, DType::F32);  // (end - begin)
  }
  std::memset(bk.buffer.raw_data(), 0, size_t(bk.end - bk.begin) * sizeof(float));
  for (size_t i : bk.params) {
    Tensor p = params_[i].second;  // shares the parameter's TensorImpl
    if (!p.grad().defined()) p.set_grad(view_of(bk.buffer.impl()->storage, layout_[i].offset - bk.begin, p.shape()));
  }
}

void DataParallel::on_grad_ready(size_t b) {
  Bucket& bk = buckets_[b];
  if (++bk.ready == int(bk.params.size()) && (o_.zero >= 2 || last_micro_ || o_.deterministic)) fire_bucket(b);
}

void DataParallel::fire_bucket(size_t b) {
  if (o_.deterministic) return fire_deterministic(b);
  Bucket& bk = buckets_[b];
  bk.fired = true;
  const int64_t n = bk.end - bk.begin;
  if (o_.zero == 0) {
    float* g = fptr(flat_grads_) + bk.begin;
    submit_bounded([this, g, n] { pg_->allreduce(g, n, o_.algo); });
    return;
  }
  if (o_.zero == 1) {  // only this rank's shard of the sum is needed: reduce-scatter, same bytes as DDP
    const float* in = fptr(flat_grads_) + bk.begin;
    std::vector<int64_t> counts = counts_in(bk.begin, bk.end);
    const int64_t mine = counts[size_t(pg_->rank())];
    float* dst = mine > 0 ? fptr(flat_grads_) + std::max(bk.begin, lo_) : nullptr;
    submit_bounded([this, in, counts, dst, mine] {
      Tensor out;
      {
        MemTagScope tag(MemTag::Workspace);
        out = Tensor::empty({std::max<int64_t>(mine, 1)}, DType::F32);  // (mine)
      }
      pg_->reduce_scatter(in, out.data<float>(), counts, o_.algo);
      if (mine > 0) std::memcpy(dst, out.data<float>(), size_t(mine) * sizeof(float));
    });
    return;
  }
  // ZeRO-2/3: copy the bucket's gradients out, free them, reduce-scatter into the shards.
  wait_in_flight(kMaxInFlight - 1);  // bounds the staging buffers alive at once
  Tensor staging = hand_off(b);      // (n) flat gradients of the bucket
  std::vector<int64_t> counts = counts_in(bk.begin, bk.end);
  const int64_t mine = counts[size_t(pg_->rank())];
  float* dst = mine > 0 ? fptr(grad_shard_) + (std::max(bk.begin, lo_) - lo_) : nullptr;
  submit_bounded([this, staging, counts, dst, mine] {
    Tensor out;
    {
      MemTagScope tag(MemTag::Workspace);
      out = Tensor::empty({std::max<int64_t>(mine, 1)}, DType::F32);
    }
    pg_->reduce_scatter(staging.data<float>(), out.data<float>(), counts, o_.algo);
    const float* src = out.data<float>();
    for (int64_t j = 0; j < mine; ++j) dst[j] += src[j];
  });
}

// At most kMaxInFlight bucket collectives queued at once, for every stage: the backward waits for
// the oldest before it queues another. Unbounded, one rank's queue can fall behind: its
// collectives then run back to back at a fraction of their usual speed (4-6 MiB buckets taking
// 50-150 ms instead of under 10), and the step ends with that rank waiting up to 1.4 s for the
// backlog (measured at 124M, dp 2, one thread per rank on 2 cores: every second or third step
// 1.0-1.4 s longer under ZeRO-0 and ZeRO-1; bounded, none in 32 steps). The bound also caps the ZeRO-2/3
// staging buffers alive at once.
void DataParallel::submit_bounded(std::function<void()> task) {
  wait_in_flight(kMaxInFlight - 1);
  in_flight_.push_back(queue_->submit(std::move(task)));
}

void DataParallel::wait_in_flight(size_t keep) {
  while (in_flight_.size() > keep) {
    queue_->wait(in_flight_.front());
    in_flight_.pop_front();
  }
}

// ZeRO-2/3: the bucket's gradients as one flat buffer, its parameters' gradients freed; the next
// bucket armed, and (ZeRO-3) the unit released once its gradients are out.
Tensor DataParallel::hand_off(size_t b) {
  Bucket& bk = buckets_[b];
  arm_bucket(b);
  Tensor staging = std::move(bk.buffer);  // (n) flat gradients of the bucket
  bk.buffer = Tensor();
  for (size_t i : bk.params) {
    Tensor p = params_[i].second;  // shares the parameter's TensorImpl
    Tensor g = p.grad();
    if (g.defined() && !g.same_storage(staging))
      std::memcpy(staging.data<float>() + (layout_[i].offset - bk.begin), g.data<float>(),
                  size_t(g.numel()) * sizeof(float));
    p.set_grad(Tensor());
  }
  if (b + 1 < buckets_.size() && !buckets_[b + 1].fired) arm_bucket(b + 1);
  if (o_.zero == 3 && units_[size_t(bk.unit)].module && !keep_all_) release_unit(size_t(bk.unit));
  return staging;
}

// Deterministic mode: the bucket's gradient of this micro-step's atom goes into the tree.
void DataParallel::fire_deterministic(size_t b) {
  Bucket& bk = buckets_[b];
  bk.fired = true;
  const int64_t n = bk.end - bk.begin;
  if (o_.zero < 2) {
    float* g = fptr(flat_grads_) + bk.begin;
    tree_add(g, bk.begin, n);
    std::memset(g, 0, size_t(n) * sizeof(float));  // the next atom's backward starts from zero
    return;
  }
  Tensor staging = hand_off(b);  // (n) flat gradients of the bucket
  tree_add(staging.data<float>(), bk.begin, n);
}

float* DataParallel::tree_level(size_t l) {
  while (tree_.size() <= l) tree_.push_back(zeroed_storage(padded_, MemTag::Grads));
  return fptr(tree_[l]);
}

// The binary counter over atoms: before atom i, level l holds the sum of an aligned block of 2^l
// atoms exactly when bit l of i is set; atom i carries through those levels (left + right) and
// lands in the first level whose bit is clear.
void DataParallel::tree_add(const float* src, int64_t begin, int64_t n) {
  size_t l = 0;
  const float* cur = src;
  while ((micro_ >> l) & 1) {
    float* left = tree_level(l) + begin;
    add_into(left, cur, n);
    cur = left;
    ++l;
  }
  float* dst = tree_level(l) + begin;
  if (dst != cur) std::memcpy(dst, cur, size_t(n) * sizeof(float));
}

void DataParallel::finish_gradients() {
  for (size_t b = 0; b < buckets_.size(); ++b)  // parameters the backward did not reach: zero gradients
    if (!buckets_[b].fired) fire_bucket(b);
  if (o_.deterministic) {
    const int64_t A = o_.accumulation;
    BRIGADE_CHECK((A & (A - 1)) == 0, ConfigError,
                  "parallel.deterministic: {} micro-steps per rank; the canonical tree needs a power of two", A);
    size_t top = 0;
    while ((int64_t(1) << top) < A) ++top;
    float* sum = tree_level(top);  // atom A - 1 (every bit set) carried the whole block up to here
    if (pg_->size() > 1) {
      const auto t0 = Clock::now();
      pg_->allreduce(sum, padded_, dist::AllreduceAlgo::Tree);  // ((r0 + r1) + (r2 + r3)) + ...
      direct_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
    }
    const float s = float(1.0 / (double(pg_->size()) * double(A)));
    if (s != 1.0f) scale(sum, padded_, s);
    if (o_.zero < 2)
      std::memcpy(fptr(flat_grads_), sum, size_t(padded_) * sizeof(float));
    else
      std::memcpy(fptr(grad_shard_), sum + lo_, size_t(S_) * sizeof(float));
    if (o_.zero == 3) release_persistent();
    return;
  }
  queue_->wait_all();
  in_flight_.clear();
  const float s = float(1.0 / (double(pg_->size()) * double(o_.accumulation)));
  if (s != 1.0f) {
    if (o_.zero == 0)
      scale(fptr(flat_grads_), padded_, s);
    else if (o_.zero == 1)
      scale(fptr(flat_grads_) + lo_, S_, s);
    else
      scale(fptr(grad_shard_), S_, s);
  }
  if (o_.zero == 3) release_persistent();
}

double DataParallel::grad_norm() {
  if (o_.deterministic) return deterministic_norm();
  if (o_.zero == 0) return optim::grad_norm(params_);  // full gradients on every rank
  const Tensor g = o_.zero == 1 ? view_of(flat_grads_, lo_, {S_}) : view_of(grad_shard_, 0, {S_});
  double sq = ops::sum_squares(g);
  const auto t0 = Clock::now();
  pg_->allreduce(&sq, 1);
  direct_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
  return std::sqrt(sq);
}

// The norm of what the optimizer reads (after loss unscaling), independent of dp and threads: the
// sum of squares of each block of kNormBlock flat elements, in double and in order, by the rank
// whose shard holds it (ZeRO-0: every rank, all blocks); the blocks' sums gathered (an allreduce
// of one non-zero per slot is exact) and added in block order.
double DataParallel::deterministic_norm() {
  const int64_t blocks = (numel_ + kNormBlock - 1) / kNormBlock;
  const bool whole = o_.zero == 0;
  const int64_t lo = whole ? 0 : lo_, hi = whole ? numel_ : std::min(hi_, numel_);
  std::vector<double> part(size_t(blocks), 0.0);
  const int64_t b0 = lo / kNormBlock, b1 = hi > lo ? (hi + kNormBlock - 1) / kNormBlock : b0;
#pragma omp parallel for schedule(static) if (b1 - b0 > 8)
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t begin = b * kNormBlock, n = std::min(hi, begin + kNormBlock) - begin;
    const float* g = o_.zero < 2 ? fptr(flat_grads_) + begin : fptr(grad_shard_) + (begin - lo_);
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += double(g[i]) * double(g[i]);
    part[size_t(b)] = s;
  }
  if (!whole && pg_->size() > 1) {
    const auto t0 = Clock::now();
    pg_->allreduce(part.data(), blocks);
    direct_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  double total = 0.0;
  for (double v : part) total += v;
  return std::sqrt(total);
}

double DataParallel::clip_grad_norm(double max_norm) {
  if (o_.deterministic) {  // one elementwise scaling of what the optimizer reads, for every stage
    const double norm = grad_norm();
    if (max_norm > 0.0 && norm > max_norm) {
      const float c = float(optim::clip_coefficient(norm, max_norm));
      if (o_.zero == 0)
        scale(fptr(flat_grads_), padded_, c);
      else if (o_.zero == 1)
        scale(fptr(flat_grads_) + lo_, S_, c);
      else
        scale(fptr(grad_shard_), S_, c);
    }
    return norm;
  }
  if (o_.zero == 0) return optim::clip_grad_norm(params_, max_norm);
  const double norm = grad_norm();
  if (max_norm > 0.0 && norm > max_norm)  // as torch's clip_grad_norm_
    ops::mul_scalar_(o_.zero == 1 ? view_of(flat_grads_, lo_, {S_}) : view_of(grad_shard_, 0, {S_}),
                     optim::clip_coefficient(norm, max_norm));
  return norm;
}

void DataParallel::after_optimizer_step() {
  if ((o_.zero == 1 || o_.zero == 2) && pg_->size() > 1) {
    const auto t0 = Clock::now();
    std::vector<int64_t> counts(size_t(pg_->size()), S_);
    pg_->allgather(fptr(flat_params_) + lo_, fptr(flat_params_), counts);
    direct_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  // ZeRO-3: a unit gathered by a prefetch that no forward or backward consumed (the backward of a
  // model whose blocks are not one chain, e.g. CLIP's two towers, prefetches a unit it already
  // finished) holds the weights from before this update: release it, so the next step gathers
  // the updated shards.
  if (o_.zero == 3 && !keep_all_)
    for (size_t u = 0; u < units_.size(); ++u)
      if (units_[u].module) release_unit(u);
}

// ---------------------------------------------------------------- ZeRO-3 gathering

void DataParallel::prefetch(size_t u) {
  Unit& un = units_[u];
  if (un.state != Unit::Released) return;
  un.storage->materialize();
  std::vector<int64_t> counts = counts_in(un.begin, un.end);
  const float* src = fptr(param_shard_) + std::clamp(un.begin - lo_, int64_t(0), S_);
  float* dst = fptr(un.storage);
  un.ticket = queue_->submit([this, src, dst, counts] { pg_->allgather(src, dst, counts); });
  un.state = Unit::Pending;
}

void DataParallel::ensure_gathered(size_t u) {
  Unit& un = units_[u];
  if (un.state == Unit::Released) prefetch(u);
  if (un.state == Unit::Pending) {
    queue_->wait(un.ticket);
    un.state = Unit::Gathered;
  }
}

void DataParallel::release_unit(size_t u) {
  Unit& un = units_[u];
  if (un.state == Unit::Released) return;
  if (un.state == Unit::Pending) queue_->wait(un.ticket);
  un.storage->free_data();
  un.state = Unit::Released;
}

void DataParallel::gather_persistent() {
  if (o_.zero != 3) return;
  for (size_t u = 0; u < units_.size(); ++u)
    if (!units_[u].module) prefetch(u);
  for (size_t u = 0; u < units_.size(); ++u)
    if (!units_[u].module) ensure_gathered(u);
}

void DataParallel::release_persistent() {
  if (o_.zero != 3 || keep_all_) return;
  for (size_t u = 0; u < units_.size(); ++u)
    if (!units_[u].module) release_unit(u);
}

void DataParallel::gather_all() {
  if (o_.zero != 3) return;
  keep_all_ = true;
  for (size_t u = 0; u < units_.size(); ++u) prefetch(u);
  for (size_t u = 0; u < units_.size(); ++u) ensure_gathered(u);
}

void DataParallel::release_all() {
  if (o_.zero != 3) return;
  keep_all_ = false;
  for (size_t u = 0; u < units_.size(); ++u) release_unit(u);
}

void DataParallel::for_each_unit_gathered(const std::function<void(const nn::NamedTensors&)>& fn) {
  if (o_.zero != 3) {
    fn(params_);
    return;
  }
  std::vector<bool> was_released;
  for (const Unit& u : units_) was_released.push_back(u.state == Unit::Released);
  for (size_t u = 0; u < units_.size(); ++u) {
    if (u + 1 < units_.size()) prefetch(u + 1);
    ensure_gathered(u);
    nn::NamedTensors ps;
    for (size_t i : units_[u].params) ps.push_back(params_[i]);
    fn(ps);
    if (was_released[u] && !keep_all_) release_unit(u);
  }
}

// ---------------------------------------------------------------- checkpoint state

std::map<std::string, Tensor> DataParallel::shard_state(const nn::NamedTensors& state) const {
  BRIGADE_ASSERT(o_.zero >= 1, "shard_state() needs ZeRO >= 1");
  std::map<std::string, const Tensor*> by_name;
  std::set<std::string> kinds;
  for (auto& [n, t] : state) {
    by_name[n] = &t;
    kinds.insert(split_state_name(n).first);
  }
  const int64_t len = std::max<int64_t>(0, shard_end() - lo_);
  std::map<std::string, Tensor> out;
  for (const std::string& k : kinds) {
    Tensor flat = Tensor::zeros({len}, DType::F32);  // (len) this rank's shard of state k
    for (size_t j = 0; j < opt_params_.size(); ++j) {
      auto it = by_name.find(k + "." + opt_params_[j].first);
      BRIGADE_ASSERT(it != by_name.end(), "optimizer state {}.{} missing", k, opt_params_[j].first);
      const auto [a, b] = opt_ranges_[j];
      std::memcpy(flat.data<float>() + (a - lo_), it->second->data<float>(), size_t(b - a) * sizeof(float));
    }
    out.emplace(k, flat);
  }
  return out;
}

void DataParallel::load_shard_state(const std::map<std::string, Tensor>& flat, const nn::NamedTensors& state) const {
  for (auto& [n, t] : state) {
    const auto [kind, pname] = split_state_name(n);
    auto it = flat.find(kind);
    BRIGADE_CHECK(it != flat.end(), CheckpointError,
                  "optimizer state '{}' is missing from the checkpoint; it was saved with another optimizer", kind);
    size_t j = 0;
    while (j < opt_params_.size() && opt_params_[j].first != pname) ++j;
    BRIGADE_ASSERT(j < opt_params_.size(), "state for unknown parameter '{}'", pname);
    const auto [a, b] = opt_ranges_[j];
    BRIGADE_ASSERT(it->second.numel() >= b - lo_, "flat state {} too short", kind);
    std::memcpy(t.data<float>(), it->second.data<float>() + (a - lo_), size_t(b - a) * sizeof(float));
  }
}

}  // namespace brigade::parallel
