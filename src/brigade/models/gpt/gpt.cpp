// GPT-2 model code; see gpt.h.
#include "brigade/models/gpt/gpt.h"

#include <algorithm>
#include <cmath>

#include "brigade/core/allocator.h"
#include "brigade/core/error.h"

namespace brigade::models {

namespace F = brigade::fn;

GPTTransformer::GPTTransformer(const GPTConfig& c, Generator* gen) {
  wte = register_module("wte", std::make_shared<nn::Embedding>(c.vocab_size, c.n_embd));
  wpe = register_module("wpe", std::make_shared<nn::Embedding>(c.block_size, c.n_embd));
  drop = register_module("drop", std::make_shared<nn::Dropout>(c.dropout, gen));
  h = register_module("h", std::make_shared<nn::ModuleList<nn::TransformerBlock>>());
  for (int64_t i = 0; i < c.n_layer; ++i)
    h->push_back(std::make_shared<nn::TransformerBlock>(c.n_embd, c.n_head, c.dropout, c.layer_norm_eps, gen));
  ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(c.n_embd, c.layer_norm_eps));
}

GPT::GPT(const GPTConfig& c) : cfg_(c) {
  BRIGADE_CHECK(c.vocab_size > 0 && c.block_size > 0 && c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0, ConfigError,
                "GPT config: all sizes must be positive");
  BRIGADE_CHECK(c.n_embd % c.n_head == 0, ConfigError, "GPT config: n_embd={} must be divisible by n_head={}", c.n_embd,
                c.n_head);
  transformer = register_module("transformer", std::make_shared<GPTTransformer>(c, &gen_));
  name_parameters();
}

void GPT::init_weights(Generator& g) {
  // Same order and distributions as the PyTorch reference (HF GPT-2 _init_weights,
  // with the GPT-2 paper's 1/sqrt(2L) scaling of the residual projections).
  const double std = cfg_.init_std;
  const double proj_std = std / std::sqrt(2.0 * double(cfg_.n_layer));
  auto& t = *transformer;
  g.normal_(t.wte->weight, 0.0, std);
  g.normal_(t.wpe->weight, 0.0, std);
  for (const auto& block : *t.h) {
    block->ln_1->weight.fill_(1.0);
    block->ln_1->bias.zero_();
    g.normal_(block->attn->c_attn->weight, 0.0, std);
    block->attn->c_attn->bias.zero_();
    g.normal_(block->attn->c_proj->weight, 0.0, proj_std);
    block->attn->c_proj->bias.zero_();
    block->ln_2->weight.fill_(1.0);
    block->ln_2->bias.zero_();
    g.normal_(block->mlp->c_fc->weight, 0.0, std);
    block->mlp->c_fc->bias.zero_();
    g.normal_(block->mlp->c_proj->weight, 0.0, proj_std);
    block->mlp->c_proj->bias.zero_();
  }
  t.ln_f->weight.fill_(1.0);
  t.ln_f->bias.zero_();
}

Tensor GPT::forward(const Tensor& ids) const {
  return F::reshape(forward_flat(ids), {ids.size(0), ids.size(1), cfg_.vocab_size});  // (B, T, V)
}

Tensor GPT::forward_flat(const Tensor& ids) const {
  return head_logits(run_blocks(embed(ids), 0, cfg_.n_layer));  // (B*T, V)
}

Tensor GPT::embed(const Tensor& ids) const {
  BRIGADE_CHECK(ids.dim() == 2, ShapeError, "GPT.forward: ids must be (B, T), got {}", ids.str());
  const int64_t T = ids.size(1);
  BRIGADE_CHECK(T <= cfg_.block_size, ShapeError,
                "GPT.forward: sequence length {} exceeds block_size {}; shorten the input or raise model.block_size", T,
                cfg_.block_size);
  auto& t = *transformer;
  Tensor pos = Tensor::arange(T, DType::I64);                   // (T)
  Tensor x = F::add(t.wte->forward(ids), t.wpe->forward(pos));  // (B, T, C)
  return t.drop->forward(x);
}

Tensor GPT::run_blocks(const Tensor& x0, int64_t begin, int64_t end) const {
  BRIGADE_CHECK(0 <= begin && begin <= end && end <= cfg_.n_layer, ValueError,
                "GPT.run_blocks: blocks [{}, {}) outside [0, {})", begin, end, cfg_.n_layer);
  Tensor x = x0;
  for (int64_t i = begin; i < end; ++i) x = (*transformer->h)[size_t(i)].forward(x);  // (B, T, C)
  return x;
}

