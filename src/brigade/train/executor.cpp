// The local step executor and the model's data-parallel units; see executor.h.
#include "brigade/train/executor.h"

#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/nn/layers.h"

namespace brigade::train {

std::vector<parallel::ParamUnit> model_units(const nn::Module& model) {
  std::vector<parallel::ParamUnit> units(1);
  units[0].name = "embeddings+head";
  const auto blocks = nn::find_blocks(model);
  std::vector<parallel::ParamUnit> block_units(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    block_units[i].name = blocks[i].first;
    block_units[i].module = blocks[i].second;
  }
  for (auto& [name, p] : model.named_parameters()) {
    if (!p.requires_grad()) continue;  // frozen (fine-tuning): no gradient, no optimizer state, never sharded
    bool placed = false;
    for (size_t i = 0; i < blocks.size() && !placed; ++i)
      if (name.rfind(block_units[i].name + ".", 0) == 0) {
        block_units[i].params.emplace_back(name, p);
        placed = true;
      }
    if (!placed) units[0].params.emplace_back(name, p);
  }
  for (auto& u : block_units) units.push_back(std::move(u));
  std::erase_if(units, [](const parallel::ParamUnit& u) { return u.params.empty(); });
  return units;
}

namespace {

class LocalExecutor : public StepExecutor {
 public:
  LocalExecutor(Task& task, std::shared_ptr<dist::ProcessGroup> world) : task_(task), world_(std::move(world)) {}

  std::vector<parallel::ParamUnit> units(int zero) override { return task_.units(zero); }
  std::shared_ptr<dist::ProcessGroup> dp_group() override { return world_; }
  Shard shard() override { return {world_->rank(), world_->size(), world_.get()}; }

  double train_micro(Task& task, const Batch& b, int64_t micro, double factor, double weight, const amp::Policy& policy,
                     Metrics& train_metrics, const std::function<void()>& after_forward) override {
    Loss l;
    {
      amp::AutocastScope autocast(policy);
      l = task.loss(b, micro, train_metrics);
    }
    if (after_forward) after_forward();
    // the scaled loss is an f32 scalar (outside the autocast scope, so never rounded to fp16)
    autograd::backward(factor != 1.0 ? fn::mul_scalar(l.loss, factor) : l.loss);
    const double v = l.value ? *l.value : l.loss.item();
    return weight != 1.0 ? v * weight : v;
  }

  Task::Scorer scorer(Task& task, const amp::Policy& policy) override {
    return [&task, policy](const Batch& b, Metrics& m) {
      amp::AutocastScope autocast(policy);
      task.score(b, m);
    };
  }

 private:
  Task& task_;
  std::shared_ptr<dist::ProcessGroup> world_;
};

}  // namespace

std::unique_ptr<StepExecutor> make_local_executor(Task& task, std::shared_ptr<dist::ProcessGroup> world) {
  return std::make_unique<LocalExecutor>(task, std::move(world));
}

}  // namespace brigade::train
