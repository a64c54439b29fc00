// Tensor-parallel plans as data; see tp_plan.h.
#include "brigade/nn/tp_plan.h"

#include "brigade/core/error.h"

namespace brigade::nn {

const char* tp_style_name(TpStyle s) {
  switch (s) {
    case TpStyle::Column: return "column";
    case TpStyle::Row: return "row";
    case TpStyle::VocabEmbedding: return "vocab_embedding";
    case TpStyle::VocabHead: return "vocab_head";
    case TpStyle::Heads: return "heads";
  }
  return "?";
}

bool tp_path_matches(std::string_view pattern, std::string_view path) {
  for (;;) {
    const size_t pd = pattern.find('.'), qd = path.find('.');
    const std::string_view ps = pattern.substr(0, pd), qs = path.substr(0, qd);
    if (ps != "*" && ps != qs) return false;
    if (pd == std::string_view::npos || qd == std::string_view::npos) return pd == qd;
    pattern.remove_prefix(pd + 1);
    path.remove_prefix(qd + 1);
  }
}

void check_head_count(int64_t n_head, int64_t parts) {
  BRIGADE_CHECK(parts >= 1 && n_head % parts == 0, ConfigError,
                "tensor parallelism: parallel.tp = {} does not divide model.n_head = {} (each rank computes whole "
                "attention heads); choose a parallel.tp that divides model.n_head",
                parts, n_head);
}

void divide_head_count(int64_t& n_head, int64_t parts) {
  check_head_count(n_head, parts);
  n_head /= parts;
}

}  // namespace brigade::nn
