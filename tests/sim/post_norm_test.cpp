// Norms after the attention and the MLP (TransformerSpec::post_sublayer_norms, Gemma 3): two more
// norm ops per block in the forward and in the backward, and the two sub-block outputs they read
// kept from the forward to the backward with what each norm saves.
#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "cpsim/sim/schedule.hpp"

#include "block_oracle.hpp"
#include "evaluate_step.hpp"
#include "helpers.hpp"

namespace cpsim::sim {
namespace {

using models::CpMethod;
using testing::inputs;
using testing::ops_named;
using testing::tensor_bytes;

constexpr std::int64_t kSeq = 64 * 1024;

TEST(PostSublayerNorms, TwoNormsMorePerBlockAndTheirInputsKept) {
  ScheduleInputs pre = inputs(CpMethod::kUlysses, "llama3-8b", 8, kSeq);
  pre.recipe.checkpointing = models::CheckpointMode::kNone;  // every block's tensors kept
  pre.recipe.checkpoint_offload = false;
  ScheduleInputs post = pre;
  post.model.post_sublayer_norms = true;

  const Workload w_pre = build_step(pre);
  const Workload w_post = build_step(post);
  const auto layers = static_cast<int>(pre.model.layers);
  for (const char* name :
       {"post_attn_norm", "post_mlp_norm", "post_attn_norm_bwd", "post_mlp_norm_bwd"}) {
    EXPECT_EQ(ops_named(w_pre, name), 0) << name;
    EXPECT_EQ(ops_named(w_post, name), layers) << name;
  }
  EXPECT_EQ(w_post.ops.size() - w_pre.ops.size(), static_cast<std::size_t>(4 * layers));

  // Saved per block: the attention output and the MLP output ([s/C, h] each) and, per norm, what
  // the recipe's norm keeps beyond its input (the same as the pre-norms': norm1_saved).
  const std::int64_t output_bytes = (kSeq / 8) * pre.model.hidden * pre.recipe.activation_bytes;
  const std::int64_t norm_saved = tensor_bytes(w_pre, "norm1_saved");
  const auto activations = static_cast<std::size_t>(MemCategory::kActivations);
  const StepReport r_pre = test::evaluate(pre).report;
  const StepReport r_post = test::evaluate(post).report;
  EXPECT_EQ(r_post.category_peak[activations] - r_pre.category_peak[activations],
            layers * 2 * (output_bytes + norm_saved));
  EXPECT_GT(r_post.step_time_s, r_pre.step_time_s);
}

TEST(PostSublayerNorms, RepeatedBlocksEqualBlocksBuiltOneByOne) {
  ScheduleInputs in = inputs(CpMethod::kUlysses, "llama3-8b", 8, kSeq);
  in.model.post_sublayer_norms = true;
  test::expect_repeated_blocks_equal_oracle(in);
}

}  // namespace
}  // namespace cpsim::sim
