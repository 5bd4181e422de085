// Speed of the planner: `maxlen` for Llama-3-8B on 8 GPUs per method (recipe alst), as the CLI
// runs it and on one thread, and per implementation with its default recipe (target ≤ 50 ms each),
// `plan --seq 1M` over every method on 8 GPUs, and the same plan on 8, 16, 32 and 64 GPUs: 213,920
// configurations with the pipeline search (target: ≥ 10k configurations per second on 2 cores),
// and Llama-3-70B on 1024 GPUs over TP × PP × CP × DP (BM_Plan1024Gpus); 1,000 packed batches
// per load balancer (BM_PackedBatches, target ≤ 1 s).
#include <algorithm>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "cpsim/models/documents.hpp"
#include "cpsim/models/io.hpp"
#include "cpsim/planner/batches.hpp"
#include "cpsim/planner/maxlen.hpp"
#include "cpsim/planner/search.hpp"
#include "cpsim/sim/implementation.hpp"

namespace {

using namespace cpsim;

const models::DataDir kData{CPSIM_TEST_DATA_DIR};

sim::ScheduleInputs base(models::CpMethod method) {
  sim::ScheduleInputs in;
  in.model = models::load_model("llama3-8b", kData);
  in.hardware = models::load_hardware("h100-sxm-80g", kData);
  in.recipe = models::load_recipe("alst", kData);
  in.parallel.method = method;
  in.parallel.gpus = 8;
  in.parallel.cp_degree = 8;
  in.parallel.ring_degree =
      method == models::CpMethod::kRing || method == models::CpMethod::kAllGather ? 8
      : method == models::CpMethod::kUsp                                          ? 2
                                                                                  : 1;
  in.parallel.seq_len = 1 << 20;
  return in;
}

// maxlen of one method (the argument) as `cpsim maxlen` runs it (MaxLenOptions defaults: a second
// thread evaluates the likely next length), and with one thread.
void run_max_len(benchmark::State& state, int threads) {
  const auto method = static_cast<models::CpMethod>(state.range(0));
  const sim::ScheduleInputs in = base(method);
  planner::MaxLenOptions o;
  if (threads > 0) {
    o.threads = threads;
  }
  int evaluations = 0;
  for (auto _ : state) {
    const planner::MaxLenResult r = planner::max_seq_len(in, o);
    evaluations += r.evaluations;
    benchmark::DoNotOptimize(r.max_seq_len);
  }
  state.SetLabel(models::to_string(method));
  state.counters["simulations_per_s"] =
      benchmark::Counter(static_cast<double>(evaluations), benchmark::Counter::kIsRate);
}

void BM_MaxLen(benchmark::State& state) {
  run_max_len(state, 0);
}
BENCHMARK(BM_MaxLen)
    ->Arg(static_cast<int>(models::CpMethod::kUPipe))
    ->Arg(static_cast<int>(models::CpMethod::kUlysses))
    ->Arg(static_cast<int>(models::CpMethod::kRing))
    ->Arg(static_cast<int>(models::CpMethod::kFpdt))
    ->Arg(static_cast<int>(models::CpMethod::kAllGather))
    ->Arg(static_cast<int>(models::CpMethod::kUsp))
    ->Unit(benchmark::kMillisecond);

void BM_MaxLenOneThread(benchmark::State& state) {
  run_max_len(state, 1);
}
BENCHMARK(BM_MaxLenOneThread)
    ->Arg(static_cast<int>(models::CpMethod::kUPipe))
    ->Arg(static_cast<int>(models::CpMethod::kUlysses))
    ->Arg(static_cast<int>(models::CpMethod::kRing))
    ->Arg(static_cast<int>(models::CpMethod::kFpdt))
    ->Arg(static_cast<int>(models::CpMethod::kAllGather))
    ->Arg(static_cast<int>(models::CpMethod::kUsp))
    ->Unit(benchmark::kMillisecond);

// The inputs of one implementation as
// `cpsim maxlen --model llama3-8b --gpus 8 --impl NAME --recipe R` runs it: R is the recipe it is
// the default of (alst for megatron-core-cp, which is no recipe's default), the method the
// implementation's first, the degrees the CLI's (ring-only methods: ring degree 8; otherwise
// Ulysses 8 within the node).
sim::ScheduleInputs implementation_inputs(const sim::Implementation& impl) {
  const models::CpMethod method = impl.methods().front();
  std::string recipe = "alst";
  for (const char* r : {"alst", "alst-deepspeed", "torch-native", "deepspeed-fpdt"}) {
    if (impl.default_for(r, method)) {
      recipe = r;
      break;
    }
  }
  sim::ScheduleInputs in = base(method);
  in.recipe = models::load_recipe(recipe, kData);
  in.parallel.implementation = std::string(impl.name());
  in.parallel.ring_degree = sim::cp_scheme(method).has_ulysses_part() ? 1 : 8;
  return in;
}

// maxlen of one implementation (the argument: its index in sim::implementations()) as the CLI
// runs it, and with one thread.
void run_max_len_impl(benchmark::State& state, int threads) {
  const auto all = sim::implementations();
  if (static_cast<std::size_t>(state.range(0)) >= all.size()) {
    state.SkipWithError("no implementation with this index");
    return;
  }
  const sim::Implementation& impl = *all[static_cast<std::size_t>(state.range(0))];
  const sim::ScheduleInputs in = implementation_inputs(impl);
  planner::MaxLenOptions o;
  if (threads > 0) {
    o.threads = threads;
  }
  int evaluations = 0;
  std::int64_t max_seq_len = 0;
  for (auto _ : state) {
    const planner::MaxLenResult r = planner::max_seq_len(in, o);
    evaluations += r.evaluations;
    max_seq_len = r.max_seq_len;
    benchmark::DoNotOptimize(r.max_seq_len);
  }
  state.SetLabel(std::string(impl.name()) + " / " + in.recipe.name);
  state.counters["max_seq_len"] = static_cast<double>(max_seq_len);
  state.counters["simulations_per_s"] =
      benchmark::Counter(static_cast<double>(evaluations), benchmark::Counter::kIsRate);
}

void BM_MaxLenImpl(benchmark::State& state) {
  run_max_len_impl(state, 0);
}
// One run per registered implementation.
const int kLastImplementation = static_cast<int>(sim::implementations().size()) - 1;

BENCHMARK(BM_MaxLenImpl)->DenseRange(0, kLastImplementation)->Unit(benchmark::kMillisecond);

void BM_MaxLenImplOneThread(benchmark::State& state) {
  run_max_len_impl(state, 1);
}
BENCHMARK(BM_MaxLenImplOneThread)
    ->DenseRange(0, kLastImplementation)
    ->Unit(benchmark::kMillisecond);

void BM_PlanSeq1M(benchmark::State& state) {
  const sim::ScheduleInputs in = base(models::CpMethod::kUlysses);
  planner::PlanOptions o;
  o.seq_len = 1 << 20;
  o.threads = 2;
  o.allow_data_parallel = true;  // every CP degree, as `--allow-data-parallel`
  std::int64_t configurations = 0;
  for (auto _ : state) {
    const planner::PlanResult r = planner::plan(in, o);
    configurations += r.generated;
    benchmark::DoNotOptimize(r.ranked.size());
  }
  state.counters["configurations_per_s"] =
      benchmark::Counter(static_cast<double>(configurations), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_PlanSeq1M)->Unit(benchmark::kMillisecond)->UseRealTime();

// `plan --seq 1M` for Llama-3-8B on 8, 16, 32 and 64 GPUs, 2 threads: 213,920 configurations over
// TP × PP × CP × DP × micro-batches and the recipe knobs (33,152 before the pipeline search), most
// refused or pruned by the memory lower bound before simulating.
void BM_PlanSweepGpus(benchmark::State& state) {
  planner::PlanOptions o;
  o.seq_len = 1 << 20;
  o.threads = 2;
  o.allow_data_parallel = true;
  std::vector<sim::ScheduleInputs> bases;
  for (const int gpus : {8, 16, 32, 64}) {
    sim::ScheduleInputs in = base(models::CpMethod::kUlysses);
    in.parallel.gpus = gpus;
    in.parallel.cp_degree = gpus;
    bases.push_back(in);
  }
  std::int64_t configurations = 0, simulations = 0;
  for (auto _ : state) {
    for (const sim::ScheduleInputs& in : bases) {
      const planner::PlanResult r = planner::plan(in, o);
      configurations += r.generated;
      simulations += r.simulations;
      benchmark::DoNotOptimize(r.ranked.size());
    }
  }
  state.counters["configurations_per_s"] =
      benchmark::Counter(static_cast<double>(configurations), benchmark::Counter::kIsRate);
  state.counters["simulations_per_s"] =
      benchmark::Counter(static_cast<double>(simulations), benchmark::Counter::kIsRate);
  state.counters["configurations"] =
      static_cast<double>(configurations) /
      static_cast<double>(std::max<std::int64_t>(1, state.iterations()));
}
BENCHMARK(BM_PlanSweepGpus)->Unit(benchmark::kMillisecond)->UseRealTime();

// One plan per iteration, with its counters (of the last plan): configurations, pruned by the
// memory bound, evaluated, simulations.
void run_plan(benchmark::State& state,
              const sim::ScheduleInputs& in,
              const planner::PlanOptions& o) {
  planner::PlanResult last;
  for (auto _ : state) {
    last = planner::plan(in, o);
    benchmark::DoNotOptimize(last.ranked.size());
  }
  state.counters["configurations"] = static_cast<double>(last.generated);
  state.counters["pruned"] = static_cast<double>(last.pruned);
  state.counters["evaluated"] = static_cast<double>(last.evaluated);
  state.counters["simulations"] = static_cast<double>(last.simulations);
}

// `plan --seq 128K --allow-data-parallel` for Llama-3-70B on 1024 H100s, 2 threads: TP × PP × CP
// × DP × micro-batches × pipeline schedules × recipes, 111,808 configurations before pruning
// (target: ≤ 2 s on 2 cores). Counters per plan: configurations, pruned by the memory bound,
// evaluated, simulations (a pipeline stage's runs serve every schedule and micro-batch count).
void BM_Plan1024Gpus(benchmark::State& state) {
  sim::ScheduleInputs in = base(models::CpMethod::kUlysses);
  in.model = models::load_model("llama3-70b", kData);
  in.parallel.gpus = 1024;
  in.parallel.cp_degree = 1024;
  in.parallel.seq_len = 128 * 1024;
  planner::PlanOptions o;
  o.seq_len = in.parallel.seq_len;
  o.threads = 2;
  o.allow_data_parallel = true;
  run_plan(state, in, o);
}
BENCHMARK(BM_Plan1024Gpus)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);

// `cpsim plan` on its defaults (Llama-3-8B on 8 H100s, longest context), 2 threads: every
// candidate's longest context searched, then the reserved memory of every candidate shown
// checked.
void BM_PlanMaxContext(benchmark::State& state) {
  planner::PlanOptions o;
  o.threads = 2;
  run_plan(state, base(models::CpMethod::kUlysses), o);
}
BENCHMARK(BM_PlanMaxContext)->Unit(benchmark::kMillisecond)->UseRealTime();

// 1,000 packed batches on 8 GPUs (issue target: ≤ 1 s), one load balancer each (the argument:
// head-tail, contiguous, per-document), ring attention at 128K, lognormal documents of median 8K.
void BM_PackedBatches(benchmark::State& state) {
  sim::ScheduleInputs in = base(models::CpMethod::kRing);
  in.parallel.seq_len = 128 * 1024;
  in.parallel.implementation = "none";  // the ring's scheme: every load balancer
  planner::BatchOptions o;
  o.lengths = models::parse_length_distribution("lognormal:median=8K,sigma=1.2", "lengths");
  o.batches = 1000;
  const std::vector<planner::LoadBalancer> all = planner::load_balancers(in);
  o.balancers = {all.at(static_cast<std::size_t>(state.range(0)))};
  for (auto _ : state) {
    const planner::BatchStudy s = planner::study_batches(in, o);
    benchmark::DoNotOptimize(s.balancers.front().p50_s);
  }
  state.SetLabel(std::string(o.balancers.front().name));
}
BENCHMARK(BM_PackedBatches)->DenseRange(0, 4)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
