// Megatron-style tensor parallelism (Shoeybi et al. 2019) for the GPT model, applied
// from outside as a plan: the model code stays single-device.
//
// Design. Four differentiable communication functions (autograd nodes, collective over
// a tensor-parallel group `tp`) carry all the communication:
//   tp_copy    f: identity forward, allreduce of the gradient in the backward;
//   tp_reduce  g: allreduce forward, identity backward;
//   vocab_parallel_embedding / vocab_parallel_cross_entropy: the token embedding and the
//              tied LM head + loss on a shard of the vocabulary, never building the full
//              (N, V) logits (global max, sum of exponentials and target logit by allreduce).
// apply_tensor_parallel replaces the full parameters by this rank's shards
// (Module::set_parameter) and installs the layer hooks of nn/layers.h:
//   attn.c_attn, mlp.c_fc    column-parallel  y_local = tp_copy(x) W[:, cols] + b[cols]
//   attn.c_proj, mlp.c_proj  row-parallel     y = tp_reduce(x_local W[rows, :]) + b
//   transformer.wte          vocabulary-parallel lookup and loss (rows padded to a
//                            multiple of tp; padding rows are zero and excluded from the loss)
// and sets each attention's n_head to the local head count n_head / tp. LayerNorms,
// wpe and the row-parallel biases are replicated (every rank holds the same values and
// computes the same gradients for them). One block thus costs two allreduces of
// (B, T, C) in the forward and two in the backward.
//
// Dropout: GPT-2's dropouts sit on replicated tensors (after the embedding's reduce and
// after each row-parallel reduce), so every tp rank must draw the same masks: the
// caller seeds the model's dropout generator (GPT::dropout_generator) identically on
// all ranks of a tp group.
//
// Weights are Hugging Face Conv1D layout (in, out). Every rank first builds the full
// model with the same init; the plan copies its slices into fresh contiguous tensors
// (MemTag::Params) and drops the full ones. tp_shard_param / tp_gather_param convert
// between the full (checkpoint) form and this rank's shard.
//
// All collectives here run on the calling thread, in the same order on every rank of
// the group (they follow the model's forward and backward). 16-bit tensors are reduced
// by widening to f32 and rounding back once.
#pragma once
#include <memory>
#include <string>

#include "brigade/core/tensor.h"
#include "brigade/dist/process_group.h"
#include "brigade/models/gpt/gpt.h"

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

// Shards `model` (built in full, with the same init, on every rank of tp) over tp:
// this rank keeps its heads, MLP columns/rows and vocabulary rows (see the top of this
// file). The model holds `tp` (in its layer hooks) from then on. ConfigError when
// model.n_head is not divisible by the group size. Call before building DataParallel
// or an optimizer over the parameters (they are replaced). A group of size 1 leaves the
// parameters in place and installs no hooks.
void apply_tensor_parallel(models::GPT& model, std::shared_ptr<dist::ProcessGroup> tp);

// The padded vocabulary ceil(V / tp) * tp; rank t owns rows [t V_pad / tp, (t + 1) V_pad / tp).
int64_t tp_padded_vocab(int64_t vocab_size, int tp_size);

// True for parameters every tp rank holds identically (LayerNorms, wpe, the biases of
// the row-parallel attn.c_proj / mlp.c_proj): a global gradient norm counts them once.
bool tp_replicated(const std::string& full_param_name);

// Collective over tp: the full parameter (Hugging Face shape, vocabulary padding
// removed, the local tensor's dtype) from each rank's shard `local`, on every rank.
// Replicated parameters come back as a copy of `local`. Also gathers gradients (pass
// the shard's grad). ShapeError when `local` is not this parameter's shard shape.
Tensor tp_gather_param(const std::string& full_param_name, const Tensor& local, const models::GPTConfig& full_cfg,
                       dist::ProcessGroup& tp);

// The inverse, without communication: rank tp_rank's shard of the full parameter `full`
// (a fresh contiguous tensor under MemTag::Params; zero padding rows for wte), or `full`
// itself for replicated parameters. ShapeError when `full` does not have the shape
// full_cfg gives this parameter.
Tensor tp_shard_param(const std::string& full_param_name, const Tensor& full, const models::GPTConfig& full_cfg,
                      int tp_rank, int tp_size);

}  // namespace brigade::parallel
