#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cpsim/models/error.hpp"
#include "cpsim/models/io.hpp"
#include "cpsim/models/transformer.hpp"

namespace cpsim::models {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

/// A Llama-3-8B config.json with the legacy rope keys, as published on the Hub.
json llama_config() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": false,
    "bos_token_id": 128000,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": false,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0,
    "tie_word_embeddings": false,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256
  })");
}

TransformerSpec parse(const json& config, const std::string& origin = "llama.json") {
  return parse_hf_config(config.dump(), origin);
}

/// The InputError field raised by parsing `config`, or "" when it parses.
std::string error_field(const json& config, const std::string& origin = "llama.json") {
  try {
    parse_hf_config(config.dump(), origin);
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    return e.field();
  }
  return "";
}

TEST(HfConfig, LegacyRopeKeys) {
  const TransformerSpec spec = parse(llama_config());
  EXPECT_EQ(spec.layers, 32);
  EXPECT_EQ(spec.hidden, 4096);
  EXPECT_EQ(spec.heads, 32);
  EXPECT_EQ(spec.kv_heads, 8);
  EXPECT_EQ(spec.head_dim, 128);
  EXPECT_EQ(spec.ffn_hidden, 14336);
  EXPECT_EQ(spec.vocab, 128256);
  EXPECT_FALSE(spec.tied_embeddings);
  EXPECT_FALSE(spec.qk_norm);
  EXPECT_FALSE(spec.qkv_bias);
  EXPECT_EQ(spec.activation, ActivationKind::kSwiGlu);
  EXPECT_EQ(spec.norm, NormKind::kRmsNorm);
  EXPECT_DOUBLE_EQ(spec.rope_theta, 500000.0);
  EXPECT_EQ(spec.max_position_embeddings, 131072);
  EXPECT_EQ(spec.name, "llama");  // from the origin when the file has no name
  EXPECT_EQ(spec.source, "llama.json");
  EXPECT_EQ(count_parameters(spec).total, 8'030'261'248);
}

TEST(HfConfig, TransformersV5RopeParameters) {
  json config = llama_config();
  config.erase("rope_theta");
  config.erase("rope_scaling");
  config["rope_parameters"] = json::parse(R"({"rope_type": "llama3", "rope_theta": 750000.0,
      "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192})");
  config["dtype"] = "bfloat16";
  EXPECT_DOUBLE_EQ(parse(config).rope_theta, 750000.0);

  config["rope_parameters"] = json::parse(R"({"full_attention": {"rope_type": "default",
      "rope_theta": 1000000.0}, "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})");
  EXPECT_DOUBLE_EQ(parse(config).rope_theta, 1000000.0);

  config["rope_parameters"] = json::parse(R"({"rope_type": "default", "rope_theta": "big"})");
  EXPECT_EQ(error_field(config), "llama.json:rope_parameters.rope_theta");
  config["rope_parameters"] = 5;
  EXPECT_EQ(error_field(config), "llama.json:rope_parameters");
}

TEST(HfConfig, RopeThetaDefaultsWhenAbsent) {
  json config = llama_config();
  config.erase("rope_theta");
  config.erase("rope_scaling");
  EXPECT_DOUBLE_EQ(parse(config).rope_theta, 10000.0);
}

TEST(HfConfig, DefaultsOfKvHeadsAndHeadDim) {
  json config = llama_config();
  config.erase("num_key_value_heads");
  TransformerSpec spec = parse(config);
  EXPECT_EQ(spec.kv_heads, 32);
  EXPECT_EQ(spec.head_dim, 4096 / 32);

  config["num_key_value_heads"] = nullptr;  // null means absent
  config["head_dim"] = nullptr;
  EXPECT_EQ(parse(config).kv_heads, 32);

  config["hidden_size"] = 2560;  // explicit head_dim need not be hidden / heads (Qwen3-4B)
  config["head_dim"] = 128;
  spec = parse(config);
  EXPECT_EQ(spec.head_dim, 128);
  EXPECT_EQ(spec.q_width(), 4096);

  config.erase("head_dim");
  config["hidden_size"] = 4100;  // 4100 / 32 is not an integer
  EXPECT_EQ(error_field(config), "llama.json:head_dim");
}

