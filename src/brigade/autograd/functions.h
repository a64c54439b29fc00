// Differentiable functions: each runs a raw op (ops/ops.h) and, when grad mode is on and an input
// needs a gradient, records a Node whose backward (ops:: calls, so any backend) is the derivative
// rule, in autograd/rules/<family>.cpp (the ops/ stems, plus shape and checkpoint). Model code
// calls these (`namespace F = brigade::fn`), never ops:: directly.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>

#include "brigade/core/rng.h"
#include "brigade/core/tensor.h"
#include "brigade/ops/ops.h"

namespace brigade::fn {

using ops::WeightLayout;

// Precision: each function computes in the dtype the active policy (amp/policy.h; the amp::Op
// comments say which functions are which kind) gives its kind of op, casting floating inputs first
// with recorded casts; at O0 it runs in its inputs' dtype (two floating dtypes: f32). Functions
// that only move values (reshape, patchify, roll2d, concat, ...) run in their inputs' dtype.
// Gradients come back in each input's own dtype.

// x converted to dtype dt (x itself when it already is); differentiable: the backward
// converts the gradient back. A cast of a parameter is allocated as MemTag::Params.
Tensor cast(const Tensor& x, DType dt);

// ---- elementwise (broadcasting) and scalar, activations
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor mul_scalar(const Tensor& a, double s);
Tensor add_scalar(const Tensor& a, double s);
Tensor gelu(const Tensor& x);
// Exact GELU: 0.5 x (1 + erf(x / sqrt 2)) (torch's default gelu; fn::gelu is the tanh form).
Tensor gelu_erf(const Tensor& x);
// x * sigmoid(x).
Tensor silu(const Tensor& x);
Tensor relu(const Tensor& x);
// relu(add(a, b)) in one pass and one node (ResNet's residual join), bitwise the same; a and b of
// one shape.
Tensor add_relu(const Tensor& a, const Tensor& b);
// torch.sigmoid; the backward reads the output (saved detached): g y (1 - y).
Tensor sigmoid(const Tensor& x);
// torch.reciprocal, 1 / x; the backward reads the output (saved detached): -g y^2.
Tensor reciprocal(const Tensor& x);
// Elementwise exp(x) in x's dtype (no autocast cast: CLIP applies it to the f32 logit_scale).
// Backward: g * exp(x) (the output, saved detached).
Tensor exp(const Tensor& x);

// OpenAI CLIP's / HF's quick_gelu: x * sigmoid(1.702 x), composed as silu(1.702 x) / 1.702
// (fn::silu; mathematically identical, a few ulp apart).
Tensor quick_gelu(const Tensor& x);
// torch.tanh, elementwise (amp::Op::Elementwise, like sigmoid). Flamingo's gates tanh(alpha).
// Backward: g (1 - y^2), from the output (saved detached).
Tensor tanh(const Tensor& x);

// ---- shape (views in the forward, copies in the backward)
Tensor reshape(const Tensor& a, const Shape& shape);
Tensor transpose(const Tensor& a, int64_t d0, int64_t d1);
Tensor narrow(const Tensor& a, int64_t dim, int64_t start, int64_t length);

// Identity in the forward (a view of x); in the backward, calls on_backward() once
// before passing the gradient through. Placed on a block's output, it runs before
// any node inside the block (they all depend on it): ZeRO-3 gathers the block's
// parameters there.
Tensor backward_hook(const Tensor& x, std::function<void()> on_backward);
// [token; x]: token (C) (or any shape of C elements, e.g. ViT's cls_token (1, 1, C)) placed in
// front of every row of x (N, T, C) -> (N, 1 + T, C). Backward: token gets the sum over N of the
// gradient at position 0, x the rest. The token is cast (recorded) to x's dtype.
Tensor prepend_token(const Tensor& token, const Tensor& x);
// torch.cat([a, b], dim): a and b agree in every dim but `dim` (negative counts from the end);
// the result is a fresh contiguous tensor. Moves values: runs in the inputs' dtype (inputs of
// two floating dtypes are promoted to f32 with recorded casts). Backward: each input gets its
// slice of the gradient (an input that wants no gradient gets none computed).
Tensor concat(const Tensor& a, const Tensor& b, int64_t dim);
// x (B, H, W, C), H and W multiples of ws -> (B*nW, N, C), windows row-major per image
// (Hugging Face's window_partition followed by view(-1, ws*ws, C)).
Tensor window_partition(const Tensor& x, int64_t ws);
// The inverse: windows (B*nW, N, C) (or (B*nW, ws, ws, C)) -> (B, H, W, C).
Tensor window_reverse(const Tensor& windows, int64_t ws, int64_t H, int64_t W);

// Patch merging's gather: x (B, H, W, C), H and W even -> (B, (H/2)(W/2), 4C), the channels
// [x0 | x1 | x2 | x3] with x0 = x[:, 0::2, 0::2], x1 = x[:, 1::2, 0::2], x2 = x[:, 0::2, 1::2],
// x3 = x[:, 1::2, 1::2] (HF's SwinPatchMerging order).
Tensor patch_merge(const Tensor& x);

// ---- reductions
Tensor sum_all(const Tensor& a);
Tensor mean_all(const Tensor& a);
Tensor softmax(const Tensor& x);
// x (N, C, H, W) -> the mean over (H, W): (N, C), or (N, C, 1, 1) with keepdim.
Tensor spatial_mean(const Tensor& x, bool keepdim = false);

// ---- gemm
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, WeightLayout layout);

