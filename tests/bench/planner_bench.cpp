// Speed of the planner: `maxlen` for Llama-3-8B on 8 GPUs (target ≤ 200 ms) and `plan --seq 1M`
// over every method (target ≤ 5 s on 2 cores, both used).
#include <benchmark/benchmark.h>

#include "cpsim/models/io.hpp"
#include "cpsim/planner/maxlen.hpp"
#include "cpsim/planner/search.hpp"

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
      method == models::CpMethod::kRing || method == models::CpMethod::kAllGather ? 8 : 1;
  in.parallel.seq_len = 1 << 20;
  return in;
}

void BM_MaxLen(benchmark::State& state) {
  const auto method = static_cast<models::CpMethod>(state.range(0));
  const sim::ScheduleInputs in = base(method);
  int evaluations = 0;
  for (auto _ : state) {
    const planner::MaxLenResult r = planner::max_seq_len(in);
    evaluations += r.evaluations;
    benchmark::DoNotOptimize(r.max_seq_len);
  }
  state.SetLabel(models::to_string(method));
  state.counters["simulations_per_s"] =
      benchmark::Counter(static_cast<double>(evaluations), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_MaxLen)
    ->Arg(static_cast<int>(models::CpMethod::kUPipe))
    ->Arg(static_cast<int>(models::CpMethod::kUlysses))
    ->Arg(static_cast<int>(models::CpMethod::kRing))
    ->Arg(static_cast<int>(models::CpMethod::kFpdt))
    ->Unit(benchmark::kMillisecond);

void BM_PlanSeq1M(benchmark::State& state) {
  const sim::ScheduleInputs in = base(models::CpMethod::kUlysses);
  planner::PlanOptions o;
  o.seq_len = 1 << 20;
  o.threads = 2;
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

}  // namespace

BENCHMARK_MAIN();
