// What the trainer needs from a causal language model (GPT, LLaMA): single-device
// model code behind one interface, so the training loop, data parallelism, checkpoints,
// sampling and pipeline stages do not depend on the architecture. Tensor parallelism reads
// each model's plan as data (GPT::tp_plan(), LLaMA::tp_plan(); nn/tp_plan.h); the
// activation-memory estimate is written for GPT alone.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "brigade/core/rng.h"
#include "brigade/nn/layers.h"

namespace brigade::models {

class CausalLM : public nn::Module {
 public:
  virtual const char* arch() const = 0;                                     // "gpt", "llama"
  virtual Tensor forward(const Tensor& ids) const = 0;                      // ids (B, T) -> logits (B, T, V)
  virtual Tensor loss(const Tensor& ids, const Tensor& targets) const = 0;  // mean cross-entropy, 0-d f32
  // The forward in pieces (pipeline stages): loss(ids, targets) ==
  // head_loss(run_blocks(embed(ids), 0, L), targets), with L = blocks().size().
  virtual Tensor embed(const Tensor& ids) const = 0;                                 // (B, T) -> (B, T, C)
  virtual Tensor run_blocks(const Tensor& x, int64_t begin, int64_t end) const = 0;  // blocks [begin, end)
  virtual Tensor head_loss(const Tensor& x, const Tensor& targets) const = 0;        // (B, T, C) -> 0-d
  virtual int64_t hidden_size() const = 0;                                           // C
  // Parameters the head reads besides embed (a head tied to the token embedding): a pipeline
  // keeps them on its first and last stage and sums their gradients.
  virtual std::vector<std::string> tied_parameters() const { return {}; }
  // Model FLOPs per token of one training step (forward + backward), PaLM's 6N + 12 L T C form.
  virtual double flops_per_token(int64_t T) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_seq_len() const = 0;
  virtual Generator& dropout_generator() = 0;  // the stream dropout draws from (re-seeded per step)
  // The repeated blocks in forward order, by full name ("transformer.h.3"). ZeRO-3 gathers
  // each one around its forward through the module's pre/post forward hooks, so a block
  // listed here must run them (nn::TransformerBlock does); an architecture whose blocks do
  // not returns an empty list, and its parameters stay gathered for the whole step.
  virtual std::vector<std::pair<std::string, nn::Module*>> blocks() = 0;
  // Per-block activation recompute (nn::Recompute); an architecture without it throws a
  // ConfigError for any mode but None.
  virtual void set_recompute(const std::vector<nn::Recompute>& modes) = 0;
  virtual std::vector<nn::Recompute> recompute_modes() const = 0;
};

}  // namespace brigade::models
