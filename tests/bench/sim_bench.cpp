// Speed of the simulator: events/s of the event loop on a synthetic op graph, the wall time of
// whole `simulate` evaluations of the reference cases, and the caching-allocator replay of
// a long FPDT step with and without its repeated blocks.
#include <benchmark/benchmark.h>

#include "cpsim/models/io.hpp"
#include "cpsim/planner/evaluate.hpp"
#include "cpsim/sim/allocator.hpp"
#include "cpsim/sim/engine.hpp"
#include "cpsim/sim/schedule.hpp"

namespace {

using namespace cpsim;

const models::DataDir kData{CPSIM_TEST_DATA_DIR};

// 8 ranks; per rank a chain of compute ops with an all-to-all every 4th op and a host copy every
// 16th, so compute, collectives and copies interleave as in a real step.
sim::Workload synthetic_workload(int ops_per_rank) {
  sim::Workload w;
  const int ranks = 8;
  w.ranks = ranks;
  w.static_memory.assign(ranks, {});
  const std::int32_t name = w.intern("op");
  const std::int32_t tensor_name = w.intern("t");
  for (int i = 0; i < ops_per_rank; ++i) {
    const bool coll = i % 4 == 3;
    const bool copy = i % 16 == 5;
    sim::CollectiveId cid = sim::kNone;
    if (coll) {
      sim::Collective c;
      if (w.groups.empty()) {
        w.groups.push_back({0, 1, 2, 3, 4, 5, 6, 7});
      }
      c.group = 0;
      c.size_bytes = 64 << 20;
      c.wire_bytes = (64 << 20) / 8 * 7;
      c.alpha_s = 15e-6;
      c.nominal_bytes_per_s = 300e9;
      cid = static_cast<sim::CollectiveId>(w.collectives.size());
      w.collectives.push_back(c);
    }
    for (int r = 0; r < ranks; ++r) {
      sim::Op o;
      o.rank = r;
      o.name = name;
      o.stream = coll ? sim::Stream::kComm : copy ? sim::Stream::kD2H : sim::Stream::kCompute;
      o.kind = coll ? sim::OpKind::kCollective : copy ? sim::OpKind::kCopyD2H : sim::OpKind::kGemm;
      o.collective = cid;
      o.duration_ns = 50000 + 1000 * (i % 7);
      o.transfer_bytes = copy ? (256 << 20) : 0;
      o.deps_begin = static_cast<std::int32_t>(w.edges.size());
      if (i > 0) {
        w.edges.push_back(static_cast<std::int32_t>(w.ops.size()) -
                          ranks);  // previous op of the rank
      }
      o.deps_end = static_cast<std::int32_t>(w.edges.size());
      o.inputs_begin = o.inputs_end = o.deps_end;
      sim::Tensor t;
      t.rank = r;
      t.bytes = 1 << 20;
      t.name = tensor_name;
      t.producer = static_cast<sim::OpId>(w.ops.size());
      w.tensors.push_back(t);
      o.outputs_begin = static_cast<std::int32_t>(w.edges.size());
      w.edges.push_back(static_cast<std::int32_t>(w.tensors.size()) - 1);
      o.outputs_end = static_cast<std::int32_t>(w.edges.size());
      w.ops.push_back(o);
    }
  }
  return w;
}

void BM_EventLoop(benchmark::State& state) {
  const sim::Workload w = synthetic_workload(static_cast<int>(state.range(0)));
  const models::HardwareProfile hw = models::load_hardware("h100-sxm-80g", kData);
  std::int64_t events = 0;
  for (auto _ : state) {
    const sim::SimResult r = sim::simulate(w, hw);
    events += r.events;
    benchmark::DoNotOptimize(r.step_time_ns);
  }
  state.counters["events_per_s"] =
      benchmark::Counter(static_cast<double>(events), benchmark::Counter::kIsRate);
  state.counters["ops"] = static_cast<double>(w.ops.size());
}
BENCHMARK(BM_EventLoop)->Arg(20000)->Unit(benchmark::kMillisecond);

// The same loop as a search runs it: one Simulator reused from run to run, so its buffers are
// already allocated and faulted in (BM_EventLoop pays for fresh ones every run, as one `simulate`).
void BM_EventLoopReused(benchmark::State& state) {
  const sim::Workload w = synthetic_workload(static_cast<int>(state.range(0)));
  const models::HardwareProfile hw = models::load_hardware("h100-sxm-80g", kData);
  sim::Simulator simulator;
  std::int64_t events = 0;
  for (auto _ : state) {
    const sim::SimResult r = simulator.run(w, hw);
    events += r.events;
    benchmark::DoNotOptimize(r.step_time_ns);
  }
  state.counters["events_per_s"] =
      benchmark::Counter(static_cast<double>(events), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_EventLoopReused)->Arg(20000)->Unit(benchmark::kMillisecond);

sim::ScheduleInputs reference_case(models::CpMethod method,
                                   const char* model,
                                   int gpus,
                                   std::int64_t seq) {
  sim::ScheduleInputs in;
  in.model = models::load_model(model, kData);
  in.hardware = models::load_hardware("h100-sxm-80g", kData);
  in.recipe = models::load_recipe("alst", kData);
  in.parallel.method = method;
  in.parallel.gpus = gpus;
  in.parallel.cp_degree = gpus;
  in.parallel.gpus_per_node = 8;
  in.parallel.seq_len = seq;
  return in;
}

// The whole `cpsim simulate --model llama3-8b --gpus 8 --method upipe --seq 3M` minus file loading:
// build the op graph, check it, simulate every rank, summarise.
void BM_SimulateUpipe3M(benchmark::State& state) {
  const sim::ScheduleInputs in = reference_case(models::CpMethod::kUPipe, "llama3-8b", 8, 3 << 20);
  std::int64_t events = 0;
  for (auto _ : state) {
    const planner::Evaluation e = planner::evaluate(in);
    events += e.report.events;
    benchmark::DoNotOptimize(e.report.step_time_s);
  }
  state.counters["events_per_s"] =
      benchmark::Counter(static_cast<double>(events), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_SimulateUpipe3M)->Unit(benchmark::kMillisecond);

void BM_SimulateUlysses3M(benchmark::State& state) {
  const sim::ScheduleInputs in =
      reference_case(models::CpMethod::kUlysses, "llama3-8b", 8, 3 << 20);
  for (auto _ : state) {
    benchmark::DoNotOptimize(planner::evaluate(in).report.step_time_s);
  }
}
BENCHMARK(BM_SimulateUlysses3M)->Unit(benchmark::kMillisecond);

// The largest built-in model on 2 nodes.
void BM_SimulateQwen32B16Gpus(benchmark::State& state) {
  const sim::ScheduleInputs in = reference_case(models::CpMethod::kUPipe, "qwen3-32b", 16, 1 << 20);
  for (auto _ : state) {
    benchmark::DoNotOptimize(planner::evaluate(in).report.step_time_s);
  }
}
BENCHMARK(BM_SimulateQwen32B16Gpus)->Unit(benchmark::kMillisecond);

// The caching-allocator replay of deepspeed-fpdt's step at 6.5M tokens on 8 GPUs (its logged
// run: 347K entries, 52 blocks fast-forwarded), as `maxlen`'s reserved-memory check replays it:
// argument 1 with the fast-forward's repeats (copies applied while the allocator's blocks
// repeat), 0 request by request.
void BM_AllocatorReplayFpdt(benchmark::State& state) {
  sim::ScheduleInputs in = reference_case(models::CpMethod::kFpdt, "llama3-8b", 8, 104 << 16);
  in.recipe = models::load_recipe("deepspeed-fpdt", kData);
  in.parallel.implementation = "deepspeed-fpdt";
  const sim::Workload w = sim::build_step(in);
  sim::SimOptions logged;
  logged.log_allocations = true;
  const sim::SimResult r = sim::simulate(w, in.hardware, logged);
  sim::AllocatorConfig config;
  config.capacity_bytes = in.hardware.hbm_capacity_bytes;
  const bool repeats = state.range(0) != 0;
  std::int32_t applied = 0;
  for (auto _ : state) {
    const sim::AllocatorReplay replay =
        repeats ? sim::replay_allocator(r.allocations, r.allocation_repeats, 0, config)
                : sim::replay_allocator(r.allocations, 0, config);
    applied = replay.copies_applied;
    benchmark::DoNotOptimize(replay.peak_reserved_bytes);
  }
  state.counters["entries"] = static_cast<double>(r.allocations.size());
  state.counters["copies_applied"] = applied;
}
BENCHMARK(BM_AllocatorReplayFpdt)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
