// Sliding-window layers (TransformerSpec::layer_attention): the attention kernels of a windowed
// block are the causal block's scaled by models::window_share, nothing else changes, and what is
// not modelled is refused naming the quantity.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include <gtest/gtest.h>

#include "cpsim/models/transformer.hpp"
#include "cpsim/sim/engine.hpp"
#include "cpsim/sim/schedule.hpp"

#include "block_oracle.hpp"
#include "evaluate_step.hpp"
#include "helpers.hpp"

namespace cpsim::sim {
namespace {

using models::CpMethod;
using models::LayerAttention;
using testing::inputs;

constexpr std::int64_t kSeq = 256 * 1024;
constexpr std::int64_t kWindow = 32 * 1024;

bool is_attention(const Op& o) {
  return o.kind == OpKind::kAttentionFwd || o.kind == OpKind::kAttentionBwd;
}

ScheduleInputs windowed(ScheduleInputs in, const std::vector<LayerAttention>& pattern) {
  in.model.sliding_window = kWindow;
  in.model.layer_attention.clear();
  for (std::int64_t l = 0; l < in.model.layers; ++l) {
    in.model.layer_attention.push_back(pattern[static_cast<std::size_t>(l) % pattern.size()]);
  }
  return in;
}

// Op by op against the same step without a window: the attention kernels of windowed blocks
// last share × as long (to the nanosecond the durations are rounded to), every other op is the
// same. Returns the number of scaled ops.
int compare_with_causal(const ScheduleInputs& causal_in, const ScheduleInputs& window_in) {
  const double share = models::window_share(kSeq, kWindow);
  BuildOptions one_by_one;
  one_by_one.repeat_layers = false;  // the oracle: every block built on its own
  const Workload causal = build_step(causal_in, one_by_one);
  const Workload window = build_step(window_in, one_by_one);
  EXPECT_EQ(causal.ops.size(), window.ops.size());
  int scaled = 0;
  for (std::size_t i = 0; i < std::min(causal.ops.size(), window.ops.size()); ++i) {
    const Op& c = causal.ops[i];
    const Op& w = window.ops[i];
    const bool slides =
        c.layer >= 0 && window_in.model.attention_of(c.layer) == LayerAttention::kSliding;
    if (is_attention(c) && slides) {
      EXPECT_NEAR(static_cast<double>(w.duration_ns), share * static_cast<double>(c.duration_ns),
                  1.0)
          << "op " << i << " of block " << c.layer;
      EXPECT_DOUBLE_EQ(w.flops, share * c.flops);
      ++scaled;
    } else {
      EXPECT_EQ(w.duration_ns, c.duration_ns) << "op " << i;
    }
  }
  return scaled;
}

TEST(SlidingWindow, WindowedBlocksScaleTheirAttentionKernelsOnly) {
  const ScheduleInputs causal = inputs(CpMethod::kUlysses, "llama3-8b", 8, kSeq);
  const ScheduleInputs all = windowed(causal, {LayerAttention::kSliding});
  const int scaled_all = compare_with_causal(causal, all);
  // Forward, recomputation (full checkpointing) and backward kernels of 32 blocks.
  EXPECT_EQ(scaled_all % 32, 0);
  EXPECT_GE(scaled_all, 3 * 32);
  // Every other block windowed: half of them.
  const ScheduleInputs half = windowed(causal, {LayerAttention::kSliding, LayerAttention::kFull});
  EXPECT_EQ(compare_with_causal(causal, half), scaled_all / 2);
  // The window changes time, not memory.
  const StepReport c = test::evaluate(causal).report;
  const StepReport w = test::evaluate(all).report;
  EXPECT_EQ(w.peak_memory_bytes, c.peak_memory_bytes);
  EXPECT_LT(w.step_time_s, c.step_time_s);
}

TEST(SlidingWindow, UPipeStagesScaleToo) {
  const ScheduleInputs causal = inputs(CpMethod::kUPipe, "llama3-8b", 8, kSeq);
  EXPECT_GT(compare_with_causal(causal, windowed(causal, {LayerAttention::kSliding})), 0);
}

TEST(SlidingWindow, RepeatedBlocksEqualBlocksBuiltOneByOne) {
  // A window on every block keeps the block template; the simulated step equals the one built
  // block by block.
  const ScheduleInputs in =
      windowed(inputs(CpMethod::kUlysses, "llama3-8b", 8, kSeq), {LayerAttention::kSliding});
  test::expect_repeated_blocks_equal_oracle(in);
}

TEST(SlidingWindow, AllGatherCallsSeeTheWindowOfTheirPrefix) {
  // Zigzag over R = 8: position 0 holds chunks 0 and 15 of c = N/16 = 16K tokens and attends
  // (c queries, c keys) and (c queries, 16c keys), each bottom-right causal. With w = 8K < c:
  // the first covers c·w − w²/2, the second (its queries start at 15c ≥ w) c·w.
  constexpr std::int64_t c = kSeq / 16, w = 8 * 1024;
  ScheduleInputs in = inputs(CpMethod::kAllGather, "llama3-8b", 8, kSeq);
  in.parallel.ring_degree = 8;
  in.model.sliding_window = w;
  in.model.layer_attention.assign(static_cast<std::size_t>(in.model.layers),
                                  LayerAttention::kSliding);
  ASSERT_FALSE(check_head_layout(in).issue.has_value());
  BuildOptions every_rank;
  every_rank.all_ranks = true;
  const Workload work = build_step(in, every_rank);
  const double area = static_cast<double>(c * w - w * w / 2 + c * w);
  const double hd = static_cast<double>(in.model.q_width());
  bool found = false;
  for (const Op& o : work.ops) {
    if (o.rank == 0 && o.kind == OpKind::kAttentionFwd && o.layer == 0) {
      EXPECT_DOUBLE_EQ(o.flops, 4.0 * area * hd);
      found = true;
      break;
    }
  }
  EXPECT_TRUE(found);
  EXPECT_DOUBLE_EQ(models::window_share(c, c, w), (c * w - w * w / 2.0) / (c * c / 2.0));
  EXPECT_DOUBLE_EQ(models::window_share(c, 16 * c, w),
                   static_cast<double>(c * w) / (c * 16.0 * c - c * c / 2.0));
  EXPECT_DOUBLE_EQ(models::window_share(kSeq, kSeq, w), models::window_share(kSeq, w));
}

std::optional<ConfigIssue> issue_of(const ScheduleInputs& in) {
  return check_head_layout(in).issue;
}

TEST(SlidingWindow, WhatIsNotModelledIsRefusedNamingTheQuantity) {
  const std::vector<LayerAttention> all = {LayerAttention::kSliding};
  // A ring part or FPDT's chunks.
  ScheduleInputs ring = windowed(inputs(CpMethod::kRing, "llama3-8b", 8, kSeq), all);
  ring.parallel.ring_degree = 8;
  ASSERT_TRUE(issue_of(ring).has_value());
  EXPECT_EQ(issue_of(ring)->quantity, Quantity::kAttentionWindow);
  ScheduleInputs fpdt = windowed(inputs(CpMethod::kFpdt, "llama3-8b", 8, kSeq), all);
  ASSERT_TRUE(issue_of(fpdt).has_value());
  EXPECT_EQ(issue_of(fpdt)->quantity, Quantity::kAttentionWindow);
  // Implementations that do not pass the window, or pass it wrongly.
  ScheduleInputs upipe = windowed(inputs(CpMethod::kUPipe, "llama3-8b", 8, kSeq, 8), all);
  EXPECT_FALSE(issue_of(upipe).has_value()) << "the scheme alone takes the window";
  upipe.parallel.implementation = "untied-ulysses-upipe";
  ASSERT_TRUE(issue_of(upipe).has_value());
  EXPECT_EQ(issue_of(upipe)->quantity, Quantity::kAttentionWindow);
  ScheduleInputs ulysses = windowed(inputs(CpMethod::kUlysses, "llama3-8b", 8, kSeq), all);
  for (const char* impl : {"deepspeed-ulysses", "yunchang-usp", "megatron-core-cp"}) {
    ulysses.parallel.implementation = impl;
    EXPECT_FALSE(issue_of(ulysses).has_value()) << impl;
  }
  // SDPA takes a window as a mask tensor.
  ulysses.parallel.implementation = "none";
  ulysses.recipe.attention_kernel = "sdpa";
  ASSERT_TRUE(issue_of(ulysses).has_value());
  EXPECT_EQ(issue_of(ulysses)->quantity, Quantity::kAttentionWindow);
  // A window of the whole sequence hides nothing: the ring runs it.
  ScheduleInputs wide = ring;
  wide.model.sliding_window = kSeq;
  EXPECT_FALSE(issue_of(wide).has_value());
  // Pipeline stages of blocks that differ.
  ScheduleInputs stages = windowed(inputs(CpMethod::kUlysses, "llama3-8b", 8, kSeq),
                                   {LayerAttention::kSliding, LayerAttention::kFull});
  stages.parallel.pp_degree = 2;
  stages.parallel.cp_degree = 4;
  ASSERT_TRUE(issue_of(stages).has_value());
  EXPECT_EQ(issue_of(stages)->quantity, Quantity::kPpDegree);
}

// Chunked layers (Llama 4): a chunked block's attention kernels are the causal block's scaled by
// models::chunk_share, as a windowed block's by its window share; the rest of the step is the same.
ScheduleInputs chunked(ScheduleInputs in, const std::vector<LayerAttention>& pattern) {
  in = windowed(std::move(in), pattern);
  in.model.sliding_window = 0;
  in.model.attention_chunk = kWindow;
  return in;
}

TEST(ChunkedAttention, ChunkedBlocksScaleTheirAttentionKernelsOnly) {
  const ScheduleInputs causal = inputs(CpMethod::kUlysses, "llama3-8b", 8, kSeq);
  const ScheduleInputs every_other =
      chunked(causal, {LayerAttention::kChunked, LayerAttention::kFull});
  const double share = models::chunk_share(kSeq, kWindow);  // 8 chunks: 1/8
  EXPECT_DOUBLE_EQ(share, 0.125);
  BuildOptions one_by_one;
  one_by_one.repeat_layers = false;
  const Workload full = build_step(causal, one_by_one);
  const Workload half = build_step(every_other, one_by_one);
  ASSERT_EQ(full.ops.size(), half.ops.size());
  int scaled = 0;
  for (std::size_t i = 0; i < full.ops.size(); ++i) {
    const Op& c = full.ops[i];
    const Op& h = half.ops[i];
    if (is_attention(c) && c.layer >= 0 && c.layer % 2 == 0) {
      EXPECT_DOUBLE_EQ(h.flops, share * c.flops) << "op " << i;
      ++scaled;
    } else {
      EXPECT_EQ(h.duration_ns, c.duration_ns) << "op " << i;
    }
  }
  EXPECT_GE(scaled, 3 * 16);  // forward, recomputation and backward of 16 blocks
  // Every block chunked keeps the block template.
  test::expect_repeated_blocks_equal_oracle(chunked(causal, {LayerAttention::kChunked}));
}

TEST(ChunkedAttention, WhatIsNotModelledIsRefusedNamingTheQuantity) {
  const std::vector<LayerAttention> all = {LayerAttention::kChunked};
  ScheduleInputs ring = chunked(inputs(CpMethod::kRing, "llama3-8b", 8, kSeq), all);
  ring.parallel.ring_degree = 8;
  ASSERT_TRUE(issue_of(ring).has_value());
  EXPECT_EQ(issue_of(ring)->quantity, Quantity::kAttentionChunks);
  ScheduleInputs gathered = chunked(inputs(CpMethod::kAllGather, "llama3-8b", 8, kSeq), all);
  gathered.parallel.ring_degree = 8;
  ASSERT_TRUE(issue_of(gathered).has_value());
  EXPECT_EQ(issue_of(gathered)->quantity, Quantity::kAttentionChunks);
  // No implementation's code runs Llama 4's chunks; the scheme alone does, not through SDPA.
  ScheduleInputs ulysses = chunked(inputs(CpMethod::kUlysses, "llama3-8b", 8, kSeq), all);
  EXPECT_FALSE(issue_of(ulysses).has_value());
  for (const char* impl : {"deepspeed-ulysses", "yunchang-usp", "megatron-core-cp"}) {
    ulysses.parallel.implementation = impl;
    ASSERT_TRUE(issue_of(ulysses).has_value()) << impl;
    EXPECT_EQ(issue_of(ulysses)->quantity, Quantity::kAttentionChunks) << impl;
  }
  ulysses.parallel.implementation = "none";
  ulysses.recipe.attention_kernel = "sdpa";
  ASSERT_TRUE(issue_of(ulysses).has_value());
  EXPECT_EQ(issue_of(ulysses)->quantity, Quantity::kAttentionChunks);
  // Chunks of the whole sequence hide nothing.
  ScheduleInputs wide = ring;
  wide.model.attention_chunk = kSeq;
  EXPECT_FALSE(issue_of(wide).has_value());
}

}  // namespace
}  // namespace cpsim::sim
