// nn::Block across the transformer models: the repeated layers of BERT, ViT, Swin, CLIP (both
// towers), LLaMA and GPT are blocks that plans reach from outside with no model-specific code.
// For each model, at a tiny size:
//  - nn::find_blocks lists exactly the expected blocks by full name, in registration order, and
//    every parameter of a block is under its name (Swin's patch merging stays outside);
//  - recompute Full, Selective, and a mix of Full / Selective / None on the blocks give a loss
//    and every parameter gradient bitwise equal (memcmp, no tolerance) to recompute None, from the
//    same inputs and the same dropout seed (BERT, ViT and GPT with dropout > 0 in train mode, so
//    the recompute must replay the masks; BERT with a padded attention mask), and the dropout
//    generator ends in the same state;
//  - the forward hooks (ZeRO-3's way in) run exactly once per block and forward, also under
//    recompute, where the backward re-runs the body but not the hooks; a backward hook placed by
//    the post hook on the block's output (ZeRO-3's re-gather) fires once per block in the
//    backward in every mode; the blocks' forwards run in find_blocks order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/models/bert/bert.h"
#include "brigade/models/clip/clip.h"
#include "brigade/models/gpt/gpt.h"
#include "brigade/models/llama/llama.h"
#include "brigade/models/swin/swin.h"
#include "brigade/models/vit/vit.h"
#include "brigade/nn/layers.h"

using namespace brigade;
using nn::Recompute;

namespace {

constexpr uint64_t kDropoutSeed = 4242;

// Deterministic values in [0, n) (a small LCG, so the inputs do not depend on any generator).
std::vector<int64_t> ints(size_t count, int64_t n, uint32_t seed) {
  std::vector<int64_t> v(count);
  uint32_t s = seed;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = int64_t((s >> 8) % uint32_t(n));
  }
  return v;
}

Tensor images(int64_t N, int64_t C, int64_t H, uint64_t seed) {
  Tensor t = Tensor::zeros({N, C, H, H});  // (N, C, H, W)
  Generator g(seed);
  g.normal_(t);
  return t;
}

// A model under test: the module tree, its dropout generator (null: no dropout), and a loss
// that runs the forward (the same inputs every call).
struct Case {
  std::shared_ptr<nn::Module> model;
  Generator* gen = nullptr;
  std::function<Tensor()> loss;
  std::vector<std::string> blocks;  // expected find_blocks names
};

std::vector<std::string> numbered(const std::string& prefix, int64_t n) {
  std::vector<std::string> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(prefix + std::to_string(i));
  return v;
}

// A model of config `c`, initialised from `seed`, in train mode.
template <class Model, class Config>
std::shared_ptr<Model> initialised(const Config& c, uint64_t seed) {
  auto m = std::make_shared<Model>(c);
  Generator init(seed);
  m->init_weights(init);
  m->train(true);
  return m;
}

// A causal LM's case: B = 2 rows of T = 8 ids and targets in [0, vocab) (from seeds `seed` and
// `seed + 1`), its blocks, and its dropout generator (null: no dropout).
template <class LM>
Case lm_case(const std::shared_ptr<LM>& m, int64_t vocab, uint32_t seed, std::vector<std::string> blocks,
             Generator* gen) {
  const int64_t B = 2, T = 8;
  const Tensor ids = Tensor::from_vector_i64(ints(size_t(B * T), vocab, seed), {B, T});      // (B, T)
  const Tensor tgt = Tensor::from_vector_i64(ints(size_t(B * T), vocab, seed + 1), {B, T});  // (B, T)
  return {m, gen, [m, ids, tgt] { return m->loss(ids, tgt); }, std::move(blocks)};
}

Case bert_case() {
  models::BERTConfig c;
  c.vocab_size = 53;
  c.max_position_embeddings = 16;
  c.hidden_size = 16;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 2;
  c.intermediate_size = 32;
  c.hidden_dropout = 0.2;
  auto m = initialised<models::BERT>(c, 7);
  const int64_t B = 2, T = 8;
  const Tensor ids = Tensor::from_vector_i64(ints(size_t(B * T), c.vocab_size, 11), {B, T});  // (B, T)
  std::vector<int64_t> lab(size_t(B * T), -100), mask(size_t(B * T), 1);
  const std::vector<int64_t> target = ints(lab.size(), c.vocab_size, 12);
  for (size_t i = 0; i < lab.size(); i += 3) lab[i] = target[i];
  for (int64_t t = 5; t < T; ++t) mask[size_t(1 * T + t)] = 0;  // row 1 padded after 5 tokens
  lab[size_t(1 * T + 6)] = -100;                                // (no label on padding)
  const Tensor labels = Tensor::from_vector_i64(lab, {B, T});   // (B, T)
  const Tensor am = Tensor::from_vector_i64(mask, {B, T});      // (B, T) of 0 / 1
  return {m, &m->dropout_generator(), [m, ids, labels, am] { return m->mlm_loss(ids, labels, am); },
          numbered("bert.encoder.layer.", c.num_hidden_layers)};
}

