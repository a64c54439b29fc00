// Captions for CLIP (data/image/captions.h): the vocabulary and ids of known captions exactly,
// padding and lengths, determinism of the seeded template choice, every class name present,
// the zero-shot prompts, and errors.
#include <gtest/gtest.h>

#include <set>

#include "brigade/core/error.h"
#include "brigade/data/image/captions.h"
#include "brigade/data/image/fashion_mnist.h"

using namespace brigade;
using namespace brigade::data;

namespace {

TEST(Captions, VocabularyIsSortedWordsBetweenPaddingAndSpecialIds) {
  CaptionTokenizer tok;
  const std::vector<std::string> want = {"a",     "an",      "and",     "ankle",    "bag",        "black",   "boot",
                                         "coat",  "dress",   "grey",    "image",    "in",         "low",     "of",
                                         "or",    "photo",   "picture", "pullover", "resolution", "sandal",  "shirt",
                                         "small", "sneaker", "t-shirt", "the",      "top",        "trouser", "white"};
  EXPECT_EQ(tok.words(), want);
  EXPECT_EQ(tok.pad_id(), 0);
  EXPECT_EQ(tok.sot_id(), 29);
  EXPECT_EQ(tok.eot_id(), 30);
  EXPECT_EQ(tok.vocab_size(), 31);
  EXPECT_EQ(tok.eot_id(), tok.vocab_size() - 1);  // the largest id (HF's argmax pooling agrees)
  EXPECT_EQ(tok.max_length(), 11);                // "a low resolution photo of a t-shirt or top" + 2
}

TEST(Captions, IdsOfAKnownCaption) {
  CaptionTokenizer tok;
  EXPECT_EQ(class_phrase("T-shirt/top"), "t-shirt or top");
  EXPECT_EQ(class_phrase("Ankle boot"), "ankle boot");
  const std::string cap = format_caption("a photo of a {}", "T-shirt/top");
  EXPECT_EQ(cap, "a photo of a t-shirt or top");
  EXPECT_EQ(tok.encode(cap), (std::vector<int64_t>{29, 1, 16, 14, 1, 24, 15, 26, 30}));
  EXPECT_EQ(tok.decode(tok.encode(cap)), cap);
  EXPECT_EQ(tok.encode("A  Grey   Bag"), (std::vector<int64_t>{29, 1, 10, 5, 30}));  // case and spaces
}

TEST(Captions, BatchPadsToTheContextLength) {
  CaptionTokenizer tok;
  const TokenBatch b = tok.batch({"a small coat", "a photo of a t-shirt or top"}, 10);
  EXPECT_EQ(b.ids.shape(), Shape({2, 10}));
  EXPECT_EQ(b.ids.dtype(), DType::I64);
  EXPECT_EQ(b.ids.to_vector_i64(),
            (std::vector<int64_t>{29, 1, 22, 8, 30, 0, 0, 0, 0, 0, 29, 1, 16, 14, 1, 24, 15, 26, 30, 0}));
  EXPECT_EQ(b.lengths.to_vector_i64(), (std::vector<int64_t>{5, 9}));
  EXPECT_THROW(tok.batch({"a photo of a t-shirt or top"}, 8), DataError);  // needs 9
  EXPECT_THROW(tok.encode("a photo of a cat"), DataError);
  EXPECT_THROW(tok.decode({31}), ValueError);
  EXPECT_THROW(format_caption("no slot", "Bag"), ValueError);
}

TEST(Captions, EveryClassNameInEveryTemplate) {
  CaptionTokenizer tok;
  ASSERT_EQ(tok.class_names().size(), 10u);
  for (size_t c = 0; c < 10; ++c) {
    EXPECT_EQ(tok.class_names()[c], fashion_mnist_classes()[c]);
    for (const auto& t : caption_templates()) {
      const std::string cap = format_caption(t, fashion_mnist_classes()[c]);
      EXPECT_NE(cap.find(class_phrase(fashion_mnist_classes()[c])), std::string::npos) << cap;
      EXPECT_EQ(tok.decode(tok.encode(cap)), cap);
      EXPECT_LE(int64_t(tok.encode(cap).size()), tok.max_length());
    }
  }
  EXPECT_GE(caption_templates().size(), 4u);
}

TEST(Captions, ZeroShotPrompts) {
  const std::vector<std::string> p = zero_shot_prompts();
  ASSERT_EQ(p.size(), 10u);
  EXPECT_EQ(p[0], "a photo of a t-shirt or top");
  EXPECT_EQ(p[1], "a photo of a trouser");
  EXPECT_EQ(p[9], "a photo of a ankle boot");
  EXPECT_EQ(zero_shot_template(), "a photo of a {}");
  CaptionTokenizer tok;
  const TokenBatch b = tok.batch(p, tok.max_length());
  EXPECT_EQ(b.ids.shape(), Shape({10, 11}));
  EXPECT_EQ(b.lengths.to_vector_i64()[1], 7);  // sot a photo of a trouser eot
}

TEST(Captions, PairsAreDeterministicBySeed) {
  CaptionTokenizer tok;
  const std::vector<int64_t> labels = {0, 9, 3, 3, 5, 1, 8, 2, 7, 4, 6, 0, 0, 0, 0, 0};
  const CaptionPairs a = make_caption_pairs(tok, labels, 42, tok.max_length());
  const CaptionPairs b = make_caption_pairs(tok, labels, 42, tok.max_length());
  const CaptionPairs c = make_caption_pairs(tok, labels, 43, tok.max_length());
  ASSERT_EQ(a.captions.size(), labels.size());
  EXPECT_EQ(a.captions, b.captions);
  EXPECT_EQ(a.tokens.ids.to_vector_i64(), b.tokens.ids.to_vector_i64());
  EXPECT_NE(a.template_index, c.template_index);  // 16 draws of 8 templates: another seed differs
  std::set<int64_t> used;
  for (size_t i = 0; i < labels.size(); ++i) {
    EXPECT_EQ(a.image_index[i], int64_t(i));
    EXPECT_EQ(a.captions[i], format_caption(caption_templates()[size_t(a.template_index[i])],
                                            fashion_mnist_classes()[size_t(labels[i])]));
    used.insert(a.template_index[i]);
  }
  EXPECT_GT(used.size(), 2u);  // the choice varies within a batch
  EXPECT_EQ(a.tokens.ids.shape(), Shape({16, tok.max_length()}));
  EXPECT_THROW(make_caption_pairs(tok, {10}, 1, 11), ValueError);
}

}  // namespace
