// Captions for CLIP on Fashion-MNIST: text made from the class names by templates,
// a tiny deterministic word-level tokenizer over exactly that vocabulary, fixed-length id
// tensors with lengths, seeded (image, caption) pairs and the zero-shot prompts.
//
// Class phrases: the class name lower-cased with '/' read as " or " ("T-shirt/top" ->
// "t-shirt or top", "Ankle boot" -> "ankle boot"). Templates hold one "{}" for the phrase.
// Words: the text lower-cased and split on spaces (punctuation stays inside a word, so
// "t-shirt" is one word). Vocabulary ids: 0 = padding, then the distinct words of every
// template and class phrase in sorted (byte) order from 1, then start-of-text, then
// end-of-text = vocab_size - 1, the largest id (so HF CLIP's argmax(ids) pooling rule and
// models::CLIP's "position lengths[b] - 1" rule pick the same token).
// An encoded caption is [start, words..., end], padded with 0 to the context length; its length
// counts start and end.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "brigade/core/tensor.h"

namespace brigade::data {

// "a photo of a {}", "a picture of a {}", "an image of a {}", "a {} in black and white",
// "a low resolution photo of a {}", "a photo of the {}", "a small {}", "a grey {}".
const std::vector<std::string>& caption_templates();
// The zero-shot prompt template, "a photo of a {}" (= caption_templates()[0]).
const std::string& zero_shot_template();

// "T-shirt/top" -> "t-shirt or top": lower case, '/' -> " or ".
std::string class_phrase(const std::string& class_name);
// The template with its "{}" replaced by class_phrase(class_name). ValueError without "{}".
std::string format_caption(const std::string& tmpl, const std::string& class_name);

struct TokenBatch {
  Tensor ids;      // (M, T) i64, padded with pad_id
  Tensor lengths;  // (M) i64: start + words + end
};

class CaptionTokenizer {
 public:
  // Vocabulary over every template x class name (defaults: caption_templates() and
  // fashion_mnist_classes()).
  CaptionTokenizer();
  CaptionTokenizer(const std::vector<std::string>& class_names, const std::vector<std::string>& templates);

  int64_t vocab_size() const { return int64_t(words_.size()) + 3; }
  static constexpr int64_t pad_id() { return 0; }
  int64_t sot_id() const { return int64_t(words_.size()) + 1; }
  int64_t eot_id() const { return int64_t(words_.size()) + 2; }
  const std::vector<std::string>& words() const { return words_; }  // id i + 1 is words()[i]
  int64_t word_id(const std::string& w) const;                      // DataError for a word outside the vocabulary

  // [sot, word ids..., eot] (no padding). DataError for an unknown word.
  std::vector<int64_t> encode(const std::string& text) const;
  // Words joined by one space; special ids are skipped. ValueError for an id out of range.
  std::string decode(const std::vector<int64_t>& ids) const;
  // Texts -> (M, context_length) ids and lengths. DataError when a caption needs more than
  // context_length tokens (start and end included).
  TokenBatch batch(const std::vector<std::string>& texts, int64_t context_length) const;
  // The longest encoded caption of every template x class (a context length that fits all).
  int64_t max_length() const { return max_length_; }
  const std::vector<std::string>& class_names() const { return classes_; }
  const std::vector<std::string>& templates() const { return templates_; }

 private:
  std::vector<std::string> classes_, templates_, words_;
  std::map<std::string, int64_t> ids_;
  int64_t max_length_ = 0;
};

// A batch of (image index, caption) pairs: image i of the batch (label labels[i]) pairs with
// caption i, its class's phrase in a template chosen by splitmix64 of (seed, i) (the same
// seed and labels give the same captions).
struct CaptionPairs {
  std::vector<int64_t> image_index;  // 0..N-1
  std::vector<int64_t> template_index;
  std::vector<std::string> captions;
  TokenBatch tokens;  // (N, context_length)
};
CaptionPairs make_caption_pairs(const CaptionTokenizer& tok, const std::vector<int64_t>& labels, uint64_t seed,
                                int64_t context_length);

// One prompt per class, zero_shot_template() with the class phrase, in class order.
std::vector<std::string> zero_shot_prompts(const std::vector<std::string>& class_names);
std::vector<std::string> zero_shot_prompts();  // for fashion_mnist_classes()

}  // namespace brigade::data
