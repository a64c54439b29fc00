// The precision policy table; see policy.h.
#include "brigade/amp/policy.h"

#include <fmt/format.h>

#include <iterator>

#include "brigade/core/enum_names.h"
#include "brigade/core/error.h"

namespace brigade::amp {

namespace {

constexpr Rule K = Rule::Keep, F = Rule::F32, L = Rule::Low, M = Rule::Mixed;

// rows: Op (in enum order); columns: O0 O1 O2 O3
constexpr Rule kTable[size_t(Op::kCount)][4] = {
    /* linear        */ {K, L, L, L},
    /* matmul        */ {K, L, L, L},
    /* attention     */ {K, L, L, L},
    /* conv          */ {K, L, L, L},
    /* embedding     */ {K, F, L, L},
    /* gelu          */ {K, F, L, L},
    /* elementwise   */ {K, F, L, L},
    /* pool          */ {K, F, L, L},
    /* layer_norm    */ {K, F, F, L},
    /* batch_norm    */ {K, F, M, L},
    /* softmax       */ {K, F, F, L},
    /* cross_entropy */ {K, F, F, L},
    /* reduction     */ {K, F, F, L},
    /* dropout       */ {K, K, K, K},
};

thread_local Policy t_policy;

}  // namespace

Rule rule(Op op, Level level) { return kTable[size_t(op)][size_t(level)]; }

// The names, indexed by Level.
constexpr std::string_view kLevelNames[] = {"O0", "O1", "O2", "O3"};

std::string_view level_name(Level l) { return enum_name(l, kLevelNames); }

Level level_from_name(std::string_view s) {
  return enum_from_name<Level>(
      s, kLevelNames, "precision level",
      R"("O0" (fp32), "O1" (autocast), "O2" (low-precision model, fp32 master weights) or "O3" (pure low precision))");
}

std::string_view op_name(Op op) {
  constexpr std::string_view names[] = {"linear",  "matmul",        "attention", "conv",       "embedding",
                                        "gelu",    "elementwise",   "pool",      "layer_norm", "batch_norm",
                                        "softmax", "cross_entropy", "reduction", "dropout"};
  static_assert(std::size(names) == size_t(Op::kCount), "one name per op kind");
  return names[size_t(op)];
}

std::string_view rule_name(Rule r) {
  constexpr std::string_view names[] = {"keep", "f32", "low", "mixed"};
  return names[size_t(r)];
}

const Policy& current_policy() { return t_policy; }

AutocastScope::AutocastScope(const Policy& p) : prev_(t_policy) {
  BRIGADE_CHECK(p.low == DType::BF16 || p.low == DType::F16, ValueError,
                "a precision policy's low dtype must be bf16 or f16, got {}", dtype_name(p.low));
  t_policy = p;
}
AutocastScope::~AutocastScope() { t_policy = prev_; }

DType compute_dtype(Op op, std::initializer_list<DType> inputs) {
  switch (rule(op, t_policy.level)) {
    case Rule::F32:
    case Rule::Mixed: return DType::F32;
    case Rule::Low: return t_policy.low;
    case Rule::Keep: break;
  }
  DType common = inputs.size() ? *inputs.begin() : DType::F32;
  for (DType d : inputs)
    if (d != common) return DType::F32;
  return common;
}

std::string policy_table_markdown() {
  std::string s = "| op | O0 | O1 | O2 | O3 |\n|---|---|---|---|---|\n";
  for (size_t i = 0; i < size_t(Op::kCount); ++i) {
    s += fmt::format("| {} |", op_name(Op(i)));
    for (int l = 0; l < 4; ++l) s += fmt::format(" {} |", rule_name(rule(Op(i), Level(l))));
    s += '\n';
  }
  return s;
}

}  // namespace brigade::amp
