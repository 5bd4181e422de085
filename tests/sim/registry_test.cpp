// The registry of CP implementations: every method has exactly one, and each one's validation,
// sequence multiple, search candidates, labels and launchers hold together.
#include <optional>
#include <set>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cpsim/sim/cp_method.hpp"
#include "cpsim/sim/schedule.hpp"

#include "helpers.hpp"

namespace cpsim::sim {
namespace {

using models::CpMethod;
using testing::inputs;

constexpr std::int64_t kM = 1 << 20;

TEST(Registry, OneImplementationPerMethodInListOrder) {
  std::set<CpMethod> seen;
  std::vector<std::string> names;
  for (const CpScheme* m : cp_schemes()) {
    EXPECT_TRUE(seen.insert(m->id()).second) << m->name();
    EXPECT_EQ(&cp_scheme(m->id()), m);
    EXPECT_EQ(models::parse_cp_method(m->name(), "--method"), m->id());
    names.emplace_back(m->name());
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{"ulysses", "upipe", "ring", "allgather", "fpdt", "usp"}));
}

TEST(Registry, EveryImplementationBuildsAndSearches) {
  for (const CpScheme* m : cp_schemes()) {
    SCOPED_TRACE(m->name());
    EXPECT_TRUE(m->has_ulysses_part() || m->has_ring_part());
    // A method no launcher runs says why (FPDT: Megatron-DeepSpeed's layers train another block).
    EXPECT_TRUE(!m->launchers().runs.empty() || !m->launchers().note.empty());
    EXPECT_EQ(m->report_color().size(), 7u);
    // Every candidate a search offers for 8 GPUs at 1M is valid and of this method.
    models::ParallelConfig base = inputs(m->id(), "llama3-8b", 8, kM).parallel;
    SearchSpace space;
    space.cp_degree = 8;
    space.heads = 32;
    space.seq_len = kM;
    std::vector<models::ParallelConfig> offered;
    m->search_candidates(base, space, offered);
    ASSERT_FALSE(offered.empty());
    for (const models::ParallelConfig& p : offered) {
      ScheduleInputs in = inputs(m->id(), "llama3-8b", 8, kM);
      in.parallel = p;
      const LayoutCheck checked = check_head_layout(in);
      EXPECT_FALSE(checked.issue) << m->label(LabelStyle::kSearch, p, nullptr) << ": "
                                  << checked.issue->message;
      EXPECT_EQ(in.parallel.seq_len % m->seq_multiple(p), 0);
      EXPECT_FALSE(m->label(LabelStyle::kDescription, p, &checked.layout).empty());
      // The layout is derived once and carried by the workload.
      EXPECT_EQ(build_step(in).layout.stages, checked.layout.stages);
    }
  }
}

TEST(Registry, SequenceMultiples) {
  models::ParallelConfig p = inputs(CpMethod::kRing, "llama3-8b", 8, kM).parallel;
  p.ring_degree = 8;
  EXPECT_EQ(cp_scheme(CpMethod::kRing).seq_multiple(p), 16);  // zigzag: 2C
  p.ring_layout = models::RingLayout::kContiguous;
  EXPECT_EQ(cp_scheme(CpMethod::kRing).seq_multiple(p), 8);
  models::ParallelConfig f = inputs(CpMethod::kFpdt, "llama3-8b", 8, kM).parallel;
  f.fpdt_chunk = 96 * 1024;
  EXPECT_EQ(cp_scheme(CpMethod::kFpdt).seq_multiple(f), 96 * 1024);
}

TEST(Registry, LauncherSentences) {
  const LauncherSupport ulysses = cp_scheme(CpMethod::kUlysses).launchers();
  EXPECT_TRUE(ulysses.runs_on("untied-ulysses"));
  EXPECT_FALSE(ulysses.runs_on("torchtitan"));
  EXPECT_EQ(ulysses.list(), "arctic, deepspeed, accelerate, megatron, nemo, untied-ulysses");
  EXPECT_THAT(cp_scheme(CpMethod::kFpdt).launchers().sentence(),
              ::testing::StartsWith("no launcher: Megatron-DeepSpeed's FPDT layers"));
  EXPECT_EQ(cp_scheme(CpMethod::kAllGather).launchers().sentence(),
            "torchtitan, torchtitan-0.2.2, torchtitan-0.2.1, torchtitan-main, megatron, nemo or "
            "accelerate");
  EXPECT_FALSE(cp_scheme(CpMethod::kRing).launchers().runs_on("torchtitan"));
  EXPECT_FALSE(cp_scheme(CpMethod::kRing).launchers().runs_on("torchtitan-0.2.2"));
  EXPECT_TRUE(cp_scheme(CpMethod::kRing).launchers().runs_on("torchtitan-0.2.1"));
  EXPECT_FALSE(cp_scheme(CpMethod::kRing).launchers().runs_on("torchtitan-main"));
}

// Every launcher of a method's table selects it; no other launcher does.
TEST(Registry, LauncherSelectionFollowsTheTable) {
  const ScheduleInputs in = inputs(CpMethod::kUlysses, "llama3-8b", 8, kM);
  for (const CpScheme* m : cp_schemes()) {
    for (const char* launcher : {"torchtitan", "torchtitan-main", "untied-ulysses", "deepspeed",
                                 "accelerate", "megatron", "arctic", "nemo"}) {
      const std::optional<LauncherSelection> s =
          m->launcher_selection(launcher, in.parallel, "fa3");
      EXPECT_EQ(s.has_value(), m->launchers().runs_on(launcher)) << m->name() << " " << launcher;
      if (s) {
        EXPECT_FALSE(s->selects.empty()) << m->name() << " " << launcher;
      }
    }
  }
}

TEST(Registry, LauncherSelectionDependsOnTheConfiguration) {
  models::ParallelConfig p = inputs(CpMethod::kUsp, "llama3-8b", 8, kM).parallel;
  const CpScheme& usp = cp_scheme(CpMethod::kUsp);
  p.ring_degree = 2;
  EXPECT_EQ(usp.launcher_selection("megatron", p, "fa3")->selects, "a2a+p2p");
  p.ring_degree = 1;
  const std::optional<LauncherSelection> a2a = usp.launcher_selection("megatron", p, "fa3");
  EXPECT_EQ(a2a->selects, "a2a");
  ASSERT_EQ(a2a->notes.size(), 1u);
  EXPECT_EQ(a2a->notes[0], "usp with ring degree 1 is plain a2a");
  p.ring_degree = 8;
  EXPECT_EQ(usp.launcher_selection("megatron", p, "fa3")->selects, "p2p");

  const CpScheme& ring = cp_scheme(CpMethod::kRing);
  EXPECT_EQ(ring.launcher_selection("untied-ulysses", p, "fa2")->selects, "usp");
  EXPECT_EQ(ring.launcher_selection("untied-ulysses", p, "sdpa")->selects, "torch_ring_alltoall");
  EXPECT_EQ(ring.launcher_selection("megatron", p, "sdpa")->selects, "p2p");
  EXPECT_FALSE(ring.launcher_selection("deepspeed", p, "fa3").has_value());
}

TEST(Registry, RefusalCarriesTheConfiguration) {
  ScheduleInputs in = inputs(CpMethod::kUPipe, "llama3-8b", 8, kM, 12);
  try {
    (void)build_step(in);
    FAIL() << "U = 12 accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.quantity(), Quantity::kHeadsPerStage);
    EXPECT_EQ(e.config().heads_per_stage, 12);
    EXPECT_EQ(std::string(e.what()), "U = 12 must be a positive multiple of the Ulysses degree 8");
  }
}

}  // namespace
}  // namespace cpsim::sim
