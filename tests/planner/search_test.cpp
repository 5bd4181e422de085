// maxlen against a brute-force scan, the binding constraint one step above, the plan against
// exhaustive simulation, and the memory lower bound against the simulator — on small models and
// a small GPU so that brute force is cheap.
#include "cpsim/planner/search.hpp"

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/io.hpp"
#include "cpsim/planner/maxlen.hpp"
#include "cpsim/sim/implementation.hpp"

namespace cpsim::planner {
namespace {

MaxLenOptions maxlen_options(std::int64_t granularity, int threads = 2) {
  MaxLenOptions o;
  o.granularity = granularity;
  o.threads = threads;
  return o;
}

// A whole evaluation with the caching allocator replayed: what a plan checks before it shows a
// candidate.
sim::StepReport evaluate_reserved(const sim::ScheduleInputs& in) {
  EvaluateOptions o;
  o.model_allocator = true;
  return evaluate(in, o).report;
}

using models::CpMethod;

const models::DataDir kData{CPSIM_TEST_DATA_DIR};

// A 0.3B-parameter Llama-style model on a GPU with 3 GiB so that limits fall at short lengths;
// without NCCL's memory (its communicators alone would take most of the 3 GiB; it has its own
// tests: nccl_memory_test.cpp, nccl_communicators_test.cpp).
sim::ScheduleInputs small(CpMethod method, int gpus) {
  sim::ScheduleInputs in;
  in.model.name = "tiny";
  in.model.layers = 8;
  in.model.hidden = 1024;
  in.model.heads = 16;
  in.model.kv_heads = 8;
  in.model.head_dim = 64;
  in.model.ffn_hidden = 2816;
  in.model.vocab = 32000;
  in.model.max_position_embeddings = 1 << 20;
  in.hardware = models::load_hardware("h100-sxm-80g", kData);
  in.hardware.hbm_capacity_bytes = 3LL << 30;
  in.hardware.nccl = {};
  in.hardware.attention_kernels["fa3"].head_dim = 64;
  in.recipe = models::load_recipe("alst", kData);
  in.parallel.method = method;
  in.parallel.gpus = gpus;
  in.parallel.gpus_per_node = 8;
  in.parallel.cp_degree = gpus;
  in.parallel.ring_degree = method == CpMethod::kRing || method == CpMethod::kAllGather ? gpus : 1;
  in.parallel.fpdt_chunk = 16 * 1024;
  in.parallel.seq_len = 16 * 1024;
  return in;
}

// One run, both reports: with allocated_report_too the report is what model_allocator alone gives
// and allocated_report what an evaluation without it gives (maxlen's likely answer).
TEST(EvaluationScratch, OneRunGivesTheReportWithAndWithoutTheAllocator) {
  EvaluationScratch scratch;
  for (const CpMethod m :
       {CpMethod::kFpdt, CpMethod::kUlysses, CpMethod::kUPipe, CpMethod::kRing}) {
    SCOPED_TRACE(models::to_string(m));
    sim::ScheduleInputs in = small(m, 8);
    in.parallel.seq_len = 64 * 1024;
    EvaluateOptions reserved;
    reserved.model_allocator = true;
    EvaluateOptions both = reserved;
    both.allocated_report_too = true;
    const sim::StepReport plain = evaluate(in).report;
    const sim::StepReport with_allocator = evaluate(in, reserved).report;
    const Evaluation e = evaluate(in, both, scratch);
    ASSERT_TRUE(e.allocated_report.has_value());
    EXPECT_TRUE(e.report.reserved_checked);
    EXPECT_EQ(e.report.reserved_peak_bytes, with_allocator.reserved_peak_bytes);
    EXPECT_EQ(e.report.allocator_cache_releases, with_allocator.allocator_cache_releases);
    EXPECT_EQ(e.report.gpu_headroom_bytes, with_allocator.gpu_headroom_bytes);
    EXPECT_EQ(e.report.fits(), with_allocator.fits());
    EXPECT_EQ(e.report.binding, with_allocator.binding);
    const sim::StepReport& a = *e.allocated_report;
    EXPECT_FALSE(a.reserved_checked);
    EXPECT_EQ(a.reserved_peak_bytes, 0);
    EXPECT_EQ(a.step_time_s, plain.step_time_s);
    EXPECT_EQ(a.peak_memory_bytes, plain.peak_memory_bytes);
    EXPECT_EQ(a.peak_op, plain.peak_op);
    EXPECT_EQ(a.gpu_headroom_bytes, plain.gpu_headroom_bytes);
    EXPECT_EQ(a.fits(), plain.fits());
    EXPECT_EQ(a.binding, plain.binding);
    EXPECT_EQ(a.events, plain.events);
    // Without model_allocator the option asks for nothing more.
    EvaluateOptions alone;
    alone.allocated_report_too = true;
    EXPECT_FALSE(evaluate(in, alone, scratch).allocated_report.has_value());
  }
}

bool fits_at(sim::ScheduleInputs in, std::int64_t n) {
  in.parallel.seq_len = n;
  return evaluate(in).report.fits();
}

// One scratch reused across evaluations of different sizes and methods (the larger first, so that
// every buffer holds stale contents) gives what fresh evaluations give, field by field.
TEST(EvaluationScratch, ReuseMatchesFreshEvaluations) {
  std::vector<sim::ScheduleInputs> configs;
  for (const CpMethod m : {CpMethod::kUPipe, CpMethod::kUlysses, CpMethod::kFpdt, CpMethod::kRing,
                           CpMethod::kAllGather, CpMethod::kUsp, CpMethod::kUPipe}) {
    sim::ScheduleInputs in = small(m, m == CpMethod::kUsp ? 16 : 8);
    if (m == CpMethod::kUsp) {
      in.parallel.ring_degree = 2;
    }
    in.parallel.seq_len = (m == CpMethod::kUPipe ? 64 : 32) * 1024;
    configs.push_back(in);
  }
  configs.back().recipe.checkpointing = models::CheckpointMode::kSelective;
  EvaluationScratch scratch;
  for (const sim::ScheduleInputs& in : configs) {
    const sim::StepReport fresh = evaluate(in).report;
    const sim::StepReport reused = evaluate(in, {}, scratch).report;
    SCOPED_TRACE(models::to_string(in.parallel.method));
    EXPECT_EQ(reused.step_time_s, fresh.step_time_s);
    EXPECT_EQ(reused.stream_busy_s, fresh.stream_busy_s);
    EXPECT_EQ(reused.exposed_comm_s, fresh.exposed_comm_s);
    EXPECT_EQ(reused.peak_memory_bytes, fresh.peak_memory_bytes);
    EXPECT_EQ(reused.peak_op, fresh.peak_op);
    EXPECT_EQ(reused.breakdown_at_peak, fresh.breakdown_at_peak);
    EXPECT_EQ(reused.category_peak, fresh.category_peak);
    EXPECT_EQ(reused.host_memory_bytes, fresh.host_memory_bytes);
    EXPECT_EQ(reused.ops, fresh.ops);
    EXPECT_EQ(reused.events, fresh.events);
    EXPECT_EQ(reused.notes, fresh.notes);
  }
}

TEST(MaxLen, MatchesBruteForceForEveryMethod) {
  for (const CpMethod m : {CpMethod::kUlysses, CpMethod::kUPipe, CpMethod::kRing,
                           CpMethod::kAllGather, CpMethod::kFpdt, CpMethod::kUsp}) {
    SCOPED_TRACE(models::to_string(m));
    sim::ScheduleInputs in = small(m, 4);
    if (m == CpMethod::kUsp)
      in.parallel.ring_degree = 2;
    MaxLenOptions o;
    o.granularity = 16 * 1024;
    o.check_reserved = false;  // the search on the allocated peak alone
    const MaxLenResult r = max_seq_len(in, o);
    ASSERT_GT(r.max_seq_len, 0);
    // Brute force: every multiple of the step up to twice the answer.
    std::int64_t brute = 0;
    for (std::int64_t n = r.step; n <= 2 * r.max_seq_len + r.step; n += r.step) {
      if (fits_at(in, n))
        brute = n;
    }
    EXPECT_EQ(r.max_seq_len, brute);
    EXPECT_TRUE(r.monotone);
    // Memory is close to linear in the length: the secant search lands next to the limit in a few
    // probes (1, 2, a leap of at most 8×, the line's prediction, its neighbours), where doubling
    // and bisection need about 2·log2(max / step).
    EXPECT_LE(r.evaluations, 9) << r.max_seq_len / r.step << " steps";
    // The binding constraint is what fails one step above.
    sim::ScheduleInputs above = in;
    above.parallel.seq_len = r.max_seq_len + r.step;
    const sim::StepReport rep = evaluate(above).report;
    ASSERT_EQ(r.binding.seq_len, r.max_seq_len + r.step);
    if (r.binding.kind == BindingConstraint::Kind::kGpuMemory) {
      EXPECT_GT(rep.peak_memory_bytes, rep.gpu_capacity_bytes);
      EXPECT_EQ(r.binding.used_bytes, rep.peak_memory_bytes);
      EXPECT_EQ(r.binding.op, rep.peak_op);
    } else {
      EXPECT_EQ(r.binding.kind, BindingConstraint::Kind::kHostMemory);
      EXPECT_FALSE(rep.fits_host);
    }
    EXPECT_EQ(r.headroom_bytes, r.at_max.gpu_capacity_bytes - r.at_max.peak_memory_bytes);

    // With the reserved memory checked at the answer (the default): the longest length whose
    // caching allocator fits, by brute force below the allocated answer.
    o.check_reserved = true;
    const MaxLenResult held = max_seq_len(in, o);
    std::int64_t held_brute = 0;
    for (std::int64_t n = r.step; n <= r.max_seq_len; n += r.step) {
      sim::ScheduleInputs at = in;
      at.parallel.seq_len = n;
      if (evaluate_reserved(at).fits())
        held_brute = n;
    }
    EXPECT_EQ(held.max_seq_len, held_brute);
    EXPECT_LE(held.max_seq_len, r.max_seq_len);
    EXPECT_TRUE(held.at_max.reserved_checked);
    EXPECT_EQ(held.binding.seq_len, held.max_seq_len + held.step);
    EXPECT_EQ(held.headroom_bytes,
              held.at_max.gpu_capacity_bytes - held.at_max.reserved_peak_bytes);
  }
}

// Speculative evaluation on a second thread changes nothing in the result, whatever the timing.
// The lengths asked depend on the thread count only after a failed long leap (with a helper the
// search asks the length the helper evaluated meanwhile), not on the timing: the same count on
// every run with two threads.
TEST(MaxLen, SameResultForAnyThreadCount) {
  for (const CpMethod m : {CpMethod::kUlysses, CpMethod::kUPipe, CpMethod::kRing,
                           CpMethod::kAllGather, CpMethod::kFpdt, CpMethod::kUsp}) {
    SCOPED_TRACE(models::to_string(m));
    sim::ScheduleInputs in = small(m, 4);
    if (m == CpMethod::kUsp)
      in.parallel.ring_degree = 2;
    const MaxLenResult one = max_seq_len(in, maxlen_options(16 * 1024, 1));
    const MaxLenResult first_two = max_seq_len(in, maxlen_options(16 * 1024, 2));
    for (int run = 0; run < 3; ++run) {
      const MaxLenResult two = max_seq_len(in, maxlen_options(16 * 1024, 2));
      EXPECT_EQ(two.max_seq_len, one.max_seq_len);
      EXPECT_EQ(two.step, one.step);
      EXPECT_EQ(two.evaluations, first_two.evaluations);
      EXPECT_EQ(two.monotone, one.monotone);
      EXPECT_EQ(two.warnings, one.warnings);
      EXPECT_EQ(two.headroom_bytes, one.headroom_bytes);
      EXPECT_EQ(two.binding.kind, one.binding.kind);
      EXPECT_EQ(two.binding.text, one.binding.text);
      EXPECT_EQ(two.binding.seq_len, one.binding.seq_len);
      EXPECT_EQ(two.binding.used_bytes, one.binding.used_bytes);
      EXPECT_EQ(two.at_max.step_time_s, one.at_max.step_time_s);
      EXPECT_EQ(two.at_max.peak_memory_bytes, one.at_max.peak_memory_bytes);
      EXPECT_EQ(two.at_max.peak_op, one.at_max.peak_op);
      EXPECT_EQ(two.at_max.host_memory_bytes, one.at_max.host_memory_bytes);
    }
  }
}

TEST(MaxLen, HostMemoryCanBind) {
  sim::ScheduleInputs in = small(CpMethod::kUlysses, 4);
  in.hardware.hbm_capacity_bytes = 80LL << 30;
  in.hardware.host_memory_bytes_per_node = 4LL << 30;  // checkpoints offloaded to a small host
  const MaxLenResult r = max_seq_len(in, maxlen_options(16 * 1024));
  EXPECT_EQ(r.binding.kind, BindingConstraint::Kind::kHostMemory);
  EXPECT_GT(r.max_seq_len, 0);
}

TEST(MaxLen, MarginAndRequiredMultiple) {
  sim::ScheduleInputs in = small(CpMethod::kRing, 4);
  EXPECT_EQ(required_multiple(in), 8);  // zigzag: 2·C
  const MaxLenResult plain = max_seq_len(in, maxlen_options(16 * 1024));
  in.margin.gpu_bytes = 512LL << 20;
  const MaxLenResult margin = max_seq_len(in, maxlen_options(16 * 1024));
  EXPECT_LT(margin.max_seq_len, plain.max_seq_len);
  EXPECT_GE(margin.headroom_bytes, 0);
  // The answer is checked on the reserved memory: it fits with the margin, one step more does not.
  EXPECT_TRUE(margin.at_max.reserved_checked);
  EXPECT_GE(margin.at_max.reserved_peak_bytes, margin.at_max.peak_memory_bytes);
  EXPECT_LE(margin.at_max.reserved_peak_bytes + in.margin.gpu_bytes,
            in.hardware.hbm_capacity_bytes);
  EXPECT_EQ(margin.headroom_bytes, in.hardware.hbm_capacity_bytes - in.margin.gpu_bytes -
                                       margin.at_max.reserved_peak_bytes);
  sim::ScheduleInputs longer = in;
  longer.parallel.seq_len = margin.max_seq_len + margin.step;
  EXPECT_FALSE(evaluate_reserved(longer).fits());
}

// A margin is kept against the reserved memory: a step whose reserved memory is R fits with a
// margin of capacity − R and not with one byte more; without the allocator model the allocated
// peak decides. The host margin likewise against the host peak.
TEST(Margin, DecidesOnReservedMemoryExactly) {
  sim::ScheduleInputs in = small(CpMethod::kUlysses, 4);
  in.parallel.seq_len = 32 * 1024;
  const sim::StepReport bare = evaluate_reserved(in);
  ASSERT_TRUE(bare.fits());
  ASSERT_GT(bare.reserved_peak_bytes, bare.peak_memory_bytes);
  in.margin.gpu_bytes = in.hardware.hbm_capacity_bytes - bare.reserved_peak_bytes;
  const sim::StepReport edge = evaluate_reserved(in);
  EXPECT_TRUE(edge.fits_gpu);
  EXPECT_EQ(edge.gpu_headroom_bytes, 0);
  in.margin.gpu_bytes += 1;
  const sim::StepReport over = evaluate_reserved(in);
  EXPECT_FALSE(over.fits_gpu);
  EXPECT_EQ(over.gpu_headroom_bytes, -1);
  EXPECT_NE(over.binding.find("reserved"), std::string::npos) << over.binding;
  // The allocated peak alone (no allocator model) still fits under that margin.
  const sim::StepReport allocated_only = evaluate(in).report;
  EXPECT_FALSE(allocated_only.reserved_checked);
  EXPECT_TRUE(allocated_only.fits_gpu);
  EXPECT_EQ(allocated_only.gpu_headroom_bytes,
            in.hardware.hbm_capacity_bytes - in.margin.gpu_bytes - bare.peak_memory_bytes);

  sim::ScheduleInputs host = small(CpMethod::kFpdt, 4);
  host.recipe.checkpoint_offload = true;
  host.parallel.seq_len = 64 * 1024;
  const sim::StepReport h = evaluate(host).report;
  ASSERT_GT(h.host_memory_bytes, 0);
  host.margin.host_bytes = h.host_capacity_bytes - h.host_memory_bytes;
  EXPECT_TRUE(evaluate(host).report.fits_host);
  host.margin.host_bytes += 1;
  EXPECT_FALSE(evaluate(host).report.fits_host);
}

// The candidates of a search at its one length (o.seq_len) whose inputs can run (heads divide, the
// recipe is consistent), with the memory bound and the simulated peak of each.
struct BoundAgainstPeak {
  sim::ScheduleInputs inputs;
  std::string label;
  std::int64_t bound_bytes;
  std::int64_t peak_bytes;
};

std::vector<BoundAgainstPeak> bounds_against_peaks(const sim::ScheduleInputs& base,
                                                   const PlanOptions& o) {
  std::vector<BoundAgainstPeak> out;
  for (const Candidate& c : enumerate_candidates(base, o)) {
    sim::ScheduleInputs in = c.inputs(base);
    in.parallel.seq_len = o.seq_len.value();
    try {
      (void)sim::derive_head_layout(in);
      in.recipe.validate();
    } catch (const sim::ConfigError&) {
      continue;
    } catch (const InputError&) {
      continue;
    }
    const std::int64_t bound = memory_lower_bound(in);
    const std::int64_t peak = evaluate(in).report.peak_memory_bytes;
    out.push_back({std::move(in), c.label, bound, peak});
  }
  return out;
}

// Every configuration the search enumerates (methods, degrees, AC and offload, tiling, loss, ZeRO)
// on two base recipes and for each MLP kernel, at two lengths: the bound never exceeds the
// simulated peak. It prunes, so a bound above the peak would drop a configuration that fits.
TEST(LowerBound, NeverAboveTheSimulatedPeak) {
  int compared = 0, binding = 0, pipelined = 0;
  for (const char* recipe : {"alst", "deepspeed-fpdt"}) {
    for (const auto mlp :
         {models::MlpKernel::kUnfused, models::MlpKernel::kFused, models::MlpKernel::kEager}) {
      for (const std::int64_t seq : {32 * 1024, 128 * 1024}) {
        sim::ScheduleInputs base = small(CpMethod::kUlysses, 4);
        base.recipe = models::load_recipe(recipe, kData);
        base.recipe.attention_kernel = "fa3";
        base.recipe.mlp_kernel = mlp;
        base.hardware.hbm_capacity_bytes = 1LL << 40;
        PlanOptions o;
        o.seq_len = seq;
        o.allow_data_parallel = true;
        for (const BoundAgainstPeak& b : bounds_against_peaks(base, o)) {
          EXPECT_LE(b.bound_bytes, b.peak_bytes)
              << recipe << " " << models::to_string(mlp) << " " << seq << " " << b.label;
          ++compared;
          pipelined += b.inputs.parallel.pp_degree > 1 ? 1 : 0;
          binding += 10 * b.bound_bytes >= 9 * b.peak_bytes ? 1 : 0;
        }
      }
    }
  }
  EXPECT_GT(compared, 1000);
  EXPECT_GT(pipelined, 100);  // the bound of pipelined steps (stage × in-flight) is tested too
  EXPECT_GT(binding, compared / 10);  // tight (within 10 %) for a good share, or it prunes little
}

// The same for a mixture of experts (every MLP tensor is k·s rows of an expert's width), with EP
// searched and a stated routing imbalance, where the ZeRO-3 block buffers hold only a rank's share
// of the experts.
TEST(LowerBound, NeverAboveTheSimulatedPeakWithExperts) {
  int compared = 0, expert_parallel = 0;
  for (const double imbalance : {1.0, 1.5}) {
    for (const std::int64_t seq : {32 * 1024, 128 * 1024}) {
      sim::ScheduleInputs base = small(CpMethod::kUlysses, 8);
      base.model.moe = {16, 4, 704, true};
      base.model.ffn_hidden = 2816;
      base.parallel.expert_imbalance = imbalance;
      base.parallel.implementation = "none";
      base.recipe.attention_kernel = "fa3";
      base.recipe.tiled_mlp = false;
      base.hardware.hbm_capacity_bytes = 1LL << 40;
      PlanOptions o;
      o.seq_len = seq;
      o.allow_data_parallel = true;
      o.methods = {CpMethod::kUlysses, CpMethod::kRing};
      for (const BoundAgainstPeak& b : bounds_against_peaks(base, o)) {
        EXPECT_LE(b.bound_bytes, b.peak_bytes) << imbalance << " " << seq << " " << b.label;
        ++compared;
        expert_parallel += b.inputs.parallel.ep_degree > 1 ? 1 : 0;
      }
    }
  }
  EXPECT_GT(compared, 100);
  EXPECT_GT(expert_parallel, 50);
}

// The same for what Megatron-LM's launcher runs (megatron-core-cp, Megatron's vocab-parallel loss
// on materialised logits: 6 bytes per logit in the bound, not 12; TP and PP with both pipeline
// stages' bounds).
TEST(LowerBound, NeverAboveTheSimulatedPeakAsMegatronRunsIt) {
  int compared = 0, pipelined = 0, megatron_loss = 0;
  for (const std::int64_t seq : {32 * 1024, 128 * 1024}) {
    sim::ScheduleInputs base = small(CpMethod::kRing, 8);
    base.hardware.hbm_capacity_bytes = 1LL << 40;
    base.recipe.attention_kernel = "fa3";
    PlanOptions o;
    o.seq_len = seq;
    o.allow_data_parallel = true;
    o.launcher = LauncherFormat::kMegatron;
    o.methods = {CpMethod::kRing, CpMethod::kUlysses, CpMethod::kUsp};
    for (const BoundAgainstPeak& b : bounds_against_peaks(base, o)) {
      EXPECT_LE(b.bound_bytes, b.peak_bytes) << seq << " " << b.label;
      ++compared;
      pipelined += b.inputs.parallel.pp_degree > 1 ? 1 : 0;
      megatron_loss +=
          !b.inputs.recipe.fused_loss && sim::logits_loss_peak_bytes_per_logit(b.inputs) == 6;
    }
  }
  EXPECT_GT(compared, 50);
  EXPECT_GT(pipelined, 10);
  EXPECT_GT(megatron_loss, 50);
}

// With FP8 the search keeps to untiled MLPs and ZeRO <= 2 (TransformerEngine's Linear layers with
// unsharded weights), and the bound, which counts the down projection's FP8 input, stays below the
// simulated peak.
TEST(LowerBound, Fp8NeverAboveTheSimulatedPeak) {
  int compared = 0;
  for (const std::int64_t seq : {32 * 1024, 128 * 1024}) {
    sim::ScheduleInputs base = small(CpMethod::kUlysses, 4);
    base.recipe.attention_kernel = "fa3";
    base.recipe.fp8 = true;
    base.recipe.tiled_mlp = false;
    base.recipe.zero_stage = 1;
    base.hardware.hbm_capacity_bytes = 1LL << 40;
    PlanOptions o;
    o.seq_len = seq;
    o.allow_data_parallel = true;
    for (const Candidate& c : enumerate_candidates(base, o)) {
      sim::ScheduleInputs in = c.inputs(base);
      in.parallel.seq_len = seq;
      EXPECT_FALSE(in.recipe.tiled_mlp) << c.label;
      EXPECT_LT(in.recipe.zero_stage, 3) << c.label;
      try {
        (void)sim::derive_head_layout(in);
      } catch (const sim::ConfigError&) {
        continue;
      }
      const std::int64_t bound = memory_lower_bound(in);
      const std::int64_t peak = evaluate(in).report.peak_memory_bytes;
      EXPECT_LE(bound, peak) << seq << " " << c.label;
      ++compared;
    }
  }
  EXPECT_GT(compared, 50);
}

// The plan's best at a fixed length equals the best of simulating every candidate.
TEST(Plan, SameOptimumAsExhaustiveSimulation) {
  const sim::ScheduleInputs base = small(CpMethod::kUlysses, 4);
  PlanOptions o;
  o.seq_len = 64 * 1024;
  o.threads = 2;
  o.allow_data_parallel = true;
  const PlanResult res = plan(base, o);
  ASSERT_FALSE(res.ranked.empty());
  EXPECT_GT(res.pruned, 0);
  double best = 0.0;
  std::set<std::string> best_labels;  // several when they tie (selective twins run alike)
  for (Candidate c : enumerate_candidates(base, o)) {
    c.parallel.seq_len = 64 * 1024;
    try {
      const sim::StepReport r = evaluate(c.inputs(base)).report;
      if (!r.fits() || !evaluate_reserved(c.inputs(base)).fits() || r.tokens_per_s_per_gpu < best) {
        continue;
      }
      if (r.tokens_per_s_per_gpu > best) {
        best = r.tokens_per_s_per_gpu;
        best_labels.clear();
      }
      best_labels.insert(c.label);
    } catch (const sim::ConfigError&) {
    } catch (const InputError&) {
    }
  }
  EXPECT_EQ(res.ranked.front().report.tokens_per_s_per_gpu, best);
  EXPECT_EQ(best_labels.count(res.ranked.front().label), 1U) << res.ranked.front().label;
  EXPECT_EQ(res.generated, res.refused + res.pruned + res.evaluated);
  // Pareto front members are not dominated; the best is on it.
  EXPECT_EQ(res.pareto.front().label, res.ranked.front().label);
  EXPECT_FALSE(res.why_best.empty());
}

// The plan stops simulating a configuration once it passes the GPU's memory: it still ranks
// exactly the configurations that fit, each with the report of a whole simulation.
// Progress: one call per work item, from the threads one at a time, counting up to every
// candidate that was neither refused before simulating nor pruned (stage groups count each of
// their candidates).
TEST(Plan, ReportsProgressUpToEveryEvaluation) {
  const sim::ScheduleInputs base = small(CpMethod::kUlysses, 4);
  for (const bool max_context : {false, true}) {
    SCOPED_TRACE(max_context ? "longest context" : "--seq");
    PlanOptions o;
    if (!max_context) {
      o.seq_len = 64 * 1024;
      o.allow_data_parallel = true;
    }
    o.threads = 2;
    std::vector<std::pair<std::int64_t, std::int64_t>> calls;
    o.on_progress = [&calls](std::int64_t done, std::int64_t total) {
      calls.emplace_back(done, total);
    };
    const PlanResult res = plan(base, o);
    ASSERT_FALSE(calls.empty());
    const std::int64_t total = calls.front().second;
    for (std::size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(calls[i].second, total);
      EXPECT_GT(calls[i].first, i == 0 ? 0 : calls[i - 1].first);
    }
    EXPECT_EQ(calls.back().first, total);
    EXPECT_GE(total, res.evaluated);
    EXPECT_LE(total, res.generated - res.pruned);
  }
}

TEST(Plan, RanksExactlyWhatFitsAlthoughOverfullRunsStopEarly) {
  const sim::ScheduleInputs base = small(CpMethod::kUlysses, 4);
  PlanOptions o;
  o.seq_len = 128 * 1024;
  o.threads = 1;
  o.allow_data_parallel = true;
  const PlanResult res = plan(base, o);
  std::map<std::string, sim::StepReport> fitting;
  int overfull = 0;
  for (Candidate c : enumerate_candidates(base, o)) {
    c.parallel.seq_len = *o.seq_len;
    try {
      const sim::StepReport r = evaluate(c.inputs(base)).report;
      if (r.fits()) {
        fitting.emplace(c.label, r);
      } else if (memory_lower_bound(c.inputs(base)) <= base.hardware.hbm_capacity_bytes &&
                 c.parallel.pp_degree == 1) {
        // (A pipeline's stage run stops only on the stage's own peak: the in-flight micro-batches
        // are added after it.)
        ++overfull;  // simulated by the plan, and stopped early
        EvaluateOptions stop;
        stop.stop_above_device_bytes = base.hardware.hbm_capacity_bytes;
        const sim::StepReport s = evaluate(c.inputs(base), stop).report;
        EXPECT_TRUE(s.stopped_early) << c.label;
        EXPECT_FALSE(s.fits()) << c.label;
        EXPECT_LT(s.events, r.events) << c.label;
      }
    } catch (const sim::ConfigError&) {
    } catch (const InputError&) {
    }
  }
  EXPECT_GT(overfull, 0);  // the case exercises early stops
  std::set<std::string> ranked;
  for (const Candidate& c : res.ranked) {
    SCOPED_TRACE(c.label);
    ranked.insert(c.label);
    ASSERT_EQ(fitting.count(c.label), 1U);
    const sim::StepReport& r = fitting.at(c.label);
    EXPECT_FALSE(c.report.stopped_early);
    EXPECT_EQ(c.report.step_time_s, r.step_time_s);
    EXPECT_EQ(c.report.peak_memory_bytes, r.peak_memory_bytes);
    EXPECT_EQ(c.report.events, r.events);
  }
  // What fits on its allocated peak and is not ranked failed its reserved-memory check.
  for (const auto& [label, r] : fitting) {
    if (ranked.count(label) == 0) {
      SCOPED_TRACE(label);
      for (Candidate c : enumerate_candidates(base, o)) {
        if (c.label == label) {
          c.parallel.seq_len = *o.seq_len;
          EXPECT_FALSE(evaluate_reserved(c.inputs(base)).fits());
        }
      }
    }
  }
  // The first of the ranking is checked on its reserved memory.
  ASSERT_FALSE(res.ranked.empty());
  EXPECT_TRUE(res.ranked.front().reserved_checked);
}

// The one-pass front against the definition (every pair compared), on ranked lists with ties in
// either key, in both modes.
TEST(Pareto, OnePassMatchesPairwiseDominance) {
  auto dominates = [](const Candidate& a, const Candidate& b, bool ctx) {
    const double ap = ctx ? static_cast<double>(a.max_seq_len) : a.report.tokens_per_s_per_gpu;
    const double bp = ctx ? static_cast<double>(b.max_seq_len) : b.report.tokens_per_s_per_gpu;
    const double aq = ctx ? a.report.tokens_per_s_per_gpu : -double(a.report.peak_memory_bytes);
    const double bq = ctx ? b.report.tokens_per_s_per_gpu : -double(b.report.peak_memory_bytes);
    return ap >= bp && aq >= bq && (ap > bp || aq > bq);
  };
  std::uint64_t state = 12345;
  auto next = [&state](int n) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<int>((state >> 33) % static_cast<std::uint64_t>(n));
  };
  for (const bool ctx : {false, true}) {
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<Candidate> ranked(static_cast<std::size_t>(1 + next(40)));
      for (std::size_t i = 0; i < ranked.size(); ++i) {
        ranked[i].label = std::to_string(i);
        ranked[i].max_seq_len = 65536 * (1 + next(5));  // few values: many ties
        ranked[i].report.tokens_per_s_per_gpu = 100.0 * (1 + next(6));
        ranked[i].report.peak_memory_bytes = std::int64_t{1} << (20 + next(6));
      }
      // The plan's order: primary descending, then throughput or peak, then label.
      std::stable_sort(ranked.begin(), ranked.end(), [ctx](const Candidate& a, const Candidate& b) {
        if (ctx && a.max_seq_len != b.max_seq_len)
          return a.max_seq_len > b.max_seq_len;
        if (a.report.tokens_per_s_per_gpu != b.report.tokens_per_s_per_gpu)
          return a.report.tokens_per_s_per_gpu > b.report.tokens_per_s_per_gpu;
        return a.report.peak_memory_bytes < b.report.peak_memory_bytes;
      });
      std::vector<std::string> expected;
      for (const Candidate& c : ranked) {
        bool dominated = false;
        for (const Candidate& d : ranked) {
          dominated = dominated || dominates(d, c, ctx);
        }
        if (!dominated)
          expected.push_back(c.label);
      }
      std::vector<std::string> got;
      for (const Candidate& c : pareto_front(ranked, ctx))
        got.push_back(c.label);
      EXPECT_EQ(got, expected) << "trial " << trial << (ctx ? " max context" : " at a length");
    }
  }
}

