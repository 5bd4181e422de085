#pragma once
/// @file The context-parallel schemes: one type per CP method (sim/src/methods/<name>.cpp)
/// that owns everything specific to it (validation, head layout and buffers, the attention ops of
/// one layer, the sequence-length multiple, search candidates, labels, launchers), and the
/// registry the simulator, planner and CLI iterate over. docs/ADDING_AN_IMPLEMENTATION.md says how
/// to add one.

#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cpsim/models/parallel.hpp"
#include "cpsim/sim/head_layout.hpp"
#include "cpsim/sim/schedule_inputs.hpp"

namespace cpsim::sim {

namespace detail {
class StepBuilder;
struct SavedLayer;
struct InputGrad;
struct TensorSet;
}  // namespace detail

/// The quantity a refused configuration gets wrong. The simulator names quantities, never the
/// flags or fields a front end reads them from (the CLI maps them to its flags).
enum class Quantity {
  kGpus,            ///< GPUs of the job
  kGpusPerNode,     ///< GPUs per node
  kCpDegree,        ///< CP group size C (must divide the GPUs, whole nodes when spanning nodes)
  kRingDegree,      ///< ring part of C
  kSeqLen,          ///< sequence length out of range
  kSeqLenMultiple,  ///< sequence length not a multiple of what the method needs
  kModelHeads,      ///< the model's query or KV heads against the Ulysses degree
  kHeadsPerStage,   ///< UPipe's U
  kFpdtChunk,       ///< FPDT's chunk
  kImplementation,  ///< the implementation asked for (unknown, or not one of the method)
  kTpDegree,        ///< tensor-parallel degree T (placement, heads, the implementation's support)
  kMicroBatches,    ///< micro-batches per optimizer step
  kPpDegree,        ///< pipeline-parallel degree P, its schedule and virtual stages
  kDocuments,       ///< the packed documents (ScheduleInputs::documents) against the ring
  /// the model's sliding-window layers against the method, implementation and kernel
  kAttentionWindow,
  kAttentionSinks,   ///< the model's attention sinks against the implementation and method
  kAttentionChunks,  ///< the model's chunked layers against the method, implementation, kernel
  kLatentAttention,  ///< the model's multi-head latent attention against method and implementation
  kExperts,          ///< the model's mixture of experts against the implementation and recipe
  kExpertParallel,   ///< expert-parallel degree E_p
  kExpertImbalance,  ///< the routing imbalance stated for EP
};
const char* to_string(Quantity q);

/// What is wrong with a configuration: the quantity at fault and one line for humans.
struct ConfigIssue {
  Quantity quantity = Quantity::kGpus;
  std::string message;
};

/// A refused configuration where a caller cannot go on. `what()` is the message; the parallel
/// configuration is kept so that a front end can name the input at fault.
class ConfigError : public std::invalid_argument {
 public:
  ConfigError(ConfigIssue issue, const models::ParallelConfig& config)
      : std::invalid_argument(issue.message), issue_(std::move(issue)), config_(config) {}
  const ConfigIssue& issue() const { return issue_; }
  Quantity quantity() const { return issue_.quantity; }
  const models::ParallelConfig& config() const { return config_; }

 private:
  ConfigIssue issue_;
  models::ParallelConfig config_;
};

/// Which label of a configuration: the planner's compact one ("usp C8 (u4 x r2)"), the sentence
/// of `simulate` ("USP (Ulysses 4 x ring 2, zigzag ring)"), or the degrees of `report`.
enum class LabelStyle { kSearch, kDescription, kDegrees };

/// One launcher that runs a method, and the launcher's own word for selecting it: Megatron-LM's
/// `--cp-comm-type`, TorchTitan's `context_parallel_rotate_method`, the UPipe fork's attention
/// implementation (`usp`, `upipe`, `torch_ring_alltoall`), Accelerate's backend (`deepspeed` for
/// its Ulysses SP, else torch CP's `cp_comm_strategy`), DeepSpeed's mode (`ulysses`, `fpdt`),
/// ArcticTraining's (`ulysses`).
struct LauncherRun {
  std::string_view launcher;
  std::string_view selects;
};

/// The launchers that run a method, best first (names as `--emit` spells them), and a note on the
/// ones that need a particular setting or fork.
struct LauncherSupport {
  std::vector<LauncherRun> runs;
  std::string_view note;  ///< empty when none
  bool runs_on(std::string_view launcher) const;
  /// The launcher's word for the method; nullopt when it does not run it.
  std::optional<std::string_view> selects_on(std::string_view launcher) const;
  /// "a, b, c".
  std::string list() const;
  /// "a, b or c (note)".
  std::string sentence() const;
};

/// How one launcher runs one configuration of a method: the launcher's word for it (LauncherRun)
/// and what the launcher does differently from what cpsim simulates (notes for the emitted file).
struct LauncherSelection {
  std::string selects;
  std::vector<std::string> notes;
};

/// What a search offers a method: the CP degree to split and the model's heads.
struct SearchSpace {
  int cp_degree = 1;
  std::int64_t heads = 0;
  /// Throughput search at this length (FPDT chunks must divide it); nullopt: longest context.
  std::optional<std::int64_t> seq_len;
};

/// The scheme of one context-parallel *method* (ulysses, upipe, ring, allgather, fpdt, usp): what
/// the method does whatever code runs it. The upstream code that runs a method is an
/// *implementation* (implementation.hpp). Schemes are stateless and registered once
/// (cp_schemes); everything method-specific lives behind this interface.
class CpScheme {
 public:
  virtual ~CpScheme() = default;
  virtual models::CpMethod id() const = 0;
  const char* name() const { return models::to_string(id()); }

