#include "cpsim/models/recipe.hpp"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cpsim/models/error.hpp"
#include "cpsim/models/io.hpp"
#include "cpsim/models/parallel.hpp"

namespace cpsim::models {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

json minimal_recipe() {
  return json{{"schema", "cpsim.recipe/1"}};
}

std::string error_field(const json& recipe) {
  try {
    parse_recipe(recipe.dump(), "r.json");
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    return e.field();
  }
  return "";
}

TEST(Recipe, BuiltInAlstMatchesTheDefaults) {
  const TrainingRecipe alst = load_recipe("alst", DataDir{CPSIM_TEST_DATA_DIR});
  const TrainingRecipe defaults;
  EXPECT_EQ(alst.name, "alst");
  EXPECT_FALSE(alst.description.empty());
  EXPECT_EQ(alst.param_bytes, defaults.param_bytes);
  EXPECT_EQ(alst.activation_bytes, defaults.activation_bytes);
  EXPECT_EQ(alst.master_param_bytes, defaults.master_param_bytes);
  EXPECT_EQ(alst.grad_bytes, defaults.grad_bytes);
  EXPECT_EQ(alst.grad_reduce_bytes, defaults.grad_reduce_bytes);
  EXPECT_EQ(alst.optimizer_state_bytes, defaults.optimizer_state_bytes);
  EXPECT_EQ(alst.optimizer, "adamw");
  EXPECT_EQ(alst.zero_stage, 3);
  EXPECT_EQ(alst.fsdp_prefetch_layers, 1);
  EXPECT_EQ(alst.checkpointing, CheckpointMode::kFull);
  EXPECT_TRUE(alst.checkpoint_offload);
  EXPECT_TRUE(alst.offload_keep_first_last);
  EXPECT_TRUE(alst.tiled_mlp);
  EXPECT_EQ(alst.tiled_mlp_shards, 0);
  EXPECT_TRUE(alst.tiled_norm);
  EXPECT_TRUE(alst.fused_loss);
  EXPECT_TRUE(alst.expandable_segments);
  EXPECT_EQ(alst.attention_kernel, "fa3");
  EXPECT_EQ(alst.rope_kernel, defaults.rope_kernel);
  // TorchTitan's Llama apply_rotary_emb; its Qwen3 model rotates with rotate_half.
  EXPECT_EQ(alst.rope_kernel_for("llama"), RopeKernel::kComplex);
  EXPECT_EQ(alst.rope_kernel_for("qwen3"), RopeKernel::kEager);
  EXPECT_EQ(alst.rope_kernel_for(""), RopeKernel::kComplex);
}

TEST(Recipe, RopeKernelPerModelType) {
  json r = minimal_recipe();
  r["rope_kernel"] = {{"default", "fused"}, {"qwen3", "eager"}, {"llama", "complex"}};
  const TrainingRecipe x = parse_recipe(r.dump(), "r.json");
  EXPECT_EQ(x.rope_kernel, RopeKernel::kFused);
  EXPECT_EQ(x.rope_kernel_for("qwen3"), RopeKernel::kEager);
  EXPECT_EQ(x.rope_kernel_for("llama"), RopeKernel::kComplex);
  EXPECT_EQ(x.rope_kernel_for("mistral"), RopeKernel::kFused);
  // One name for every model type: no exceptions listed.
  r["rope_kernel"] = "eager";
  const TrainingRecipe one = parse_recipe(r.dump(), "r.json");
  EXPECT_TRUE(one.rope_kernel_by_model_type.empty());
  EXPECT_EQ(one.rope_kernel_for("qwen3"), RopeKernel::kEager);
}

TEST(Recipe, ParsesEveryField) {
  const json recipe = json::parse(R"({
    "schema": "cpsim.recipe/1", "name": "plain", "description": "d",
    "precision": {"param_bytes": 4, "activation_bytes": 4, "master_param_bytes": 0,
                  "grad_bytes": 2, "grad_reduce_bytes": 2, "optimizer_state_bytes": 4},
    "optimizer": "sgd",
    "sharding": {"zero_stage": 1, "fsdp_prefetch_layers": 2, "reduce_bucket_elements": 1000,
                 "host_grad_partition_buffer": true},
    "activation_checkpointing": {"mode": "selective", "offload_to_host": false,
                                 "keep_first_last_on_gpu": false},
    "tiled_mlp": {"enabled": false, "shards": 4},
    "tiled_norm": false, "fused_loss": false, "rope_kernel": "eager",
    "allocator": {"expandable_segments": false},
    "attention_kernel": "cudnn"})");
  const TrainingRecipe r = parse_recipe(recipe.dump(), "plain.json");
  EXPECT_EQ(r.name, "plain");
  EXPECT_EQ(r.description, "d");
  EXPECT_EQ(r.param_bytes, 4);
  EXPECT_EQ(r.activation_bytes, 4);
  EXPECT_EQ(r.master_param_bytes, 0);
  EXPECT_EQ(r.grad_bytes, 2);
  EXPECT_EQ(r.grad_reduce_bytes, 2);
  EXPECT_EQ(r.optimizer_state_bytes, 4);
  EXPECT_EQ(r.optimizer, "sgd");
  EXPECT_EQ(r.zero_stage, 1);
  EXPECT_EQ(r.fsdp_prefetch_layers, 2);
  EXPECT_EQ(r.reduce_bucket_elements, 1000);
  EXPECT_TRUE(r.host_grad_partition_buffer);
  EXPECT_EQ(r.checkpointing, CheckpointMode::kSelective);
  EXPECT_FALSE(r.checkpoint_offload);
  EXPECT_FALSE(r.offload_keep_first_last);
  EXPECT_FALSE(r.tiled_mlp);
  EXPECT_EQ(r.tiled_mlp_shards, 4);
  EXPECT_FALSE(r.tiled_norm);
  EXPECT_FALSE(r.fused_loss);
  EXPECT_FALSE(r.expandable_segments);
  EXPECT_EQ(r.attention_kernel, "cudnn");
  EXPECT_EQ(r.rope_kernel, RopeKernel::kEager);
}

