// NCCL's memory in a step (StepBuilder::set_nccl_memory): one communicator per kind of group the
// step's collectives run over, plus the pipeline's neighbours, computed by hand from
// tests/models/nccl_memory_test.cpp's cases (8 H100s: 230 MiB at init, ring 288 MiB, NVLS 256
// MiB, an all-to-all peer 384 MiB).
#include <cstdint>

#include <gtest/gtest.h>

#include "cpsim/sim/pipeline.hpp"
#include "cpsim/sim/schedule.hpp"

#include "helpers.hpp"

namespace cpsim::sim {
namespace {

using models::CpMethod;
using testing::inputs;

constexpr std::int64_t kMiB = 1024 * 1024;

std::int64_t nccl_bytes(const ScheduleInputs& in) {
  const Workload w = build_step(in);
  return w.static_memory.front().nccl_bytes;
}

TEST(NcclCommunicators, UlyssesHoldsItsAllToAllAndZeroCommunicators) {
  // Ulysses (8 ranks): init 230 + 7 peers · 384 = 2918 MiB; ZeRO-3 over all 8: 774 MiB.
  const ScheduleInputs in = inputs(CpMethod::kUlysses, "llama3-8b", 8, 64 * 1024);
  EXPECT_EQ(nccl_bytes(in), (2918 + 774) * kMiB);
  const Workload w = build_step(in);
  EXPECT_EQ(w.static_memory.front().fixed_overhead_bytes,
            in.hardware.fixed_overhead_bytes() + (2918 + 774) * kMiB);
}

TEST(NcclCommunicators, RingHoldsItsNeighbours) {
  ScheduleInputs in = inputs(CpMethod::kRing, "llama3-8b", 8, 64 * 1024);
  in.parallel.ring_degree = 8;
  EXPECT_EQ(nccl_bytes(in), (230 + 384 + 774) * kMiB);
}

TEST(NcclCommunicators, PipelineStagesAddTheirNeighbours) {
  // 16 GPUs, PP 2 over nodes: a stage is 8 GPUs (Ulysses C8 and ZeRO over them, as above) and
  // sends to and receives from the other stage, on the other node: a communicator of 2 ranks on 2
  // nodes, init (2 + 3 · 16) · 2 MiB, and its only peer remote: the send and receive pools,
  // 2 · 16 channels · 16 steps · 128 KiB.
  ScheduleInputs in = inputs(CpMethod::kUlysses, "llama3-8b", 16, 64 * 1024);
  in.parallel.cp_degree = 8;
  in.parallel.pp_degree = 2;
  in.parallel.micro_batches = 2;
  in.recipe.zero_stage = 1;
  make_pipeline_stage(in, 1, PipelineStage::kWithOutputLayer);
  ASSERT_EQ(in.pipeline.stages, 2);
  EXPECT_EQ(nccl_bytes(in), (2918 + 774 + 100 + 64) * kMiB);
}

}  // namespace
}  // namespace cpsim::sim
