// nn's layers, one header per family: include this for all of them, or the family header.
// Layers allocate zeroed parameters; the model owns initialisation.
#pragma once
#include "brigade/nn/attention.h"  // CausalSelfAttention (GPT-2), EncoderSelfAttention
#include "brigade/nn/block.h"      // Block, Recompute, find_blocks, MLP, TransformerBlock
#include "brigade/nn/conv.h"       // Conv2d, pooling
#include "brigade/nn/dropout.h"    // Dropout
#include "brigade/nn/embedding.h"  // Embedding, EmbeddingShard
#include "brigade/nn/linear.h"     // Linear, LinearShard
#include "brigade/nn/norm.h"       // LayerNorm, BatchNorm2d