TEST(Recipe, Fp8IsOffByDefaultAndNeedsTeLinears) {
  EXPECT_FALSE(parse_recipe(minimal_recipe().dump(), "r.json").fp8);
  json on = minimal_recipe();
  on["precision"]["fp8"] = true;
  on["tiled_mlp"]["enabled"] = false;
  on["sharding"]["zero_stage"] = 1;
  TrainingRecipe r = parse_recipe(on.dump(), "r.json");
  EXPECT_TRUE(r.fp8);
  EXPECT_NO_THROW(r.validate());
  r.tiled_mlp = true;  // TiledMLP wraps Hugging Face's MLP, not TransformerEngine's Linear
  EXPECT_THROW(r.validate(), InputError);
  r.tiled_mlp = false;
  r.zero_stage = 3;
  try {
    r.validate();
    FAIL() << "ZeRO-3 with FP8";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "recipe.precision.fp8");
  }
}

// DeepSpeed's defaults, which the ALST recipes keep (their zero_optimization sets only stage and
// offload): reduce_bucket_size 5e8 (deepspeed/runtime/zero/config.py), gradient partitions with
// the offloaded optimizer.
TEST(Recipe, AlstDeepSpeedKeepsDeepSpeedBuffers) {
  const TrainingRecipe r = load_recipe("alst-deepspeed", DataDir{CPSIM_TEST_DATA_DIR});
  EXPECT_EQ(r.reduce_bucket_elements, 500000000);
  EXPECT_TRUE(r.host_grad_partition_buffer);
  EXPECT_EQ(TrainingRecipe{}.reduce_bucket_elements, 0);
  EXPECT_FALSE(TrainingRecipe{}.host_grad_partition_buffer);
  TrainingRecipe negative;
  negative.reduce_bucket_elements = -1;
  EXPECT_THROW(negative.validate(), InputError);
}

TEST(Recipe, AbsentKeysKeepTheDefaults) {
  const TrainingRecipe r = parse_recipe(minimal_recipe().dump(), "/tmp/mine.json");
  EXPECT_EQ(r.name, "mine");
  EXPECT_EQ(r.zero_stage, TrainingRecipe{}.zero_stage);
  EXPECT_EQ(r.checkpointing, CheckpointMode::kFull);
}

