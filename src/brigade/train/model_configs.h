// The [model] section of a recipe as each model's own config (the registry's rows build their
// models from these; memory planning and model parallelism read them too).
#pragma once
#include "brigade/data/ext_captions.h"
#include "brigade/models/bert/bert.h"
#include "brigade/models/clip/clip.h"
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

}  // namespace brigade::train
