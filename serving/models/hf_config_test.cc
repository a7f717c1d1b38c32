// config.json parsing (NOTE [config fields that change the math]): every field read, every
// unsupported value refused naming its field.

#include "serving/models/hf_config.h"

#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "nlohmann/json.hpp"

namespace dtensor::serving {
namespace {

using json = nlohmann::json;

json llama() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 64, "rms_norm_eps": 1e-05, "hidden_act": "silu",
    "max_position_embeddings": 131072, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "attention_bias": false, "mlp_bias": false, "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009], "rope_theta": 500000.0,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"}})");
}

std::string refusal(const json& j) {
  try {
    parse_hf_config(j.dump(), "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(HfConfig, ReadsLlama32) {
  const HfConfig c = parse_hf_config(llama().dump(), "config.json");
  EXPECT_EQ(c.family, Family::kLlama);
  EXPECT_EQ(c.vocab, 128256);
  EXPECT_EQ(c.hidden, 2048);
  EXPECT_EQ(c.intermediate, 8192);
  EXPECT_EQ(c.layers, 16);
  EXPECT_EQ(c.heads, 32);
  EXPECT_EQ(c.kv_heads, 8);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_DOUBLE_EQ(c.eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_TRUE(c.llama3_rope);
  EXPECT_DOUBLE_EQ(c.rope_factor, 32.0);
  EXPECT_EQ(c.original_max_positions, 8192);
  EXPECT_EQ(c.max_context(), 131072);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.dtype, "bfloat16");
  EXPECT_EQ(c.bos_token_ids, (std::vector<int64_t>{128000}));
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
}

TEST(HfConfig, ReadsTransformers5RopeParametersAndDefaults) {
  json j = llama();
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j.erase("head_dim");
  j.erase("num_key_value_heads");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  const HfConfig c = parse_hf_config(j.dump(), "config.json");
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_FALSE(c.llama3_rope);
  EXPECT_EQ(c.head_dim, 64);  // hidden / heads
  EXPECT_EQ(c.kv_heads, 32);  // multi-head attention
}

TEST(HfConfig, FamilyDifferences) {
  json q2 = llama();
  q2["architectures"] = {"Qwen2ForCausalLM"};
  q2.erase("attention_bias");
  q2["use_sliding_window"] = false;
  q2["sliding_window"] = 4096;  // unused without use_sliding_window
  const HfConfig c2 = parse_hf_config(q2.dump(), "config.json");
  EXPECT_TRUE(c2.qkv_bias);
  EXPECT_EQ(c2.max_context(), 131072);
  json q3 = q2;
  q3["architectures"] = {"Qwen3ForCausalLM"};
  q3["layer_types"] = {"full_attention", "full_attention"};
  const HfConfig c3 = parse_hf_config(q3.dump(), "config.json");
  EXPECT_TRUE(c3.qk_norm);
  EXPECT_FALSE(c3.qkv_bias);
  json m = llama();
  m["architectures"] = {"MistralForCausalLM"};
  m["sliding_window"] = 4096;
  const HfConfig cm = parse_hf_config(m.dump(), "config.json");
  EXPECT_EQ(cm.max_context(), 4096);  // full attention up to the window
}

TEST(HfConfig, RefusesWhatChangesTheMathNamingTheField) {
  const auto with = [](const char* key, json value) {
    json j = llama();
    j[key] = std::move(value);
    return j;
  };
  struct Case {
    json config;
    std::string field;
  };
  json qwen_sliding = with("architectures", {"Qwen2ForCausalLM"});
  qwen_sliding.erase("attention_bias");
  qwen_sliding["use_sliding_window"] = true;
  json qwen3_bias = with("architectures", {"Qwen3ForCausalLM"});
  qwen3_bias["attention_bias"] = true;
  const Case cases[] = {
      {with("architectures", {"GPT2LMHeadModel"}), "'architectures'"},
      {with("hidden_act", "gelu"), "'hidden_act'"},
      {with("attention_bias", true), "'attention_bias'"},
      {with("mlp_bias", true), "'mlp_bias'"},
      {with("rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}), "'rope_scaling'"},
      {with("rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}}), "'rope_scaling'"},
      {with("layer_types", {"full_attention", "sliding_attention"}), "'layer_types'"},
      {with("num_key_value_heads", 5), "'num_key_value_heads'"},
      {with("torch_dtype", "float8_e4m3fn"), "'torch_dtype'"},
      {with("vocab_size", "many"), "'vocab_size'"},
      {qwen_sliding, "'use_sliding_window'"},
      {with("final_logit_softcapping", 30.0), "'final_logit_softcapping'"},
      {with("partial_rotary_factor", 0.5), "'partial_rotary_factor'"},
      {with("residual_multiplier", 0.22), "'residual_multiplier'"},
      {with("rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"mrope_section", {16}}}),
       "'mrope_section'"},
      {qwen3_bias, "'attention_bias'"},
  };
  for (const Case& c : cases) {
    const std::string msg = refusal(c.config);
    EXPECT_NE(msg.find(c.field), std::string::npos) << c.field << ": " << msg;
    EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
  }
  // Neutral values of those fields are accepted.
  EXPECT_EQ(refusal(with("partial_rotary_factor", 1.0)), "");
  EXPECT_EQ(refusal(with("residual_multiplier", 1)), "");
  json missing = llama();
  missing.erase("num_hidden_layers");
  EXPECT_NE(refusal(missing).find("'num_hidden_layers' is missing"), std::string::npos);
  EXPECT_NE(refusal(json::array()).find("not a JSON object"), std::string::npos);
}

}  // namespace
}  // namespace dtensor::serving