Tensor GPT::head_features(const Tensor& x0, const char* where) const {
  BRIGADE_CHECK(x0.dim() == 3, ShapeError, "GPT.{}: x must be (B, T, C), got {}", where, x0.str());
  Tensor x = transformer->ln_f->forward(x0);                    // (B, T, C)
  return F::reshape(x, {x0.size(0) * x0.size(1), x0.size(2)});  // (B*T, C)
}

Tensor GPT::head_logits(const Tensor& x) const {
  return transformer->wte->attend(head_features(x, "head_logits"));  // (B*T, V): tied head, x @ wte^T
}

Tensor GPT::head_loss(const Tensor& x, const Tensor& targets) const {
  // Tied head + mean cross-entropy; under a vocabulary-sharding plan the embedding computes
  // it without materialising the full (B*T, V) logits.
  return transformer->wte->lm_loss(head_features(x, "head_loss"), targets.reshape({targets.numel()}));  // 0-d
}

Tensor GPT::loss(const Tensor& ids, const Tensor& targets) const {
  BRIGADE_CHECK(targets.shape() == ids.shape(), ShapeError, "GPT.loss: targets {} must match ids {}", targets.str(),
                ids.str());
  return head_loss(run_blocks(embed(ids), 0, cfg_.n_layer), targets);
}

nn::TpPlan GPT::tp_plan() {
  using nn::TpStyle;
  return {{{"transformer.wte", TpStyle::VocabEmbedding},
           {"transformer.h.*.attn", TpStyle::Heads},
           {"transformer.h.*.attn.c_attn", TpStyle::Column, 3},  // [q | k | v], each split by heads
           {"transformer.h.*.attn.c_proj", TpStyle::Row},
           {"transformer.h.*.mlp.c_fc", TpStyle::Column},
           {"transformer.h.*.mlp.c_proj", TpStyle::Row}}};
}

std::vector<std::pair<std::string, nn::Module*>> GPT::blocks() {
  std::vector<std::pair<std::string, nn::Module*>> out;
  const auto& h = *transformer->h;
  for (size_t i = 0; i < h.size(); ++i) out.emplace_back(fmt::format("transformer.h.{}", i), &h[i]);
  return out;
}

void GPT::set_recompute(const std::vector<nn::Recompute>& modes) {
  auto& blocks = *transformer->h;
  BRIGADE_CHECK(modes.size() == blocks.size(), ValueError, "GPT.set_recompute: {} modes for {} blocks", modes.size(),
                blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i].recompute = modes[i];
}

std::vector<nn::Recompute> GPT::recompute_modes() const {
  std::vector<nn::Recompute> out;
  for (const auto& b : *transformer->h) out.push_back(b->recompute);
  return out;
}

double GPT::flops_per_token(int64_t T) const {
  const double N = double(num_parameters());
  return 6.0 * N + 12.0 * double(cfg_.n_layer) * double(T) * double(cfg_.n_embd);
}

// ------------------------------------------------------------------ activation recompute plan

const char* recompute_name(nn::Recompute r) {
  switch (r) {
    case nn::Recompute::None: return "none";
    case nn::Recompute::Full: return "full";
    case nn::Recompute::Selective: return "selective";
  }
  return "?";
}

