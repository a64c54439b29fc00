// Sampling loop; see generate.h.
#include "brigade/train/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "brigade/autograd/engine.h"
#include "brigade/core/error.h"

namespace brigade::train {

std::string generate_text(const models::CausalLM& model, const data::TextTokenizer& tok, const std::string& prompt,
                          const SampleOptions& o) {
  BRIGADE_CHECK(o.temperature > 0.0, ValueError, "temperature must be > 0, got {}", o.temperature);
  BRIGADE_CHECK(o.tokens >= 0, ValueError, "number of tokens must be >= 0, got {}", o.tokens);
  BRIGADE_CHECK(o.top_k >= 0, ValueError, "top_k must be >= 0, got {}", o.top_k);
  std::vector<int> ids = tok.document_prefix();
  const std::vector<int> prompt_ids = tok.encode_strict(prompt, "prompt");
  ids.insert(ids.end(), prompt_ids.begin(), prompt_ids.end());
  if (ids.empty()) {
    BRIGADE_CHECK(tok.begin_id() >= 0, ValueError, "the tokenizer of {} has no token to start from; give a prompt",
                  tok.folder());
    ids.push_back(tok.begin_id());
  }
  const size_t skip = prompt_ids.empty() && tok.document_prefix().empty() ? 1 : tok.document_prefix().size();
  const int64_t V = model.vocab_size(), block = model.max_seq_len();
  Generator gen(o.seed);
  autograd::NoGradGuard no_grad;
  std::vector<float> probs(static_cast<size_t>(V));
  std::vector<int> order(static_cast<size_t>(V));
  for (int64_t step = 0; step < o.tokens; ++step) {
    const int64_t start = std::max<int64_t>(0, int64_t(ids.size()) - block);
    const int64_t T = int64_t(ids.size()) - start;
    std::vector<int64_t> ctx(ids.begin() + start, ids.end());
    Tensor x = Tensor::from_vector_i64(ctx, {1, T});  // (1, T)
    Tensor logits = model.forward(x);                 // (1, T, V)
    std::vector<float> last = logits.select(0, 0).select(0, T - 1).to_vector();
    // top-k filter, then softmax(logits / temperature)
    std::iota(order.begin(), order.end(), 0);
    int64_t k = (o.top_k == 0 || o.top_k > V) ? V : o.top_k;
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
      return last[size_t(a)] > last[size_t(b)] || (last[size_t(a)] == last[size_t(b)] && a < b);
    });
    const double mx = last[size_t(order[0])];
    double z = 0.0;
    for (int64_t i = 0; i < k; ++i) {
      probs[size_t(i)] = float(std::exp((last[size_t(order[size_t(i)])] - mx) / o.temperature));
      z += probs[size_t(i)];
    }
    double u = double(gen.uniform_float()) * z, acc = 0.0;
    int next = order[size_t(k - 1)];
    for (int64_t i = 0; i < k; ++i) {
      acc += probs[size_t(i)];
      if (u < acc) {
        next = order[size_t(i)];
        break;
      }
    }
    ids.push_back(next);
  }
  std::vector<int> out(ids.begin() + int64_t(skip), ids.end());
  return tok.decode(out);
}

}  // namespace brigade::train