TEST(HfConfig, HeadsMustBeAMultipleOfKvHeads) {
  json config = llama_config();
  config["num_key_value_heads"] = 12;
  EXPECT_EQ(error_field(config), "llama.json:num_key_value_heads");
  config["num_key_value_heads"] = 64;
  EXPECT_EQ(error_field(config), "llama.json:num_key_value_heads");
}

TEST(HfConfig, Qwen3HasQkNormAndTiedEmbeddings) {
  json config = llama_config();
  config["model_type"] = "qwen3";
  config["tie_word_embeddings"] = true;
  config["attention_bias"] = true;
  const TransformerSpec spec = parse(config);
  EXPECT_TRUE(spec.qk_norm);
  EXPECT_TRUE(spec.tied_embeddings);
  EXPECT_TRUE(spec.qkv_bias);
  EXPECT_TRUE(spec.output_proj_bias);  // Llama-style code: o_proj has attention_bias too
  EXPECT_EQ(spec.model_type, "qwen3");
  EXPECT_EQ(parse(llama_config()).model_type, "llama");
}

TEST(HfConfig, Activations) {
  json config = llama_config();
  // Gemma's MLP is gated (GemmaMLP: gate_proj, up_proj, down_proj): 3·h·f like SwiGLU.
  config["model_type"] = "gemma";
  config["hidden_act"] = "gelu_pytorch_tanh";
  EXPECT_EQ(parse(config).activation, ActivationKind::kGeGlu);
  EXPECT_EQ(count_parameters(parse(config)).mlp_per_layer,
            3 * config["hidden_size"].get<std::int64_t>() *
                config["intermediate_size"].get<std::int64_t>());
  // GELU elsewhere is not known to be gated: refused, never taken for another MLP.
  config["model_type"] = "llama";
  EXPECT_EQ(error_field(config), "llama.json:hidden_act");
  // Model types with a plain two-matrix MLP are refused whatever the activation.
  config["model_type"] = "starcoder2";
  EXPECT_EQ(error_field(config), "llama.json:model_type");
  config["model_type"] = "llama";
  config["hidden_act"] = "swiglu";
  EXPECT_EQ(parse(config).activation, ActivationKind::kSwiGlu);
  config.erase("hidden_act");
  EXPECT_EQ(parse(config).activation, ActivationKind::kSwiGlu);
  config["hidden_act"] = "relu2";
  EXPECT_EQ(error_field(config), "llama.json:hidden_act");
}

TEST(HfConfig, NameAndSourceExtensions) {
  json config = llama_config();
  config["name"] = "my-llama";
  config["source"] = "hub";
  const TransformerSpec spec = parse(config);
  EXPECT_EQ(spec.name, "my-llama");
  EXPECT_EQ(spec.source, "hub");
  config.erase("name");
  EXPECT_EQ(parse(config, "/models/Meta-Llama-3-8B/config.json").name, "Meta-Llama-3-8B");
}

TEST(HfConfig, RefusesMoeAndMla) {
  for (const char* key :
       {"num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok",
        "moe_intermediate_size", "kv_lora_rank", "q_lora_rank"}) {
    json config = llama_config();
    config[key] = 8;
    try {
      parse(config);
      ADD_FAILURE() << "accepted " << key;
    } catch (const InputError& e) {
      EXPECT_EQ(e.field(), std::string("llama.json:") + key);
      EXPECT_THAT(e.what(), HasSubstr("not modelled yet"));
    }
    config[key] = nullptr;  // explicit null or 0 means a dense model
    EXPECT_NO_THROW(parse(config)) << key;
    config[key] = 0;
    EXPECT_NO_THROW(parse(config)) << key;
  }
}

TEST(HfConfig, BiasedMlpsAndLayerNormAreRefusedWhateverTheModelType) {
  // A model_type cpsim does not list (GLM-4.5's glm4_moe) still names its experts.
  json moe = llama_config();
  moe["model_type"] = "glm4_moe";
  moe["n_routed_experts"] = 160;
  EXPECT_EQ(error_field(moe), "llama.json:n_routed_experts");
  json biased = llama_config();
  biased["mlp_bias"] = true;
  EXPECT_EQ(error_field(biased), "llama.json:mlp_bias");
  json layer_norm = llama_config();
  layer_norm.erase("rms_norm_eps");
  layer_norm["layer_norm_eps"] = 1e-5;
  EXPECT_EQ(error_field(layer_norm), "llama.json:layer_norm_eps");
  EXPECT_EQ(error_field(llama_config()), "");  // mlp_bias false, rms_norm_eps: modelled
}