TEST(Recipe, RejectsUnknownKeysAndBadValues) {
  json r = minimal_recipe();
  r["tiled_mpl"] = true;  // typo
  EXPECT_EQ(error_field(r), "r.json:tiled_mpl");

  r = minimal_recipe();
  r["sharding"] = {{"zero", 3}};
  EXPECT_EQ(error_field(r), "r.json:sharding.zero");

  r = minimal_recipe();
  r["sharding"] = {{"zero_stage", 4}};
  EXPECT_EQ(error_field(r), "r.json:sharding.zero_stage");

  r = minimal_recipe();
  r["sharding"] = {{"zero_stage", "3"}};
  EXPECT_EQ(error_field(r), "r.json:sharding.zero_stage");

  r = minimal_recipe();
  r["sharding"] = 3;
  EXPECT_EQ(error_field(r), "r.json:sharding");

  r = minimal_recipe();
  r["activation_checkpointing"] = {{"mode", "partial"}};
  EXPECT_EQ(error_field(r), "r.json:activation_checkpointing.mode");

  r = minimal_recipe();
  r["precision"] = {{"param_bytes", 3}};
  EXPECT_EQ(error_field(r), "r.json:precision.param_bytes");

  r = minimal_recipe();
  r["tiled_mlp"] = {{"shards", -1}};
  EXPECT_EQ(error_field(r), "r.json:tiled_mlp.shards");

  r = minimal_recipe();
  r["fused_loss"] = "yes";
  EXPECT_EQ(error_field(r), "r.json:fused_loss");

  r = minimal_recipe();
  r["rope_kernel"] = "liger";
  EXPECT_EQ(error_field(r), "r.json:rope_kernel");
  r["rope_kernel"] = {{"qwen3", "eager"}};
  EXPECT_EQ(error_field(r), "r.json:rope_kernel.default");
  r["rope_kernel"] = {{"default", "eager"}, {"qwen3", "liger"}};
  EXPECT_EQ(error_field(r), "r.json:rope_kernel.qwen3");
  r["rope_kernel"] = {{"default", 3}};
  EXPECT_EQ(error_field(r), "r.json:rope_kernel.default");
  r["rope_kernel"] = 3;
  EXPECT_EQ(error_field(r), "r.json:rope_kernel");

  r = minimal_recipe();
  r["attention_kernel"] = "";
  EXPECT_EQ(error_field(r), "r.json:attention_kernel");

  r = minimal_recipe();
  r["schema"] = "cpsim.hardware/1";
  EXPECT_EQ(error_field(r), "r.json:schema");
  r.erase("schema");
  EXPECT_EQ(error_field(r), "r.json:schema");
}

TEST(Recipe, ValidateNamesTheField) {
  TrainingRecipe r;
  EXPECT_NO_THROW(r.validate());
  r.zero_stage = -1;
  try {
    r.validate();
    ADD_FAILURE() << "accepted zero_stage -1";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "recipe.sharding.zero_stage");
  }
  r = TrainingRecipe{};
  r.optimizer_state_bytes = 100;
  EXPECT_THROW(r.validate(), InputError);
}

TEST(CheckpointMode, ParseAndPrint) {
  for (const CheckpointMode m :
       {CheckpointMode::kNone, CheckpointMode::kSelective, CheckpointMode::kFull}) {
    EXPECT_EQ(parse_checkpoint_mode(to_string(m), "--ac"), m);
  }
  try {
    parse_checkpoint_mode("Full", "--ac");
    ADD_FAILURE() << "accepted 'Full'";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--ac");
    EXPECT_THAT(e.what(), HasSubstr("none, selective, full"));
  }
}

TEST(CpMethod, ParseAndPrint) {
  EXPECT_EQ(parse_cp_method("ulysses", "--method"), CpMethod::kUlysses);
  EXPECT_EQ(parse_cp_method("upipe", "--method"), CpMethod::kUPipe);
  EXPECT_STREQ(to_string(CpMethod::kUPipe), "upipe");
  for (const CpMethod m : {CpMethod::kUlysses, CpMethod::kUPipe, CpMethod::kRing,
                           CpMethod::kAllGather, CpMethod::kFpdt, CpMethod::kUsp}) {
    EXPECT_EQ(parse_cp_method(to_string(m), "--method"), m);
  }
  try {
    parse_cp_method("ring2", "--method");
    ADD_FAILURE() << "accepted 'ring2'";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--method");
    EXPECT_THAT(e.what(), HasSubstr("ulysses, upipe, ring, allgather, fpdt, usp"));
  }
  EXPECT_EQ(parse_ring_layout("zigzag", "--ring-layout"), RingLayout::kZigzag);
  EXPECT_THROW(parse_ring_layout("spiral", "--ring-layout"), InputError);
}

TEST(ParallelConfig, DerivedSizes) {
  ParallelConfig p;
  p.gpus = 16;
  p.cp_degree = 8;
  p.seq_len = 1 << 20;
  EXPECT_EQ(p.data_parallel(), 2);
  EXPECT_EQ(p.local_seq(), (1 << 20) / 8);
}

}  // namespace
}  // namespace cpsim::models
