// ALIGN: the EfficientNet image tower, the BERT text tower, HF's loss, init and FLOPs (see
// align.h). Differentiable fn:: calls only.
#include "brigade/models/align/align.h"

#include <algorithm>
#include <cmath>

#include "brigade/autograd/engine.h"
#include "brigade/autograd/functions.h"
#include "brigade/core/error.h"

#include <nlohmann/json.hpp>

namespace brigade::models {

namespace F = brigade::fn;

// ---------------------------------------------------------------- geometry

int64_t AlignVisionConfig::round_filters(int64_t channels) const {
  const double divisor = double(depth_divisor);
  const double c = double(channels) * width_coefficient;
  int64_t dim = std::max(depth_divisor, int64_t(c + divisor / 2) / depth_divisor * depth_divisor);
  if (double(dim) < 0.9 * c) dim += depth_divisor;  // never round down by more than 10%
  return dim;
}

int64_t AlignVisionConfig::round_repeats(int64_t repeats) const {
  return int64_t(std::ceil(depth_coefficient * double(repeats)));
}

std::vector<AlignBlockSpec> align_blocks(const AlignVisionConfig& c) {
  std::vector<AlignBlockSpec> out;
  int64_t total = 0;
  for (int64_t r : c.num_block_repeats) total += c.round_repeats(r);
  int64_t index = 0;
  for (size_t i = 0; i < c.in_channels.size(); ++i) {
    const int64_t in0 = c.round_filters(c.in_channels[i]), out_dim = c.round_filters(c.out_channels[i]);
    const int64_t k = c.kernel_sizes[i];
    for (int64_t j = 0; j < c.round_repeats(c.num_block_repeats[i]); ++j, ++index) {
      AlignBlockSpec s;
      s.in = j == 0 ? in0 : out_dim;
      s.out = out_dim;
      s.expand = c.expand_ratios[i] != 1;
      s.expanded = s.in * c.expand_ratios[i];
      s.kernel = k;
      s.stride = j == 0 ? c.strides[i] : 1;
      s.se = std::max<int64_t>(1, int64_t(double(s.in) * c.squeeze_expansion_ratio));  // from the input width
      if (s.stride == 2) {  // ZeroPad2d(correct_pad(k, adjust)) then a "valid" conv
        const bool adjust =
            std::find(c.depthwise_padding.begin(), c.depthwise_padding.end(), index) == c.depthwise_padding.end();
        const int64_t lo = adjust ? k / 2 - 1 : k / 2, hi = k / 2;
        s.depthwise = {2, lo, hi, lo, hi, s.expanded};
      } else {  // torch's padding="same": k - 1 in all, the smaller half first
        const int64_t lo = (k - 1) / 2, hi = k - 1 - lo;
        s.depthwise = {1, lo, hi, lo, hi, s.expanded};
      }
      s.residual = s.stride == 1 && j > 0;
      s.drop_rate = c.drop_connect_rate * double(index) / double(total);
      out.push_back(s);
    }
  }
  return out;
}

namespace {
int64_t conv_side(int64_t side, int64_t k, int64_t stride, int64_t lo, int64_t hi) {
  return side + lo + hi < k ? 0 : (side + lo + hi - k) / stride + 1;  // 0: the kernel does not fit
}
int64_t stem_side(int64_t image_size) { return conv_side(image_size, 3, 2, 0, 1); }
}  // namespace

int64_t align_final_side(const AlignVisionConfig& c) {
  int64_t side = stem_side(c.image_size);
  for (const AlignBlockSpec& s : align_blocks(c))
    side = conv_side(side, s.kernel, s.stride, s.depthwise.pad_top, s.depthwise.pad_bottom);
  return side;
}

void AlignConfig::validate() const {
  text.validate();
  const AlignVisionConfig& v = vision;
  auto positive = [](double x, const char* name) {
    BRIGADE_CHECK(x > 0, ConfigError, "AlignConfig: vision.{} must be positive, got {}", name, x);
  };
  positive(double(v.num_channels), "num_channels");
  positive(double(v.image_size), "image_size");
  positive(v.width_coefficient, "width_coefficient");
  positive(v.depth_coefficient, "depth_coefficient");
  positive(double(v.depth_divisor), "depth_divisor");
  positive(v.squeeze_expansion_ratio, "squeeze_expansion_ratio");
  positive(v.batch_norm_eps, "batch_norm_eps");
  positive(v.initializer_range, "initializer_range");
  const size_t S = v.in_channels.size();
  BRIGADE_CHECK(S >= 1, ConfigError,
                "AlignConfig: vision.in_channels is empty: the image tower needs one stage at least");
  auto same_length = [&](const std::vector<int64_t>& list, const char* name) {
    BRIGADE_CHECK(list.size() == S, ConfigError,
                  "AlignConfig: vision.{} has {} entries but vision.in_channels has {}: one per stage", name,
                  list.size(), S);
  };
  same_length(v.out_channels, "out_channels");
  same_length(v.kernel_sizes, "kernel_sizes");
  same_length(v.strides, "strides");
  same_length(v.num_block_repeats, "num_block_repeats");
  same_length(v.expand_ratios, "expand_ratios");
  for (size_t i = 0; i < S; ++i) {
    BRIGADE_CHECK(v.in_channels[i] > 0 && v.out_channels[i] > 0 && v.num_block_repeats[i] > 0 && v.expand_ratios[i] > 0,
                  ConfigError,
                  "AlignConfig: stage {}: in_channels {}, out_channels {}, num_block_repeats {} and expand_ratios {} "
                  "must be positive",
                  i, v.in_channels[i], v.out_channels[i], v.num_block_repeats[i], v.expand_ratios[i]);
    BRIGADE_CHECK(v.strides[i] == 1 || v.strides[i] == 2, ConfigError,
                  "AlignConfig: vision.strides[{}] = {}: HF's depthwise convolutions take stride 1 (padding \"same\") "
                  "or 2 (explicit padding)",
                  i, v.strides[i]);
    BRIGADE_CHECK(v.kernel_sizes[i] >= (v.strides[i] == 2 ? 2 : 1), ConfigError,
                  "AlignConfig: vision.kernel_sizes[{}] = {} is too small for stride {}", i, v.kernel_sizes[i],
                  v.strides[i]);
  }
  BRIGADE_CHECK(v.round_filters(v.in_channels[0]) == v.stem_channels(), ConfigError,
                "AlignConfig: vision.in_channels[0] = {} rounds to {} channels, but the stem gives round_filters(32) "
                "= {}; set in_channels[0] = 32 as HF does",
                v.in_channels[0], v.round_filters(v.in_channels[0]), v.stem_channels());
  for (size_t i = 1; i < S; ++i)
    BRIGADE_CHECK(v.round_filters(v.in_channels[i]) == v.round_filters(v.out_channels[i - 1]), ConfigError,
                  "AlignConfig: vision.in_channels[{}] = {} must equal out_channels[{}] = {} (stage {} reads what "
                  "stage {} writes)",
                  i, v.in_channels[i], i - 1, v.out_channels[i - 1], i, i - 1);
  BRIGADE_CHECK(v.hidden_act == "swish" || v.hidden_act == "silu", ConfigError,
                "AlignConfig: vision.hidden_act \"{}\" is not supported (swish)", v.hidden_act);
  BRIGADE_CHECK(v.pooling_type == "mean", ConfigError,
                "AlignConfig: vision.pooling_type \"{}\" is not supported (mean)", v.pooling_type);
  BRIGADE_CHECK(v.batch_norm_momentum >= 0 && v.batch_norm_momentum <= 1, ConfigError,
                "AlignConfig: vision.batch_norm_momentum must be in [0, 1], got {}", v.batch_norm_momentum);
  BRIGADE_CHECK(v.drop_connect_rate >= 0 && v.drop_connect_rate < 1, ConfigError,
                "AlignConfig: vision.drop_connect_rate must be in [0, 1), got {}", v.drop_connect_rate);
  BRIGADE_CHECK(stem_side(v.image_size) >= 1, ConfigError,
                "AlignConfig: vision.image_size {} is too small for the stem", v.image_size);
  int64_t side = stem_side(v.image_size), index = 0;
  for (const AlignBlockSpec& s : align_blocks(v)) {
    side = conv_side(side, s.kernel, s.stride, s.depthwise.pad_top, s.depthwise.pad_bottom);
    BRIGADE_CHECK(side >= 1, ConfigError,
                  "AlignConfig: vision.image_size {} shrinks to nothing at block {} (stride {}, kernel {}); use "
                  "larger images or fewer stride-2 stages",
                  v.image_size, index, s.stride, s.kernel);
    ++index;
  }
  BRIGADE_CHECK(v.hidden_dim >= side, ConfigError,
                "AlignConfig: vision.hidden_dim {} is smaller than the final {}x{} feature map: HF's pooler "
                "(AvgPool2d(hidden_dim, ceil_mode=True)) would not be a global mean; set hidden_dim >= {}",
                v.hidden_dim, side, side, side);
  BRIGADE_CHECK(projection_dim == v.embed_dim(), ConfigError,
                "AlignConfig: projection_dim {} must equal the image tower's pooled width round_filters({}) = {} "
                "(ALIGN has no image projection)",
                projection_dim, v.out_channels.back(), v.embed_dim());
  BRIGADE_CHECK(std::isfinite(temperature_init_value) && temperature_init_value > 0, ConfigError,
                "AlignConfig: temperature_init_value must be positive, got {}", temperature_init_value);
}

std::string AlignConfig::to_json() const {
  const AlignVisionConfig& v = vision;
  const nlohmann::json j{{"model_type", "align"},
                         {"projection_dim", projection_dim},
                         {"temperature_init_value", temperature_init_value},
                         {"text_config",
                          {{"model_type", "align_text_model"},
                           {"vocab_size", text.vocab_size},
                           {"max_position_embeddings", text.max_position_embeddings},
                           {"type_vocab_size", text.type_vocab_size},
                           {"hidden_size", text.hidden_size},
                           {"num_hidden_layers", text.num_hidden_layers},
                           {"num_attention_heads", text.num_attention_heads},
                           {"intermediate_size", text.intermediate_size},
                           {"layer_norm_eps", text.layer_norm_eps},
                           {"hidden_act", "gelu"},
                           {"hidden_dropout_prob", text.hidden_dropout},
                           {"attention_probs_dropout_prob", 0.0},
                           {"initializer_range", text.initializer_range}}},
                         {"vision_config",
                          {{"model_type", "align_vision_model"},
                           {"num_channels", v.num_channels},
                           {"image_size", v.image_size},
                           {"width_coefficient", v.width_coefficient},
                           {"depth_coefficient", v.depth_coefficient},
                           {"depth_divisor", v.depth_divisor},
                           {"kernel_sizes", v.kernel_sizes},
                           {"in_channels", v.in_channels},
                           {"out_channels", v.out_channels},
                           {"depthwise_padding", v.depthwise_padding},
                           {"strides", v.strides},
                           {"num_block_repeats", v.num_block_repeats},
                           {"expand_ratios", v.expand_ratios},
                           {"squeeze_expansion_ratio", v.squeeze_expansion_ratio},
                           {"hidden_act", v.hidden_act},
                           {"hidden_dim", v.hidden_dim},
                           {"pooling_type", v.pooling_type},
                           {"initializer_range", v.initializer_range},
                           {"batch_norm_eps", v.batch_norm_eps},
                           {"batch_norm_momentum", v.batch_norm_momentum},
                           {"drop_connect_rate", v.drop_connect_rate}}}};
  return j.dump();
}

AlignConfig AlignConfig::from_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(fmt::format("AlignConfig: the config is not JSON: {}", e.what()));
  }
  AlignConfig c;
  auto get = [](const nlohmann::json& o, const char* key, auto& field, const char* where) {
    if (!o.contains(key)) return;
    try {
      o.at(key).get_to(field);
    } catch (const nlohmann::json::exception&) {
      throw ConfigError(fmt::format("AlignConfig: {}{} = {} has the wrong type", where, key, o.at(key).dump()));
    }
  };
  BRIGADE_CHECK(j.is_object() && j.contains("text_config") && j.contains("vision_config"), ConfigError,
                "AlignConfig: the config needs \"text_config\" and \"vision_config\" objects (HF's AlignConfig)");
  get(j, "projection_dim", c.projection_dim, "");
  get(j, "temperature_init_value", c.temperature_init_value, "");
  const nlohmann::json& t = j.at("text_config");
  for (auto [key, field] : std::initializer_list<std::pair<const char*, int64_t*>>{
           {"vocab_size", &c.text.vocab_size},
           {"max_position_embeddings", &c.text.max_position_embeddings},
           {"type_vocab_size", &c.text.type_vocab_size},
           {"hidden_size", &c.text.hidden_size},
           {"num_hidden_layers", &c.text.num_hidden_layers},
           {"num_attention_heads", &c.text.num_attention_heads},
           {"intermediate_size", &c.text.intermediate_size}})
    get(t, key, *field, "text_config.");
  get(t, "layer_norm_eps", c.text.layer_norm_eps, "text_config.");
  get(t, "initializer_range", c.text.initializer_range, "text_config.");
  c.text.hidden_dropout = 0.0;
  for (const char* key : {"hidden_dropout_prob", "attention_probs_dropout_prob"}) {
    double p = 0.0;
    get(t, key, p, "text_config.");
    BRIGADE_CHECK(p == 0.0, ConfigError,
                  "AlignConfig: text_config.{} = {}: the text tower runs without dropout here; set it to 0", key, p);
  }
  std::string act = "gelu";
  get(t, "hidden_act", act, "text_config.");
  BRIGADE_CHECK(act == "gelu", ConfigError, "AlignConfig: text_config.hidden_act \"{}\" is not supported (gelu)", act);
  const nlohmann::json& v = j.at("vision_config");
  AlignVisionConfig& w = c.vision;
  for (auto [key, field] : std::initializer_list<std::pair<const char*, int64_t*>>{{"num_channels", &w.num_channels},
                                                                                   {"image_size", &w.image_size},
                                                                                   {"depth_divisor", &w.depth_divisor},
                                                                                   {"hidden_dim", &w.hidden_dim}})
    get(v, key, *field, "vision_config.");
  for (auto [key, field] :
       std::initializer_list<std::pair<const char*, double*>>{{"width_coefficient", &w.width_coefficient},
                                                              {"depth_coefficient", &w.depth_coefficient},
                                                              {"squeeze_expansion_ratio", &w.squeeze_expansion_ratio},
                                                              {"initializer_range", &w.initializer_range},
                                                              {"batch_norm_eps", &w.batch_norm_eps},
                                                              {"batch_norm_momentum", &w.batch_norm_momentum},
                                                              {"drop_connect_rate", &w.drop_connect_rate}})
    get(v, key, *field, "vision_config.");
  for (auto [key, field] :
       std::initializer_list<std::pair<const char*, std::vector<int64_t>*>>{{"kernel_sizes", &w.kernel_sizes},
                                                                            {"in_channels", &w.in_channels},
                                                                            {"out_channels", &w.out_channels},
                                                                            {"depthwise_padding", &w.depthwise_padding},
                                                                            {"strides", &w.strides},
                                                                            {"num_block_repeats", &w.num_block_repeats},
                                                                            {"expand_ratios", &w.expand_ratios}})
    get(v, key, *field, "vision_config.");
  get(v, "hidden_act", w.hidden_act, "vision_config.");
  get(v, "pooling_type", w.pooling_type, "vision_config.");
  c.validate();
  return c;
}

