#pragma once
/// @file What one simulated step means for the user: time, throughput, memory, whether it fits.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "cpsim/sim/engine.hpp"
#include "cpsim/sim/pipeline.hpp"
#include "cpsim/sim/schedule.hpp"

namespace cpsim::sim {

struct StepReport {
  // Time and throughput
  double step_time_s = 0.0;
  std::int64_t tokens_per_step = 0;  ///< seq_len × data-parallel replicas × micro-batches
  double tokens_per_s_per_gpu = 0.0;
  double model_flops_per_step = 0.0;  ///< no recomputation counted (models::model_step_flops)
  double model_tflops_per_gpu = 0.0;  ///< model FLOPs / step time / GPUs, in TFLOP/s
  double mfu = 0.0;                   ///< model TFLOP/s / peak bf16
  std::array<double, kStreamCount> stream_busy_s{};  ///< rank 0
  double exposed_comm_s = 0.0;                       ///< step time not covered by compute on rank 0

  // GPU memory (the rank with the highest peak)
  std::int64_t peak_memory_bytes = 0;  ///< incl. fixed overheads
  int peak_rank = 0;
  std::string peak_op;  ///< "recompute layer 31 attn_fwd[s2]"
  std::array<std::int64_t, kMemCategoryCount> breakdown_at_peak{};
  std::int64_t fixed_overhead_bytes = 0;  ///< CUDA context, cuBLAS workspace and NCCL
  std::int64_t nccl_memory_bytes = 0;     ///< NCCL's communicators, part of the fixed overhead
  std::array<std::int64_t, kMemCategoryCount> category_peak{};
  std::int64_t gpu_capacity_bytes = 0;
  std::int64_t gpu_margin_bytes = 0;  ///< ScheduleInputs::margin: kept free to count as fitting
  /// capacity − margin − the memory that decides (reserved when modelled, else the allocated
  /// peak); negative when it does not fit.
  std::int64_t gpu_headroom_bytes = 0;
  /// Device memory the process holds at most (PyTorch's reserved memory, modelled in
  /// allocator.hpp, plus the fixed overheads): what nvidia-smi would show. 0 when not modelled
  /// (SimOptions::log_allocations off).
  std::int64_t reserved_peak_bytes = 0;
  /// Times the modelled allocator emptied its cache to satisfy a request (slow: it synchronizes).
  std::int32_t allocator_cache_releases = 0;
  /// The modelled allocator could not serve a request even with its cache emptied: out of memory
  /// from fragmentation although the allocated peak fits (likely without expandable segments).
  bool allocator_out_of_memory = false;
  /// The simulation stopped once device memory passed SimOptions::stop_above_device_bytes, or a
  /// node's host memory SimOptions::stop_above_host_bytes (it does not fit): that peak is a lower
  /// bound and the times are not a whole step's.
  bool stopped_early = false;

  // Host memory (pinned offload buffers), the busiest node
  std::int64_t host_memory_bytes = 0;
  std::int64_t host_capacity_bytes = 0;
  std::int64_t host_margin_bytes = 0;  ///< kept free on every node to count as fitting

  /// Allocated peak + margin ≤ capacity, and, when the allocator is modelled, reserved + margin ≤
  /// capacity without an allocator out-of-memory.
  bool fits_gpu = true;
  /// Whether fits_gpu includes the reserved memory (the caching allocator was replayed); false:
  /// the allocated peak alone, a necessary condition.
  bool reserved_checked = false;
  bool fits_host = true;  ///< host peak + host margin ≤ host capacity
  /// False when a kernel of the recipe cannot address a tensor (int32_index_violation).
  bool fits_kernels = true;
  std::string kernel_limit;  ///< why fits_kernels is false
  bool fits() const { return fits_gpu && fits_host && fits_kernels; }
  std::string binding;  ///< what limits it: GPU memory, host memory, a kernel limit, or empty

