#include "cpsim/sim/result.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace cpsim::sim {

std::int64_t forward_saved_bytes(const Workload& w, int rank) {
  if (w.loss_begin == kNone) {
    return 0;
  }
  const std::size_t forward_end = static_cast<std::size_t>(w.loss_begin);
  std::vector<bool> counted(w.tensors.size(), false);
  std::int64_t bytes = 0;
  for (std::size_t i = forward_end; i < w.ops.size(); ++i) {
    const Op& o = w.ops[i];
    if (o.rank != rank || o.phase == Phase::kForward) {
      continue;
    }
    for (std::int32_t e = o.inputs_begin; e < o.inputs_end; ++e) {
      const auto t = static_cast<std::size_t>(w.edges[static_cast<std::size_t>(e)]);
      const Tensor& ten = w.tensors[t];
      const bool saved =
          ten.producer != kNone && static_cast<std::size_t>(ten.producer) < forward_end &&
          !ten.on_host &&
          (ten.category == MemCategory::kActivations || ten.category == MemCategory::kAttention ||
           ten.category == MemCategory::kOther);
      if (saved && !counted[t]) {
        counted[t] = true;
        bytes += allocation_bytes(ten.bytes);
      }
    }
  }
  return bytes;
}

std::string describe_op(const Workload& w, OpId op) {
  if (op == kNone) {
    return "start of step (static memory)";
  }
  const Op& o = w.ops[static_cast<std::size_t>(op)];
  const std::string& name = w.names[static_cast<std::size_t>(o.name)];
  if (o.layer >= 0) {
    return fmt::format("{} layer {} {}", to_string(o.phase), o.layer, name);
  }
  return fmt::format("{} {}", to_string(o.phase), name);
}

PeakContents peak_contents(const Workload& w, const SimResult& r, int rank, std::size_t top) {
  PeakContents out;
  const auto ri = static_cast<std::size_t>(rank);
  if (ri >= r.memory.size() || r.intervals.empty()) {
    return out;
  }
  const RankMemory& pm = r.memory[ri];
  const SimTime t = pm.peak_time_ns;
  std::vector<SimTime> start(w.ops.size(), -1), end(w.ops.size(), -1);
  for (const OpInterval& iv : r.intervals) {
    start[static_cast<std::size_t>(iv.op)] = iv.start_ns;
    end[static_cast<std::size_t>(iv.op)] = iv.end_ns;
  }
  // Free time of each tensor: the end of its last consumer.
  std::vector<SimTime> freed(w.tensors.size(), -1);
  for (std::size_t o = 0; o < w.ops.size(); ++o) {
    const Op& op = w.ops[o];
    for (std::int32_t e = op.inputs_begin; e < op.inputs_end; ++e) {
      const auto ti = static_cast<std::size_t>(w.edges[static_cast<std::size_t>(e)]);
      freed[ti] = std::max(freed[ti], end[o]);
    }
  }
  // The peak is noted when its op starts at t, after the ops that ended at t released memory;
  // ops starting at t are counted up to and including the peak op (program order breaks ties).
  const auto begun_by_peak = [&](OpId op) {
    const SimTime s = start[static_cast<std::size_t>(op)];
    return s >= 0 && (s < t || (s == t && op <= pm.peak_op));
  };
  std::vector<LiveTensor> live;
  for (std::size_t ti = 0; ti < w.tensors.size(); ++ti) {
    const Tensor& ten = w.tensors[ti];
    if (ten.rank != rank || ten.on_host || ten.producer == kNone || !begun_by_peak(ten.producer)) {
      continue;
    }
    const SimTime free_at =
        ten.consumers > 0 ? freed[ti] : end[static_cast<std::size_t>(ten.producer)];
    if (free_at >= 0 && free_at <= t && ten.producer != pm.peak_op) {
      continue;
    }
    live.push_back({w.names[static_cast<std::size_t>(ten.name)], describe_op(w, ten.producer),
                    ten.category, allocation_bytes(ten.bytes)});
  }
  for (std::size_t o = 0; o < w.ops.size(); ++o) {
    const Op& op = w.ops[o];
    const auto id = static_cast<OpId>(o);
    if (op.rank != rank || op.workspace_bytes == 0 || !begun_by_peak(id) ||
        (end[o] <= t && id != pm.peak_op)) {
      continue;
    }
    live.push_back({"workspace", describe_op(w, id), op.workspace_category,
                    allocation_bytes(op.workspace_bytes)});
  }
  std::stable_sort(live.begin(), live.end(),
                   [](const LiveTensor& a, const LiveTensor& b) { return a.bytes > b.bytes; });
  for (std::size_t i = 0; i < live.size(); ++i) {
    if (i < top) {
      out.listed_bytes += live[i].bytes;
      out.largest.push_back(std::move(live[i]));
    } else {
      out.other_bytes += live[i].bytes;
      ++out.other_count;
    }
  }
  return out;
}

