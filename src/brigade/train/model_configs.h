// The [model] section of a recipe as each model's own config (the registry's rows build their
// models from these; memory planning and model parallelism read them too).
#pragma once
#include "brigade/data/image/captions.h"
#include "brigade/models/align/align.h"
#include "brigade/models/bert/bert.h"
#include "brigade/models/clip/clip.h"
#include "brigade/models/flamingo/flamingo.h"
#include "brigade/models/gpt/gpt.h"
#include "brigade/models/llama/llama.h"
#include "brigade/models/resnet/resnet.h"
#include "brigade/models/swin/swin.h"
#include "brigade/models/vit/vit.h"
#include "brigade/train/config.h"

namespace brigade::train {

models::GPTConfig gpt_config(const ModelConfig& m);
// intermediate_size 0 = 8 n_embd / 3 rounded up to a multiple of 64; n_kv_head 0 = n_head.
models::LLaMAConfig llama_config(const ModelConfig& m);
// vocab = model.vocab_size + 1 (the extra id is [MASK]); intermediate_size 0 = 4 n_embd;
// max_position_embeddings = block_size; hidden_dropout = dropout.
models::BERTConfig bert_config(const ModelConfig& m);
models::ViTConfig vit_config(const ModelConfig& m);        // intermediate_size 0 = 4 n_embd
models::SwinConfig swin_config(const ModelConfig& m);      // heads n_head << stage
models::ResNetConfig resnet_config(const ModelConfig& m);  // resnet18 / resnet50 layout, small-input stem
// The image tower from model.image_size, patch_size, in_channels, n_layer, n_head, n_embd,
// intermediate_size (0 = 4 n_embd); the text tower from text_layers / text_heads / text_width (0 =
// the image tower's), MLP 4 x text_width, vocabulary and context from the caption tokenizer;
// projection_dim (0 = n_embd); quick_gelu.
models::CLIPConfig clip_config(const ModelConfig& m, const data::CaptionTokenizer& tok);
// The text tower (BERT) from n_layer, n_head, n_embd, intermediate_size (0 = 4 n_embd),
// layer_norm_eps, vocabulary and context from the caption tokenizer; the image tower from
// model.stages (EfficientNet block strings; "" = kAlignDefaultStages), width_coefficient,
// depth_coefficient, depthwise_padding, in_channels, image_size, HF's other defaults (depth_divisor
// 8, squeeze_expansion_ratio 0.25, batch_norm_eps 1e-3, momentum 0.99) and drop_connect_rate 0;
// projection_dim (0 = the image tower's pooled width). ConfigError naming the key otherwise.
models::AlignConfig align_config(const ModelConfig& m, const data::CaptionTokenizer& tok);
// The vision tower from model.vision_from's recipe (a clip checkpoint), the LM from model.lm_from's (a
// gpt checkpoint; dropout 0), the resampler from resampler_depth, resampler_heads (head width =
// vision width / heads), resampler_latents, MLP 4x; gated blocks every cross_attn_every_n_layers,
// the LM's heads and head width, MLP 4x; init_std. ConfigError naming the key otherwise.
models::FlamingoConfig flamingo_config(const Recipe& r);
// The 28x28 image tower of recipes/align-fashion.toml (docs/models.md explains the choice).
extern const char* const kAlignDefaultStages;

}  // namespace brigade::train