// ---------------------------------------------------------------- image tower

AlignVisionEmbeddings::AlignVisionEmbeddings(const AlignVisionConfig& c) {
  const int64_t C0 = c.stem_channels();
  // nn.ZeroPad2d((0, 1, 0, 1)) then a 3x3 stride-2 "valid" conv
  convolution = register_module(
      "convolution", std::make_shared<nn::Conv2d>(c.num_channels, C0, 3, ops::Conv2dParams{2, 0, 1, 0, 1, 1}, false));
  batchnorm =
      register_module("batchnorm", std::make_shared<nn::BatchNorm2d>(C0, c.batch_norm_eps, c.batch_norm_momentum));
}

Tensor AlignVisionEmbeddings::forward(const Tensor& images) const {
  BRIGADE_CHECK(images.dim() == 4 && images.size(1) == convolution->in_channels, ShapeError,
                "ALIGN.encode_image: images must be (N, C={}, H, W), got {}", convolution->in_channels,
                shape_str(images.shape()));
  return F::silu(batchnorm->forward(convolution->forward(images)));  // (N, C0, H', W')
}

AlignVisionBlock::AlignVisionBlock(const AlignBlockSpec& s, const AlignVisionConfig& c, Generator* gen)
    : spec(s), gen_(gen) {
  const double eps = c.batch_norm_eps, m = c.batch_norm_momentum;
  if (s.expand) {
    expansion = register_module("expansion", std::make_shared<nn::Submodules>());
    expand_conv = expansion->add("expand_conv", std::make_shared<nn::Conv2d>(s.in, s.expanded, 1, 1, 0, false));
    expand_bn = expansion->add("expand_bn", std::make_shared<nn::BatchNorm2d>(s.expanded, eps));  // torch's 0.1
  }
  depthwise_conv = register_module("depthwise_conv", std::make_shared<nn::Submodules>());
  depthwise = depthwise_conv->add("depthwise_conv",
                                  std::make_shared<nn::Conv2d>(s.expanded, s.expanded, s.kernel, s.depthwise, false));
  depthwise_norm = depthwise_conv->add("depthwise_norm", std::make_shared<nn::BatchNorm2d>(s.expanded, eps, m));
  squeeze_excite = register_module("squeeze_excite", std::make_shared<nn::Submodules>());
  reduce = squeeze_excite->add("reduce", std::make_shared<nn::Conv2d>(s.expanded, s.se, 1, 1, 0, true));
  expand_se = squeeze_excite->add("expand", std::make_shared<nn::Conv2d>(s.se, s.expanded, 1, 1, 0, true));
  projection = register_module("projection", std::make_shared<nn::Submodules>());
  project_conv = projection->add("project_conv", std::make_shared<nn::Conv2d>(s.expanded, s.out, 1, 1, 0, false));
  project_bn = projection->add("project_bn", std::make_shared<nn::BatchNorm2d>(s.out, eps, m));
  if (s.residual && s.drop_rate > 0) dropout = std::make_shared<nn::Dropout>(s.drop_rate, gen);
}

