// The model configs the reference scripts write into a fixture's "config" metadata
// (tests/reference/make_fixtures.py, make_llama_fixture.py, make_lora_fixtures.py), read
// back, for the model tests that build the fixture's model.
#pragma once
#include <nlohmann/json.hpp>

#include "brigade/models/gpt/gpt.h"
#include "brigade/models/llama/llama.h"

namespace brigade::test_support {

inline models::GPTConfig gpt_config_from_json(const nlohmann::json& j) {
  models::GPTConfig c;
  c.vocab_size = j.at("vocab_size");
  c.block_size = j.at("block_size");
  c.n_layer = j.at("n_layer");
  c.n_head = j.at("n_head");
  c.n_embd = j.at("n_embd");
  c.layer_norm_eps = j.at("layer_norm_eps");
  return c;
}

inline models::LLaMAConfig llama_config_from_json(const nlohmann::json& j) {
  models::LLaMAConfig c;
  c.vocab_size = j.at("vocab_size");
  c.hidden_size = j.at("hidden_size");
  c.intermediate_size = j.at("intermediate_size");
  c.n_layer = j.at("n_layer");
  c.n_head = j.at("n_head");
  c.n_kv_head = j.at("n_kv_head");
  c.max_position = j.at("max_position");
  c.rms_norm_eps = j.at("rms_norm_eps");
  c.rope_theta = j.at("rope_theta");
  return c;
}

}  // namespace brigade::test_support
