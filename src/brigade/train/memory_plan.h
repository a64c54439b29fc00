// Memory accounting ahead of time: what `brigade train RECIPE --dry-run` prints and what
// a run writes beside its measurements in memory.json["predicted"]. For one rank of a
// recipe's plan (model, micro-batch, optimizer, data parallelism + ZeRO stage, activation
// recompute policy) it predicts the bytes the caching allocator will account per MemTag,
// rounded as Allocator::round_size rounds them, from formulas alone: no model is built and
// no data is read. docs/memory.md "Memory accounting and --dry-run" gives the formulas and
// a predicted-vs-measured table.
//
// Categories (peak = high-water mark during the training loop, live = between steps):
//   params       zero 0-2: the flat fp32 parameter buffer (each parameter 16-float aligned,
//                padded to dp x S); zero 3: this rank's shard S, plus at the peak the
//                embeddings+head unit and two block units gathered (computing + prefetched)
//   grads        zero 0-1: the flat gradient buffer (same size as params); zero 2-3: the
//                gradient shard plus the bucket buffers alive at once: 2 consecutive buckets
//                without overlap or with one rank; with overlap it depends on how fast the
//                reduce-scatters finish: 2 up to 4 (ZeRO-2) or 3 (ZeRO-3, whose gathers
//                order the queue), predicted as the range [peak_low, peak]
//   optimizer    per optimizer tensor (a parameter, or its piece of this rank's shard under
//                ZeRO >= 1): 2 states for adamw and lamb, 1 for sgd with momentum, 0 without
//   activations  the peak of one micro-batch's forward + backward, from the tensors each
//                op saves per block under the block's recompute mode
//                (models::estimate_activation_peak, shared with the "budget" planner)
//   workspace    the attention kernels' per-thread tiles (run.threads x one thread's), and
//                ZeRO >= 1: one reduce-scatter output (this rank's part of a bucket) at a time,
//                which with overlap on may coincide with the tiles (the range [max, sum]);
//                at least the gradient norm's partial sums
//   other        ZeRO-3, rank 0: the per-parameter copies a checkpoint is written from
// Total: the steady state plus the activation peak, plus what ZeRO holds transiently at that
// moment (the head's backward): the embeddings+head unit (zero 3) and the first armed
// gradient bucket (zero >= 2).
#pragma once
#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "brigade/core/allocator.h"
#include "brigade/train/config.h"

namespace brigade::train {

class Task;

struct PredictedCategory {
  int64_t peak = 0;      // bytes, as the allocator accounts them (an upper bound where timing decides)
  int64_t peak_low = 0;  // the lower end where the peak depends on communication timing (ZeRO-2/3
                         // gradient buckets, ZeRO >= 1 workspace, with overlap on); equal to peak elsewhere
  int64_t live = 0;      // bytes held between steps (what memory.json's "live" reports at the end)
  std::string formula;   // the formula in words, with this recipe's numbers
};

struct MemoryPrediction {
  int rank = 0, dp = 1, zero = 0;
  std::array<PredictedCategory, kNumMemTags> tags;  // indexed by MemTag
  int64_t total_peak = 0;
  std::string total_formula;
  std::string recompute;  // per-block modes, e.g. "nnnn" (n = none, s = selective, f = full)
  bool measured = false;  // activations and workspace from a measured dry step (MemoryInputs)

