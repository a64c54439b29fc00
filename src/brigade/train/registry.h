// The model registry: one row per model.type. A row says what the model trains on, which
// recipe keys it reads, what it supports, how to check its recipe and how to build its task.
// Adding a model is a folder under models/, a row in registry.cpp and tests. Every command
// (train, eval, bench, --dry-run, ablate, generate) finds the model through its row, and an
// unsupported combination is refused in one place (check_supported) with a message naming the
// model, the feature and the models that have it.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "brigade/train/config.h"

namespace brigade::train {

class Task;

// What a model trains on. Any: a model defined outside the zoo (model.type = "custom"), whose
// task the caller builds and hands to train::train (examples/custom_cnn).
enum class DataKind { Text, FashionMnist, Any };

struct Capabilities {
  bool tensor_parallel = false;    // parallel.tp > 1: the model has a tensor-parallel plan
  bool pipeline_parallel = false;  // parallel.pp > 1: the task gives its forward in stages
  bool recompute_budget = false;   // memory.recompute = "budget": an activation estimate exists
  bool memory_formula = false;     // --dry-run from formulas alone (else a measured dry step)
  bool dropout = false;            // model.dropout > 0
  bool sample = false;             // a text sample at the end of training; `brigade generate`
  bool batch_norm = false;         // has BatchNorm (parallel.sync_batchnorm applies)
  // data.corpus = "synthetic": random images of any model.image_size / in_channels / num_classes,
  // for `brigade bench` and --dry-run at shapes Fashion-MNIST does not have (training refuses it)
  bool synthetic_images = false;
};

using Fail = std::function<void(const std::string&)>;

struct ModelEntry {
  std::string_view type;     // model.type
  std::string_view summary;  // "GPT-2 causal language model"
  DataKind data;
  // The model.* keys (and data.mlm_probability / data.augment) this model reads besides the
  // common ones; any other model key set away from its default is refused by name.
  std::vector<std::string_view> keys;
  Capabilities caps;
  // Model-specific range and combination checks (shapes, heads, the data it needs).
  void (*validate)(const Recipe& r, const Fail& fail);
  // The model initialised from run.seed (dropout seeded with run.seed + 1) inside its task.
  std::unique_ptr<Task> (*make_task)(const Recipe& r);
};

const std::vector<ModelEntry>& model_registry();
// The row of `type`; ConfigError listing the known types (with a did-you-mean) otherwise.
const ModelEntry& model_entry(const std::string& type);
// Every model type, comma-separated ("gpt, llama, ...").
std::string model_types();
// The types whose row has a capability, e.g. "gpt, llama, bert, vit".
std::string model_types_with(bool Capabilities::*cap);

// The model part of validate_recipe (called by it): the row's keys, data kind and checks.
void validate_model(const Recipe& r, const Fail& fail);
// What the recipe asks that this model cannot do: parallel.tp / pp without a plan, a recompute
// budget without an estimate, dropout on a model without dropout, sync_batchnorm without
// BatchNorm. ConfigError "model.type = "X" ... ; supported by: ...". Part of validate_model.
void check_supported(const Recipe& r, const Fail& fail);

// The recipe's task (model built and initialised; data not opened yet: Task::open_data), with
// fine-tuning applied (train/finetune.h): model.init_from's weights loaded unless `init_weights`
// is false (a checkpoint replaces every weight next), and finetune.method's adapters added.
std::unique_ptr<Task> make_task(const Recipe& r, bool init_weights = true);

}  // namespace brigade::train
