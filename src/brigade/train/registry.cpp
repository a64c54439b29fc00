// The model registry; see registry.h. Each model type has, below, its config mapping, its
// recipe checks and its task factory, then one row in model_registry().
#include "brigade/train/registry.h"
#include "brigade/train/finetune.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "brigade/core/error.h"
#include "brigade/core/rng.h"
#include "brigade/train/model_configs.h"
#include "brigade/train/tasks.h"

namespace brigade::train {

// ---------------------------------------------------------------- config mappings

namespace {
int64_t or_default(int64_t v, int64_t fallback) { return v > 0 ? v : fallback; }
}  // namespace

models::GPTConfig gpt_config(const ModelConfig& m) {
  return {.vocab_size = m.vocab_size,
          .block_size = m.block_size,
          .n_layer = m.n_layer,
          .n_head = m.n_head,
          .n_embd = m.n_embd,
          .dropout = m.dropout,
          .layer_norm_eps = m.layer_norm_eps,
          .init_std = m.init_std};
}

models::LLaMAConfig llama_config(const ModelConfig& m) {
  models::LLaMAConfig c{.vocab_size = m.vocab_size,
                        .hidden_size = m.n_embd,
                        .intermediate_size = or_default(m.intermediate_size, (8 * m.n_embd / 3 + 63) / 64 * 64),
                        .n_layer = m.n_layer,
                        .n_head = m.n_head,
                        .n_kv_head = or_default(m.n_kv_head, m.n_head),
                        .max_position = m.block_size,
                        .rms_norm_eps = m.layer_norm_eps,
                        .rope_theta = m.rope_theta,
                        .init_std = m.init_std,
                        .tie_word_embeddings = m.tie_embeddings};
  // validate_llama has checked the names and values; a scaling's unset parameters keep the
  // config's defaults, which that scaling does not read.
  if (m.rope_scaling == "linear") {
    c.rope_scaling = ops::RopeScaling::Linear;
    c.rope_factor = m.rope_scaling_factor;
  } else if (m.rope_scaling == "llama3") {
    c.rope_scaling = ops::RopeScaling::Llama3;
    c.rope_factor = m.rope_scaling_factor;
    c.rope_low_freq_factor = m.rope_low_freq_factor;
    c.rope_high_freq_factor = m.rope_high_freq_factor;
    c.rope_original_max_positions = double(m.rope_original_max_positions);
  } else {
    BRIGADE_CHECK(m.rope_scaling == "none", ConfigError,
                  "model.rope_scaling = \"{}\" is not a RoPE scaling; use \"none\", \"linear\" or \"llama3\"",
                  m.rope_scaling);
  }
  return c;
}

models::BERTConfig bert_config(const ModelConfig& m) {
  return {.vocab_size = m.vocab_size + 1,  // + [MASK]
          .max_position_embeddings = m.block_size,
          .hidden_size = m.n_embd,
          .num_hidden_layers = m.n_layer,
          .num_attention_heads = m.n_head,
          .intermediate_size = or_default(m.intermediate_size, 4 * m.n_embd),
          .layer_norm_eps = m.layer_norm_eps,
          .hidden_dropout = m.dropout,
          .initializer_range = m.init_std};
}

models::ViTConfig vit_config(const ModelConfig& m) {
  return {.image_size = m.image_size,
          .patch_size = m.patch_size,
          .num_channels = m.in_channels,
          .hidden_size = m.n_embd,
          .num_hidden_layers = m.n_layer,
          .num_attention_heads = m.n_head,
          .intermediate_size = or_default(m.intermediate_size, 4 * m.n_embd),
          .num_labels = m.num_classes,
          .layer_norm_eps = m.layer_norm_eps,
          .hidden_dropout = m.dropout,
          .initializer_range = m.init_std};
}

models::SwinConfig swin_config(const ModelConfig& m) {
  std::vector<int64_t> heads;
  for (size_t i = 0; i < swin_depths(m).size(); ++i) heads.push_back(m.n_head << i);  // doubling per stage
  return {.image_size = m.image_size,
          .patch_size = m.patch_size,
          .num_channels = m.in_channels,
          .embed_dim = m.n_embd,
          .depths = swin_depths(m),
          .num_heads = heads,
          .window_size = m.window_size,
          .mlp_ratio = m.mlp_ratio,
          .num_labels = m.num_classes,
          .layer_norm_eps = m.layer_norm_eps,
          .initializer_range = m.init_std};
}

models::ResNetConfig resnet_config(const ModelConfig& m) {
  const bool small_input = m.stem != "imagenet";
  models::ResNetConfig rc = m.type == "resnet50" ? models::resnet50_config(m.num_classes, m.in_channels, small_input)
                                                 : models::resnet18_config(m.num_classes, m.in_channels, small_input);
  rc.width = m.width;
  rc.channels_last = m.memory_format == "channels_last";
  return rc;
}

models::CLIPConfig clip_config(const ModelConfig& m, const data::CaptionTokenizer& tok) {
  const int64_t text_width = or_default(m.text_width, m.n_embd);
  models::CLIPConfig c{.text = {.vocab_size = tok.vocab_size(),
                                .max_position_embeddings = tok.max_length(),
                                .hidden_size = text_width,
                                .num_hidden_layers = or_default(m.text_layers, m.n_layer),
                                .num_attention_heads = or_default(m.text_heads, m.n_head),
                                .intermediate_size = 4 * text_width,
                                .layer_norm_eps = m.layer_norm_eps},
                       .vision = {.image_size = m.image_size,
                                  .patch_size = m.patch_size,
                                  .num_channels = m.in_channels,
                                  .hidden_size = m.n_embd,
                                  .num_hidden_layers = m.n_layer,
                                  .num_attention_heads = m.n_head,
                                  .intermediate_size = or_default(m.intermediate_size, 4 * m.n_embd),
                                  .layer_norm_eps = m.layer_norm_eps},
                       .projection_dim = or_default(m.projection_dim, m.n_embd),
                       .hidden_act = "quick_gelu",
                       .initializer_range = m.init_std};
  c.validate();
  return c;
}

const char* const kAlignDefaultStages =
    "r1_k3_s1_e1_i32_o16, r2_k3_s2_e6_i16_o24, r2_k5_s2_e6_i24_o40, r3_k3_s1_e6_i40_o80, r1_k3_s1_e6_i80_o96";

namespace {

// One EfficientNet block string ("r2_k3_s2_e6_i16_o24"; the stride also as "s22", squeeze
// "se0.25" allowed) into stage i of the vision config.
void parse_block_string(const std::string& text, models::AlignVisionConfig& v) {
  const std::string key = "model.stages";
  std::map<std::string, double> f;
  std::stringstream in(text);
  for (std::string tok; std::getline(in, tok, '_');) {
    const size_t n = tok.rfind("se", 0) == 0 ? 2 : 1;
    const std::string name = tok.substr(0, n), num = tok.substr(std::min(n, tok.size()));
    size_t used = 0;
    double x = 0;
    try {
      x = std::stod(num, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    BRIGADE_CHECK(!num.empty() && used == num.size() && std::string("rkseio").find(name) != std::string::npos,
                  ConfigError,
                  "{}: \"{}\" in block \"{}\" is not one of r<repeats>, k<kernel>, s<stride>, e<expand ratio>, "
                  "i<in channels>, o<out channels>, se<squeeze ratio>; e.g. \"r2_k3_s2_e6_i16_o24\"",
                  key, tok, text);
    if (name == "s" && (num == "11" || num == "22")) x = num == "11" ? 1 : 2;  // TF's (sy, sx) pair
    BRIGADE_CHECK(!f.count(name), ConfigError, "{}: block \"{}\" gives {} twice", key, text, name);
    f[name] = x;
  }
  for (const char* need : {"r", "k", "s", "e", "i", "o"})
    BRIGADE_CHECK(f.count(need), ConfigError, "{}: block \"{}\" lacks {}<...>; write e.g. \"r2_k3_s2_e6_i16_o24\"", key,
                  text, need);
  for (const char* whole : {"r", "k", "s", "e", "i", "o"})
    BRIGADE_CHECK(f[whole] == std::floor(f[whole]) && f[whole] >= 1, ConfigError,
                  "{}: block \"{}\": {} must be a whole number >= 1", key, text, whole);
  if (f.count("se"))
    BRIGADE_CHECK(f["se"] == 0.25, ConfigError,
                  "{}: block \"{}\": se{} - HF's ALIGN has one squeeze_expansion_ratio, 0.25, for every block", key,
                  text, f["se"]);
  v.num_block_repeats.push_back(int64_t(f["r"]));
  v.kernel_sizes.push_back(int64_t(f["k"]));
  v.strides.push_back(int64_t(f["s"]));
  v.expand_ratios.push_back(int64_t(f["e"]));
  v.in_channels.push_back(int64_t(f["i"]));
  v.out_channels.push_back(int64_t(f["o"]));
}

}  // namespace

models::AlignConfig align_config(const ModelConfig& m, const data::CaptionTokenizer& tok) {
  models::AlignConfig c;
  c.text = {.vocab_size = tok.vocab_size(),
            .max_position_embeddings = tok.max_length(),
            .type_vocab_size = 2,
            .hidden_size = m.n_embd,
            .num_hidden_layers = m.n_layer,
            .num_attention_heads = m.n_head,
            .intermediate_size = or_default(m.intermediate_size, 4 * m.n_embd),
            .layer_norm_eps = m.layer_norm_eps,
            .hidden_dropout = 0.0,
            .initializer_range = m.init_std};
  models::AlignVisionConfig& v = c.vision;
  v.num_channels = m.in_channels;
  v.image_size = m.image_size;
  v.width_coefficient = m.width_coefficient;
  v.depth_coefficient = m.depth_coefficient;
  v.kernel_sizes.clear(), v.in_channels.clear(), v.out_channels.clear(), v.strides.clear();
  v.num_block_repeats.clear(), v.expand_ratios.clear();
  const std::string stages = m.stages.empty() ? kAlignDefaultStages : m.stages;
  std::stringstream in(stages);
  for (std::string block; std::getline(in, block, ',');) {
    block.erase(0, block.find_first_not_of(' '));
    block.erase(block.find_last_not_of(' ') + 1);
    BRIGADE_CHECK(!block.empty(), ConfigError, "model.stages = \"{}\": an empty block between commas", stages);
    parse_block_string(block, v);
  }
  v.depthwise_padding = m.depthwise_padding.empty() ? std::vector<int64_t>{}
                                                    : parse_count_list("model.depthwise_padding", m.depthwise_padding);
  v.drop_connect_rate = 0.0;  // dropout would differ between the contrastive task's two passes
  v.initializer_range = m.init_std;
  c.projection_dim = m.projection_dim > 0 ? m.projection_dim : v.embed_dim();
  c.validate();
  return c;
}

std::unique_ptr<models::CausalLM> make_causal_lm(const ModelConfig& m) {
  if (m.type == "llama") return std::make_unique<models::LLaMA>(llama_config(m));
  BRIGADE_CHECK(m.type == "gpt", ConfigError, "model.type = \"{}\" is not a causal language model (gpt, llama)",
                m.type);
  return std::make_unique<models::GPT>(gpt_config(m));
}

namespace {

// ---------------------------------------------------------------- recipe checks

void check_image_data(const Recipe& r, const Fail& fail) {
  if (r.data.corpus == "synthetic") {  // any shape (validate_model admits it only where the row says so)
    if (r.model.image_size < 1 || r.model.image_size > 4096)
      fail(fmt::format("model.image_size = {} must be in [1, 4096]", r.model.image_size));
    if (r.model.in_channels < 1 || r.model.in_channels > 4096)
      fail(fmt::format("model.in_channels = {} must be in [1, 4096]", r.model.in_channels));
    if (r.model.num_classes < 2 || r.model.num_classes > 1000000)
      fail(fmt::format("model.num_classes = {} must be in [2, 1000000]", r.model.num_classes));
    return;
  }
  if (r.model.image_size != 28)
    fail(fmt::format("model.image_size = {}: Fashion-MNIST images are 28x28; set model.image_size = 28",
                     r.model.image_size));
  if (r.model.in_channels != 1)
    fail(fmt::format("model.in_channels = {}: Fashion-MNIST images are grey (one channel); set model.in_channels = 1",
                     r.model.in_channels));
  if (r.model.num_classes != 10)
    fail(fmt::format("model.num_classes = {}: Fashion-MNIST has 10 classes; set model.num_classes = 10",
                     r.model.num_classes));
}

void check_patches(const Recipe& r, const Fail& fail) {
  if (r.model.patch_size < 1 || r.model.image_size % r.model.patch_size != 0)
    fail(
        fmt::format("model.patch_size = {} must divide model.image_size = {} (the image is cut into whole "
                    "patches); use e.g. 2, 4, 7 or 14",
                    r.model.patch_size, r.model.image_size));
}

void check_mlp_width(const Recipe& r, const Fail& fail) {
  if (r.model.intermediate_size < 0)
    fail(fmt::format("model.intermediate_size = {} must be >= 0 (0 = 4 n_embd)", r.model.intermediate_size));
}

void validate_gpt(const Recipe&, const Fail&) {}

// model.rope_scaling and the numbers it reads: each scaling sets exactly its own, in range.
void check_rope_scaling(const Recipe& r, const Fail& fail) {
  const ModelConfig& m = r.model;
  const ModelConfig d;
  const std::string& s = m.rope_scaling;
  if (s != "none" && s != "linear" && s != "llama3") {
    const bool other = s == "dynamic" || s == "yarn" || s == "longrope" || s == "ntk" || s == "su";
    fail(
        fmt::format("model.rope_scaling = \"{}\" is {}; use \"none\", \"linear\" (positions / factor) or "
                    "\"llama3\" (Llama 3.1-3.3)",
                    s, other ? "not implemented (only linear and llama3 scalings are)" : "not a RoPE scaling"));
    return;
  }
  // (key, value, whether it is set, whether this scaling reads it)
  struct Num {
    const char* key;
    double v;
    bool set, read;
  };
  const Num nums[] = {
      {"model.rope_scaling_factor", m.rope_scaling_factor, m.rope_scaling_factor != d.rope_scaling_factor, s != "none"},
      {"model.rope_low_freq_factor", m.rope_low_freq_factor, m.rope_low_freq_factor != d.rope_low_freq_factor,
       s == "llama3"},
      {"model.rope_high_freq_factor", m.rope_high_freq_factor, m.rope_high_freq_factor != d.rope_high_freq_factor,
       s == "llama3"},
      {"model.rope_original_max_positions", double(m.rope_original_max_positions),
       m.rope_original_max_positions != d.rope_original_max_positions, s == "llama3"}};
  for (const Num& n : nums) {
    if (n.set && !n.read)
      fail(fmt::format("{} = {} has no effect with model.rope_scaling = \"{}\"; remove it{}", n.key, n.v, s,
                       s == "none" ? " or set model.rope_scaling = \"linear\" / \"llama3\"" : ""));
    if (n.read && !(n.v > 0))
      fail(
          fmt::format("{} = {} must be > 0 with model.rope_scaling = \"{}\"; set the value the model was "
                      "trained with (config.json's rope_scaling; Llama 3.2: factor 32, low_freq_factor 1, "
                      "high_freq_factor 4, original_max_position_embeddings 8192)",
                      n.key, n.v, s));
  }
  if (s == "llama3" && m.rope_low_freq_factor > 0 && !(m.rope_high_freq_factor > m.rope_low_freq_factor))
    fail(
        fmt::format("model.rope_high_freq_factor = {} must be > model.rope_low_freq_factor = {} (the llama3 "
                    "scaling blends the frequencies between the two wavelengths they give)",
                    m.rope_high_freq_factor, m.rope_low_freq_factor));
}

void validate_llama(const Recipe& r, const Fail& fail) {
  const int64_t kv = r.model.n_kv_head == 0 ? r.model.n_head : r.model.n_kv_head;
  if (kv < 1 || r.model.n_head % kv != 0)
    fail(
        fmt::format("model.n_kv_head = {} must divide model.n_head = {} (grouped-query attention shares each "
                    "key/value head among n_head / n_kv_head query heads); 0 means n_head",
                    r.model.n_kv_head, r.model.n_head));
  if (r.model.intermediate_size < 0)
    fail(fmt::format("model.intermediate_size = {} must be >= 0 (0 = 8 n_embd / 3 rounded up to a multiple of 64)",
                     r.model.intermediate_size));
  if (!(r.model.rope_theta > 0))
    fail(fmt::format("model.rope_theta = {} must be > 0; LLaMA uses 10000", r.model.rope_theta));
  check_rope_scaling(r, fail);
}

void validate_bert(const Recipe& r, const Fail& fail) {
  if (!(r.data.mlm_probability > 0 && r.data.mlm_probability < 1))
    fail(fmt::format("data.mlm_probability = {} must be in (0, 1); BERT uses 0.15", r.data.mlm_probability));
  check_mlp_width(r, fail);
}

void validate_vit(const Recipe& r, const Fail& fail) {
  check_image_data(r, fail);
  check_patches(r, fail);
  check_mlp_width(r, fail);
}

void validate_resnet(const Recipe& r, const Fail& fail) {
  check_image_data(r, fail);
  if (r.model.width < 1 || r.model.width > 4096)
    fail(
        fmt::format("model.width = {} must be in [1, 4096]: the ResNet's stem and stage-1 channels (torchvision "
                    "64; 16 or 32 train faster)",
                    r.model.width));
  if (r.model.stem != "small" && r.model.stem != "imagenet")
    fail(
        fmt::format("model.stem = \"{}\" must be \"small\" (3x3 stride-1 conv, no max-pool: for 28x28 inputs) or "
                    "\"imagenet\" (torchvision's 7x7 stride-2 conv and 3x3 stride-2 max-pool: for 224x224)",
                    r.model.stem));
  if (r.model.memory_format != "nchw" && r.model.memory_format != "channels_last")
    fail(
        fmt::format("model.memory_format = \"{}\" must be \"nchw\" (the default) or \"channels_last\" (NHWC "
                    "activations: faster convolutions, the same parameters and checkpoints)",
                    r.model.memory_format));
}

void validate_swin(const Recipe& r, const Fail& fail) {
  check_image_data(r, fail);
  check_patches(r, fail);
  if (!(r.model.mlp_ratio > 0 && r.model.mlp_ratio <= 64))
    fail(fmt::format("model.mlp_ratio = {} must be in (0, 64]; Swin uses 4", r.model.mlp_ratio));
  if (r.model.window_size < 1)
    fail(fmt::format("model.window_size = {} must be >= 1; Swin uses 7", r.model.window_size));
  std::vector<int64_t> d;
  try {
    d = swin_depths(r.model);
  } catch (const ConfigError& e) {
    fail(e.what());
  }
  if (d.empty()) fail("model.depths is empty; give the blocks per stage, e.g. \"2,2\"");
  const int64_t grid = r.model.image_size / std::max<int64_t>(1, r.model.patch_size);
  for (size_t i = 0; i < d.size(); ++i) {
    const int64_t res = grid >> i;
    if (d[i] < 1)
      fail(fmt::format("model.depths = \"{}\": stage {} has {} blocks; every stage needs at least 1", r.model.depths, i,
                       d[i]));
    if (res < 1 || (i + 1 < d.size() && res % 2 != 0))
      fail(
          fmt::format("model.depths = \"{}\": stage {} would work on a {}x{} grid, which patch merging cannot "
                      "halve; use fewer stages or a smaller model.patch_size",
                      r.model.depths, i, res, res));
    if (res > r.model.window_size && res % r.model.window_size != 0)
      fail(
          fmt::format("model.window_size = {} does not divide stage {}'s {}x{} grid (image_size / patch_size / "
                      "2^stage); choose a window that divides it",
                      r.model.window_size, i, res, res));
  }
}

void validate_clip(const Recipe& r, const Fail& fail) {
  check_image_data(r, fail);
  check_patches(r, fail);
  check_mlp_width(r, fail);
  if (r.model.text_layers < 0 || r.model.text_heads < 0 || r.model.text_width < 0 || r.model.projection_dim < 0)
    fail(
        "model.text_layers, text_heads, text_width and projection_dim must be >= 0 (0 = the image tower's "
        "n_layer, n_head, n_embd)");
  const int64_t tw = r.model.text_width > 0 ? r.model.text_width : r.model.n_embd;
  const int64_t th = r.model.text_heads > 0 ? r.model.text_heads : r.model.n_head;
  if (th < 1 || tw % th != 0)
    fail(fmt::format("model.text_width = {} is not divisible by model.text_heads = {}", tw, th));
}

void validate_align(const Recipe& r, const Fail& fail) {
  check_image_data(r, fail);
  check_mlp_width(r, fail);
  if (r.model.projection_dim < 0) fail("model.projection_dim must be >= 0 (0 = the image tower's pooled width)");
  try {
    align_config(r.model, data::CaptionTokenizer());
  } catch (const ConfigError& e) {
    fail(e.what());
  }
}

void validate_flamingo(const Recipe& r, const Fail& fail) {
  check_image_data(r, fail);
  // the shapes come from the towers' checkpoints: the language-model shape keys must stay unset
  const Recipe d;
  const std::map<std::string, std::string> now = recipe_values(r), def = recipe_values(d);
  for (const char* k : {"model.vocab_size", "model.block_size", "model.n_layer", "model.n_head", "model.n_embd",
                        "model.layer_norm_eps", "train.seq_len"})
    if (now.at(k) != def.at(k))
      fail(
          fmt::format("{} = {}: a Flamingo's shapes come from model.vision_from and model.lm_from (and its sequences "
                      "from its chunks); remove it",
                      k, now.at(k)));
  try {
    flamingo_config(r);
  } catch (const Error& e) {
    fail(e.what());
  }
}

void validate_custom(const Recipe&, const Fail&) {}  // the caller's model checks its own settings

// ---------------------------------------------------------------- task factories

std::unique_ptr<Task> make_custom_task(const Recipe& r) {
  throw ConfigError(
      fmt::format("recipe {}: model.type = \"custom\" is a model defined outside the zoo: build its task "
                  "in your program and pass it to train::train (see examples/custom_cnn); `brigade` "
                  "trains the zoo's models ({})",
                  r.path, model_types()));
}

// Every model's weights come from a generator seeded by run.seed, its dropout stream from run.seed + 1.
template <class M>
M& seeded(M& m, const Recipe& r) {
  Generator init(r.run.seed);
  m.init_weights(init);
  if constexpr (requires { m.dropout_generator(); }) m.dropout_generator().manual_seed(r.run.seed + 1);
  return m;
}

std::unique_ptr<Task> make_lm_task(const Recipe& r) {
  std::unique_ptr<models::CausalLM> model = make_causal_lm(r.model);
  if (auto* gpt = dynamic_cast<models::GPT*>(model.get())) seeded(*gpt, r);
  if (auto* llama = dynamic_cast<models::LLaMA*>(model.get())) seeded(*llama, r);
  if (r.data.format == "jsonl") return sft_task(r, std::move(model));
  return causal_lm_task(r, std::move(model));
}

// An image classifier over the model m, seeded: its module, forward and flops per image.
template <class M>
ImageClassifier image_classifier(const std::shared_ptr<M>& m, const Recipe& r, double flops_per_image) {
  seeded(*m, r);
  ImageClassifier c;
  c.module = m;
  c.forward = [p = m.get()](const Tensor& x) { return p->forward(x); };
  c.flops_per_image = flops_per_image;
  return c;
}

std::unique_ptr<Task> make_bert_task(const Recipe& r) {
  auto model = std::make_unique<models::BERT>(bert_config(r.model));
  seeded(*model, r);
  return masked_lm_task(r, std::move(model));
}

std::unique_ptr<Task> make_vit_task(const Recipe& r) {
  auto vit = std::make_shared<models::ViT>(vit_config(r.model));
  ImageClassifier c = image_classifier(vit, r, vit->flops_per_image());
  c.dropout = &vit->dropout_generator();
  c.description = fmt::format("ViT {} layers, {} dims, {} heads, patch {}", r.model.n_layer, r.model.n_embd,
                              r.model.n_head, r.model.patch_size);
  // Its forward in pieces for model parallelism; head and score as the task's loss() and score().
  Stages st;
  models::ViT* m = vit.get();
  st.num_blocks = vit->config().num_hidden_layers;
  st.embed = [m](const Batch& b) { return m->embed(b.at("images")); };  // (Bm, S, D)
  st.blocks = [m](const Tensor& x, int64_t lo, int64_t hi, const Batch&) { return m->run_blocks(x, lo, hi); };
  st.head = [m](const Tensor& x, const Batch& b, Metrics&) { return fn::cross_entropy(m->head(x), b.at("labels")); };
  st.score = [m](const Tensor& x, const Batch& b, Metrics& metrics) { add_image_scores(m->head(x), b, metrics); };
  const int64_t S = 1 + vit->config().num_patches(), D = vit->config().hidden_size;
  st.hidden = [S, D](int64_t rows) { return Shape{rows, S, D}; };
  st.tp_plan = models::ViT::tp_plan();
  st.score_in_fp32 = true;  // as the image task's score()
  c.stages = std::move(st);
  return image_classification_task(r, std::move(c));
}

std::unique_ptr<Task> make_resnet_task(const Recipe& r) {
  auto resnet = std::make_shared<models::ResNet>(resnet_config(r.model));
  ImageClassifier c = image_classifier(resnet, r, resnet->flops_per_image(r.model.image_size));
  c.buffers = resnet->named_buffers();
  c.description = fmt::format("ResNet-{} layout, width {}, {} stem{}", r.model.type == "resnet50" ? 50 : 18,
                              r.model.width, r.model.stem == "imagenet" ? "ImageNet" : "small-input",
                              r.model.memory_format == "channels_last" ? ", channels-last" : "");
  return image_classification_task(r, std::move(c));
}

std::unique_ptr<Task> make_swin_task(const Recipe& r) {
  auto swin = std::make_shared<models::Swin>(swin_config(r.model));
  ImageClassifier c = image_classifier(swin, r, swin->flops_per_image());
  c.description = fmt::format("Swin, embed {}, depths {}, window {}, patch {}", r.model.n_embd,
                              r.model.depths.empty() ? "2,2" : r.model.depths, r.model.window_size, r.model.patch_size);
  return image_classification_task(r, std::move(c));
}

std::unique_ptr<Task> make_clip_task(const Recipe& r) {
  const data::CaptionTokenizer tok;
  auto clip = std::make_unique<models::CLIP>(clip_config(r.model, tok));
  seeded(*clip, r);
  return contrastive_task(r, std::move(clip));
}

std::unique_ptr<Task> make_align_task(const Recipe& r) {
  const data::CaptionTokenizer tok;
  auto align = std::make_unique<models::ALIGN>(align_config(r.model, tok));
  seeded(*align, r);
  return contrastive_task(r, std::move(align));
}

std::unique_ptr<Task> make_flamingo_task(const Recipe& r) {
  auto model = std::make_unique<models::Flamingo>(flamingo_config(r));
  seeded(*model, r);  // the resampler, gated blocks and new rows; the towers are replaced next
  load_flamingo_towers(r, *model);
  return flamingo_task(r, std::move(model));
}

// The optional model keys: each row lists those it reads; the others must keep their defaults.
const std::vector<std::string_view>& optional_keys() {
  // clang-format off
  static const std::vector<std::string_view> k{
      "model.n_kv_head",  "model.intermediate_size", "model.rope_theta",  "model.rope_scaling",
      "model.rope_scaling_factor", "model.rope_low_freq_factor", "model.rope_high_freq_factor",
      "model.rope_original_max_positions", "model.tie_embeddings", "model.image_size", "model.patch_size",
      "model.num_classes", "model.in_channels",      "model.width",       "model.stem",  "model.memory_format",
      "model.depths",
      "model.window_size", "model.mlp_ratio", "model.text_layers", "model.text_heads", "model.text_width",
      "model.projection_dim",
      "model.stages", "model.width_coefficient", "model.depth_coefficient", "model.depthwise_padding",
      "model.vision_from", "model.lm_from", "model.resampler_depth", "model.resampler_heads",
      "model.resampler_latents", "model.cross_attn_every_n_layers", "data.mlm_probability", "data.augment"};
  // clang-format on
  return k;
}

}  // namespace

// ---------------------------------------------------------------- the rows

const std::vector<ModelEntry>& model_registry() {
  static const std::vector<std::string_view> kImage{"model.image_size", "model.num_classes", "model.in_channels",
                                                    "data.augment"};
  auto with = [](std::vector<std::string_view> a, std::initializer_list<std::string_view> b) {
    a.insert(a.end(), b);
    return a;
  };
  static const std::vector<ModelEntry> rows{
      {"gpt",
       "GPT-2 causal language model",
       DataKind::Text,
       {},
       {.tensor_parallel = true,
        .pipeline_parallel = true,
        .recompute_budget = true,
        .memory_formula = true,
        .dropout = true,
        .sample = true},
       validate_gpt,
       make_lm_task},
      {"llama",
       "LLaMA causal language model (RMSNorm, RoPE, SwiGLU, grouped-query attention)",
       DataKind::Text,
       {"model.n_kv_head", "model.intermediate_size", "model.rope_theta", "model.rope_scaling",
        "model.rope_scaling_factor", "model.rope_low_freq_factor", "model.rope_high_freq_factor",
        "model.rope_original_max_positions", "model.tie_embeddings"},
       {.tensor_parallel = true, .pipeline_parallel = true, .sample = true},
       validate_llama,
       make_lm_task},
      {"bert",
       "BERT masked language model",
       DataKind::Text,
       {"model.intermediate_size", "data.mlm_probability"},
       {.tensor_parallel = true, .pipeline_parallel = true, .dropout = true},
       validate_bert,
       make_bert_task},
      {"vit",
       "ViT image classifier",
       DataKind::FashionMnist,
       with(kImage, {"model.patch_size", "model.intermediate_size"}),
       {.tensor_parallel = true, .pipeline_parallel = true, .dropout = true, .synthetic_images = true},
       validate_vit,
       make_vit_task},
      {"resnet18",
       "ResNet-18 image classifier",
       DataKind::FashionMnist,
       with(kImage, {"model.width", "model.stem", "model.memory_format"}),
       {.batch_norm = true, .synthetic_images = true},
       validate_resnet,
       make_resnet_task},
      {"resnet50",
       "ResNet-50 image classifier",
       DataKind::FashionMnist,
       with(kImage, {"model.width", "model.stem", "model.memory_format"}),
       {.batch_norm = true, .synthetic_images = true},
       validate_resnet,
       make_resnet_task},
      {"swin",
       "Swin Transformer image classifier",
       DataKind::FashionMnist,
       with(kImage, {"model.patch_size", "model.depths", "model.window_size", "model.mlp_ratio"}),
       {.synthetic_images = true},
       validate_swin,
       make_swin_task},
      {"custom",
       "a model defined outside the zoo, trained through the library (train::train with its own task)",
       DataKind::Any,
       {"model.image_size", "model.num_classes", "model.in_channels", "model.width", "model.intermediate_size",
        "data.augment"},
       {.dropout = true, .batch_norm = true},
       validate_custom,
       make_custom_task},
      {"clip",
       "CLIP contrastive image-text model",
       DataKind::FashionMnist,
       with(kImage, {"model.patch_size", "model.intermediate_size", "model.text_layers", "model.text_heads",
                     "model.text_width", "model.projection_dim"}),
       {},
       validate_clip,
       make_clip_task},
      {"align",
       "ALIGN contrastive image-text model (EfficientNet image tower, BERT text tower)",
       DataKind::FashionMnist,
       with(kImage, {"model.intermediate_size", "model.projection_dim", "model.stages", "model.width_coefficient",
                     "model.depth_coefficient", "model.depthwise_padding"}),
       {.batch_norm = true},
       validate_align,
       make_align_task},
      {"flamingo",
       "Flamingo visual language model (frozen CLIP vision tower and GPT, Perceiver resampler, gated "
       "cross-attention)",
       DataKind::FashionMnist,
       with(kImage, {"model.vision_from", "model.lm_from", "model.resampler_depth", "model.resampler_heads",
                     "model.resampler_latents", "model.cross_attn_every_n_layers"}),
       {},
       validate_flamingo,
       make_flamingo_task},
  };
  return rows;
}

std::string model_types() {
  std::string s;
  for (const ModelEntry& e : model_registry()) s += fmt::format("{}{}", s.empty() ? "" : ", ", e.type);
  return s;
}

std::string model_types_with(bool Capabilities::*cap) {
  std::string s;
  for (const ModelEntry& e : model_registry())
    if (e.caps.*cap) s += fmt::format("{}{}", s.empty() ? "" : ", ", e.type);
  return s.empty() ? "none yet" : s;
}

const ModelEntry& model_entry(const std::string& type) {
  std::vector<std::string> names;
  for (const ModelEntry& e : model_registry()) {
    if (e.type == type) return e;
    names.emplace_back(e.type);
  }
  throw ConfigError(fmt::format("model.type = \"{}\" is not a known model; use one of {}{}", type, model_types(),
                                did_you_mean(type, names)));
}

void check_supported(const Recipe& r, const Fail& fail) {
  const ModelEntry& e = model_entry(r.model.type);
  const std::string& t = r.model.type;
  if (r.parallel.tp > 1 && !e.caps.tensor_parallel)
    fail(
        fmt::format("parallel.tp = {}: model.type = \"{}\" has no tensor-parallel plan; tensor parallelism is built "
                    "for {}; use parallel.dp (and ZeRO) for \"{}\"",
                    r.parallel.tp, t, model_types_with(&Capabilities::tensor_parallel), t));
  if (r.parallel.pp > 1 && !e.caps.pipeline_parallel)
    fail(
        fmt::format("parallel.pp = {}: model.type = \"{}\" is not cut into pipeline stages; pipeline parallelism is "
                    "built for {}; use parallel.dp (and ZeRO) for \"{}\"",
                    r.parallel.pp, t, model_types_with(&Capabilities::pipeline_parallel), t));
  if (r.memory.recompute == "budget" && !e.caps.recompute_budget)
    fail(
        fmt::format("memory.recompute = \"budget\" needs an activation estimate, which exists for {}; use \"full\", "
                    "\"selective\" or \"every_k\" for model.type = \"{}\"",
                    model_types_with(&Capabilities::recompute_budget), t));
  if (r.model.dropout != 0 && !e.caps.dropout)
    fail(fmt::format("model.dropout = {}: the {} model has no dropout; set model.dropout = 0 (models with dropout: {})",
                     r.model.dropout, t, model_types_with(&Capabilities::dropout)));
  if (r.parallel.sync_batchnorm && !e.caps.batch_norm)
    fail(
        fmt::format("parallel.sync_batchnorm = true: model.type = \"{}\" has no BatchNorm (models with BatchNorm: "
                    "{}); remove it",
                    t, model_types_with(&Capabilities::batch_norm)));
}

void validate_model(const Recipe& r, const Fail& fail) {
  const ModelEntry* e = nullptr;
  try {
    e = &model_entry(r.model.type);
  } catch (const ConfigError& err) {
    fail(err.what());
    return;
  }
  // data of the right kind
  const bool synthetic = r.data.corpus == "synthetic";
  if (synthetic && !e->caps.synthetic_images)
    fail(
        fmt::format("data.corpus = \"synthetic\" (random images for `brigade bench`) is for the image classifiers "
                    "({}), not model.type = \"{}\"; set data.corpus = \"fashion-mnist\"",
                    model_types_with(&Capabilities::synthetic_images), r.model.type));
  const bool images = r.data.corpus == "fashion-mnist";
  if (e->data == DataKind::FashionMnist && !images && !synthetic)
    fail(
        fmt::format("model.type = \"{}\" is an image model but data.corpus = \"{}\" is text; set data.corpus = "
                    "\"fashion-mnist\" (and data.dir to its folder, e.g. \"/usr/share/datasets/fashion-mnist\")",
                    r.model.type, r.data.corpus));
  if (e->data == DataKind::Text && images)
    fail(
        fmt::format("data.corpus = \"fashion-mnist\" is image data, but model.type = \"{}\" trains on text; use an "
                    "image model ({})",
                    r.model.type, [] {
                      std::string s;
                      for (const ModelEntry& m : model_registry())
                        if (m.data == DataKind::FashionMnist) s += fmt::format("{}{}", s.empty() ? "" : ", ", m.type);
                      return s;
                    }()));
  // keys this model does not read keep their defaults
  const Recipe defaults;
  const std::map<std::string, std::string> now = recipe_values(r), def = recipe_values(defaults);
  for (std::string_view key : optional_keys()) {
    if (std::find(e->keys.begin(), e->keys.end(), key) != e->keys.end()) continue;
    const std::string k(key);
    if (now.at(k) == def.at(k)) continue;
    std::string users;
    for (const ModelEntry& m : model_registry())
      if (std::find(m.keys.begin(), m.keys.end(), key) != m.keys.end())
        users += fmt::format("{}\"{}\"", users.empty() ? "" : ", ", m.type);
    fail(fmt::format("{} = {} applies to model.type = {}, not \"{}\"; remove it", k, now.at(k), users, r.model.type));
  }
  check_supported(r, fail);
  e->validate(r, fail);
}

std::unique_ptr<Task> make_task(const Recipe& r, bool init_weights) {
  std::unique_ptr<Task> task = model_entry(r.model.type).make_task(r);
  task->finetune_line = apply_finetune(r, *task, init_weights);
  return task;
}

}  // namespace brigade::train