  const PredictedCategory& operator[](MemTag t) const { return tags[size_t(t)]; }
};

// One transformer block's or the embeddings+head unit's parameters (numel each, in the
// model's parameter order). The flat layout of parallel::DataParallel is built from these.
struct PlannedUnit {
  std::string name;
  std::vector<std::pair<std::string, int64_t>> params;  // full name, numel
};
// GPT's parameter units as train's model_units() builds them: "embeddings+head" (wte, wpe,
// ln_f), then transformer.h.0 .. h.{L-1}.
std::vector<PlannedUnit> planned_gpt_units(const ModelConfig& m);

// What a prediction is made from: the parameter units (their flat layout gives params, grads,
// optimizer and other), and the activation and kernel-workspace peaks of one micro-batch.
// Models with formulas (the registry's memory_formula: GPT) get the activation estimate of
// models::estimate_activation_peak; the others a measured dry step: their task is built, one
// synthetic micro-batch runs forward and backward (and one evaluation batch forward) on the
// caching allocator, and the activation / workspace peaks are read off it (exact for this
// process's kernels, at the recipe's precision; nothing trained, no data read).
struct MemoryInputs {
  std::vector<PlannedUnit> units;
  int64_t act_peak = 0, act_live = 0;
  std::string act_formula;
  int64_t work_compute = 0;  // kernel scratch (attention tiles, ...), before ZeRO's buffers
  std::string work_formula;
  std::string recompute;  // per-block modes, "n" / "s" / "f"
  bool measured = false;
  // Frozen parameters (fine-tuning: LoRA's base), per tensor: outside the flat buffers, held
  // whole on every rank, with no gradient or optimizer state, in their stored dtype (bf16 with
  // lora.base_dtype = "bf16").
  struct Frozen {
    int64_t numel = 0, element_bytes = 4;
  };
  std::vector<Frozen> frozen;
  // Measured dry steps only: the parameters' working copies at the step's peak, above the stored
  // parameters (the casts of the weights the ops read in another dtype: a frozen base stored in
  // bf16 and computed in f32 at O0, one weight at a time; the GEMMs' 16-bit copies at O1-O3).
  int64_t params_work = 0;
  // Measured dry steps only, for ZeRO-2/3 (parallel::DataParallel's gathers and buckets), read
  // when the backward first enters a gathered unit (for the transformers the last block, once the
  // head's backward is done):
  // - params_work_backward: the most working copies alive from there to the end of the backward
  //   (the blocks' casts, saved since their forward or re-made by a recompute), which ZeRO-3
  //   holds beside the two block units it has gathered; -1 = not measured (ZeRO-3 then adds
  //   params_work, the whole step's peak of them, to the gathered pair: an upper bound);
  // - early_grads: the parameters whose gradients exist by then (the head's weights: an untied
  //   LM head, a final norm). Unless they are in the first bucket (armed before the backward),
  //   their gradients live outside the buckets until theirs fires.
  int64_t params_work_backward = -1;
  std::vector<std::string> early_grads;
};
MemoryInputs memory_inputs(const Recipe& r);
// Whether memory_inputs uses the formulas (GPT in fp32, no LoRA) rather than a measured dry step.
bool memory_from_formulas(const Recipe& r);
// The measured dry step alone, for any model (GPT included): what memory_inputs gives a model
// without formulas. Tests pin GPT's formulas to it byte for byte.
MemoryInputs measured_inputs(const Recipe& r);
// The same on a task already built from r's model (its recompute modes are set from r): for a
// caller that measures several precision levels and recompute modes on one large model.
MemoryInputs measured_inputs(const Recipe& r, Task& task);

// Predicted memory of `rank` (0 <= rank < parallel.dp) for the recipe. ConfigError for a
// recipe training would also refuse (e.g. a recompute budget below the least possible).
MemoryPrediction predict_memory(const Recipe& r, int rank = 0);
MemoryPrediction predict_memory(const Recipe& r, int rank, const MemoryInputs& in);

// memory.json["predicted"] and `--dry-run --json`: live / peak / peak_low bytes per category (and
// the formulas when asked).
nlohmann::json prediction_json(const MemoryPrediction& p, bool formulas);
// `brigade train --dry-run --json`: {model, measured, dp, zero, ranks: [prediction_json per rank]}.
nlohmann::json dry_run_json(const Recipe& r);

// The `--dry-run` report: a table of predicted peak (and live) bytes per category, one
// column per rank when ranks differ, and the formula of each category.
std::string dry_run_report(const Recipe& r);

// Bytes as "12.3 MiB" (KiB below 1 MiB, GiB from 1 GiB).
std::string format_bytes(int64_t bytes);

}  // namespace brigade::train
