// Shared pieces of the task interface; see task.h.
#include "brigade/train/task.h"

#include "brigade/core/error.h"
#include "brigade/train/executor.h"

namespace brigade::train {

namespace {
struct ItemNames {
  const char *name, *rate_key, *rate_unit, *seen_key;
};
const ItemNames& names(ItemKind k) {
  static const ItemNames table[] = {{"tokens", "tokens_per_s", "tok/s", "tokens_seen"},
                                    {"images", "images_per_s", "img/s", "images_seen"},
                                    {"pairs", "pairs_per_s", "pairs/s", "pairs_seen"}};
  return table[size_t(k)];
}
}  // namespace

const char* item_name(ItemKind k) { return names(k).name; }
const char* item_rate_key(ItemKind k) { return names(k).rate_key; }
const char* item_rate_unit(ItemKind k) { return names(k).rate_unit; }
const char* items_seen_key(ItemKind k) { return names(k).seen_key; }

std::vector<parallel::ParamUnit> Task::units(int) { return model_units(model()); }

std::vector<parallel::ParamUnit> single_unit_below_zero3(nn::Module& model, int zero) {
  if (zero == 3) return model_units(model);
  nn::NamedTensors trainable;  // frozen parameters (fine-tuning) have no gradient and no optimizer state
  for (auto& [name, p] : model.named_parameters())
    if (p.requires_grad()) trainable.emplace_back(name, p);
  return {parallel::ParamUnit{"model", std::move(trainable), nullptr}};
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