json mixtral_config() {
  json config = llama_config();
  config["model_type"] = "mixtral";
  config["num_local_experts"] = 8;
  config["num_experts_per_tok"] = 2;
  config["vocab_size"] = 32000;
  config["max_position_embeddings"] = 32768;
  config["rope_theta"] = 1e6;
  config.erase("rope_scaling");
  config.erase("mlp_bias");
  config["sliding_window"] = nullptr;
  return config;
}

json qwen3_moe_config() {
  return json::parse(R"({
    "model_type": "qwen3_moe", "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
    "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "norm_topk_prob": true, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
    "tie_word_embeddings": false, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "use_sliding_window": false, "sliding_window": null, "max_window_layers": 48
  })");
}

TEST(HfConfig, MixtralExpertsAreIntermediateSizeWide) {
  const TransformerSpec spec = parse(mixtral_config());
  EXPECT_EQ(spec.moe.experts, 8);
  EXPECT_EQ(spec.moe.experts_per_token, 2);
  EXPECT_EQ(spec.moe.expert_ffn_hidden, 14336);
  // Per layer: attention 2·4096² + 2·4096·1024 = 41,943,040, experts 8·3·4096·14336 =
  // 1,409,286,144, router 4096·8, norms 2·4096; ×32, plus 2·32000·4096 and the final norm:
  // Mixtral-8x7B's 46.7 B.
  EXPECT_EQ(count_parameters(spec).total, 46'702'792'704);
  json noisy = mixtral_config();
  noisy["router_jitter_noise"] = 0.01;
  EXPECT_EQ(error_field(noisy), "llama.json:router_jitter_noise");
  json windowed = mixtral_config();
  windowed["sliding_window"] = 4096;
  EXPECT_EQ(parse(windowed).windowed_layers(), 32);  // every layer, as Mistral
}

TEST(HfConfig, Qwen3MoeExpertsAndItsDenseLayers) {
  const TransformerSpec spec = parse(qwen3_moe_config());
  EXPECT_EQ(spec.moe.experts, 128);
  EXPECT_EQ(spec.moe.experts_per_token, 8);
  EXPECT_EQ(spec.moe.expert_ffn_hidden, 768);
  EXPECT_EQ(spec.mlp_width(), 768);
  EXPECT_TRUE(spec.qk_norm);
  EXPECT_EQ(count_parameters(spec).total, 30'532'122'624);  // Qwen3-30B-A3B
  EXPECT_TRUE(spec.layer_mlp.empty());                      // every layer sparse
  // Layer i has experts unless in mlp_only_layers, when (i + 1) % decoder_sparse_step == 0.
  json step = qwen3_moe_config();
  step["decoder_sparse_step"] = 2;
  step["mlp_only_layers"] = {3};
  const TransformerSpec every_other = parse(step);
  EXPECT_EQ(every_other.sparse_layers(), 23);
  EXPECT_FALSE(every_other.experts_at(0));
  EXPECT_TRUE(every_other.experts_at(1));
  EXPECT_FALSE(every_other.experts_at(3));
  // Per dense layer 3·2048·6144 in place of the 128 experts and the router.
  const ParameterCount p = count_parameters(every_other);
  EXPECT_EQ(p.dense_layers, 25);
  EXPECT_EQ(p.per_layer - p.dense_per_layer, 603'979'776 + 262'144 - 3LL * 2048 * 6144);
  json outside = qwen3_moe_config();
  outside["mlp_only_layers"] = {48};
  EXPECT_EQ(error_field(outside), "llama.json:mlp_only_layers[0]");
  json none_sparse = qwen3_moe_config();
  none_sparse["decoder_sparse_step"] = 100;
  EXPECT_EQ(error_field(none_sparse), "llama.json:mlp_only_layers");
  json too_many = qwen3_moe_config();
  too_many["num_experts_per_tok"] = 129;
  EXPECT_EQ(error_field(too_many), "llama.json:num_experts_per_tok");
  json no_experts = qwen3_moe_config();
  no_experts.erase("moe_intermediate_size");
  EXPECT_EQ(error_field(no_experts), "llama.json:moe_intermediate_size");
  // Qwen2-MoE: a gated shared expert (required width), q/k/v biases by `qkv_bias`.
  json qwen2 = qwen3_moe_config();
  qwen2["model_type"] = "qwen2_moe";
  EXPECT_EQ(error_field(qwen2), "llama.json:shared_expert_intermediate_size");
  qwen2["shared_expert_intermediate_size"] = 5632;
  const TransformerSpec shared = parse(qwen2);
  EXPECT_EQ(shared.moe.shared_ffn_hidden, 5632);
  EXPECT_TRUE(shared.moe.shared_gate);
  EXPECT_TRUE(shared.qkv_bias);
  EXPECT_FALSE(shared.output_proj_bias);
  EXPECT_FALSE(shared.qk_norm);
  qwen2["qkv_bias"] = false;
  EXPECT_FALSE(parse(qwen2).qkv_bias);
  // A Qwen3-MoE config labelled deepseek_v3 names the first key DeepSeek-V3's reader needs.
  json deepseek = qwen3_moe_config();
  deepseek["model_type"] = "deepseek_v3";
  EXPECT_EQ(error_field(deepseek), "llama.json:kv_lora_rank");
}

/// The layers of `spec` with a window, as 'S' and 'F' per layer.
std::string pattern(const TransformerSpec& spec) {
  std::string out;
  for (std::int64_t l = 0; l < spec.layers; ++l) {
    out += spec.attention_of(l) == LayerAttention::kSliding ? 'S' : 'F';
  }
  return out;
}

json small_config(const std::string& model_type) {
  json c = llama_config();
  c["model_type"] = model_type;
  c["num_hidden_layers"] = 6;
  return c;
}

// transformers 4.57.6's rules, checked against its config classes by
// tests/models/test_hf_models.py.
TEST(HfConfig, SlidingWindowLayersFollowTheModelTypesRules) {
  json mistral = small_config("mistral");
  mistral["sliding_window"] = 4096;
  TransformerSpec spec = parse(mistral);
  EXPECT_EQ(spec.sliding_window, 4096);
  EXPECT_EQ(pattern(spec), "SSSSSS");
  // Mistral's attention ignores layer_types: every layer has the window.
  mistral["layer_types"] = json::array({"full_attention", "full_attention", "full_attention",
                                        "full_attention", "full_attention", "full_attention"});
  EXPECT_EQ(pattern(parse(mistral)), "SSSSSS");
  mistral["sliding_window"] = nullptr;
  EXPECT_EQ(parse(mistral).windowed_layers(), 0);

  json qwen = small_config("qwen2");
  qwen["sliding_window"] = 1024;
  qwen["max_window_layers"] = 4;
  EXPECT_EQ(parse(qwen).windowed_layers(), 0) << "use_sliding_window defaults to false";
  qwen["use_sliding_window"] = true;
  spec = parse(qwen);
  EXPECT_EQ(pattern(spec), "FFFFSS");
  EXPECT_EQ(spec.sliding_window, 1024);
  EXPECT_TRUE(spec.mixed_attention());
  qwen.erase("max_window_layers");  // default 28: no layer of six
  EXPECT_EQ(pattern(parse(qwen)), "FFFFFF");

  json listed = small_config("ministral");
  listed["sliding_window"] = 512;
  EXPECT_EQ(pattern(parse(listed)), "SSSSSS");
  listed["layer_types"] = json::array({"sliding_attention", "full_attention", "sliding_attention",
                                       "full_attention", "sliding_attention", "full_attention"});
  EXPECT_EQ(pattern(parse(listed)), "SFSFSF");
  listed["use_sliding_window"] = false;
  EXPECT_EQ(parse(listed).windowed_layers(), 0);
  listed.erase("use_sliding_window");
  listed["sliding_window"] = nullptr;  // sliding_attention layers without a window: causal
  EXPECT_EQ(parse(listed).windowed_layers(), 0);
}

TEST(HfConfig, Gemma3TextModel) {
  // google/gemma-3-27b-pt's text_config (REFERENCES.md [HF-config-gemma3]); what it leaves out
  // takes Gemma3TextConfig's defaults.
  json gemma = json::parse(R"({"model_type": "gemma3_text", "head_dim": 128, "hidden_size": 5376,
    "intermediate_size": 21504, "num_attention_heads": 32, "num_hidden_layers": 62,
    "num_key_value_heads": 16, "query_pre_attn_scalar": 168, "sliding_window": 1024,
    "vocab_size": 262208, "rope_scaling": {"factor": 8.0, "rope_type": "linear"}})");
  const TransformerSpec spec = parse(gemma);
  EXPECT_TRUE(spec.qk_norm);
  EXPECT_TRUE(spec.post_sublayer_norms);
  EXPECT_TRUE(spec.tied_embeddings);  // the class default
  EXPECT_EQ(spec.activation, ActivationKind::kGeGlu);
  EXPECT_EQ(spec.sliding_window, 1024);
  EXPECT_EQ(spec.windowed_layers(), 52);  // every 6th of 62 layers full: 10
  EXPECT_EQ(pattern(spec).substr(0, 12), "SSSSSFSSSSSF");
  EXPECT_DOUBLE_EQ(spec.rope_theta, 1e6);
  // By hand: attention 3 · 5376·4096 + 2·128 (q/k norms) = 66,060,544; MLP 3·5376·21504 =
  // 346,816,512; four norms 4·5376; 62 layers, the tied embedding 262208·5376 and the final norm.
  const ParameterCount p = count_parameters(spec);
  EXPECT_EQ(p.per_layer, 66'060'544 + 346'816'512 + 4 * 5376);
  EXPECT_EQ(p.total, 62 * p.per_layer + 262'208LL * 5376 + 5376);
  EXPECT_EQ(p.total, 27'009'346'304);

  json defaults = gemma;
  defaults.erase("sliding_window");
  EXPECT_EQ(parse(defaults).sliding_window, 4096);
  json both_ways = gemma;
  both_ways["use_bidirectional_attention"] = true;
  EXPECT_EQ(error_field(both_ways), "llama.json:use_bidirectional_attention");
  json capped = gemma;
  capped["final_logit_softcapping"] = 30.0;
  EXPECT_EQ(error_field(capped), "llama.json:final_logit_softcapping");
}

TEST(HfConfig, WindowsNotReadAreRefusedNamingTheField) {
  json unknown = small_config("llama");
  unknown["sliding_window"] = 4096;
  EXPECT_EQ(error_field(unknown), "llama.json:sliding_window");
  json chunked = small_config("llama");  // chunks are read for Llama 4 only
  chunked["sliding_window"] = 512;
  chunked["layer_types"] = json::array({"chunked_attention", "full_attention", "full_attention",
                                        "full_attention", "full_attention", "full_attention"});
  EXPECT_EQ(error_field(chunked), "llama.json:layer_types[0]");
  json short_list = small_config("ministral");
  short_list["sliding_window"] = 512;
  short_list["layer_types"] = json::array({"sliding_attention"});
  EXPECT_EQ(error_field(short_list), "llama.json:layer_types");
  json zero = small_config("mistral");
  zero["sliding_window"] = 0;
  EXPECT_EQ(error_field(zero), "llama.json:sliding_window");
}

TEST(HfConfig, MissingRequiredKeyIsNamed) {
  for (const char* key : {"hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "vocab_size"}) {
    json config = llama_config();
    config.erase(key);
    EXPECT_EQ(error_field(config), std::string("llama.json:") + key);
  }
}

TEST(HfConfig, WrongTypeIsNamed) {
  const auto with = [](const char* key, json value) {
    json config = llama_config();
    config[key] = std::move(value);
    return error_field(config);
  };
  EXPECT_EQ(with("hidden_size", "4096"), "llama.json:hidden_size");
  EXPECT_EQ(with("hidden_size", 4096.5), "llama.json:hidden_size");
  EXPECT_EQ(with("hidden_size", true), "llama.json:hidden_size");
  EXPECT_EQ(with("num_hidden_layers", nullptr), "llama.json:num_hidden_layers");
  EXPECT_EQ(with("num_key_value_heads", json::array({8})), "llama.json:num_key_value_heads");
  EXPECT_EQ(with("tie_word_embeddings", "false"), "llama.json:tie_word_embeddings");
  EXPECT_EQ(with("attention_bias", 0), "llama.json:attention_bias");
  EXPECT_EQ(with("rope_theta", "500000"), "llama.json:rope_theta");
  EXPECT_EQ(with("rope_scaling", 8), "llama.json:rope_scaling");
  EXPECT_EQ(with("hidden_act", 1), "llama.json:hidden_act");
  EXPECT_EQ(with("model_type", json::object()), "llama.json:model_type");
  EXPECT_EQ(with("max_position_embeddings", -1), "llama.json:max_position_embeddings");
  EXPECT_EQ(with("vocab_size", 0), "llama.json:vocab_size");
  EXPECT_EQ(with("hidden_size", 18446744073709551615ULL), "llama.json:hidden_size");
  // Integral doubles are accepted.
  EXPECT_EQ(with("hidden_size", 4096.0), "");
}

TEST(HfConfig, MalformedJsonNamesTheOriginAndPosition) {
  try {
    parse_hf_config("{\n  \"hidden_size\": 4096,\n  \"vocab_size\": ,\n}", "bad.json");
    ADD_FAILURE() << "accepted malformed JSON";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "bad.json");
    EXPECT_THAT(e.what(), HasSubstr("line 3"));
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
  }
  EXPECT_EQ(error_field(json::array({1, 2}), "arr.json"), "arr.json");
  try {
    parse_hf_config("", "empty.json");
    ADD_FAILURE() << "accepted empty text";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "empty.json");
  }
  try {
    parse_hf_config(R"({"hidden_size": 1e999})", "big.json");
    ADD_FAILURE() << "accepted an overflowing number";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "big.json");
  }
}

TEST(HfConfig, LoadModelFromAPathAndAFolder) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "cpsim_models_test_hf" / "Tiny-Model";
  std::filesystem::create_directories(dir);
  json config = llama_config();
  config["num_hidden_layers"] = 2;
  {
    std::ofstream out(dir / "config.json");
    out << config.dump(2);
  }
  const DataDir data{CPSIM_TEST_DATA_DIR};
  const TransformerSpec from_file = load_model((dir / "config.json").string(), data);
  EXPECT_EQ(from_file.layers, 2);
  EXPECT_EQ(from_file.name, "Tiny-Model");
  EXPECT_EQ(load_model(dir.string(), data).layers, 2);
  // What from_pretrained takes: the folder of a config.json given by path (even when the file
  // names a hub id), the hub id of a built-in, nothing for another file without one.
  EXPECT_EQ(from_file.hf_name_or_path, dir.string());
  EXPECT_EQ(load_model(dir.string(), data).hf_name_or_path, dir.string());
  EXPECT_EQ(load_model("llama3-8b", data).hf_name_or_path, "meta-llama/Meta-Llama-3-8B");
  EXPECT_EQ(load_model("qwen3-32b", data).hf_name_or_path, "Qwen/Qwen3-32B");
  {
    std::ofstream out(dir / "tiny.json");
    out << config.dump(2);
  }
  EXPECT_EQ(load_model((dir / "tiny.json").string(), data).hf_name_or_path, "");
  config["_name_or_path"] = "org/tiny";
  {
    std::ofstream out(dir / "tiny.json");
    out << config.dump(2);
  }
  EXPECT_EQ(load_model((dir / "tiny.json").string(), data).hf_name_or_path, "org/tiny");
  config.erase("_name_or_path");

  config["num_attention_heads"] = "many";
  {
    std::ofstream out(dir / "config.json");
    out << config.dump(2);
  }
  try {
    load_model((dir / "config.json").string(), data);
    ADD_FAILURE() << "accepted a bad file";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), (dir / "config.json").string() + ":num_attention_heads");
  }
  std::filesystem::remove_all(dir.parent_path());
}

