// Megatron-style tensor parallelism (Shoeybi et al. 2019) for any model that declares a plan
// (nn/tp_plan.h: GPT::tp_plan(), LLaMA::tp_plan(), BERT::tp_plan(), ViT::tp_plan()), applied
// from outside by one generic function: the model code stays single-device, and parallel/ does
// not depend on models/.
//
// Design. Four differentiable communication functions (autograd nodes, collective over
// a tensor-parallel group `tp`) carry all the communication:
//   tp_copy    f: identity forward, allreduce of the gradient in the backward;
//   tp_reduce  g: allreduce forward, identity backward;
//   vocab_parallel_embedding / vocab_parallel_cross_entropy: a token embedding and an LM head
//              (tied or not) + loss on a shard of the vocabulary, never building the full
//              (N, V) logits (global max, sum of exponentials and target logit by allreduce).
// apply_tensor_parallel replaces the full parameters of the modules the plan names by this
// rank's shards (Module::set_parameter) and installs the layer hooks of nn/linear.h, nn/embedding.h:
//   Column          y_local = tp_copy(x) W[:, cols] + b[cols]         (Linear)
//   Row             y = tp_reduce(x_local W[rows, :]) + b               (Linear, b replicated)
//   VocabEmbedding  vocabulary-parallel lookup and Embedding::lm_loss   (rows padded to a
//                   multiple of tp; padding rows are zero and excluded from the loss)
//   VocabHead       column-parallel Linear over the padded vocabulary + vocabulary-parallel
//                   cross-entropy in Linear::lm_loss
//   Heads           HeadParallel::divide_heads(tp): the attention computes its n_head / tp heads
// Everything the plan does not name (norms, position embeddings, the row-parallel biases, and
// for BERT and ViT the embeddings and heads) is replicated: every rank holds the same values and
// computes the same gradients for it. A transformer block thus costs two allreduces of (B, T, C)
// in the forward and two in the backward.
//
// Dropout: the dropouts of these models sit on replicated tensors (after a reduce, or outside
// the split layers), so every tp rank must draw the same masks: the caller seeds the model's
// dropout generator identically on all ranks of a tp group.
//
// Weights are in each Linear's own layout (torch (out, in) or HF Conv1D (in, out)): a column
// split cuts the out dim (and the bias), a row split the in dim. Every rank first builds the full
// model with the same init; the plan copies its slices into fresh contiguous tensors
// (MemTag::Params) and drops the full ones. The TpLayout it returns knows every parameter's split
// (taken from the model's shapes before sharding), so tp_shard_param / tp_gather_param convert
// between the full (checkpoint) form and this rank's shard without any model config.
//
// All collectives here run on the calling thread, in the same order on every rank of
// the group (they follow the model's forward and backward). 16-bit tensors are reduced
// by widening to f32 and rounding back once.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "brigade/core/tensor.h"
#include "brigade/dist/process_group.h"
#include "brigade/nn/module.h"
#include "brigade/nn/tp_plan.h"