  // ---- shape ----
  /// Heads are split across the CP group by an all-to-all (Ulysses part).
  virtual bool has_ulysses_part() const = 0;
  /// K/V move between ranks that hold different tokens (ring part): ring steps or an all-gather.
  virtual bool has_ring_part() const = 0;
  /// The ring part all-gathers K/V instead of rotating blocks.
  virtual bool gathers_kv() const { return false; }
  /// Reads ParallelConfig::heads_per_stage.
  virtual bool uses_heads_per_stage() const { return false; }
  /// Reads ParallelConfig::fpdt_chunk and fpdt_offload.
  virtual bool uses_fpdt_chunk() const { return false; }
  /// Its scheme builds multi-head latent attention (value heads narrower than the query's, the
  /// latent projections): the Ulysses scheme does, and the methods built on it.
  virtual bool builds_latent_attention() const { return true; }
  /// Whether selective checkpointing changes what a block of configuration `p` keeps and runs
  /// again (the Ulysses scheme, which the ring, all-gather and USP methods build on, recomputes
  /// the attention core from the local Q and K/V). false: the method's attention keeps what it
  /// keeps without checkpointing, so a step under selective checkpointing is, op for op, the step
  /// without any (a search simulates it once for both).
  virtual bool recomputes_selectively(const models::ParallelConfig& /*p*/) const { return true; }

  // ---- validation and layout (called by check_head_layout in this order) ----
  /// The ring degree against the CP degree.
  virtual std::optional<ConfigIssue> check_ring_degree(const models::ParallelConfig& p) const = 0;
  /// After the sequence length is known to be a multiple of the CP degree: the method's own
  /// sequence constraints.
  virtual std::optional<ConfigIssue> check_sequence(const ScheduleInputs& /*in*/) const {
    return std::nullopt;
  }
  /// Fills heads_per_stage, stages, kv_heads_per_fetch, stages_per_kv_fetch and fpdt_chunks of
  /// `layout` (cp, ulysses, ring, heads and the KV replication are set).
  virtual std::optional<ConfigIssue> stage_heads(const ScheduleInputs& in,
                                                 HeadLayout& layout) const;
  /// Per-rank bytes of the attention buffers of one layer.
  virtual AttentionBuffers buffers(const ScheduleInputs& in, const HeadLayout& layout) const;
  /// The sequence lengths the method accepts are the multiples of this.
  virtual std::int64_t seq_multiple(const models::ParallelConfig& p) const;

  // ---- the attention block of one layer (between norm1 and the output projection) ----
  /// Forward; `grad` false when it runs without autograd (the first forward under full AC).
  /// Recomputation runs this again with grad on.
  virtual void attention_forward(detail::StepBuilder& b,
                                 detail::SavedLayer& sv,
                                 detail::TensorSet params,
                                 bool grad) const = 0;
  virtual detail::InputGrad attention_backward(detail::StepBuilder& b,
                                               const detail::SavedLayer& sv,
                                               detail::TensorSet d_o,
                                               detail::TensorSet params,
                                               detail::TensorSet grads) const = 0;

  // ---- planner and front ends ----
  /// The configurations a search tries for one CP degree: `base` with method, CP degree set and
  /// heads_per_stage 0, zigzag layout; appended to `out`.
  virtual void search_candidates(const models::ParallelConfig& base,
                                 const SearchSpace& space,
                                 std::vector<models::ParallelConfig>& out) const = 0;
  /// Order of magnitude of the ops one block simulates (sorts a search's work, longest first).
  virtual std::int64_t ops_per_block_estimate(const ScheduleInputs& in) const;
  /// `layout` may be null where the configuration is refused (kDegrees only).
  virtual std::string label(LabelStyle style,
                            const models::ParallelConfig& p,
                            const HeadLayout* layout) const = 0;
  /// Colour of the method in reports (#rrggbb).
  virtual std::string_view report_color() const = 0;
  virtual LauncherSupport launchers() const = 0;
  /// How `launcher` runs configuration `p` with the recipe's `attention_kernel`; nullopt when it
  /// does not run the method. The default is the launcher's word from launchers(), no notes.
  /// Why `launcher`'s code refuses `model` under this method where cpsim's scheme runs it (the
  /// launcher's run is the scheme alone, no implementation modelled); nullopt: it runs it.
  virtual std::optional<std::string> launcher_refuses(
      std::string_view /*launcher*/, const models::TransformerSpec& /*model*/) const {
    return std::nullopt;
  }
  virtual std::optional<LauncherSelection> launcher_selection(
      std::string_view launcher,
      const models::ParallelConfig& p,
      std::string_view attention_kernel) const;
};

/// Every implementation, in the order searches and `--method all` list them.
std::span<const CpScheme* const> cp_schemes();
/// The implementation of `method` (every CpMethod has one).
const CpScheme& cp_scheme(models::CpMethod method);

}  // namespace cpsim::sim