// YaRN from rope_scaling (or transformers v5's rope_parameters): what launchers that define the
// model themselves need (Megatron-LM's MLA: --rotary-scaling-factor, --mscale, --mscale-all-dim).
TEST(HfConfig, YarnScalingIsReadWithTransformersDefaults) {
  const TransformerSpec spec = load_model("deepseek-v3", DataDir{CPSIM_TEST_DATA_DIR});
  ASSERT_TRUE(spec.yarn.has_value());
  EXPECT_EQ(*spec.yarn, (YarnScaling{40.0, 4096, 32.0, 1.0, 1.0, 1.0}));
  std::ifstream file(std::string(CPSIM_TEST_DATA_DIR) + "/models/deepseek-v3.json");
  json config = json::parse(file);
  // beta_fast 32, beta_slow 1 unless given; mscale absent stays absent; the original length
  // falls back on max_position_embeddings (_compute_yarn_parameters).
  json bare = config;
  bare["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  EXPECT_EQ(*parse(bare, "ds.json").yarn, (YarnScaling{4.0, 163840, 32.0, 1.0, {}, {}}));
  json v5 = config;
  v5.erase("rope_scaling");
  v5["rope_parameters"] = {{"rope_type", "yarn"},
                           {"factor", 8.0},
                           {"rope_theta", 10000.0},
                           {"original_max_position_embeddings", 8192},
                           {"beta_fast", 16}};
  EXPECT_EQ(*parse(v5, "ds.json").yarn, (YarnScaling{8.0, 8192, 16.0, 1.0, {}, {}}));
  json linear = config;
  linear["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};  // changes no cost: not read
  EXPECT_FALSE(parse(linear, "ds.json").yarn.has_value());
  json no_factor = config;
  no_factor["rope_scaling"].erase("factor");
  EXPECT_EQ(error_field(no_factor, "ds.json"), "ds.json:rope_scaling.factor");
  json bad_beta = config;
  bad_beta["rope_scaling"]["beta_slow"] = -1;
  EXPECT_EQ(error_field(bad_beta, "ds.json"), "ds.json:rope_scaling.beta_slow");
  json bad_original = config;
  bad_original["rope_scaling"]["original_max_position_embeddings"] = 0;
  EXPECT_EQ(error_field(bad_original, "ds.json"),
            "ds.json:rope_scaling.original_max_position_embeddings");
}

}  // namespace
}  // namespace cpsim::models