Case vit_case() {
  models::ViTConfig c;
  c.image_size = 8;
  c.patch_size = 4;
  c.num_channels = 3;
  c.hidden_size = 16;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 2;
  c.intermediate_size = 32;
  c.num_labels = 5;
  c.hidden_dropout = 0.2;
  auto m = initialised<models::ViT>(c, 8);
  const Tensor x = images(3, 3, 8, 21);                                      // (N, C, H, W)
  const Tensor y = Tensor::from_vector_i64(ints(3, c.num_labels, 22), {3});  // (N)
  return {m, &m->dropout_generator(), [m, x, y] { return m->loss(x, y); },
          numbered("vit.encoder.layer.", c.num_hidden_layers)};
}

models::SwinConfig swin_config() {
  models::SwinConfig c;  // stage 0: an 8x8 grid, windows of 4, block 1 shifted by 2; stage 1: 4x4, one window
  c.image_size = 16;
  c.patch_size = 2;
  c.num_channels = 3;
  c.embed_dim = 8;
  c.depths = {2, 2};
  c.num_heads = {2, 4};
  c.window_size = 4;
  c.mlp_ratio = 2.0;
  c.num_labels = 5;
  return c;
}

Case swin_case() {
  const models::SwinConfig c = swin_config();
  auto m = std::make_shared<models::Swin>(c);
  Generator init(9);
  m->init_weights(init);
  // HF zero-initialises the relative position bias table; give it values so its gradient path
  // (through the constant relative_position_index) carries information into the loss.
  for (auto& [name, p] : m->named_parameters())
    if (name.find("relative_position_bias_table") != std::string::npos) init.normal_(p, 0.0, 0.5);
  m->train(true);
  const Tensor x = images(2, 3, 16, 31);                                     // (N, C, H, W)
  const Tensor y = Tensor::from_vector_i64(ints(2, c.num_labels, 32), {2});  // (N)
  return {m,
          nullptr,
          [m, x, y] { return m->loss(x, y); },
          {"swin.encoder.layers.0.blocks.0", "swin.encoder.layers.0.blocks.1", "swin.encoder.layers.1.blocks.0",
           "swin.encoder.layers.1.blocks.1"}};
}

Case clip_case() {
  models::CLIPConfig c;
  c.text.vocab_size = 40;
  c.text.max_position_embeddings = 8;
  c.text.hidden_size = 16;
  c.text.num_hidden_layers = 2;
  c.text.num_attention_heads = 2;
  c.text.intermediate_size = 32;
  c.vision.image_size = 8;
  c.vision.patch_size = 4;
  c.vision.num_channels = 3;
  c.vision.hidden_size = 24;
  c.vision.num_hidden_layers = 3;
  c.vision.num_attention_heads = 2;
  c.vision.intermediate_size = 48;
  c.projection_dim = 8;
  auto m = initialised<models::CLIP>(c, 10);
  const int64_t N = 3, T = 6;
  const Tensor x = images(N, 3, 8, 41);                                                            // (N, C, H, W)
  const Tensor ids = Tensor::from_vector_i64(ints(size_t(N * T), c.text.vocab_size, 42), {N, T});  // (N, T)
  const Tensor lengths = Tensor::from_vector_i64({6, 3, 5}, {N});                                  // (N)
  Case k{m, nullptr, [m, x, ids, lengths] { return m->contrastive_loss(x, ids, lengths); },
         numbered("text_model.encoder.layers.", c.text.num_hidden_layers)};
  for (auto& n : numbered("vision_model.encoder.layers.", c.vision.num_hidden_layers)) k.blocks.push_back(n);
  return k;
}

Case llama_case() {
  models::LLaMAConfig c;
  c.vocab_size = 50;
  c.hidden_size = 16;
  c.intermediate_size = 40;
  c.n_layer = 3;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.max_position = 16;
  auto m = initialised<models::LLaMA>(c, 11);
  return lm_case(m, c.vocab_size, 51, numbered("model.layers.", c.n_layer), nullptr);
}

Case gpt_case() {
  models::GPTConfig c;
  c.vocab_size = 50;
  c.block_size = 16;
  c.n_layer = 3;
  c.n_head = 2;
  c.n_embd = 16;
  c.dropout = 0.2;
  auto m = initialised<models::GPT>(c, 12);
  return lm_case(m, c.vocab_size, 61, numbered("transformer.h.", c.n_layer), &m->dropout_generator());
}