// ---- embedding
Tensor embedding(const Tensor& weight, const Tensor& ids);

// ---- norm
Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps);
// x (..., C), w (C) -> x / sqrt(mean(x^2) + eps) * w (HF LlamaRMSNorm).
Tensor rms_norm(const Tensor& x, const Tensor& w, double eps);
// x / ||x||_2 along the last dim (torch: x / x.norm(p=2, dim=-1, keepdim=True)), composed as
// rms_norm(x, ones, eps 0) / sqrt(C) (rms_norm's rstd is 1 / sqrt(sum x^2 / C)). A zero row
// gives inf/nan, as torch does.
Tensor l2_normalize(const Tensor& x);
// x (N, C, H, W) (channels_last: (N, H, W, C)). Training: batch statistics, running_mean /
// running_var (f32 (C), may be undefined) updated in place with `momentum` (torch's rule), but
// not while autograd::recomputing(): they move once per real forward. Eval: the running
// statistics (required), an affine map.
Tensor batch_norm2d(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& running_mean,
                    const Tensor& running_var, bool training, double momentum, double eps, bool channels_last = false);

// Synchronised batch norm (torch.nn.SyncBatchNorm): a training batch_norm2d whose statistics are
// taken over every rank of a group. The reducer is an interface a plan implements
// (parallel/sync_batch_norm.h wraps a dist::ProcessGroup); a group of one is the identity.
class BatchNormSync {
 public:
  virtual ~BatchNormSync() = default;
  // Sums `data` (n doubles) over the group's ranks, in place. Every rank calls it the same
  // number of times in the same order with the same n (once in each forward, once in each
  // backward of every synchronised batch norm; a recompute's forward calls it again, on every
  // rank alike).
  virtual void allreduce_sum(double* data, int64_t n) const = 0;
};

//   forward: per channel, the count, sum x and sum x^2 (double) are summed over the group (one
//     allreduce of 2C + 1 doubles) and normalise x with the global mean and biased variance;
//     the running statistics move with the global mean and unbiased variance (torch's rule; not
//     while autograd::recomputing()).
//   backward: sum gy and sum gy xhat are summed over the group (2C doubles) and
//     gx = w rstd (gy - SG / M - xhat SGX / M): the gradient of the sum of every rank's loss with
//     respect to this rank's rows.
//   w and b get this rank's LOCAL part (sums over its own rows), as in torch; data parallelism's
//     gradient reduction completes them like every other parameter.
// Precision: amp::Op::BatchNorm; the sums are double whatever the dtype.
Tensor sync_batch_norm2d(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& running_mean,
                         const Tensor& running_var, double momentum, double eps,
                         const std::shared_ptr<const BatchNormSync>& sync);

// ---- attention
// What each query may attend to. None: every key. Causal: keys j <= i. KeyPadding: keys with
// key_mask[b, j] == 1 (BERT's attention_mask: (B, T) of 0 / 1 in any dtype, never differentiated;
// an undefined key_mask is None). Additive: softmax(scale q k^T + bias [+ window_mask]) with bias
// (NH, T, T) differentiated and broadcast over the batch, and window_mask (nW, T, T) (Swin's
// shift mask, never differentiated) added per window, broadcast over the heads; rows of q are
// batch-major windows (row r is window r % nW of image r / nW).
struct AttentionMask {
  enum class Kind { None, Causal, KeyPadding, Additive };
  Kind kind = Kind::None;
  Tensor key_mask, bias, window_mask;
  static AttentionMask causal() { return {Kind::Causal, {}, {}, {}}; }
  static AttentionMask key_padding(Tensor key_mask);
  static AttentionMask additive(Tensor bias, Tensor window_mask = Tensor());
};
// Multi-head scaled dot-product attention (Vaswani et al. 2017): softmax(scale q k^T + mask) v on
// q (B, NH, T, HS) and k, v (B, NKV, T, HS), NKV dividing NH (grouped-query attention: query head
// j uses kv head j / (NH / NKV), through repeat_kv; NKV == NH copies nothing). scale 0 means
// 1/sqrt(HS). Returns (B, NH, T, HS). None, Causal and KeyPadding run the tiled kernel (no T x T
// matrix); Additive is a composition of matmul, add and softmax.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionMask& mask = {}, double scale = 0);
// GPT-style fused input: qkv (B, T, 3C) laid out [q | k | v], heads split inside; causal;
// returns (B, T, C). One node: no per-head copies kept for the backward.
Tensor causal_self_attention(const Tensor& qkv, int64_t n_head);
// x (B, NKV, T, HS) -> (B, NKV * n_rep, T, HS) (HF repeat_kv); the backward sums the
// gradients of each group of n_rep heads.
Tensor repeat_kv(const Tensor& x, int64_t n_rep);