namespace cpsim::models {
namespace {

// Llama 4: a multimodal config whose text_config is the decoder (Llama4TextConfig's defaults for
// what it leaves out: chunks of 8192 on every layer but each 4th, every layer sparse).
json llama4_config() {
  return json::parse(R"({
    "model_type": "llama4", "_name_or_path": "meta-llama/Llama-4-Scout-17B-16E",
    "text_config": {
      "hidden_size": 512, "intermediate_size": 256, "intermediate_size_mlp": 1024,
      "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 2,
      "head_dim": 64, "vocab_size": 1000, "num_local_experts": 4, "num_experts_per_tok": 1,
      "rms_norm_eps": 1e-05, "rope_theta": 500000.0
    },
    "vision_config": {"hidden_size": 1408, "norm_eps": 1e-05}
  })");
}

TEST(HfConfig, Llama4ReadsItsTextModelWithChunksAndASharedExpert) {
  const TransformerSpec spec = parse(llama4_config());
  EXPECT_EQ(spec.model_type, "llama4_text");
  EXPECT_EQ(spec.hf_name_or_path, "meta-llama/Llama-4-Scout-17B-16E");
  EXPECT_EQ(spec.moe.experts, 4);
  EXPECT_EQ(spec.moe.expert_ffn_hidden, 256);
  EXPECT_EQ(spec.moe.shared_ffn_hidden, 256);
  EXPECT_FALSE(spec.moe.shared_gate);
  EXPECT_FALSE(spec.moe.renormalize);
  EXPECT_FALSE(spec.qk_norm);  // its L2 norm has no weights (a note says it is not modelled)
  EXPECT_EQ(spec.attention_chunk, 8192);
  std::string pattern;
  for (std::int64_t l = 0; l < spec.layers; ++l) {
    pattern += spec.attention_of(l) == LayerAttention::kChunked ? 'C' : 'F';
  }
  EXPECT_EQ(pattern, "CCCFCCCF");
  // Dense layers of intermediate_size_mlp where moe_layers or the interleave step leave them.
  json step = llama4_config();
  step["text_config"]["interleave_moe_layer_step"] = 2;
  const TransformerSpec interleaved = parse(step);
  EXPECT_EQ(interleaved.sparse_layers(), 4);
  EXPECT_TRUE(interleaved.experts_at(1) && !interleaved.experts_at(0));
  EXPECT_EQ(interleaved.ffn_hidden, 1024);
  json some = llama4_config();
  some["text_config"]["moe_layers"] = {1, 3, 5, 8};
  // Errors name the field inside text_config.
  EXPECT_EQ(error_field(some), "llama.json:text_config.moe_layers[3]");
  json bad = llama4_config();
  bad["text_config"]["hidden_size"] = "512";
  EXPECT_EQ(error_field(bad), "llama.json:text_config.hidden_size");
  json none = llama4_config();
  none.erase("text_config");
  EXPECT_EQ(error_field(none), "llama.json:text_config");
  // layer_types wins over no_rope_layers; a null chunk is refused (transformers raises).
  json typed = llama4_config();
  typed["text_config"]["layer_types"] = {
      "full_attention", "chunked_attention", "full_attention", "chunked_attention",
      "full_attention", "chunked_attention", "full_attention", "chunked_attention"};
  EXPECT_EQ(parse(typed).chunked_layers(), 4);
  json unchunked = llama4_config();
  unchunked["text_config"]["attention_chunk_size"] = nullptr;
  EXPECT_EQ(error_field(unchunked), "llama.json:text_config.attention_chunk_size");
}

}  // namespace
}  // namespace cpsim::models