const std::map<std::string, std::function<Case()>>& cases() {
  static const std::map<std::string, std::function<Case()>> all = {{"bert", bert_case},   {"vit", vit_case},
                                                                   {"swin", swin_case},   {"clip", clip_case},
                                                                   {"llama", llama_case}, {"gpt", gpt_case}};
  return all;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

struct Result {
  std::vector<float> loss;
  std::vector<std::pair<std::string, std::vector<float>>> grads;  // a parameter without a gradient: empty
  std::vector<bool> has_grad;
  std::string rng;  // the dropout generator after the step
};

// One forward + backward from fresh (undefined) gradients, every block in `modes`, the dropout
// generator (if any) reset to the same seed first.
Result step(const Case& k, const std::vector<Recompute>& modes) {
  const auto blocks = nn::find_blocks(*k.model);
  EXPECT_EQ(blocks.size(), modes.size());
  for (size_t i = 0; i < blocks.size() && i < modes.size(); ++i) blocks[i].second->recompute = modes[i];
  for (auto& [n, p] : k.model->named_parameters()) p.set_grad(Tensor());
  if (k.gen) k.gen->manual_seed(kDropoutSeed);
  const Tensor loss = k.loss();
  autograd::backward(loss);
  Result r;
  r.loss = loss.to_vector();
  for (auto& [n, p] : k.model->named_parameters()) {
    const Tensor g = p.grad();
    r.has_grad.push_back(g.defined());
    r.grads.emplace_back(n, g.defined() ? g.to_vector() : std::vector<float>());
  }
  if (k.gen) r.rng = k.gen->state();
  for (auto& [n, b] : blocks) b->recompute = Recompute::None;
  return r;
}

void expect_bitwise(const Result& want, const Result& got, const std::string& what) {
  EXPECT_TRUE(same_bits(want.loss, got.loss)) << what << ": loss " << want.loss.at(0) << " vs " << got.loss.at(0);
  ASSERT_EQ(want.grads.size(), got.grads.size()) << what;
  for (size_t i = 0; i < want.grads.size(); ++i) {
    EXPECT_EQ(want.has_grad[i], got.has_grad[i]) << what << ": " << want.grads[i].first;
    EXPECT_TRUE(same_bits(want.grads[i].second, got.grads[i].second))
        << what << ": gradient of " << want.grads[i].first << " differs";
  }
  EXPECT_EQ(want.rng, got.rng) << what << ": the dropout generator ends elsewhere";
}

class Blocks : public ::testing::TestWithParam<std::string> {};

TEST_P(Blocks, FindBlocksListsTheRepeatedLayers) {
  const Case k = cases().at(GetParam())();
  const auto blocks = nn::find_blocks(*k.model);
  std::vector<std::string> names;
  for (auto& [n, b] : blocks) names.push_back(n);
  EXPECT_EQ(names, k.blocks);
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), k.blocks.front());
  EXPECT_EQ(names.back(), k.blocks.back());
  // Each block holds parameters, and a parameter inside a block is named below it.
  std::map<std::string, int> per_block;
  for (auto& [n, p] : k.model->named_parameters())
    for (auto& b : names)
      if (n.rfind(b + ".", 0) == 0) ++per_block[b];
  for (auto& b : names) EXPECT_GT(per_block[b], 0) << b << " holds no parameter";
  // For the causal LMs, the trainer's CausalLM::blocks() names the same modules.
  if (auto* lm = dynamic_cast<models::CausalLM*>(k.model.get())) {
    const auto lm_blocks = lm->blocks();
    ASSERT_EQ(lm_blocks.size(), blocks.size());
    for (size_t i = 0; i < blocks.size(); ++i) {
      EXPECT_EQ(lm_blocks[i].first, blocks[i].first);
      EXPECT_EQ(lm_blocks[i].second, static_cast<nn::Module*>(blocks[i].second));
    }
  }
}

TEST_P(Blocks, RecomputeIsBitwise) {
  const Case k = cases().at(GetParam())();
  const size_t n = k.blocks.size();
  const Result none = step(k, std::vector<Recompute>(n, Recompute::None));
  ASSERT_TRUE(std::isfinite(none.loss.at(0)));
  // The reference itself is reproducible (same seed, same inputs), or nothing below means anything.
  expect_bitwise(none, step(k, std::vector<Recompute>(n, Recompute::None)), GetParam() + " none twice");
  expect_bitwise(none, step(k, std::vector<Recompute>(n, Recompute::Full)), GetParam() + " full");
  expect_bitwise(none, step(k, std::vector<Recompute>(n, Recompute::Selective)), GetParam() + " selective");
  std::vector<Recompute> mixed(n);
  for (size_t i = 0; i < n; ++i)
    mixed[i] = i % 3 == 0 ? Recompute::Full : i % 3 == 1 ? Recompute::Selective : Recompute::None;
  expect_bitwise(none, step(k, mixed), GetParam() + " mixed");
  // Every parameter receives a gradient (the blocks' parameters included).
  for (size_t i = 0; i < none.grads.size(); ++i) EXPECT_TRUE(none.has_grad[i]) << none.grads[i].first;
}