namespace {
// A 1x1 convolution with bias on a (N, C, 1, 1) map as a linear layer on (N, C): the same sums,
// one small GEMM instead of a convolution primitive. -> (N, O, 1, 1).
Tensor pointwise_on_pooled(const nn::Conv2d& conv, const Tensor& s) {
  const int64_t N = s.size(0), C = s.size(1), O = conv.out_channels;
  const Tensor y = F::linear(F::reshape(s, {N, C}), F::reshape(conv.weight, {O, C}), conv.bias,
                             ops::WeightLayout::OutIn);  // (N, O)
  return F::reshape(y, {N, O, 1, 1});
}
}  // namespace

Tensor AlignVisionBlock::body(const Tensor& x) const {
  Tensor h = x;                                                               // (N, in, H, W)
  if (spec.expand) h = F::silu(expand_bn->forward(expand_conv->forward(h)));  // (N, Ce, H, W)
  h = F::silu(depthwise_norm->forward(depthwise->forward(h)));                // (N, Ce, H', W')
  // squeeze-and-excitation: a per-channel gate from the spatial mean
  Tensor s = F::silu(pointwise_on_pooled(*reduce, F::spatial_mean(h, /*keepdim=*/true)));  // (N, se, 1, 1)
  s = F::sigmoid(pointwise_on_pooled(*expand_se, s));                                      // (N, Ce, 1, 1)
  h = F::mul(h, s);                                                                        // (N, Ce, H', W')
  h = project_bn->forward(project_conv->forward(h));                                       // (N, out, H', W')
  if (!spec.residual) return h;
  return F::add(dropout ? dropout->forward(h) : h, x);
}