namespace cpsim::models {
namespace {

TEST(HfConfig, DeepSeekV3ReadsItsLatentAttentionRouterAndDenseLayers) {
  const TransformerSpec spec = load_model("deepseek-v3", DataDir{CPSIM_TEST_DATA_DIR});
  EXPECT_TRUE(spec.is_mla());
  EXPECT_EQ(spec.head_dim, 192);  // qk_nope_head_dim + qk_rope_head_dim, not config.head_dim
  EXPECT_EQ(spec.value_head_dim(), 128);
  EXPECT_EQ(spec.mla, (MlaSpec{1536, 512, 64}));
  EXPECT_EQ(spec.moe.experts, 256);
  EXPECT_EQ(spec.moe.experts_per_token, 8);
  EXPECT_EQ(spec.moe.expert_ffn_hidden, 2048);
  EXPECT_EQ(spec.moe.shared_ffn_hidden, 2048);
  EXPECT_FALSE(spec.moe.shared_gate);
  EXPECT_TRUE(spec.moe.renormalize);
  EXPECT_EQ(spec.moe.groups, 8);
  EXPECT_EQ(spec.moe.group_topk, 4);
  EXPECT_DOUBLE_EQ(spec.moe.routed_scaling, 2.5);
  EXPECT_EQ(spec.sparse_layers(), 58);  // the first 3 layers dense (first_k_dense_replace)
  EXPECT_FALSE(spec.experts_at(2));
  EXPECT_TRUE(spec.experts_at(3));
  // A saved config's head_dim (DeepseekV3Config sets it to qk_rope_head_dim) is not read.
  std::ifstream file(std::string(CPSIM_TEST_DATA_DIR) + "/models/deepseek-v3.json");
  json config = json::parse(file);
  config["head_dim"] = 64;
  EXPECT_EQ(parse(config, "ds.json").head_dim, 192);
  config["q_lora_rank"] = nullptr;  // DeepSeek-V2-Lite: q straight from x
  EXPECT_EQ(parse(config, "ds.json").mla.q_lora_rank, 0);
  // Refusals name the field.
  for (const char* key :
       {"kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "n_group", "first_k_dense_replace"}) {
    json missing = config;
    missing.erase(key);
    EXPECT_EQ(error_field(missing, "ds.json"), std::string("ds.json:") + key) << key;
  }
  json biased = config;
  biased["attention_bias"] = true;
  EXPECT_EQ(error_field(biased, "ds.json"), "ds.json:attention_bias");
  json groups = config;
  groups["n_group"] = 3;  // does not divide 256
  EXPECT_EQ(error_field(groups, "ds.json"), "ds.json:n_group");
  json gqa = config;
  gqa["num_key_value_heads"] = 8;
  EXPECT_EQ(error_field(gqa, "ds.json"), "ds.json:num_key_value_heads");
  json rope = config;
  rope["qk_nope_head_dim"] = 0;
  EXPECT_EQ(error_field(rope, "ds.json"), "ds.json:qk_nope_head_dim");
  // DeepSeek-V2 is still refused (its routing differs): its experts are named.
  json v2 = config;
  v2["model_type"] = "deepseek_v2";
  EXPECT_EQ(error_field(v2, "ds.json"), "ds.json:n_routed_experts");
}

}  // namespace
}  // namespace cpsim::models