TEST_P(Blocks, ForwardHooksRunOnceOutsideTheRecompute) {
  const Case k = cases().at(GetParam())();
  const auto blocks = nn::find_blocks(*k.model);
  const size_t n = blocks.size();
  std::vector<int> pre(n), post(n), bwd(n), pre_recomputing(n);
  std::vector<size_t> order;  // blocks in the order their forward ran
  for (size_t i = 0; i < n; ++i) {
    nn::Block* b = blocks[i].second;
    b->pre_forward_hook = [&, i] {
      ++pre[i];
      if (autograd::recomputing()) ++pre_recomputing[i];
      order.push_back(i);
    };
    b->post_forward_hook = [&, i](const Tensor& out) -> Tensor {
      ++post[i];
      return fn::backward_hook(out, [&, i] { ++bwd[i]; });
    };
  }
  for (Recompute mode : {Recompute::None, Recompute::Full, Recompute::Selective}) {
    const std::string what = GetParam() + " " + models::recompute_name(mode);
    std::fill(pre.begin(), pre.end(), 0);
    std::fill(post.begin(), post.end(), 0);
    std::fill(bwd.begin(), bwd.end(), 0);
    std::fill(pre_recomputing.begin(), pre_recomputing.end(), 0);
    order.clear();
    for (auto& [name, b] : blocks) b->recompute = mode;
    for (auto& [name, p] : k.model->named_parameters()) p.set_grad(Tensor());
    if (k.gen) k.gen->manual_seed(kDropoutSeed);
    const Tensor loss = k.loss();
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(pre[i], 1) << what << ": pre hook of " << blocks[i].first << " after the forward";
      EXPECT_EQ(post[i], 1) << what << ": post hook of " << blocks[i].first << " after the forward";
      EXPECT_EQ(bwd[i], 0) << what << ": " << blocks[i].first;
    }
    autograd::backward(loss);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(pre[i], 1) << what << ": the backward ran the pre hook of " << blocks[i].first << " again";
      EXPECT_EQ(post[i], 1) << what << ": the backward ran the post hook of " << blocks[i].first << " again";
      EXPECT_EQ(pre_recomputing[i], 0) << what << ": " << blocks[i].first;
      EXPECT_EQ(bwd[i], 1) << what << ": backward hook on the output of " << blocks[i].first;
    }
    // The blocks run in find_blocks order (CLIP: the text tower, then the vision tower, as
    // CLIP::logits sequences them), the order ZeRO-3 prefetches its units in.
    ASSERT_EQ(order.size(), n) << what;
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(order[i], i) << what << ": forward position " << i;
  }
  for (auto& [name, b] : blocks) {
    b->pre_forward_hook = nullptr;
    b->post_forward_hook = nullptr;
    b->recompute = Recompute::None;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Blocks, ::testing::Values("bert", "vit", "swin", "clip", "llama", "gpt"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// Swin: the tiny configuration has a shifted block (its mask is a constant the body captures),
// and the patch merging of stage 0 is outside every block (gathered for the whole step by ZeRO-3).
TEST(SwinBlocks, ShiftedBlockAndMergingOutsideBlocks) {
  const models::SwinConfig c = swin_config();
  models::Swin m(c);
  const auto blocks = nn::find_blocks(m);
  ASSERT_EQ(blocks.size(), 4u);
  auto* shifted = dynamic_cast<models::SwinLayer*>(blocks[1].second);
  ASSERT_NE(shifted, nullptr);
  EXPECT_GT(shifted->shift, 0);
  ASSERT_TRUE(shifted->attn_mask.defined());
  EXPECT_FALSE(shifted->attn_mask.requires_grad());
  EXPECT_FALSE(shifted->self_attention->relative_position_index.requires_grad());
  int outside = 0;
  for (auto& [n, p] : m.named_parameters()) {
    bool inside = false;
    for (auto& [b, ptr] : blocks) inside = inside || n.rfind(b + ".", 0) == 0;
    if (n.rfind("swin.encoder.layers.0.downsample.", 0) == 0) {
      EXPECT_FALSE(inside) << n;
    }
    outside += !inside;
  }
  EXPECT_GT(outside, 0);
}

// The recompute must replay the dropout masks: with dropout > 0 a second forward from the same
// seed but without the reset draws different masks, so the bitwise checks above have teeth.
TEST(BertBlocks, DropoutIsActiveInTheComparedRuns) {
  const Case k = bert_case();
  k.gen->manual_seed(kDropoutSeed);
  const std::vector<float> a = k.loss().to_vector();
  const std::vector<float> b = k.loss().to_vector();  // the generator has moved on
  EXPECT_FALSE(same_bits(a, b));
}

}  // namespace
