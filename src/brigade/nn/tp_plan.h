// Tensor-parallel plans as data (torchtitan's `parallelize` tables, Megatron-LM's layer styles):
// a model says which of its modules are column-, row- or vocabulary-parallel and which attention
// modules divide their heads, next to its own code (GPT::tp_plan(), LLaMA::tp_plan(), ...), and
// one generic function (parallel::apply_tensor_parallel) applies any plan. nn knows no process
// group: the plan is names and styles, the applier installs the LinearShard / EmbeddingShard hooks
// of nn/linear.h and nn/embedding.h and calls HeadParallel::divide_heads.
//
// A rule matches module paths ("transformer.h.3.attn.c_attn", as Module::named_modules names
// them) against a pattern whose `*` stands for exactly one path segment
// ("transformer.h.*.attn.c_attn"). Parameters of modules no rule matches are replicated: every
// tensor-parallel rank holds them whole and computes them identically.
//
// Styles (weights in torch (out, in) or HF Conv1D (in, out) layout; the applier reads the
// Linear's own layout):
//   Column          nn::Linear: the output features are split (the weight's out dim and the
//                   bias); the input's gradient is summed over the group. `groups` > 1 splits a
//                   fused output ([q | k | v]: groups = 3) part by part, so each rank keeps its
//                   heads of each part.
//   Row             nn::Linear: the input features are split (the weight's in dim); the output
//                   is summed over the group, then the replicated bias added once.
//   VocabEmbedding  nn::Embedding: the rows (the vocabulary, padded to a multiple of the group
//                   size) are split; the lookup sums over the group, and Embedding::lm_loss (a
//                   tied head) runs vocabulary-parallel cross-entropy, never the full logits.
//   VocabHead       nn::Linear over the vocabulary: column-parallel on the padded vocabulary;
//                   Linear::lm_loss runs vocabulary-parallel cross-entropy (forward, the full
//                   logits, is refused).
//   Heads           a module implementing nn::HeadParallel (an attention): its head counts are
//                   divided by the group size (its projections are split by other rules).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace brigade::nn {

enum class TpStyle : uint8_t { Column, Row, VocabEmbedding, VocabHead, Heads };
const char* tp_style_name(TpStyle s);  // "column", "row", "vocab_embedding", "vocab_head", "heads"

struct TpRule {
  std::string pattern;  // module path, '*' = one segment
  TpStyle style = TpStyle::Column;
  int64_t groups = 1;  // Column / VocabHead: equal parts of the output split separately
};

struct TpPlan {
  std::vector<TpRule> rules;
  bool empty() const { return rules.empty(); }
};

// Whether `path` matches `pattern` segment by segment ('*' matches any one segment).
bool tp_path_matches(std::string_view pattern, std::string_view path);

// An attention module whose heads tensor parallelism divides between ranks (each rank computes
// whole heads: its projections' columns are split by Column rules).
class HeadParallel {
 public:
  virtual ~HeadParallel() = default;
  // ConfigError naming the recipe keys unless `parts` divides every head count of the layer.
  virtual void check_heads(int64_t parts) const = 0;
  // This rank computes 1 / parts of the heads from now on (check_heads passed).
  virtual void divide_heads(int64_t parts) = 0;
};

// The two HeadParallel functions of an attention with a single head count n_head (every head
// has its own keys and values): the ConfigError unless parts divides n_head, and the check then
// n_head /= parts.
void check_head_count(int64_t n_head, int64_t parts);
void divide_head_count(int64_t& n_head, int64_t parts);

}  // namespace brigade::nn
