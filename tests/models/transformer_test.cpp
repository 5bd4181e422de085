#include "cpsim/models/transformer.hpp"

#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/io.hpp"

namespace cpsim::models {
namespace {

DataDir test_data() {
  return DataDir{CPSIM_TEST_DATA_DIR};
}

double billions(std::int64_t n) {
  return static_cast<double>(n) / 1e9;
}

TEST(ParameterCount, Llama3_8bIsExact) {
  const TransformerSpec spec = load_model("llama3-8b", test_data());
  const ParameterCount p = count_parameters(spec);
  EXPECT_EQ(p.total, 8'030'261'248);
  EXPECT_EQ(p.embedding, 128256LL * 4096);
  EXPECT_EQ(p.lm_head, 128256LL * 4096);
  EXPECT_EQ(p.final_norm, 4096);
  EXPECT_EQ(p.attention_per_layer, 4096LL * 4096 * 2 + 2LL * 4096 * 1024);
  EXPECT_EQ(p.mlp_per_layer, 3LL * 4096 * 14336);
  EXPECT_EQ(p.per_layer, p.attention_per_layer + p.mlp_per_layer + 2 * 4096);
  EXPECT_EQ(p.total, spec.layers * p.per_layer + p.embedding + p.lm_head + p.final_norm);
}

// Multi-head attention (as many KV heads as heads) and the 32,000-token vocabulary, by hand:
// 32 · (4 · 4096² + 3 · 4096 · 11008 + 2 · 4096) + 2 · 32000 · 4096 + 4096.
TEST(ParameterCount, Llama2_7bIsExact) {
  const TransformerSpec spec = load_model("llama2-7b", test_data());
  EXPECT_EQ(spec.kv_heads, spec.heads);
  const ParameterCount p = count_parameters(spec);
  EXPECT_EQ(p.attention_per_layer, 4LL * 4096 * 4096);
  EXPECT_EQ(p.mlp_per_layer, 3LL * 4096 * 11008);
  EXPECT_EQ(p.embedding, 32000LL * 4096);
  EXPECT_EQ(p.total, 6'738'415'616);
}

TEST(ParameterCount, PublishedModelSizes) {
  // REFERENCES.md [HF-configs] (parameter counts are our own count).
  struct Case {
    const char* name;
    double billions;
    double tolerance;
  };
  for (const Case& c : {Case{"llama3-70b", 70.554, 0.001}, Case{"llama3.1-405b", 405.853, 0.001},
                        Case{"qwen3-32b", 32.762, 0.001}, Case{"qwen3-14b", 14.768, 0.001},
                        Case{"qwen3-8b", 8.191, 0.001}, Case{"qwen3-4b", 4.02, 0.005},
                        Case{"llama2-7b", 6.738, 0.001}, Case{"llama2-13b", 13.016, 0.001}}) {
    const TransformerSpec spec = load_model(c.name, test_data());
    EXPECT_NEAR(billions(count_parameters(spec).total), c.billions, c.tolerance) << c.name;
  }
}

TEST(ParameterCount, TiedEmbeddingsHaveNoLmHead) {
  const TransformerSpec spec = load_model("qwen3-4b", test_data());
  ASSERT_TRUE(spec.tied_embeddings);
  const ParameterCount p = count_parameters(spec);
  EXPECT_EQ(p.lm_head, 0);
  EXPECT_EQ(p.total, spec.layers * p.per_layer + p.embedding + p.final_norm);
}

TEST(ParameterCount, QkNormAddsTwoHeadDimsPerLayer) {
  TransformerSpec spec = load_model("qwen3-32b", test_data());
  ASSERT_TRUE(spec.qk_norm);
  const std::int64_t with = count_parameters(spec).total;
  spec.qk_norm = false;
  EXPECT_EQ(with - count_parameters(spec).total, spec.layers * 2 * spec.head_dim);
}

TransformerSpec tiny_model() {
  TransformerSpec spec;
  spec.name = "tiny";
  spec.layers = 2;
  spec.hidden = 8;
  spec.heads = 2;
  spec.kv_heads = 1;
  spec.head_dim = 4;
  spec.ffn_hidden = 16;
  spec.vocab = 10;
  return spec;
}

TEST(ParameterCount, TinyModelByHand) {
  TransformerSpec spec = tiny_model();
  // attention: Wq 8·8 + Wk, Wv 2·8·4 + Wo 8·8 = 192; mlp 3·8·16 = 384; norms 2·8 = 16.
  ParameterCount p = count_parameters(spec);
  EXPECT_EQ(p.attention_per_layer, 192);
  EXPECT_EQ(p.mlp_per_layer, 384);
  EXPECT_EQ(p.per_layer, 592);
  EXPECT_EQ(p.total, 2 * 592 + 80 + 80 + 8);

  spec.qkv_bias = true;                      // + 8 + 2·4
  spec.activation = ActivationKind::kGeGlu;  // gated as SwiGLU: 3·8·16
  spec.norm = NormKind::kLayerNorm;          // 4·8 per layer, 2·8 final
  spec.tied_embeddings = true;
  p = count_parameters(spec);
  EXPECT_EQ(p.attention_per_layer, 208);
  EXPECT_EQ(p.mlp_per_layer, 384);
  EXPECT_EQ(p.per_layer, 208 + 384 + 32);
  EXPECT_EQ(p.final_norm, 16);
  EXPECT_EQ(p.total, 2 * 624 + 80 + 16);
}

// gpt-oss's block: q, k, v and o biases, a sink per head, a router with a bias and experts with
// biases on gate/up and down (transformers 4.57.6 modeling_gpt_oss.py:74-77, 149-150, 286-298).
TEST(ParameterCount, BiasesAndSinksByHand) {
  TransformerSpec spec = tiny_model();
  spec.qkv_bias = spec.output_proj_bias = spec.attention_sinks = true;
  spec.moe = {.experts = 4, .experts_per_token = 2, .expert_ffn_hidden = 6, .biases = true};
  const ParameterCount p = count_parameters(spec);
  // attention 192 + q/k/v biases 8 + 2·4 + o bias 8 + sinks 2 = 218.
  EXPECT_EQ(p.attention_per_layer, 218);
  // experts 4·3·8·6 = 576 + biases 4·(2·6 + 8) = 80; router 8·4 + bias 4 = 36.
  EXPECT_EQ(p.experts_per_layer, 656);
  EXPECT_EQ(p.mlp_per_layer, 692);
  EXPECT_EQ(p.per_layer, 218 + 692 + 16);
}

// transformers 4.57.6 builds openai/gpt-oss-120b's config (REFERENCES.md [HF-config-gpt-oss])
// with 116,829,156,672 parameters (tests/models/test_hf_models.py counts the built model).
TEST(ParameterCount, GptOss120bIsExact) {
  const TransformerSpec spec = load_model("gpt-oss-120b", test_data());
  EXPECT_EQ(count_parameters(spec).total, 116'829'156'672);
  // gpt-oss-20b: 24 layers of 32 experts; the model card's 20.91 B total, 3.61 B active without
  // the input embedding (24 layers × 28 idle experts × 24,891,840 weights and biases each).
  const ParameterCount small = count_parameters(load_model("gpt-oss-20b", test_data()));
  EXPECT_EQ(small.total, 20'914'757'184);
  EXPECT_EQ(small.total - 24 * 28 * (small.experts_per_layer / 32) - small.embedding,
            3'608'307'264);
}

TEST(ModelStepFlops, TinyModelByHand) {
  const TransformerSpec spec = tiny_model();
  const std::int64_t n = 32;
  const StepFlops f = model_step_flops(spec, n);
  // P_matmul = 2 layers · (192 + 384) + lm_head 10·8 = 1232; dense = 6 · 32 · 1232.
  EXPECT_DOUBLE_EQ(f.dense, 6.0 * 32 * 1232);
  // attention = layers · 3.5 · 2·N²·H·d = 2 · 3.5 · 2 · 1024 · 8.
  EXPECT_DOUBLE_EQ(f.attention, 2 * 3.5 * 2 * 1024 * 8);
  EXPECT_DOUBLE_EQ(f.total(), f.dense + f.attention);
}

TEST(ModelStepFlops, SlidingWindowByHand) {
  // The band 0 ≤ q − k ≤ w of the n × n square: n·w − w²/2 (continuous positions, as n²/2 is
  // the causal area). n = 32, w = 8: 256 − 32 = 224 of the causal 512.
  EXPECT_DOUBLE_EQ(causal_window_area(32, 8), 224.0);
  EXPECT_DOUBLE_EQ(window_share(32, 8), 224.0 / 512.0);
  EXPECT_DOUBLE_EQ(causal_window_area(32, 32), 512.0);  // a window of the sequence: causal
  EXPECT_DOUBLE_EQ(causal_window_area(32, 100), 512.0);
  EXPECT_DOUBLE_EQ(window_share(32, 100), 1.0);

  TransformerSpec spec = tiny_model();  // 2 layers, H·d = 8
  spec.sliding_window = 8;
  spec.layer_attention = {LayerAttention::kSliding, LayerAttention::kFull};
  spec.validate();
  const StepFlops f = model_step_flops(spec, 32);
  // Per layer 3.5 · 4·H·d per visible pair: the full layer 512 pairs, the windowed one 224.
  EXPECT_DOUBLE_EQ(f.attention, 3.5 * 4 * 8 * (512.0 + 224.0));
  EXPECT_DOUBLE_EQ(f.dense, model_step_flops(tiny_model(), 32).dense);
}

TEST(ModelStepFlops, ChunkedAttentionByHand) {
  // n tokens in chunks of c: each full chunk c²/2 of the causal n²/2, the last r tokens r²/2.
  // n = 32, c = 8: 4 chunks of 32 = 128 of 512; n = 30, c = 8: 3·32 + 6²/2 = 114 of 450.
  EXPECT_DOUBLE_EQ(chunk_share(32, 8), 128.0 / 512.0);
  EXPECT_DOUBLE_EQ(chunk_share(30, 8), 114.0 / 450.0);
  EXPECT_DOUBLE_EQ(chunk_share(32, 32), 1.0);
  EXPECT_DOUBLE_EQ(chunk_share(32, 100), 1.0);

  TransformerSpec spec = tiny_model();  // 2 layers, H·d = 8
  spec.attention_chunk = 8;
  spec.layer_attention = {LayerAttention::kChunked, LayerAttention::kFull};
  spec.validate();
  EXPECT_TRUE(spec.mixed_attention());
  EXPECT_DOUBLE_EQ(model_step_flops(spec, 32).attention, 3.5 * 4 * 8 * (512.0 + 128.0));
  spec.attention_chunk = 0;
  EXPECT_THROW(spec.validate(), InputError);
}

// Llama-4-Scout's text model (REFERENCES.md [HF-config-llama4]): 107,769,861,120 parameters as
// transformers builds Llama4ForCausalLM (tests/models/test_hf_models.py), 17.17 B active per
// token (the model card's 17 B; its 109 B total adds the vision encoder).
TEST(ParameterCount, Llama4ScoutIsExact) {
  const TransformerSpec spec = load_model("llama-4-scout", test_data());
  const ParameterCount p = count_parameters(spec);
  EXPECT_EQ(p.total, 107'769'861'120);
  EXPECT_EQ(p.total - 48 * 15 * (p.experts_per_layer / 16), 17'172'894'720);
  EXPECT_EQ(spec.chunked_layers(), 36);
  EXPECT_EQ(spec.attention_chunk, 8192);
}

TEST(TransformerSpecValidate, LayerTypesMatchTheLayersAndNeedAWindow) {
  TransformerSpec spec = tiny_model();
  spec.layer_attention = {LayerAttention::kSliding};
  try {
    spec.validate();
    ADD_FAILURE() << "one type for two layers was accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "model.layer_types");
  }
  spec.layer_attention = {LayerAttention::kSliding, LayerAttention::kFull};
  try {
    spec.validate();
    ADD_FAILURE() << "a sliding layer without a window was accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "model.sliding_window");
  }
}

TEST(ModelStepFlops, TiedLmHeadStillCountsAndBiasesDoNot) {
  TransformerSpec spec = tiny_model();
  const double untied = model_step_flops(spec, 16).dense;
  spec.tied_embeddings = true;
  spec.qkv_bias = spec.output_proj_bias = spec.attention_sinks = true;
  spec.qk_norm = true;
  EXPECT_DOUBLE_EQ(model_step_flops(spec, 16).dense, untied);
}

TEST(ModelStepFlops, Llama3_8bMatchesTheSixNPRule) {
  const TransformerSpec spec = load_model("llama3-8b", test_data());
  const std::int64_t n = 8192;
  const StepFlops f = model_step_flops(spec, n);
  const ParameterCount p = count_parameters(spec);
  // Matmul weights: everything but the input embedding and the norms.
  const double matmul =
      static_cast<double>(p.total - p.embedding - p.final_norm - spec.layers * 2 * spec.hidden);
  EXPECT_DOUBLE_EQ(f.dense, 6.0 * n * matmul);
  EXPECT_DOUBLE_EQ(f.attention, 32 * 7.0 * n * n * 4096);
}

TEST(TransformerSpecValidate, NamesTheField) {
  const auto expect_field = [](TransformerSpec spec, const std::string& field) {
    try {
      spec.validate();
      ADD_FAILURE() << "accepted, expected error on " << field;
    } catch (const InputError& e) {
      EXPECT_EQ(e.field(), field);
    }
  };
  EXPECT_NO_THROW(tiny_model().validate());
  TransformerSpec s = tiny_model();
  s.layers = 0;
  expect_field(s, "model.num_hidden_layers");
  s = tiny_model();
  s.heads = -1;
  expect_field(s, "model.num_attention_heads");
  s = tiny_model();
  s.heads = 3;
  s.kv_heads = 2;
  expect_field(s, "model.num_key_value_heads");
  s = tiny_model();
  s.kv_heads = 4;  // more KV heads than query heads
  expect_field(s, "model.num_key_value_heads");
  s = tiny_model();
  s.vocab = std::int64_t{1} << 40;
  expect_field(s, "model.vocab_size");
  s = tiny_model();
  s.rope_theta = 0.0;
  expect_field(s, "model.rope_theta");
}

}  // namespace
}  // namespace cpsim::models