TEST(Plan, MaxContextPicksTheLongest) {
  const sim::ScheduleInputs base = small(CpMethod::kUlysses, 4);
  PlanOptions o;
  o.granularity = 16 * 1024;
  o.methods = {CpMethod::kUlysses, CpMethod::kUPipe, CpMethod::kRing};
  const PlanResult res = plan(base, o);
  ASSERT_FALSE(res.ranked.empty());
  for (const Candidate& c : res.ranked) {
    EXPECT_LE(c.max_seq_len, res.ranked.front().max_seq_len);
    // Each candidate's maximum is its own maxlen.
    EXPECT_EQ(c.max_seq_len, max_seq_len(c.inputs(base), maxlen_options(16 * 1024)).max_seq_len);
  }
  EXPECT_EQ(res.best_per_method.size(), 3U);
}

}  // namespace
}  // namespace cpsim::planner

namespace cpsim::planner {
namespace {

// Values the user fixed are kept by the enumeration (each for the methods that read it), and the
// rest is still searched: the count of what remains is derived by hand for 8 GPUs and 16 heads.
TEST(PlanConstraints, EnumerationKeepsWhatTheUserFixed) {
  sim::ScheduleInputs base = small(CpMethod::kUlysses, 8);
  PlanOptions o;
  o.seq_len = 64 * 1024;
  // Tensor parallelism: T divides the 8 GPUs of a node, the 16 heads, the 8 KV heads and the FFN
  // width 2816: 1, 2, 4, 8, each with the CP group over the 8 / T TP positions; --tp keeps one.
  std::set<int> tps;
  for (const Candidate& c : enumerate_candidates(base, o)) {
    tps.insert(c.parallel.tp_degree);
    EXPECT_EQ(c.parallel.cp_degree * c.parallel.tp_degree, 8) << c.label;
  }
  EXPECT_EQ(tps, (std::set<int>{1, 2, 4, 8}));
  o.fixed.tp_degree = 2;
  for (const Candidate& c : enumerate_candidates(base, o)) {
    EXPECT_EQ(c.parallel.tp_degree, 2) << c.label;
  }
  o.fixed.tp_degree = 1;  // the counts below are without TP
  const std::size_t all = enumerate_candidates(base, o).size();
  // Without consent to data parallelism every structure uses all 8 GPUs in one group; with it
  // the groups of 1, 2 and 4 GPUs are searched too.
  for (const Candidate& c : enumerate_candidates(base, o)) {
    EXPECT_EQ(c.parallel.cp_degree, 8) << c.label;
  }
  PlanOptions dp = o;
  dp.allow_data_parallel = true;
  EXPECT_GT(enumerate_candidates(base, dp).size(), all);
  // --cp-degree 4: every structure has C = 4 (dp 2), the user's own choice.
  o.fixed.cp_degree = 4;
  const std::vector<Candidate> c4 = enumerate_candidates(base, o);
  ASSERT_FALSE(c4.empty());
  EXPECT_LT(c4.size(), all);
  for (const Candidate& c : c4) {
    EXPECT_EQ(c.parallel.cp_degree, 4) << c.label;
  }
  // --heads-per-stage 8 for UPipe at C = 8 (u8 r1): U = 8 only, 32 recipes (2 ZeRO × 4 AC × tiled
  // × fused); with ZeRO and fused loss fixed as well: 4 AC × 2 tiled = 8.
  o = PlanOptions{};
  o.seq_len = 64 * 1024;
  o.fixed.tp_degree = 1;
  o.methods = {CpMethod::kUPipe};
  o.fixed.cp_degree = 8;
  o.fixed.ring_degree = 1;
  o.fixed.heads_per_stage = 8;
  std::vector<Candidate> upipe = enumerate_candidates(base, o);
  EXPECT_EQ(upipe.size(), 32u);
  for (const Candidate& c : upipe) {
    EXPECT_EQ(c.parallel.heads_per_stage, 8) << c.label;
    EXPECT_EQ(c.parallel.ring_degree, 1) << c.label;
  }
  base.recipe.zero_stage = 3;
  base.recipe.fused_loss = false;
  o.fixed.zero_stage = true;
  o.fixed.fused_loss = true;
  upipe = enumerate_candidates(base, o);
  EXPECT_EQ(upipe.size(), 8u);
  for (const Candidate& c : upipe) {
    EXPECT_EQ(c.recipe.zero_stage, 3) << c.label;
    EXPECT_FALSE(c.recipe.fused_loss) << c.label;
  }
  // --fpdt-chunk 32K: the FPDT structures all have that chunk; a chunk the method never proposes
  // (48K) is searched as given, alone, so that its refusal or result names it.
  o = PlanOptions{};
  o.seq_len = 256 * 1024;
  o.vary_recipe = false;
  o.methods = {CpMethod::kFpdt};
  o.fixed.cp_degree = 8;
  o.fixed.fpdt_chunk = 32 * 1024;
  std::vector<Candidate> fpdt = enumerate_candidates(base, o);
  ASSERT_EQ(fpdt.size(), 1u);
  EXPECT_EQ(fpdt.front().parallel.fpdt_chunk, 32 * 1024);
  o.fixed.fpdt_chunk = 48 * 1024;
  fpdt = enumerate_candidates(base, o);
  ASSERT_EQ(fpdt.size(), 1u);
  EXPECT_EQ(fpdt.front().parallel.fpdt_chunk, 48 * 1024);
  // A fixed Ulysses degree in the longest-context search: every CP degree is searched, and every
  // USP structure has u = 2.
  o = PlanOptions{};
  o.methods = {CpMethod::kUsp};
  o.fixed.ulysses_degree = 2;
  const std::vector<Candidate> usp = enumerate_candidates(base, o);
  ASSERT_FALSE(usp.empty());
  for (const Candidate& c : usp) {
    EXPECT_EQ(c.parallel.ulysses_degree(), 2) << c.label;
  }
}

// Pipeline parallelism in the search: P stages only where the step may grow to P micro-batches
// (data parallelism allowed at --seq, or a fixed --pp / --micro-batches), for the implementations
// that run it; 1F1B and interleaved with V dividing every stage's blocks; micro-batches P, 2P, 4P
// at --seq; P that does not divide the blocks with one block fewer on the first and last stages.
TEST(PlanConstraints, PipelineDegreesSchedulesAndMicroBatches) {
  sim::ScheduleInputs base = small(CpMethod::kAllGather, 8);  // 8 blocks; alst: allgather runs
  PlanOptions o;                                              // the scheme alone, which runs PP
  o.seq_len = 64 * 1024;
  o.methods = {CpMethod::kAllGather};
  o.vary_recipe = false;
  o.fixed.tp_degree = 1;
  for (const Candidate& c : enumerate_candidates(base, o)) {
    EXPECT_EQ(c.parallel.pp_degree, 1) << c.label;  // one sequence per step: no PP
  }
  o.allow_data_parallel = true;
  std::set<std::tuple<int, int, int>> seen;  // P, V, m
  for (const Candidate& c : enumerate_candidates(base, o)) {
    const auto& p = c.parallel;
    seen.emplace(p.pp_degree, p.virtual_stages, p.micro_batches);
    EXPECT_EQ(p.cp_degree * p.pp_degree * p.data_parallel(), 8) << c.label;
    EXPECT_EQ(c.stage_group >= 0, p.pp_degree > 1) << c.label;
  }
  // P = 2 (4 blocks a stage: V = 2, 4), P = 4 (2 blocks: V = 2); P = 8 leaves one GPU a stage,
  // and the all-gather proposes no CP group of one.
  const std::set<std::tuple<int, int, int>> expected = {
      {1, 1, 1}, {2, 1, 2}, {2, 1, 4}, {2, 1, 8}, {2, 2, 2},  {2, 2, 4}, {2, 2, 8}, {2, 4, 2},
      {2, 4, 4}, {2, 4, 8}, {4, 1, 4}, {4, 1, 8}, {4, 1, 16}, {4, 2, 4}, {4, 2, 8}, {4, 2, 16}};
  EXPECT_EQ(seen, expected);
  // A fixed PP degree is kept; a method whose implementation cannot run it stays, to be refused.
  o.fixed.pp_degree = 2;
  o.methods = {};
  o.allow_data_parallel = false;
  bool refusing = false;
  for (const Candidate& c : enumerate_candidates(base, o)) {
    EXPECT_EQ(c.parallel.pp_degree, 2) << c.label;
    EXPECT_EQ(c.parallel.micro_batches % 2, 0) << c.label;  // P, 2P, 4P micro-batches
    refusing = refusing || c.parallel.method == CpMethod::kUPipe;
  }
  EXPECT_TRUE(refusing);
  const PlanResult res = plan(base, o);
  EXPECT_GT(res.refused, 0);
  // 14 blocks over 4 stages: 3, 4, 4, 3.
  base.model.layers = 14;
  o = PlanOptions{};
  o.seq_len = 64 * 1024;
  o.methods = {CpMethod::kAllGather};
  o.vary_recipe = false;
  o.fixed.pp_degree = 4;
  const std::vector<Candidate> uneven = enumerate_candidates(base, o);
  ASSERT_FALSE(uneven.empty());
  for (const Candidate& c : uneven) {
    EXPECT_EQ(c.parallel.pp_first_stage_layers, 3) << c.label;
    EXPECT_EQ(c.parallel.pp_last_stage_layers, 3) << c.label;
  }
}

// Candidates that differ only in the schedule, V or the micro-batch count share one simulation of
// their stage: the plan runs two simulations per stage, and each composed step is the one
// evaluate() gives the candidate alone.
TEST(Plan, PipelineStagesSimulatedOncePerShape) {
  const sim::ScheduleInputs base = small(CpMethod::kAllGather, 8);
  PlanOptions o;
  o.seq_len = 32 * 1024;
  o.methods = {CpMethod::kAllGather};
  o.vary_recipe = false;
  o.fixed.pp_degree = 2;
  o.fixed.tp_degree = 1;
  o.fixed.cp_degree = 4;
  o.threads = 2;
  const PlanResult res = plan(base, o);
  // One structure (C 4, P 2): 1F1B and V = 2, 4, each with m = 2, 4, 8: nine candidates, one stage.
  EXPECT_EQ(res.generated, 9);
  EXPECT_EQ(res.evaluated, 9);
  // Two stage simulations, then one reserved-memory check per candidate shown; without sharing
  // the stage it would take 18 before any check.
  int checked = 0;
  for (const Candidate& c : res.ranked) {
    checked += c.reserved_checked ? 1 : 0;
  }
  EXPECT_GE(res.simulations, 2 + checked);
  EXPECT_LE(res.simulations, 2 + 9);
  ASSERT_FALSE(res.ranked.empty());
  for (const Candidate& c : res.ranked) {
    if (c.reserved_checked) {
      continue;  // its report is the allocator's run
    }
    const sim::StepReport alone = evaluate(c.inputs(base)).report;
    EXPECT_EQ(c.report.step_time_s, alone.step_time_s) << c.label;
    EXPECT_EQ(c.report.peak_memory_bytes, alone.peak_memory_bytes) << c.label;
  }
  // The largest m and V leave the smallest bubble: the best.
  EXPECT_EQ(res.ranked.front().parallel.micro_batches, 8);
}

// UPipe and FPDT (several chunks) keep the same blocks under selective checkpointing as without:
// each such candidate takes the simulation of its twin without checkpointing, and its report is
// the one a simulation of its own gives; with pipeline parallelism, the stage's.
TEST(Plan, SelectiveTwinsShareOneSimulation) {
  sim::ScheduleInputs base = small(CpMethod::kUPipe, 8);
  base.recipe.name = "none";  // the methods' schemes, each with pipeline parallelism
  base.parallel.implementation = "none";
  for (const int pp : {1, 0}) {
    SCOPED_TRACE(pp == 1 ? "PP 1" : "PP searched");
    PlanOptions o;
    o.seq_len = 64 * 1024;
    o.methods = {CpMethod::kUPipe, CpMethod::kFpdt};
    o.threads = 2;
    o.allow_data_parallel = true;
    o.fixed.pp_degree = pp;
    const PlanResult res = plan(base, o);
    std::map<std::string, const Candidate*> by_label;
    int pipelined = 0, checked = 0;
    for (const Candidate& c : res.ranked) {
      by_label.emplace(c.label, &c);
      pipelined += c.parallel.pp_degree > 1 ? 1 : 0;
      checked += c.reserved_checked ? 1 : 0;
    }
    EXPECT_EQ(pipelined > 0, pp == 0);
    int twins = 0;
    for (const Candidate& c : res.ranked) {
      if (c.recipe.checkpointing != models::CheckpointMode::kSelective) {
        continue;
      }
      std::string label = c.label;
      label.replace(label.find("ac selective"), 12, "ac none");
      const auto twin = by_label.find(label);
      ASSERT_NE(twin, by_label.end()) << c.label;
      twins += 1;
      for (const Candidate* x : {&c, twin->second}) {
        if (x->reserved_checked) {
          continue;  // its report is the allocator's run
        }
        const sim::StepReport alone = evaluate(x->inputs(base)).report;
        EXPECT_EQ(x->report.step_time_s, alone.step_time_s) << x->label;
        EXPECT_EQ(x->report.peak_memory_bytes, alone.peak_memory_bytes) << x->label;
      }
    }
    EXPECT_GT(twins, 10);
    if (pp == 1) {
      // One simulation per candidate and per check of one shown, but one per pair of twins (at
      // least those that fit).
      EXPECT_LE(res.simulations, res.evaluated - twins + checked);
    }
  }
}

}  // namespace
}  // namespace cpsim::planner