// ---- loss
// Mean cross-entropy of logits (N, V) against targets (N), ignoring ignore_index.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);
// torch's F.cross_entropy(logits (N, V), targets (N), ignore_index, label_smoothing=eps),
// the mean over the rows not ignored.
Tensor cross_entropy_smoothed(const Tensor& logits, const Tensor& targets, double eps, int64_t ignore_index = -100);

// ---- dropout
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen);

// ---- conv
// x (N, C, H, W), w (O, C, KH, KW), bias (O) or undefined -> (N, O, OH, OW). With
// p.channels_last, x (N, H, W, C) -> (N, OH, OW, O) (ops::Conv2dParams).
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t stride, int64_t padding);
// Grouped / depthwise, padding per side (ops::Conv2dParams): w (O, C / groups, KH, KW).
// conv2d(x, w, b, stride, padding) is this with Conv2dParams::symmetric(stride, padding).
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const ops::Conv2dParams& p);
// (N, C, OH, OW); channels_last: x (N, H, W, C) -> (N, OH, OW, C)
Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding, bool channels_last = false);
Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding);  // (N, C, OH, OW)
// torch.nn.AdaptiveAvgPool2d(1): the mean over (H, W); (N, C, H, W) -> (N, C, 1, 1).
Tensor adaptive_avg_pool2d(const Tensor& x);
// Image patches: x (N, C, H, W) -> (N, (H/p) * (W/p), C*p*p), see ops::patchify.
Tensor patchify(const Tensor& x, int64_t p);

// ---- position
// x (B, NH, T, HS) with the rotary embedding of positions pos0 .. pos0 + T - 1 (HF LLaMA
// convention and the frequency scalings, see ops/position.h); the backward is the inverse
// rotation. The theta overload is the unscaled RoPE, rope(x, ops::RopeSpec{theta}).
Tensor rope(const Tensor& x, const ops::RopeSpec& spec, int64_t pos0 = 0);
Tensor rope(const Tensor& x, double theta, int64_t pos0 = 0);
// torch.roll(x, (sh, sw), dims=(1, 2)) on x (B, H, W, C); moves values, runs in x's dtype.
Tensor roll2d(const Tensor& x, int64_t shift_h, int64_t shift_w);
// The relative position bias (NH, N, N): table ((2ws-1)^2, NH) gathered by index (N*N) i64
// (ops::relative_position_index(ws)), i.e. table[index].view(N, N, NH).permute(2, 0, 1).
// The table's gradient is the scatter-add of the embedding backward.
Tensor relative_position_bias(const Tensor& table, const Tensor& index);

// ---- activation recompute (checkpointing)

// What a checkpointed region keeps from its forward pass besides its inputs.
enum class CheckpointKeep : uint8_t {
  Inputs,       // nothing else: the backward re-runs the whole region ("full" recompute)
  GemmOutputs,  // also the outputs of linear(), matmul() and conv2d() inside the region: the
                // recompute takes them instead of running the GEMMs again, and re-runs everything
                // else (norms, attention, activations, dropout, adds) ("selective" recompute)
};

struct CheckpointOptions {
  CheckpointKeep keep = CheckpointKeep::Inputs;
  // The generator the region's dropout draws from (nullptr: the region draws nothing).
  // Its state is copied before the forward, set back for the recompute (so the same
  // masks come out) and restored afterwards (so the backward does not move the stream).
  Generator* rng = nullptr;
};

using CheckpointFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Runs fn(inputs) without recording a graph and records one node that keeps only the inputs (plus
// what `options.keep` says and the rng state). Its backward re-runs fn with recording on, on
// detached copies of the inputs, and backpropagates through that graph; parameters fn captures
// get their gradients there through their usual AccumulateGrad nodes (hooks fire as without
// recompute). Gradients are bitwise those of fn run directly, given fn is deterministic.
// fn must take every non-leaf tensor that needs a gradient through `inputs` (a captured one is a
// ValueError). Under no_grad and inside another region fn simply runs: the outermost decides.
// autograd::recomputing() is true while the backward re-runs fn.
Tensor checkpoint(CheckpointFn fn, const std::vector<Tensor>& inputs, const CheckpointOptions& options = {});

// A GEMM-shaped function's output (linear, matmul, conv2d): compute(), except that in a region
// keeping GemmOutputs the forward stores it and the recompute hands the stored tensor back.
Tensor gemm_output(const std::function<Tensor()>& compute);

}  // namespace brigade::fn
