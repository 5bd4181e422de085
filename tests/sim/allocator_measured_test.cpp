// The caching-allocator model against a measured trace: the allocations and frees of one
// Hugging Face Llama-3-8B training step at 16K tokens on an H200, recorded by PyTorch's allocator
// history (data/measurements/h200-2026-11-26/hf_llama3_8b_memory.json, "snapshot"), replayed in
// both modes and compared with the reserved peaks the same step reached:
//   - segments (the default), run 1: 49.48 GiB reserved;
//   - expandable segments, run 3: 47.29 GiB;
//   - 43.01 GiB allocated, 15.02 / 14.96 GiB of it before the step (weights).
// The condensed history keeps each event's size but not its address, so a free is matched to a
// live allocation of its size: the last one made (LIFO) or the first (FIFO). The test requires
// both matchings within 3 % of the measurement: the model's known omissions (listed in
// allocator.hpp) and the matching's ambiguity, not a fitted margin. Seen at this commit:
// segments 48.84 / 49.27 GiB, expandable 47.21 / 47.52 GiB.
#include <cmath>
#include <cstdint>
#include <deque>
#include <fstream>
#include <map>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cpsim/sim/allocator.hpp"

#include "helpers.hpp"

namespace cpsim::sim {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

nlohmann::json measurement() {
  const auto path =
      testing::data().root / "measurements" / "h200-2026-11-26" / "hf_llama3_8b_memory.json";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::json::parse(in);
}

// The snapshot's [allocate?, bytes, frame] events as allocator events, each free given the key of
// a live allocation of its size: the newest (lifo) or the oldest.
std::vector<AllocationEvent> events(const nlohmann::json& snapshot, bool lifo) {
  std::vector<AllocationEvent> out;
  std::map<std::int64_t, std::deque<std::int64_t>> live;
  std::int64_t next_key = 0;
  for (const auto& e : snapshot.at("events")) {
    const bool allocate = e.at(0).get<int>() == 1;
    const auto bytes = e.at(1).get<std::int64_t>();
    if (allocate) {
      live[bytes].push_back(next_key);
      out.push_back({next_key++, bytes, 0, 0, true});
      continue;
    }
    std::deque<std::int64_t>& same = live[bytes];
    EXPECT_FALSE(same.empty()) << "a free of " << bytes << " bytes with nothing of that size live";
    if (same.empty()) {
      continue;
    }
    const std::int64_t key = lifo ? same.back() : same.front();
    if (lifo) {
      same.pop_back();
    } else {
      same.pop_front();
    }
    out.push_back({key, bytes, 0, 0, false});
  }
  return out;
}

// The measured step at `seq` tokens of a run's file.
nlohmann::json step(const nlohmann::json& run, std::int64_t seq) {
  for (const auto& s : run.at("steps")) {
    if (s.at("seq").get<std::int64_t>() == seq) {
      return s;
    }
  }
  ADD_FAILURE() << "no step of " << seq << " tokens";
  return {};
}

TEST(AllocatorMeasured, ReplayOfAMeasuredStepMatchesItsReservedPeakInBothModes) {
  const nlohmann::json run1 = measurement();
  std::ifstream in3(testing::data().root / "measurements" / "h200-2026-11-26" /
                    "hf_llama3_8b_memory_expandable_segments.json");
  const nlohmann::json run3 = nlohmann::json::parse(in3);
  const nlohmann::json& snapshot = run1.at("snapshot");
  ASSERT_EQ(snapshot.at("seq").get<std::int64_t>(), 16384);
  const nlohmann::json default_step = step(run1, 16384);
  const nlohmann::json expandable_step = step(run3, 16384);

  for (const bool lifo : {true, false}) {
    SCOPED_TRACE(lifo ? "frees matched newest first" : "frees matched oldest first");
    const std::vector<AllocationEvent> log = events(snapshot, lifo);
    for (const auto& [mode, measured] :
         {std::pair{AllocatorMode::kSegments, default_step},
          std::pair{AllocatorMode::kExpandableSegments, expandable_step}}) {
      SCOPED_TRACE(mode == AllocatorMode::kSegments ? "segments" : "expandable segments");
      AllocatorConfig config;
      config.mode = mode;
      config.capacity_bytes = run1.at("device_memory_bytes").get<std::int64_t>();
      config.static_bytes = measured.at("static_bytes").get<std::int64_t>();
      const AllocatorReplay r = replay_allocator(log, 0, config);
      EXPECT_FALSE(r.out_of_memory);
      // The trace is run 1's: there the allocated peak is the measured one (the same blocks in
      // the same order). Run 3 started its step with 60 MB less allocated.
      if (mode == AllocatorMode::kSegments) {
        EXPECT_NEAR(static_cast<double>(r.peak_allocated_bytes) / kGiB,
                    measured.at("backward_peak_bytes").get<double>() / kGiB, 0.01);
      }
      const double reserved = static_cast<double>(r.peak_reserved_bytes);
      const double want = measured.at("reserved_peak_bytes").get<double>();
      EXPECT_LT(std::abs(reserved / want - 1.0), 0.03)
          << "replayed " << reserved / kGiB << " GiB, measured " << want / kGiB << " GiB";
    }
  }
}

}  // namespace
}  // namespace cpsim::sim