  HeadLayout layout;
  /// The implementation that ran (Workload::implementation); nullptr: the method's scheme alone.
  const Implementation* implementation = nullptr;
  AttentionBuffers attention;
  std::int64_t ops = 0;
  int simulated_ranks = 0;  ///< 1 on the representative-rank fast path
  std::int64_t events = 0;
  std::vector<std::string> notes;

  /// Pipeline parallelism (stages > 1; planner::evaluate composes it from one stage's runs).
  PipelineShape pipeline;
  double pipeline_micro_batch_s = 0.0;  ///< one micro-batch's forward + backward on the stage
  double pipeline_p2p_s = 0.0;          ///< one send/recv of PipelineShape::p2p_bytes
  /// What the micro-batches in flight on the stage before the last that holds the most
  /// (PipelineShape::memory_stage) hold beyond the one its run holds: in the peak when that stage
  /// binds (pipeline_peak_stage).
  std::int64_t pipeline_in_flight_extra_bytes = 0;
  /// The stage whose run holds the peak: "the first pipeline stage (4 micro-batches in flight)",
  /// "the last pipeline stage (LM head and loss)"; empty without pipeline parallelism.
  std::string pipeline_peak_stage;
  /// The peak of each stage simulated, with its micro-batches in flight: the stage before the last
  /// that holds the most, and the last (allocated bytes; 0 without pipeline parallelism).
  std::int64_t pipeline_inner_stage_peak_bytes = 0;
  std::int64_t pipeline_last_stage_peak_bytes = 0;
  /// forward_saved_bytes() of the peak rank, when the evaluation measured it (a pipeline stage's
  /// run; planner::EvaluateOptions::measure_forward_saved); else 0.
  std::int64_t forward_saved_bytes = 0;
};

/// Whether summarize() replays the caching allocator over the run's allocation log (when the run
/// logged one, SimOptions::log_allocations): kIgnoreLog gives the report a run without the log
/// gives, from a run that logged.
enum class AllocatorLogUse : std::uint8_t { kReplay, kIgnoreLog };

StepReport summarize(const ScheduleInputs& inputs,
                     const Workload& workload,
                     const SimResult& result,
                     AllocatorLogUse log_use = AllocatorLogUse::kReplay);

/// A device tensor (or an op's workspace) allocated at the moment of a rank's memory peak.
struct LiveTensor {
  std::string name;      ///< tensor name, or "workspace" of the op
  std::string producer;  ///< describe_op of the op that allocated it
  MemCategory category = MemCategory::kOther;
  std::int64_t bytes = 0;  ///< as allocated (rounded like the engine)
};

struct PeakContents {
  std::vector<LiveTensor> largest;  ///< the largest live tensors, largest first
  std::int64_t listed_bytes = 0;    ///< sum over `largest`
  std::int64_t other_bytes = 0;     ///< the remaining live tensors
  std::int64_t other_count = 0;
};

/// What is allocated on `rank` when its peak is set, rebuilt from the recorded op intervals
/// (requires SimOptions::record_trace): a tensor lives from its producer's start to the end of its
/// last consumer (its producer's end when nothing reads it), a workspace while its op runs.
/// Lists the `top` largest; static memory (model states, fixed overheads) is not included.
PeakContents peak_contents(const Workload& workload,
                           const SimResult& result,
                           int rank,
                           std::size_t top);

/// Device bytes, rounded as allocated, of the tensors that `rank`'s embedding and block forwards
/// (the ops before Workload::loss_begin) allocate and its recomputation or backward reads: what
/// one micro-batch holds from the end of its forward to its backward (activation, attention and
/// other tensors; not parameters, gradients or host copies). 0 when the workload has no loss.
std::int64_t forward_saved_bytes(const Workload& workload, int rank);

/// "phase layer name" of an op, e.g. "recompute layer 31 attn_fwd[s2]".
std::string describe_op(const Workload& workload, OpId op);

}  // namespace cpsim::sim