Tensor AlignVisionBlock::forward(const Tensor& x) const {
  return run(
      {x}, [this](const std::vector<Tensor>& in) { return body(in[0]); }, gen_);
}

AlignVisionModel::AlignVisionModel(const AlignVisionConfig& c, Generator* gen) {
  embeddings = register_module("embeddings", std::make_shared<AlignVisionEmbeddings>(c));
  encoder = register_module("encoder", std::make_shared<nn::Submodules>());
  blocks = encoder->add("blocks", std::make_shared<nn::ModuleList<AlignVisionBlock>>());
  for (const AlignBlockSpec& s : align_blocks(c)) blocks->push_back(std::make_shared<AlignVisionBlock>(s, c, gen));
}

Tensor AlignVisionModel::forward(const Tensor& images) const {
  Tensor x = embeddings->forward(images);
  for (const auto& b : *blocks) x = b->forward(x);
  return F::spatial_mean(x);  // (N, C): HF's AvgPool2d(hidden_dim, ceil_mode=True) over the whole map
}

// ---------------------------------------------------------------- ALIGN

ALIGN::ALIGN(const AlignConfig& c) : cfg_(c) {
  cfg_.validate();
  text_model = register_module("text_model", std::make_shared<BERTModel>(cfg_.text, &gen_));
  vision_model = register_module("vision_model", std::make_shared<AlignVisionModel>(cfg_.vision, &gen_));
  text_projection = register_module("text_projection",
                                    std::make_shared<nn::Linear>(cfg_.text.hidden_size, cfg_.projection_dim, true));
  temperature = register_parameter("temperature", {});
  temperature.fill_(cfg_.temperature_init_value);
  name_parameters();
}