namespace {

// Bytes the allocator accounts for a tensor of `n` elements of `size` bytes.
int64_t held(int64_t n, int64_t size = 4) { return int64_t(Allocator::round_size(size_t(n * size))); }

// Activation bytes of one block in a training step, from the tensors its ops allocate
// (see nn/block.cpp, nn/attention.cpp and autograd/rules/). `kept`: held from the block's forward
// to its backward, input included. `fwd`: the most the forward adds on top of the live
// bytes at its start (input included there). `bwd`: the most its backward adds on top
// of the live bytes at its start (kept bytes and the incoming gradient included there).
struct BlockBytes {
  int64_t kept = 0, fwd = 0, bwd = 0;
};

BlockBytes block_bytes(const GPTConfig& c, int64_t B, int64_t T, nn::Recompute m) {
  const int64_t N = B * T, C = c.n_embd;
  const bool drop = c.dropout > 0;
  const int64_t u = held(N * C), u3 = held(3 * N * C), u4 = held(4 * N * C);  // (B, T, C), (B, T, 3C), (B, T, 4C)
  const int64_t s = held(N), lse = held(B * c.n_head * T);                    // LayerNorm mean/rstd, attention lse
  const int64_t masks = drop ? 2 * u : 0;                                     // two dropout masks
  // Saved by the ops of a block recorded normally, input excluded: ln_1 out, q, k, v, attention out,
  // merged heads, h, ln_2 out (8 u), c_fc out and GELU out (2 u4), means/rstds, lse, masks.
  const int64_t internals = 8 * u + 2 * u4 + 4 * s + lse + masks;
  // A backward through a block graph: the residual add's two gradients (2 u), then the MLP
  // projection's input and weight gradients while they are live (u4 + (4C, C) + bias).
  // With dropout, the MLP dropout's backward has released its mask by then.
  const int64_t inner_bwd = 2 * u + u4 + held(4 * C * C) + held(C) - (drop ? u : 0);
  // Unrecorded forward (no_grad): the attention call (ln_1 out, qkv, q, k, v, out, merged heads)
  // or the MLP (h, ln_2 out, c_fc out, GELU out, projection, output, dropout).
  const int64_t nograd_fwd = std::max({6 * u + u3 + lse + 2 * s, 2 * u + 2 * u4 + 2 * s, 4 * u + u4 + masks});
  BlockBytes b;
  switch (m) {
    case nn::Recompute::None:
      b.kept = u + internals;
      b.fwd = internals + 3 * u;
      b.bwd = inner_bwd - u;  // the incoming gradient is freed after the residual add
      break;
    case nn::Recompute::Full:
      b.kept = u;
      b.fwd = nograd_fwd;
      b.bwd = std::max(internals + 3 * u, internals + inner_bwd);  // recompute, then the inner backward
      break;
    case nn::Recompute::Selective: {
      const int64_t gemm = u3 + u + u4 + u;  // qkv, attention projection, c_fc, MLP projection
      b.kept = u + gemm;
      b.fwd = nograd_fwd + gemm;
      // The recompute re-creates the internals but c_fc's output (the kept one, saved by GELU),
      // and frees the other kept GEMM outputs as it consumes them.
      const int64_t recomputed = internals - gemm;
      b.bwd = std::max(6 * u + lse + 2 * s + masks, recomputed + inner_bwd);
      break;
    }
  }
  return b;
}

}  // namespace

int64_t estimate_activation_peak(const GPTConfig& c, int64_t B, int64_t T, const std::vector<nn::Recompute>& modes) {
  BRIGADE_CHECK(int64_t(modes.size()) == c.n_layer, ValueError, "estimate_activation_peak: {} modes for {} blocks",
                modes.size(), c.n_layer);
  const int64_t N = B * T, C = c.n_embd, V = c.vocab_size;
  const bool drop = c.dropout > 0;
  const int64_t u = held(N * C), s = held(N), logits = held(N * V), vc = held(V * C);
  // The batch (ids, targets: the caller's), positions, the loss and the root gradient.
  const int64_t base = 2 * held(N, 8) + held(T, 8) + 2 * held(1);
  const int64_t emb_keep = drop ? u : 0;  // the embedding dropout's mask
  // token + position embeddings and their sum; then (those two freed) the dropout's mask and output
  int64_t peak = base + std::max(2 * u + held(T * C), drop ? 3 * u : 0);
  int64_t kept = 0;  // sum of kept bytes of blocks 0..i-1
  std::vector<BlockBytes> bb;
  for (nn::Recompute m : modes) bb.push_back(block_bytes(c, B, T, m));
  for (const BlockBytes& b : bb) {
    peak = std::max(peak, base + emb_keep + kept + u + b.fwd);
    kept += b.kept;
  }
  // Head: ln_f (out, mean, rstd), logits, lse; the cross-entropy backward writes the logits'
  // gradient over the logits (ops::cross_entropy_backward_), so no second (N, V) buffer;
  // then the head matmul's input and (V, C) weight gradients (each passed through sum_to).
  const int64_t after_blocks = base + emb_keep + kept + u + u + 2 * s + logits + s;
  peak = std::max(peak, after_blocks);
  peak = std::max(peak, after_blocks - s + std::max(2 * u, u + 2 * vc));
  // Blocks, last first: the tied embedding's head gradient (V, C) waits for the embedding's.
  for (size_t i = bb.size(); i-- > 0;) {
    kept -= bb[i].kept;
    peak = std::max(peak, base + emb_keep + kept + bb[i].kept + vc + u + bb[i].bwd);
  }
  // Embeddings, after the blocks: the base, the head's (V, C) gradient of the tied weight and the
  // gradient g of the embeddings' output (u) are live. Dropout's backward makes g * mask beside g
  // and the mask. The sum's backward passes g on to the token lookup and reduces it to (T, C) for
  // the position lookup, which runs first: its (block_size, C) table gradient is copied into the
  // parameter's gradient (MemTag::Grads, not an activation), then it and the positions are freed;
  // then the token lookup's (V, C) gradient and the sum of the tied weight's two.
  const int64_t emb_in = base + vc + u;
  if (drop) peak = std::max(peak, emb_in + 2 * u);
  peak = std::max(peak, emb_in + held(T * C) + held(c.block_size * C));
  peak = std::max(peak, emb_in - held(T, 8) + 2 * vc);
  return peak;
}