namespace cpsim::planner {
namespace {

// --emit searches what the launcher's file runs: only its methods, each recipe as the file makes
// it run (TorchTitan's TOML has no key for checkpoint offload, tiled MLP or a fused loss), each
// configuration once; and what a launcher runs, it runs again unchanged.
TEST(PlanAsLauncherRuns, TorchTitanSearchesOnlyWhatItsTomlRuns) {
  const sim::ScheduleInputs base = small(CpMethod::kUlysses, 8);
  PlanOptions o;
  o.seq_len = 64 * 1024;
  o.launcher = LauncherFormat::kTorchTitan021;
  const std::vector<Candidate> cands = enumerate_candidates(base, o);
  ASSERT_FALSE(cands.empty());
  std::set<std::string> labels;
  for (const Candidate& c : cands) {
    EXPECT_TRUE(c.parallel.method == CpMethod::kRing || c.parallel.method == CpMethod::kAllGather)
        << c.label;
    EXPECT_FALSE(c.recipe.tiled_mlp) << c.label;
    EXPECT_FALSE(c.recipe.fused_loss) << c.label;
    EXPECT_FALSE(c.recipe.checkpoint_offload &&
                 c.recipe.checkpointing == models::CheckpointMode::kFull)
        << c.label;
    EXPECT_TRUE(labels.insert(c.label).second) << "twice: " << c.label;
  }
  // ZeRO 3/2 × AC full, selective, none (offload gone) × one tiling × one loss, per structure.
  EXPECT_EQ(cands.size() % 6, 0u);
}

TEST(PlanAsLauncherRuns, EveryLauncherRunsItsOwnRecipeUnchanged) {
  for (const LauncherFormat f :
       {LauncherFormat::kTorchTitan, LauncherFormat::kTorchTitan022, LauncherFormat::kTorchTitan021,
        LauncherFormat::kTorchTitanMain, LauncherFormat::kUntiedUlysses, LauncherFormat::kDeepSpeed,
        LauncherFormat::kAccelerate, LauncherFormat::kMegatron, LauncherFormat::kArctic}) {
    for (const CpMethod m : {CpMethod::kUlysses, CpMethod::kRing, CpMethod::kFpdt}) {
      sim::ScheduleInputs in = small(m, 8);
      in.recipe.attention_kernel = "cudnn";
      const RecipeAsRun once = recipe_as_run(f, in);
      in.recipe = once.recipe;
      const RecipeAsRun twice = recipe_as_run(f, in);
      EXPECT_TRUE(twice.changes.empty()) << to_string(f) << " " << models::to_string(m);
    }
  }
  // Megatron-LM's distributed optimizer: ZeRO-3 runs as ZeRO-1, and says so.
  sim::ScheduleInputs in = small(CpMethod::kRing, 8);
  const RecipeAsRun megatron = recipe_as_run(LauncherFormat::kMegatron, in);
  EXPECT_EQ(megatron.recipe.zero_stage, 1);
  EXPECT_FALSE(megatron.changes.empty());
}

}  // namespace
}  // namespace cpsim::planner

namespace cpsim::planner {
namespace {

// The implementation a launcher runs: the recipe's default where it runs there, else the first
// implementation of the method on that launcher, else the scheme alone; one asked for is kept.
TEST(PlanAsLauncherRuns, ImplementationOfTheLauncher) {
  sim::ScheduleInputs ulysses = small(CpMethod::kUlysses, 8);  // recipe alst
  EXPECT_EQ(implementation_run_by(LauncherFormat::kArctic, ulysses), "deepspeed-ulysses");
  EXPECT_EQ(implementation_run_by(LauncherFormat::kUntiedUlysses, ulysses), "yunchang-usp");
  EXPECT_EQ(implementation_run_by(LauncherFormat::kMegatron, ulysses), "megatron-core-cp");
  EXPECT_EQ(implementation_run_by(LauncherFormat::kDeepSpeed, ulysses), "none");
  const sim::ScheduleInputs ring = small(CpMethod::kRing, 8);
  EXPECT_EQ(implementation_run_by(LauncherFormat::kTorchTitan021, ring), "torch-native-cp");
  ulysses.parallel.implementation = "none";
  EXPECT_EQ(implementation_run_by(LauncherFormat::kArctic, ulysses), "none");
}

}  // namespace
}  // namespace cpsim::planner