void ALIGN::parameter_replaced(const std::string& name, const Tensor& t) {
  if (name == "temperature") temperature = t;
}

void ALIGN::init_weights(Generator& g) {
  auto ends_with = [](const std::string& s, const char* suffix) {
    const std::string x(suffix);
    return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  for (auto& [name, p] : named_parameters()) {
    const bool norm = name.find("LayerNorm") != std::string::npos || ends_with(name, "batchnorm.weight") ||
                      ends_with(name, "_bn.weight") || ends_with(name, "_norm.weight");
    if (name == "temperature") {
      p.fill_(cfg_.temperature_init_value);
    } else if (ends_with(name, ".bias")) {
      p.zero_();
    } else if (norm) {
      p.fill_(1.0);
    } else if (name == "text_projection.weight") {  // xavier_uniform_
      const double a = std::sqrt(6.0 / double(cfg_.text.hidden_size + cfg_.projection_dim));
      g.uniform_(p, -a, a);
    } else {
      const bool text = name.rfind("text_", 0) == 0;
      g.normal_(p, 0.0, text ? cfg_.text.initializer_range : cfg_.vision.initializer_range);
    }
  }
  for (auto& [name, b] : named_buffers()) {
    if (ends_with(name, "running_var"))
      b.fill_(1.0);
    else
      b.zero_();
  }
}

Tensor ALIGN::encode_image(const Tensor& images) const {
  return F::l2_normalize(vision_model->forward(images));  // (N, E)
}

Tensor ALIGN::encode_text(const Tensor& ids, const Tensor& lengths) const {
  BRIGADE_CHECK(ids.dim() == 2 && ids.size(0) > 0 && ids.size(1) > 0 && !is_floating(ids.dtype()), ShapeError,
                "ALIGN.encode_text: ids must be integer (M, T), got {} {}", shape_str(ids.shape()),
                dtype_name(ids.dtype()));
  const int64_t M = ids.size(0), T = ids.size(1), D = cfg_.text.hidden_size;
  BRIGADE_CHECK(lengths.defined() && lengths.dim() == 1 && lengths.size(0) == M && !is_floating(lengths.dtype()),
                ShapeError, "ALIGN.encode_text: lengths must be integer (M={}), got {}", M,
                lengths.defined() ? shape_str(lengths.shape()) : std::string("undefined"));
  const std::vector<int64_t> len = lengths.to_vector_i64();
  std::vector<float> mask(size_t(M * T), 0.f);  // HF's attention_mask: 1 on the real tokens
  bool padded = false;
  for (int64_t b = 0; b < M; ++b) {
    const int64_t L = len[size_t(b)];
    BRIGADE_CHECK(L >= 1 && L <= T, ValueError, "ALIGN.encode_text: lengths[{}] = {} is outside [1, {}]", b, L, T);
    std::fill(mask.begin() + b * T, mask.begin() + b * T + L, 1.f);
    padded = padded || L < T;
  }
  const Tensor attention_mask = padded ? Tensor::from_vector(mask, {M, T}) : Tensor();  // (M, T) or none
  Tensor x = text_model->embeddings->forward(ids, Tensor());                            // (M, T, D)
  for (const auto& l : *text_model->layer) x = l->forward(x, attention_mask);           // (M, T, D)
  const Tensor first = F::reshape(F::narrow(x, 1, 0, 1), {M, D});                       // (M, D): position 0
  return F::l2_normalize(text_projection->forward(first));                              // (M, E)
}

Tensor ALIGN::logits_from_embeds(const Tensor& img, const Tensor& txt) const {
  return logits_with_scale(img, txt, temperature);
}

Tensor ALIGN::logits_with_scale(const Tensor& img, const Tensor& txt, const Tensor& t) const {
  BRIGADE_CHECK(img.dim() == 2 && txt.dim() == 2 && img.size(1) == txt.size(1), ShapeError,
                "ALIGN.logits: embeddings must be (N, E) and (M, E), got {} and {}", shape_str(img.shape()),
                shape_str(txt.shape()));
  const Tensor inv = F::reshape(F::reciprocal(t), {1, 1});  // (1, 1): 1 / temperature
  return F::mul(inv, F::matmul(img, txt, false, true));     // (N, M)
}

Tensor ALIGN::contrastive_loss_from_logits(const Tensor& logits_per_image) const {
  BRIGADE_CHECK(logits_per_image.dim() == 2 && logits_per_image.size(0) == logits_per_image.size(1) &&
                    logits_per_image.size(0) > 0,
                ShapeError, "ALIGN.contrastive_loss: needs N matching pairs, (N, N) logits, got {}",
                shape_str(logits_per_image.shape()));
  const int64_t N = logits_per_image.size(0);
  const Tensor labels = Tensor::arange(N, DType::I64);                                             // (N)
  const Tensor lt = F::cross_entropy_smoothed(F::transpose(logits_per_image, 0, 1), labels, 0.1);  // text -> image
  const Tensor li = F::cross_entropy_smoothed(logits_per_image, labels, 0.1);                      // image -> text
  // the mean of the pair as a reduction (f32 under every policy), as CLIP's loss
  return F::mean_all(F::prepend_token(lt, F::reshape(li, {1, 1, 1})));  // 0-d
}

double ALIGN::flops_per_pair() const {
  const AlignVisionConfig& v = cfg_.vision;
  double macs = 0;
  int64_t side = stem_side(v.image_size);
  macs += double(side * side) * double(v.num_channels * v.stem_channels() * 9);
  for (const AlignBlockSpec& s : align_blocks(v)) {
    const double in_area = double(side * side);
    side = conv_side(side, s.kernel, s.stride, s.depthwise.pad_top, s.depthwise.pad_bottom);
    const double area = double(side * side);
    if (s.expand) macs += in_area * double(s.in * s.expanded);
    macs += area * double(s.expanded * s.kernel * s.kernel);  // depthwise
    macs += 2.0 * double(s.expanded * s.se);                  // squeeze-and-excitation
    macs += area * double(s.expanded * s.out);                // projection
  }
  const BERTConfig& t = cfg_.text;
  const double T = double(t.max_position_embeddings), D = double(t.hidden_size), Mt = double(t.intermediate_size);
  const double L = double(t.num_hidden_layers);
  macs += T * L * (4 * D * D + 2 * D * Mt) + L * 2 * T * T * D + D * double(cfg_.projection_dim);
  return 3.0 * 2.0 * macs;
}

std::string ALIGN::describe() const {
  const AlignVisionConfig& v = cfg_.vision;
  const int64_t side = align_final_side(v);
  return fmt::format(
      "ALIGN, EfficientNet image tower {} MBConv blocks in {} stages ({} -> {} channels, final map "
      "{}x{}); BERT text tower {} layers x {}",
      align_blocks(v).size(), v.in_channels.size(), v.stem_channels(), v.embed_dim(), side, side,
      cfg_.text.num_hidden_layers, cfg_.text.hidden_size);
}

}  // namespace brigade::models
