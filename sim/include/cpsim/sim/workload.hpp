#pragma once
/// @file The op graph of one training step: ops on per-rank streams, tensors with byte sizes and
/// lifetimes, and collectives that rendezvous across a group of ranks. Schedule builders emit it;
/// the engine runs it.

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cpsim/models/hardware.hpp"
#include "cpsim/models/units.hpp"
#include "cpsim/sim/head_layout.hpp"
#include "cpsim/sim/huge_pages.hpp"

namespace cpsim::sim {

class Implementation;

using OpId = std::int32_t;
using TensorId = std::int32_t;
using CollectiveId = std::int32_t;
inline constexpr std::int32_t kNone = -1;

/// CUDA streams of one rank. Ops on one stream run in program order; streams run concurrently.
enum class Stream : std::uint8_t {
  kCompute,  ///< kernels: GEMM, attention, elementwise, loss, optimizer
  kComm,     ///< context-parallel collectives (all-to-all, send/recv)
  kFsdp,     ///< FSDP parameter all-gather and gradient reduce-scatter
  kD2H,      ///< device-to-host copies (offload)
  kH2D,      ///< host-to-device copies (prefetch)
};
inline constexpr int kStreamCount = 5;
const char* to_string(Stream s);

/// The caching allocator's pools an op's device memory comes from (PyTorch keeps pools per stream;
/// AllocationEvent::stream_pool). kByStream: the FSDP stream's pools for kFsdp ops, the default
/// pools for every other stream. The others name a pool whatever the op's stream in cpsim: kGather
/// for DeepSpeed ZeRO-3's all-gather stream, kReduce for its reduce stream (a side stream of its
/// own, besides the all-gather one).
enum class MemoryPool : std::uint8_t { kByStream, kDefault, kGather, kReduce };

enum class OpKind : std::uint8_t {
  kGemm,
  kAttentionFwd,
  kAttentionBwd,
  kElementwise,
  kLoss,
  kOptimizer,
  kCollective,
  kCopyD2H,
  kCopyH2D,
};
inline constexpr int kOpKindCount = 9;
const char* to_string(OpKind k);

/// Which part of the step an op belongs to (shown in traces and used in the breakdown).
enum class Phase : std::uint8_t { kForward, kRecompute, kBackward, kOptimizer };
inline constexpr int kPhaseCount = 4;
const char* to_string(Phase p);

/// Memory categories of the tracker. Device categories first, then host.
enum class MemCategory : std::uint8_t {
  kModelStates,  ///< sharded fp32 params, grads, optimizer states (persistent)
  kParamGather,  ///< FSDP / ZeRO-3 all-gathered bf16 params (and their host-staged shards)
  kGradBuffers,  ///< ZeRO ≥ 2 unsharded gradient buffers and the gradient-reduce workspaces
  kActivations,  ///< tensors saved for backward at layer level (checkpoints, linear inputs,
                 ///< final_out)
  kAttention,  ///< attention-stage intermediates: QKV before/after all-to-all, outputs, LSE, grads
  kOther,      ///< MLP tiles, norms, loss chunks, residual gradients, workspaces
};
inline constexpr int kMemCategoryCount = 6;
const char* to_string(MemCategory c);

struct Tensor {
  std::int64_t bytes = 0;
  std::int32_t rank = 0;
  MemCategory category = MemCategory::kOther;
  bool on_host = false;
  std::int32_t name = 0;       ///< index into Workload::names
  OpId producer = kNone;       ///< op whose start allocates it; kNone = allocated before the step
  std::int32_t consumers = 0;  ///< ops that read it; freed when the last one ends
};

struct Op {
  std::int32_t rank = 0;
  Stream stream = Stream::kCompute;
  OpKind kind = OpKind::kElementwise;
  Phase phase = Phase::kForward;
  /// The host waits for this op to end before it issues the next op of its rank (a stream or
  /// device synchronisation, a barrier after it; docs/MODEL.md, "Host issue").
  bool host_sync = false;
  std::int32_t layer = -1;  ///< transformer block, -1 for embedding/loss/optimizer
  std::int32_t name = 0;    ///< index into Workload::names
  /// Compute ops and host copies: duration at full speed, in ns. Collectives: see Collective.
  SimTime duration_ns = 0;
  std::int64_t transfer_bytes = 0;   ///< host copies: bytes moved
  double flops = 0.0;                ///< for reporting
  std::int64_t workspace_bytes = 0;  ///< allocated for the op's duration only
  MemCategory workspace_category = MemCategory::kOther;
  /// Framework ops (each with its kernel or NCCL call) the host issues for this op, in program
  /// order on its rank: the host issue model charges each the profile's per-call cost.
  std::uint16_t host_calls = 1;
  MemoryPool memory_pool = MemoryPool::kByStream;  ///< of its outputs and workspace
  CollectiveId collective = kNone;
  // Ranges into Workload::edges. Deps are the ops it waits for besides its stream's earlier ops
  // (those end first anyway: builders leave them out).
  std::int32_t deps_begin = 0, deps_end = 0;
  std::int32_t inputs_begin = 0, inputs_end = 0;
  std::int32_t outputs_begin = 0, outputs_end = 0;
};

/// A collective call: one op per member rank, started together once all members reach it.
/// Time model: t = alpha_s + wire_bytes / (nominal_bw × share), where share is the member's share
/// of its link when other transfers run at the same time (see engine.hpp).
struct Collective {
  models::Collective kind = models::Collective::kAllToAll;
  models::Span span = models::Span::kIntraNode;
  std::int32_t group = kNone;        ///< its member ranks: Workload::groups[group]
  std::int64_t size_bytes = 0;       ///< nccl-tests size S (per-rank total buffer)
  std::int64_t wire_bytes = 0;       ///< bytes each member sends over its link
  double alpha_s = 0.0;              ///< latency incl. launch
  double nominal_bytes_per_s = 0.0;  ///< peak busbw × efficiency(S)
};

/// Fixed per-rank memory outside the op graph.
struct StaticMemory {
  std::int64_t model_states_bytes = 0;
  std::int64_t fixed_overhead_bytes = 0;  ///< CUDA context, cuBLAS workspace, NCCL
  std::int64_t nccl_bytes = 0;  ///< NCCL's communicators (models/nccl_memory.hpp), in the above
};

struct Workload {
  int ranks = 0;              ///< simulated ranks
  int represented_ranks = 0;  ///< GPUs of the job; > ranks on the representative-rank fast path
  int gpus_per_node = 8;
  /// Program order: every dependency points to an earlier op.
  std::vector<Op, HugePageAllocator<Op>> ops;
  std::vector<Tensor, HugePageAllocator<Tensor>> tensors;
  std::vector<Collective> collectives;
  /// Deps (OpId), inputs/outputs (TensorId), by range.
  std::vector<std::int32_t, HugePageAllocator<std::int32_t>> edges;
  /// Member ranks of the groups collectives run over (shared by every call over one group).
  std::vector<std::vector<std::int32_t>> groups;
  std::vector<std::string> names;
  std::vector<StaticMemory> static_memory;  ///< per rank
  std::vector<std::string> notes;           ///< modelling caveats to print with results
  /// Block forwards, recomputations and backwards instantiated from a template, not built
  /// (BuildOptions::repeat_layers).
  int repeated_blocks = 0;
  /// Where each instance of a block template begins, in program order, and which template it is
  /// an instance of. Candidates for the engine's fast-forward over periodic blocks
  /// (engine_fast_forward.inc verifies the periodicity itself before relying on it).
  struct Instance {
    std::int32_t ops = 0, tensors = 0, edges = 0, collectives = 0;
    std::int32_t template_id = 0;  ///< kForwardBlock, kRecomputeBlock or kBackwardBlock
  };
  static constexpr std::int32_t kForwardBlock = 0, kRecomputeBlock = 1, kBackwardBlock = 2;
  std::vector<Instance> instances;
  /// Per template (Instance::template_id), when the build recorded it once: its instances' ops
  /// and tensors, and the ops (offsets in an instance, ascending) with an edge outside the
  /// instance. An instance's other ops are the template's with every id moved by the instance's
  /// start, by construction; the engine's fast-forward then compares only the ported ops and the
  /// tensors of two instances Δ apart. ops 0: nothing known (not recorded, or recorded more than
  /// once in the build).
  struct TemplateShape {
    std::int32_t ops = 0, tensors = 0;
    std::vector<std::int32_t> ported_ops;
  };
  std::array<TemplateShape, 3> template_shapes;
  HeadLayout layout;  ///< of the configuration the step was built for (build_step)
  /// The implementation that runs it (LayoutCheck::implementation); nullptr: the scheme alone.
  const Implementation* implementation = nullptr;
  /// The first op of the first micro-batch's loss: the ops before it are the embedding and the
  /// blocks' forward. kNone when the step has no loss.
  OpId loss_begin = kNone;