double recompute_flops(const GPTConfig& c, int64_t B, int64_t T, const std::vector<nn::Recompute>& modes) {
  const double N = double(B * T), C = double(c.n_embd);
  const double cheap = 4.0 * N * double(T) * C + 100.0 * N * C;  // attention core (QK^T, AV) + elementwise
  double f = 0;
  for (nn::Recompute m : modes) {
    if (m == nn::Recompute::Full) f += 24.0 * N * C * C + cheap;  // the block's GEMMs and the rest
    if (m == nn::Recompute::Selective) f += cheap;
  }
  return f;
}

std::vector<nn::Recompute> plan_recompute(const GPTConfig& c, int64_t B, int64_t T, const RecomputePolicy& p) {
  const size_t L = size_t(c.n_layer);
  using nn::Recompute;
  if (p.mode == "none") return std::vector<Recompute>(L, Recompute::None);
  if (p.mode == "full") return std::vector<Recompute>(L, Recompute::Full);
  if (p.mode == "selective") return std::vector<Recompute>(L, Recompute::Selective);
  if (p.mode == "every_k") {
    BRIGADE_CHECK(p.every_k >= 1, ConfigError, "memory.every_k = {} must be >= 1", p.every_k);
    std::vector<Recompute> m(L, Recompute::None);
    for (size_t i = 0; i < L; i += size_t(p.every_k)) m[i] = Recompute::Full;
    return m;
  }
  BRIGADE_CHECK(p.mode == "budget", ConfigError,
                "memory.recompute = \"{}\" is not a policy; use \"none\", \"full\", \"selective\", \"every_k\" or "
                "\"budget\"",
                p.mode);
  BRIGADE_CHECK(p.budget_bytes > 0, ConfigError, "memory.recompute = \"budget\" needs memory.budget_mb > 0");
  // Every mix: n_full blocks full, then n_sel selective, the rest none (recomputed blocks
  // first: a block's backward runs while the blocks below it still hold their activations).
  std::vector<Recompute> best;
  double best_flops = 0;
  int64_t best_peak = 0;
  for (size_t nf = 0; nf <= L; ++nf)
    for (size_t ns = 0; nf + ns <= L; ++ns) {
      std::vector<Recompute> m(L, Recompute::None);
      for (size_t i = 0; i < nf + ns; ++i) m[i] = i < nf ? Recompute::Full : Recompute::Selective;
      const int64_t peak = estimate_activation_peak(c, B, T, m);
      if (peak > p.budget_bytes) continue;
      const double f = recompute_flops(c, B, T, m);
      if (best.empty() || f < best_flops || (f == best_flops && peak < best_peak)) {
        best = m;
        best_flops = f;
        best_peak = peak;
      }
    }
  if (best.empty()) {
    const int64_t least = estimate_activation_peak(c, B, T, std::vector<Recompute>(L, Recompute::Full));
    throw ConfigError(
        fmt::format("memory.budget_mb = {:.1f} MiB is below the least activation memory this model needs: {:.1f} MiB "
                    "(estimated, every block fully recomputed, batch {} x {} tokens); raise memory.budget_mb or lower "
                    "train.batch_size or train.seq_len",
                    double(p.budget_bytes) / double(1 << 20), double(least) / double(1 << 20), B, T));
  }
  return best;
}

}  // namespace brigade::models