namespace brigade::parallel {

// ---- differentiable communication. The group must outlive the graph (a pointer is kept).
// A group of size 1 makes each of these the plain single-device function.

// Identity forward (x itself); backward: the gradient summed over tp (Megatron's "f").
Tensor tp_copy(const Tensor& x, dist::ProcessGroup& tp);
// Forward: x summed over tp into a fresh tensor; backward: identity (Megatron's "g").
Tensor tp_reduce(const Tensor& x, dist::ProcessGroup& tp);

// weight_shard (Vl, C): rows [vocab_start, vocab_start + Vl) of the table; ids (...) i32/i64
// in [0, V_pad). Returns (..., C) = the full table's rows, summed over tp (each id is found
// on exactly one rank, the others contribute zero). Backward: the gradient rows of this
// rank's ids go to the shard (scatter-add). Autocast as fn::embedding.
Tensor vocab_parallel_embedding(const Tensor& weight_shard, const Tensor& ids, int64_t vocab_start,
                                dist::ProcessGroup& tp);

// logits_shard (N, Vl): columns [vocab_start, vocab_start + Vl) of the logits; targets (N)
// i32/i64 in [0, vocab_size) or ignore_index. Returns the 0-d f32 mean cross-entropy over
// rows whose target is not ignore_index, the value fn::cross_entropy gives on the full
// logits; columns at or past vocab_size (padding) are excluded. Computed in f32 (16-bit
// logits are widened); the gradient (softmax - onehot) * grad / count, zero on padding
// columns and ignored rows, returns in the logits' dtype. NaN when every row is ignored.
Tensor vocab_parallel_cross_entropy(const Tensor& logits_shard, const Tensor& targets, int64_t vocab_start,
                                    int64_t vocab_size, dist::ProcessGroup& tp, int64_t ignore_index = -100);

// ---- the plan

// How one parameter is split over a group of `size` ranks. Along `dim` the (padded) full extent
// is `groups` groups of `size` blocks of k: rank r holds block r of every group, concatenated
// (groups x k). groups = 3 for GPT's fused [q | k | v] (each split by heads), 1 otherwise.
struct TpSplit {
  bool sharded = false;  // false: replicated (every rank holds it whole)
  int64_t dim = 0;
  int64_t groups = 1;
  Shape full;                               // the whole parameter (as the checkpoint holds it)
  int64_t real = 0;                         // extent along dim without padding (a vocabulary: V)
  int64_t padded = 0;                       // extent along dim with padding (V_pad, a multiple of size)
  nn::TpStyle style = nn::TpStyle::Column;  // the rule that split it (sharded only)
};

// Every parameter's split for one plan, one model and one group size, by full parameter name.
class TpLayout {
 public:
  int size() const { return size_; }
  bool contains(const std::string& name) const { return splits_.count(name) > 0; }
  // ValueError naming the parameter when the model has none of that name.
  const TpSplit& split(const std::string& name) const;
  // The shard this plan gives a rank: the full shape with `dim` cut to groups x k.
  Shape shard_shape(const std::string& name) const;
  const std::vector<std::string>& names() const { return names_; }  // the model's order

 private:
  friend TpLayout tp_layout(const nn::Module& model, const nn::TpPlan& plan, int tp_size);
  int size_ = 1;
  std::vector<std::string> names_;
  std::map<std::string, TpSplit> splits_;
};

// The layout `plan` gives `model` (built in full, not yet sharded) over tp_size ranks, without
// changing it. ValueError when a rule matches no module or one of the wrong kind, when two rules
// split the same module, or when the model is already sharded; ConfigError (naming parallel.tp)
// when an attention's heads or a split extent are not divisible by tp_size.
TpLayout tp_layout(const nn::Module& model, const nn::TpPlan& plan, int tp_size);

// Shards `model` (built in full, with the same init, on every rank of tp) over tp by `plan`:
// this rank keeps its part of every module the plan splits (see the top of this file). The
// model holds `tp` (in its layer hooks) from then on. Errors as tp_layout. Call before building
// DataParallel or an optimizer over the parameters (they are replaced). A group of size 1
// leaves the parameters in place and installs no hooks. Returns the layout.
TpLayout apply_tensor_parallel(nn::Module& model, const nn::TpPlan& plan, std::shared_ptr<dist::ProcessGroup> tp);

// The padded vocabulary ceil(V / tp) * tp; rank t owns rows [t V_pad / tp, (t + 1) V_pad / tp).
int64_t tp_padded_vocab(int64_t vocab_size, int tp_size);

// True for parameters every tp rank holds identically (what the plan leaves whole, and the
// biases of row-parallel layers): a global gradient norm counts them once.
bool tp_replicated(const TpLayout& layout, const std::string& full_param_name);

// Collective over tp (of layout.size() ranks): the full parameter (vocabulary padding removed,
// the local tensor's dtype) from each rank's shard `local`, on every rank. Replicated
// parameters come back as a copy of `local`. Also gathers gradients (pass the shard's grad).
// ShapeError when `local` is not this parameter's shard shape.
Tensor tp_gather_param(const TpLayout& layout, const std::string& full_param_name, const Tensor& local,
                       dist::ProcessGroup& tp);

// The inverse, without communication: rank tp_rank's shard of the full parameter `full` (a
// fresh contiguous tensor under MemTag::Params; zero padding rows for a vocabulary), or `full`
// itself for replicated parameters. ShapeError when `full` does not have the parameter's shape.
Tensor tp_shard_param(const TpLayout& layout, const std::string& full_param_name, const Tensor& full, int tp_rank);

}  // namespace brigade::parallel
