#pragma once
/// @file Parallel layout of one run: CP method, degrees, GPUs and method knobs.

#include <cstdint>
#include <string>

namespace cpsim::models {

/// Context-parallel methods (docs/REFERENCES.md, "Context-parallel methods"):
///   ulysses    all-to-all QKV to head sharding, attention over the full sequence on H/C heads
///   upipe      Ulysses in stages of U query heads (headwise chunking); a ring inside each stage
///              when ring_degree > 1
///   ring       K/V blocks rotate around the CP group (send/recv), overlapped with attention
///   allgather  all-gather K/V before attention, reduce-scatter dK/dV (Llama 3, Megatron
///   all_gather) fpdt       Ulysses over chunks of the sequence with q/k/v/out/LSE chunks offloaded
///   to host usp        Ulysses (inside a node) × ring (across) hybrid
enum class CpMethod { kUlysses, kUPipe, kRing, kAllGather, kFpdt, kUsp };
const char* to_string(CpMethod m);
/// @throws InputError (field `field`) for unknown names, listing the known ones.
CpMethod parse_cp_method(const std::string& text, const std::string& field);

/// Token layout of ring-based attention: contiguous (rank i holds chunk i) or zigzag (2C chunks,
/// rank i holds i and 2C−1−i, which balances causal work).
enum class RingLayout { kContiguous, kZigzag };
const char* to_string(RingLayout l);
RingLayout parse_ring_layout(const std::string& text, const std::string& field);

/// Pipeline schedule (Megatron-Core pipeline_parallel/schedules.py): 1F1B
/// (forward_backward_pipelining_without_interleaving) or interleaved 1F1B over virtual stages
/// (forward_backward_pipelining_with_interleaving).
enum class PipelineSchedule { k1F1B, kInterleaved };
const char* to_string(PipelineSchedule s);
PipelineSchedule parse_pipeline_schedule(const std::string& text, const std::string& field);

struct ParallelConfig {
  CpMethod method = CpMethod::kUlysses;
  int gpus = 8;
  int gpus_per_node = 8;
  int cp_degree = 8;         ///< CP group size C = Ulysses degree × ring degree
  int ring_degree = 1;       ///< ring part of C (ring, allgather: C; usp/upipe: may be > 1)
  std::int64_t seq_len = 0;  ///< global tokens in the sequence N
  std::int64_t heads_per_stage =
      0;  ///< UPipe U (query heads per stage, all ranks); 0 = Ulysses degree
  RingLayout ring_layout = RingLayout::kZigzag;
  std::int64_t fpdt_chunk = 65536;  ///< FPDT chunk in global tokens
  bool fpdt_offload = true;         ///< FPDT chunks offloaded to pinned host memory
  int micro_batch = 1;
  /// Tensor-parallel degree T (Megatron-style, with sequence parallelism): T consecutive ranks of
  /// a node share each block's GEMMs (column/row parallel) and hold s/T tokens of the norms and
  /// residuals; a CP group is C ranks of stride T (Megatron's "tp-cp-ep-dp-pp" rank order).
  int tp_degree = 1;
  /// Gradient accumulation: micro-batches of one sequence per optimizer step.
  int micro_batches = 1;
  /// Pipeline-parallel degree P: the outermost dimension of the rank order (stage i holds ranks
  /// [i·G/P, (i+1)·G/P)), L/P consecutive blocks per stage (sim/pipeline.hpp).
  int pp_degree = 1;
  PipelineSchedule pp_schedule = PipelineSchedule::k1F1B;
  /// Interleaved schedule: model chunks per pipeline rank V (Megatron
  /// --num-virtual-stages-per-pipeline-rank); 1 under 1F1B.
  int virtual_stages = 1;
  /// Uneven pipeline stages (Megatron --decoder-first/last-pipeline-num-layers): blocks on the
  /// first / last stage, the others split evenly over the middle stages; 0 = an even split.
  int pp_first_stage_layers = 0;
  int pp_last_stage_layers = 0;
  /// Expert-parallel degree E_p of a mixture-of-experts model: E_p consecutive ranks (of one TP
  /// position) split the experts, tokens all-to-all between them (sim/builder.hpp Group::kExpert).
  int ep_degree = 1;
  /// Dropless routing's load on the busiest rank of an EP group, as a multiple of the balanced
  /// share (≥ 1; 1: every rank receives its k·s token copies). Stated by the user: routing
  /// statistics are the training run's, not the model's.
  double expert_imbalance = 1.0;
  /// The implementation of the method that runs (sim/implementation.hpp, `--impl`): empty = the
  /// recipe's default for the method, "none" = the method's scheme alone.
  std::string implementation;

  int ulysses_degree() const { return cp_degree / ring_degree; }
  int data_parallel() const { return gpus / (cp_degree * tp_degree * pp_degree); }
  std::int64_t local_seq() const { return seq_len / cp_degree; }
  bool operator==(const ParallelConfig&) const = default;
};

}  // namespace cpsim::models
