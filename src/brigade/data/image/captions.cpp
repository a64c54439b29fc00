// Captions, the word-level caption tokenizer and (image, caption) pairs (see image/captions.h).
#include "brigade/data/image/captions.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <sstream>

#include "brigade/core/error.h"
#include "brigade/data/image/fashion_mnist.h"
#include "brigade/data/sampler.h"

namespace brigade::data {

namespace {

std::vector<std::string> split_words(const std::string& text) {
  std::string low = text;
  for (char& c : low) c = char(std::tolower(static_cast<unsigned char>(c)));
  std::istringstream in(low);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::vector<std::string> fashion_names() {
  const auto& a = fashion_mnist_classes();
  return {a.begin(), a.end()};
}

}  // namespace

const std::vector<std::string>& caption_templates() {
  static const std::vector<std::string> t = {"a photo of a {}",
                                             "a picture of a {}",
                                             "an image of a {}",
                                             "a {} in black and white",
                                             "a low resolution photo of a {}",
                                             "a photo of the {}",
                                             "a small {}",
                                             "a grey {}"};
  return t;
}

const std::string& zero_shot_template() { return caption_templates()[0]; }

std::string class_phrase(const std::string& class_name) {
  std::string out;
  for (char c : class_name) {
    if (c == '/')
      out += " or ";
    else
      out += char(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

std::string format_caption(const std::string& tmpl, const std::string& class_name) {
  const size_t at = tmpl.find("{}");
  BRIGADE_CHECK(at != std::string::npos, ValueError, "caption template \"{}\" has no {{}} for the class name", tmpl);
  return tmpl.substr(0, at) + class_phrase(class_name) + tmpl.substr(at + 2);
}

CaptionTokenizer::CaptionTokenizer() : CaptionTokenizer(fashion_names(), caption_templates()) {}

CaptionTokenizer::CaptionTokenizer(const std::vector<std::string>& class_names,
                                   const std::vector<std::string>& templates)
    : classes_(class_names), templates_(templates) {
  BRIGADE_CHECK(!classes_.empty() && !templates_.empty(), ValueError,
                "CaptionTokenizer: needs at least one class name and one template ({} and {})", classes_.size(),
                templates_.size());
  std::set<std::string> words;
  for (const auto& t : templates_)
    for (const auto& c : classes_)
      for (const auto& w : split_words(format_caption(t, c))) words.insert(w);
  words_.assign(words.begin(), words.end());
  for (size_t i = 0; i < words_.size(); ++i) ids_[words_[i]] = int64_t(i) + 1;
  for (const auto& t : templates_)
    for (const auto& c : classes_) max_length_ = std::max(max_length_, int64_t(encode(format_caption(t, c)).size()));
}

int64_t CaptionTokenizer::word_id(const std::string& w) const {
  auto it = ids_.find(w);
  BRIGADE_CHECK(it != ids_.end(), DataError,
                "CaptionTokenizer: the word \"{}\" is not in the caption vocabulary ({} words from the templates and "
                "class names)",
                w, words_.size());
  return it->second;
}

std::vector<int64_t> CaptionTokenizer::encode(const std::string& text) const {
  std::vector<int64_t> out{sot_id()};
  for (const auto& w : split_words(text)) out.push_back(word_id(w));
  out.push_back(eot_id());
  return out;
}

std::string CaptionTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) {
    BRIGADE_CHECK(id >= 0 && id < vocab_size(), ValueError, "CaptionTokenizer.decode: id {} outside [0, {})", id,
                  vocab_size());
    if (id == pad_id() || id == sot_id() || id == eot_id()) continue;
    if (!out.empty()) out += ' ';
    out += words_[size_t(id - 1)];
  }
  return out;
}

TokenBatch CaptionTokenizer::batch(const std::vector<std::string>& texts, int64_t context_length) const {
  BRIGADE_CHECK(!texts.empty() && context_length >= 2, ValueError,
                "CaptionTokenizer.batch: needs at least one text and a context length >= 2 (got {} texts, {})",
                texts.size(), context_length);
  const int64_t M = int64_t(texts.size()), T = context_length;
  std::vector<int64_t> ids(size_t(M * T), pad_id());
  std::vector<int64_t> len(static_cast<size_t>(M));
  for (int64_t b = 0; b < M; ++b) {
    const std::vector<int64_t> e = encode(texts[size_t(b)]);
    BRIGADE_CHECK(int64_t(e.size()) <= T, DataError,
                  "CaptionTokenizer.batch: \"{}\" needs {} tokens (start and end included), the context length is {}",
                  texts[size_t(b)], e.size(), T);
    std::copy(e.begin(), e.end(), ids.begin() + b * T);
    len[size_t(b)] = int64_t(e.size());
  }
  return {Tensor::from_vector_i64(ids, {M, T}), Tensor::from_vector_i64(len, {M})};
}

CaptionPairs make_caption_pairs(const CaptionTokenizer& tok, const std::vector<int64_t>& labels, uint64_t seed,
                                int64_t context_length) {
  BRIGADE_CHECK(!labels.empty(), ValueError, "make_caption_pairs: empty batch");
  const int64_t K = int64_t(tok.class_names().size()), NT = int64_t(tok.templates().size());
  CaptionPairs out;
  for (size_t i = 0; i < labels.size(); ++i) {
    BRIGADE_CHECK(labels[i] >= 0 && labels[i] < K, ValueError,
                  "make_caption_pairs: label {} of image {} outside [0, {})", labels[i], i, K);
    const uint64_t r = splitmix64(splitmix64(seed) ^ (uint64_t(i) * 0x9E3779B97F4A7C15ull + 1));
    const int64_t t = int64_t(r % uint64_t(NT));
    out.image_index.push_back(int64_t(i));
    out.template_index.push_back(t);
    out.captions.push_back(format_caption(tok.templates()[size_t(t)], tok.class_names()[size_t(labels[i])]));
  }
  out.tokens = tok.batch(out.captions, context_length);
  return out;
}

std::vector<std::string> zero_shot_prompts(const std::vector<std::string>& class_names) {
  std::vector<std::string> out;
  for (const auto& c : class_names) out.push_back(format_caption(zero_shot_template(), c));
  return out;
}

std::vector<std::string> zero_shot_prompts() { return zero_shot_prompts(fashion_names()); }

}  // namespace brigade::data