  /// The member ranks of collective `c`, in rank order.
  const std::vector<std::int32_t>& members(const Collective& c) const {
    return groups[static_cast<std::size_t>(c.group)];
  }
  /// Empties the workload, keeping the capacity of its vectors and the names interned so far (a
  /// builder refills it; asking for a name again returns the same id without copying the text).
  void clear();
  /// Index of `name` in `names`, adding it on first use.
  std::int32_t intern(std::string_view name);
  /// intern(prefix + index + suffix) for index ≥ 0 (per-block names: "layer12.params"). The ids
  /// of each (prefix, suffix) are kept with the names, across clear(): a rebuild formats and
  /// looks up none of them again.
  std::int32_t intern_indexed(std::string_view prefix, std::int32_t index, std::string_view suffix);

 private:
  /// Hashes std::string and std::string_view alike (lookups without a temporary string).
  struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, std::int32_t, NameHash, std::equal_to<>> name_index_;
  // Builders ask for the same names in the same order in every layer: the name that followed a
  // name last time is tried first (one string comparison instead of a hash lookup).
  std::vector<std::int32_t> next_name_;
  std::int32_t last_name_ = -1;
  struct IndexedNames {
    std::string prefix, suffix;
    std::vector<std::int32_t> ids;  ///< by index; kNone where not interned yet
  };
  std::vector<IndexedNames> indexed_names_;
};

}  // namespace cpsim::sim