namespace {

// Step time, throughput, model FLOPs and the streams' occupancy of rank 0.
void summarize_time(const ScheduleInputs& in, const SimResult& r, StepReport& rep) {
  const auto& par = in.parallel;
  rep.step_time_s = simtime_to_seconds(r.step_time_ns);
  // Gradient accumulation: M micro-batches of one sequence per data-parallel replica.
  rep.tokens_per_step = par.seq_len * par.data_parallel() * std::max(1, par.micro_batches);
  const double gpus = static_cast<double>(par.gpus);
  if (rep.step_time_s > 0) {
    rep.tokens_per_s_per_gpu = static_cast<double>(rep.tokens_per_step) / rep.step_time_s / gpus;
    rep.model_flops_per_step = models::model_step_flops(in.model, par.seq_len).total() *
                               par.data_parallel() * std::max(1, par.micro_batches);
    rep.model_tflops_per_gpu = rep.model_flops_per_step / rep.step_time_s / gpus / 1e12;
    rep.mfu = rep.model_tflops_per_gpu * 1e12 / in.hardware.peak_bf16_flops_per_s;
  }
  if (!r.busy.empty()) {
    for (std::size_t s = 0; s < kStreamCount; ++s) {
      rep.stream_busy_s[s] = simtime_to_seconds(r.busy[0].busy_ns[s]);
    }
    rep.exposed_comm_s = std::max(
        0.0, rep.step_time_s - rep.stream_busy_s[static_cast<std::size_t>(Stream::kCompute)]);
  }
}

// The GPU peak of the rank with the highest (the first wins ties: deterministic), its reserved
// memory when the allocations were logged, and whether it fits.
void summarize_gpu_memory(const ScheduleInputs& in,
                          const Workload& w,
                          const SimResult& r,
                          AllocatorLogUse log_use,
                          StepReport& rep) {
  for (std::size_t i = 0; i < r.memory.size(); ++i) {
    if (i == 0 || r.memory[i].peak_bytes > rep.peak_memory_bytes) {
      rep.peak_memory_bytes = r.memory[i].peak_bytes;
      rep.peak_rank = static_cast<int>(i);
    }
  }
  const RankMemory& pm = r.memory[static_cast<std::size_t>(rep.peak_rank)];
  rep.peak_op = describe_op(w, pm.peak_op);
  rep.breakdown_at_peak = pm.breakdown_at_peak;
  rep.fixed_overhead_bytes = pm.fixed_overhead_bytes;
  rep.nccl_memory_bytes = pm.nccl_bytes;
  rep.category_peak = pm.category_peak;
  rep.gpu_capacity_bytes = in.hardware.hbm_capacity_bytes;
  rep.gpu_margin_bytes = in.margin.gpu_bytes;
  rep.stopped_early = r.stopped_early;
  if (log_use == AllocatorLogUse::kReplay && !r.allocations.empty()) {
    // The caching allocator's reserved memory on the peak rank: what nvidia-smi shows is this plus
    // the fixed overheads (context, NCCL and library workspaces), which live outside it.
    AllocatorConfig config;
    config.mode = in.recipe.expandable_segments ? AllocatorMode::kExpandableSegments
                                                : AllocatorMode::kSegments;
    config.capacity_bytes = rep.gpu_capacity_bytes - pm.fixed_overhead_bytes;
    config.static_bytes =
        w.static_memory[static_cast<std::size_t>(rep.peak_rank)].model_states_bytes;
    const AllocatorReplay replay =
        replay_allocator(r.allocations, r.allocation_repeats, rep.peak_rank, config);
    rep.reserved_peak_bytes = replay.peak_reserved_bytes + pm.fixed_overhead_bytes;
    rep.allocator_cache_releases = replay.cache_releases;
    rep.allocator_out_of_memory = replay.out_of_memory;
    rep.reserved_checked = true;
  }
  // Reserved memory holds every allocated byte (plus cached blocks), so it decides when modelled.
  // The allocator empties its cache only when it would otherwise pass the whole GPU: with a margin
  // that is a step which would have reserved more than capacity − margin (the replay's peak is
  // after the release), so it does not fit; without a margin it is what PyTorch does and fits.
  const std::int64_t decisive = std::max(rep.peak_memory_bytes, rep.reserved_peak_bytes);
  rep.gpu_headroom_bytes = rep.gpu_capacity_bytes - rep.gpu_margin_bytes - decisive;
  rep.fits_gpu = rep.gpu_headroom_bytes >= 0 && !rep.allocator_out_of_memory &&
                 (rep.gpu_margin_bytes == 0 || rep.allocator_cache_releases == 0);
}

// Host memory per node: the sum of the host peaks of the node's ranks (symmetric ranks peak
// together, so the sum is the node's peak). On the representative-rank path every rank of a node
// holds what rank 0 holds.
void summarize_host_memory(const ScheduleInputs& in,
                           const Workload& w,
                           const SimResult& r,
                           StepReport& rep) {
  const int per_node = std::max(1, in.parallel.gpus_per_node);
  if (w.ranks < w.represented_ranks) {
    rep.host_memory_bytes =
        r.memory[0].host_peak_bytes * std::min(per_node, std::max(1, w.represented_ranks));
  }
  for (std::size_t i = 0; i < r.memory.size(); i += static_cast<std::size_t>(per_node)) {
    std::int64_t node = 0;
    for (std::size_t j = i; j < std::min(r.memory.size(), i + static_cast<std::size_t>(per_node));
         ++j) {
      node += r.memory[j].host_peak_bytes;
    }
    rep.host_memory_bytes = std::max(rep.host_memory_bytes, node);
  }
  rep.host_capacity_bytes = in.hardware.host_memory_bytes_per_node;
  rep.host_margin_bytes = in.margin.host_bytes;
  rep.fits_host = rep.host_memory_bytes + rep.host_margin_bytes <= rep.host_capacity_bytes;
}

// What limits the step: GPU memory (allocated, then reserved), host memory, a kernel's limit.
std::string binding_constraint(const StepReport& rep) {
  if (!rep.fits_gpu && rep.peak_memory_bytes + rep.gpu_margin_bytes > rep.gpu_capacity_bytes) {
    return fmt::format("GPU memory on rank {} at {}", rep.peak_rank, rep.peak_op);
  }
  if (!rep.fits_gpu) {
    return fmt::format("GPU reserved memory on rank {} (the caching allocator's segments{})",
                       rep.peak_rank,
                       rep.allocator_out_of_memory ? ": out of memory from fragmentation"
                       : rep.gpu_headroom_bytes >= 0
                           ? ": it reaches the whole GPU and empties its cache, leaving no margin"
                           : "");
  }
  if (!rep.fits_host) {
    return "host memory (pinned checkpoint offload)";
  }
  if (!rep.fits_kernels) {
    return rep.kernel_limit;
  }
  return "";
}

}  // namespace

StepReport summarize(const ScheduleInputs& in,
                     const Workload& w,
                     const SimResult& r,
                     AllocatorLogUse log_use) {
  StepReport rep;
  summarize_time(in, r, rep);
  summarize_gpu_memory(in, w, r, log_use, rep);
  summarize_host_memory(in, w, r, rep);
  rep.layout = w.layout;
  rep.implementation = w.implementation;
  rep.kernel_limit = int32_index_violation(in, rep.layout);
  rep.fits_kernels = rep.kernel_limit.empty();
  rep.binding = binding_constraint(rep);
  rep.attention = attention_buffers(in, rep.layout);
  rep.ops = static_cast<std::int64_t>(w.ops.size());
  rep.simulated_ranks = w.ranks;
  rep.events = r.events;
  rep.notes = w.notes;
  return rep;
}

}  // namespace cpsim::sim
