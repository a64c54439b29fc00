// Shared pieces of the task interface; see task.h.
#include "brigade/train/task.h"

#include "brigade/core/error.h"
#include "brigade/train/executor.h"

namespace brigade::train {

const char* item_name(ItemKind k) {
  switch (k) {
    case ItemKind::Token: return "tokens";
    case ItemKind::Image: return "images";
    case ItemKind::Pair: return "pairs";
  }
  return "items";
}

const char* item_rate_key(ItemKind k) {
  switch (k) {
    case ItemKind::Token: return "tokens_per_s";
    case ItemKind::Image: return "images_per_s";
    case ItemKind::Pair: return "pairs_per_s";
  }
  return "items_per_s";
}

const char* item_rate_unit(ItemKind k) {
  switch (k) {
    case ItemKind::Token: return "tok/s";
    case ItemKind::Image: return "img/s";
    case ItemKind::Pair: return "pairs/s";
  }
  return "items/s";
}

const char* items_seen_key(ItemKind k) {
  switch (k) {
    case ItemKind::Token: return "tokens_seen";
    case ItemKind::Image: return "images_seen";
    case ItemKind::Pair: return "pairs_seen";
  }
  return "items_seen";
}

std::vector<parallel::ParamUnit> Task::units(int) { return model_units(model()); }

std::vector<parallel::ParamUnit> single_unit_below_zero3(nn::Module& model, int zero) {
  if (zero == 3) return model_units(model);
  return {parallel::ParamUnit{"model", model.named_parameters(), nullptr}};
}

double Metrics::get(const std::string& key) const {
  auto it = sums_.find(key);
  return it == sums_.end() ? 0.0 : it->second;
}

void Metrics::merge(const Metrics& o) {
  for (auto& [k, v] : o.sums_) sums_[k] += v;
}

void Metrics::allreduce(dist::ProcessGroup& g, const std::vector<std::string>& keys) {
  if (keys.empty()) return;
  std::vector<double> v;
  for (const std::string& k : keys) v.push_back(get(k));
  g.allreduce(v.data(), int64_t(v.size()));
  for (size_t i = 0; i < keys.size(); ++i) sums_[keys[i]] = v[i];
}

const Tensor& Batch::at(const std::string& key) const {
  auto it = t.find(key);
  BRIGADE_CHECK(it != t.end(), InternalError, "batch has no tensor '{}'", key);
  return it->second;
}

Batch Batch::narrow(int64_t lo, int64_t n) const {
  Batch b;
  for (auto& [k, v] : t) b.t[k] = v.narrow(0, lo, n);
  b.rows = n;
  b.count = n;
  return b;
}

}  // namespace brigade::train
