#pragma once
/// @file Attention work of a packed sequence under a document mask, per pair of ring positions:
/// what each CP rank's queries see of each rank's keys when a token attends only to the earlier
/// tokens of its own document. The step builder scales its attention kernels by this work over
/// the work of one document filling the sequence (the causal mask it models otherwise), so one
/// document gives today's step exactly (docs/PACKING.md, "Attention work").

#include <cstdint>
#include <string_view>
#include <vector>

#include "cpsim/models/documents.hpp"
#include "cpsim/models/parallel.hpp"

namespace cpsim::sim {

/// How a CP ring splits a packed sequence over its positions.
enum class DocumentSplit : std::uint8_t {
  /// The ring layout (zigzag head-tail, or contiguous) applied to the packed sequence as a whole.
  kSequence,
  /// Every document padded to a multiple of 2R and split head-tail on its own: chunk i and
  /// 2R−1−i of every document on position i (zigzag layout only).
  kPerDocument,
  /// FlexAttention blocks of kFlexBlockTokens dealt to positions by processing-time round-robin
  /// on their masked block counts (PyTorch's PTRR load balancer).
  kPtrrBlocks,
};
const char* to_string(DocumentSplit s);

/// FlexAttention's default block (torch.nn.attention.flex_attention _DEFAULT_SPARSE_BLOCK_SIZE).
inline constexpr std::int64_t kFlexBlockTokens = 128;

/// How a CP code hands a packed sequence's tokens to its ranks (planner/batches.hpp names them).
enum class Balancer : std::uint8_t {
  kHeads,        ///< no ring part: every rank the whole sequence of its heads
  kHeadTail,     ///< the ring layout zigzag over the packed sequence
  kContiguous,   ///< the ring layout contiguous over the packed sequence
  kPerDocument,  ///< every document padded to 2R and split head-tail
  /// Megatron-Core's hybrid CP: every document on its own power-of-two CP group of the DP × CP
  /// ranks, scheduled in rounds (planner/hybrid_cp.hpp)
  kHybridCp,
  /// Megatron-LM's dynamic CP (dev branch): per micro-batch, power-of-two CP groups that run
  /// their documents packed (planner/dynamic_cp.hpp)
  kDynamicCp,
  /// TorchTitan's ptrr balancer: FlexAttention blocks dealt by processing-time round-robin
  kPtrr,
};

/// How an implementation's code attends packed documents (Implementation::document_masking).
struct DocumentMasking {
  enum class Kind : std::uint8_t {
    kNotRead,          ///< not read from its source: packed batches are refused
    kAcrossDocuments,  ///< no document mask: attention is causal over the packed sequence
    kMasked,           ///< a document mask, with the balancers listed
  };
  Kind kind = Kind::kNotRead;
  std::vector<Balancer> balancers;
  std::string_view source;  ///< where its code says so (or what was not read)
};

/// Work of the ring positions of one packed sequence. Work is the area of the visible (query,
/// key) region with positions as continuous coordinates, the convention of the cost model's
/// causal FLOPs (an n-token causal block: n²/2; a full q × k block: q·k).
struct DocumentWork {
  int ring = 0;  ///< ring positions R; 0: no documents (nothing is scaled)
  /// R × R, row i the queries of position i, column j the keys of position j: the visible area
  /// under the document mask.
  std::vector<double> visible;
  /// The same for one document filling the sequence, under the configuration's ring layout.
  std::vector<double> reference;
  /// What it was computed from (a finer split, such as FPDT's chunks, starts from it again).
  models::PackedSequence sequence;
  std::int64_t sequence_tokens = 0;

  bool empty() const { return ring == 0; }
  /// visible / reference of position i's queries against position j's keys (0 where the
  /// reference sees nothing).
  double pair_factor(int i, int j) const;
  /// Ring step `step`: position i computes on the keys of position (i − step) mod R.
  double step_factor(int position, int step) const {
    return pair_factor(position, source(position, step));
  }
  /// Position i's queries against every key.
  double position_factor(int i) const;
  /// All queries against all keys (a rank that holds the whole sequence for some heads).
  double total_factor() const;
  /// The busiest position's work over the mean (1: balanced); 1 for R = 1, whose ranks split
  /// heads, not tokens.
  double imbalance() const;
  /// The busiest position's visible area: what the slowest rank of the sequence computes.
  double busiest_work() const;

 private:
  int source(int position, int step) const { return ((position - step) % ring + ring) % ring; }
  double row(const std::vector<double>& m, int i) const;
};

/// The work of `sequence` (of `sequence_tokens`, its span multiple 2R for kPerDocument) on a ring
/// of `ring` positions. @throws std::invalid_argument for kPerDocument with a contiguous layout,
/// a span multiple that does not suit the split, or documents longer than the sequence.
DocumentWork document_work(const models::PackedSequence& sequence,
                           std::int64_t sequence_tokens,
                           int ring,
                           models::RingLayout layout,
                           DocumentSplit split);

}  // namespace cpsim::sim
