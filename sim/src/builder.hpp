#pragma once
// Internal: emits ops and tensors for every rank at once. Ranks run the same program (CP methods
// of this version are symmetric), so one call creates one op per rank: the op of rank r is
// `base + r`, and likewise for tensors.

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cpsim/sim/cost_model.hpp"
#include "cpsim/sim/workload.hpp"

namespace cpsim::sim::detail {

/// A tensor on every rank: rank r's tensor is `base + r`. base < 0 means "none".
struct TensorSet {
  TensorId base = kNone;
  bool valid() const { return base != kNone; }
  bool operator==(const TensorSet&) const = default;
};
/// An op on every rank.
struct OpSet {
  OpId base = kNone;
  bool valid() const { return base != kNone; }
  bool operator==(const OpSet&) const = default;
};

/// Communication groups. A CP group is C consecutive ranks (one per data-parallel replica); inside
/// it, Ulysses groups are u consecutive ranks (inside a node when u ≤ GPUs per node) and ring
/// groups are the r ranks with stride u (the USP "ulysses low" placement). With tensor
/// parallelism of degree T, T consecutive ranks form a TP group and every other group is the same
/// layout over the ranks of one TP position (stride T): Megatron's and TorchTitan's rank order
/// with TP innermost, then CP, then data parallel.
enum class Group : std::uint8_t {
  kCp,       ///< the rank's whole CP group
  kUlysses,  ///< the rank's Ulysses (all-to-all) group
  kRing,     ///< the rank's ring group
  kAll,      ///< every rank of the same TP position (FSDP / ZeRO; all ranks without TP)
  kTp,       ///< the rank's TP group (T consecutive ranks)
  /// The rank's expert-parallel group: E_p consecutive ranks of one TP position (TorchTitan's
  /// sparse mesh [..., efsdp, ep] and Megatron-Core's expert rank order "tp-ep-dp" put EP
  /// innermost); one rank without EP.
  kExpert,
  /// The ranks holding the same experts: stride E_p, (ranks / T) / E_p of them (TorchTitan's
  /// efsdp, Megatron-Core's expert data-parallel group); kAll without EP.
  kExpertData,
};

/// A list argument of a builder call: a braced list or a vector, read during the call only (no
/// copy, no allocation).
template <class T>
class ListRef {
 public:
  ListRef() = default;
  ListRef(std::initializer_list<T> list) : list_(list) {}
  ListRef(const std::vector<T>& v) : vector_(&v) {}
  const T* begin() const { return vector_ != nullptr ? vector_->data() : list_.begin(); }
  const T* end() const { return begin() + size(); }
  std::size_t size() const { return vector_ != nullptr ? vector_->size() : list_.size(); }

 private:
  std::initializer_list<T> list_;
  const std::vector<T>* vector_ = nullptr;
};

/// The name of an op or tensor: text, interned on use, or an id already interned (name_series);
/// text is read during the call only.
class Name {
 public:
  Name(const char* text) : text_(text) {}
  Name(const std::string& text) : text_(text) {}
  Name(std::string_view text) : text_(text) {}
  static Name interned(std::int32_t id) {
    Name n{std::string_view{}};
    n.id_ = id;
    return n;
  }
  /// The interned id in `w`.
  std::int32_t id(Workload& w) const { return id_ != kNone ? id_ : w.intern(text_); }
  /// The text, copied (interning another name may move the one `w` holds).
  std::string text(const Workload& w) const {
    return id_ != kNone ? w.names[static_cast<std::size_t>(id_)] : std::string(text_);
  }

 private:
  std::string_view text_;
  std::int32_t id_ = kNone;
};

struct OpSpec {
  std::string name;
  std::int32_t name_id = kNone;  ///< an interned name (Builder::name and friends); overrides `name`
  Stream stream = Stream::kCompute;
  OpKind kind = OpKind::kElementwise;
  double time_s = 0.0;
  std::vector<double> time_s_per_rank;  ///< overrides time_s when ranks differ (index = rank)
  double flops = 0.0;
  std::int64_t transfer_bytes = 0;
  std::int64_t workspace_bytes = 0;
  MemCategory workspace_category = MemCategory::kOther;
  MemoryPool memory_pool = MemoryPool::kByStream;  ///< Op::memory_pool
  /// Framework ops the host issues for it (Op::host_calls; beyond its range, its maximum), and
  /// whether the host waits for it to end (Op::host_sync).
  std::int64_t host_calls = 1;
  bool host_sync = false;
  std::vector<TensorSet> inputs;
  std::vector<TensorSet> outputs;
  std::vector<OpSet> deps;
};

/// Sizes of the workload's arrays at one point of the build; a segment lies between two marks.
struct Mark {
  std::int32_t ops = 0, tensors = 0, edges = 0, collectives = 0;
  bool operator==(const Mark&) const = default;
};

class Builder {
 public:
  /// `ranks` GPUs of which the first `simulated_ranks` get ops (1 = the representative-rank fast
  /// path for symmetric schedules: collectives keep the cost of their real group size).
  Builder(Workload& w,
          int ranks,
          int simulated_ranks,
          int cp_degree,
          int ring_degree,
          int gpus_per_node,
          int tp_degree = 1,
          int ep_degree = 1);

  void set_phase(Phase p) { phase_ = p; }
  void set_layer(std::int32_t layer) { layer_ = layer; }
  Phase phase() const { return phase_; }

  TensorSet tensor(std::string_view name,
                   std::int64_t bytes,
                   MemCategory category,
                   bool on_host = false);
  /// The same with an interned name (see name_series).
  TensorSet tensor(std::int32_t name_id,
                   std::int64_t bytes,
                   MemCategory category,
                   bool on_host = false);
  OpSet op(const OpSpec& spec);
  /// The op whose start allocates `t` (its first writer); none when `t` is none or allocated
  /// before the step.
  OpSet producer(TensorSet t) const {
    return t.valid() ? OpSet{w_.tensors[static_cast<std::size_t>(t.base)].producer} : OpSet{};
  }

  /// Names that differ by one index (a chunk, a stage) and repeat in every layer: a series is
  /// looked up once per call site by its key, and series_name(series, i, make) interns make()
  /// the first time index i is asked for in this build, then returns the cached id.
  std::int32_t name_series(const std::string& key);
  template <class Make>
  std::int32_t series_name(std::int32_t series, std::int64_t index, const Make& make) {
    std::vector<std::int32_t>& ids = series_[static_cast<std::size_t>(series)].second;
    const auto i = static_cast<std::size_t>(index);
    if (i >= ids.size()) {
      ids.resize(i + 1, kNone);
    }
    if (ids[i] == kNone) {
      ids[i] = w_.intern(make());
    }
    return ids[i];
  }
  /// One collective per group (kCp: one per CP group; kAll: one over all ranks). `calls` > 1:
  /// that many calls of `size_bytes` back to back as one op (their latencies and bytes add up).
  OpSet collective(const OpSpec& spec,
                   Group group,
                   models::Collective kind,
                   const CostModel& cost,
                   std::int64_t size_bytes,
                   std::int64_t calls = 1);
  // ---- segments (layer templates, layer_template.hpp) ----
  Mark mark() const;
  /// Removes everything appended since `m` (ops, tensors, edges, collectives; interned names and
  /// groups stay). Only for a segment that nothing before `m` refers to: a template's recording.
  void truncate(const Mark& m);
  /// While recording a template: a dependency on an op in [lo, hi) (a port tensor's producer) is
  /// kept even on the same rank and stream, for the instance to decide with the bound producer.
  /// kNone, kNone: none (the default).
  void set_port_ops(OpId lo, OpId hi) {
    port_ops_lo_ = lo;
    port_ops_hi_ = hi;
  }

  int ranks() const { return ranks_; }
  int simulated_ranks() const { return sim_ranks_; }
  int cp_degree() const { return cp_; }
  int ring_degree() const { return ring_; }
  int ulysses_degree() const { return cp_ / ring_; }
  int group_size(Group g) const;
  /// Simulated members of the group of kind `g` that contains `rank`, in rank order.
  std::vector<std::int32_t> members(Group g, int rank) const;
  /// Every member (simulated or not) of the group of kind `g` that contains `rank`.
  std::vector<std::int32_t> all_members(Group g, int rank) const;
  /// Position of `rank` inside its group of kind `g`.
  int position(Group g, int rank) const;
  /// Intra-node when every member sits on one node.
  models::Span span_of(Group g) const;
  /// The collective kinds run over groups of kind `g` so far in this build: bit 1 << kind per
  /// models::Collective (a template's recording counts for its instances).
  std::uint8_t collective_kinds(Group g) const {
    return collective_kinds_[static_cast<std::size_t>(g)];
  }
  static constexpr int kGroupKinds = 7;
  int gpus_per_node() const { return gpus_per_node_; }

 private:
  /// The simulated groups of one kind, in order of their lowest rank, and each simulated rank's
  /// group (computed on first use).
  struct Groups {
    bool ready = false;
    models::Span span = models::Span::kIntraNode;
    std::vector<std::vector<std::int32_t>> members;
    std::vector<std::int32_t> ids;  ///< each group's index into Workload::groups
    std::vector<std::int32_t> of_rank;
  };
  const Groups& groups(Group g);
  /// Appends the op of every simulated rank; `time_s` replaces the spec's durations when set.
  OpSet emit(const OpSpec& spec, OpKind kind, const double* time_s);
  /// A dependency on the op itself, a later or an unknown op is a bug in a builder.
  /// @throws std::logic_error naming both ops.
  [[noreturn]] void throw_bad_dependency(std::int32_t name_id, OpId self, int rank, OpId dep) const;

  Workload& w_;
  int ranks_;
  int sim_ranks_;
  int cp_;
  int ring_;
  int gpus_per_node_;
  int tp_ = 1;
  int ep_ = 1;
  Phase phase_ = Phase::kForward;
  std::int32_t layer_ = -1;
  std::array<Groups, kGroupKinds> groups_;
  std::array<std::uint8_t, kGroupKinds> collective_kinds_{};
  /// An op with at most this many candidate dependencies (explicit ones and its inputs'
  /// producers) de-duplicates them by a scan; one with more by dep_mark_.
  static constexpr std::size_t kDepsScanned = 16;
  /// dep_mark_[d] == op while op's dependency list holds d (de-duplication in O(1)).
  std::vector<OpId> dep_mark_;
  OpId port_ops_lo_ = kNone, port_ops_hi_ = kNone;  ///< set_port_ops
  std::vector<std::pair<std::string, std::vector<std::int32_t>>> series_;
  std::unordered_map<std::string, std::int32_t> series_index_;  ///< key -> index into series_
  /// The last collective costs asked for (a layer repeats the same few sizes).
  struct CostEntry {
    const CostModel* cost = nullptr;
    models::Collective kind = models::Collective::kAllToAll;
    Group group = Group::kCp;
    std::int64_t size_bytes = -1;
    CollectiveCost value;
  };
  std::array<CostEntry, 8> cost_cache_{};
  std::size_t cost_cache_next_ = 0;
};

/// Interned per-index names of one function (FPDT chunks, UPipe stages), cached by the builder for
/// the whole step: every layer and pass emits the same ones.
class ChunkNames {
 public:
  ChunkNames(Builder& b, const char* series, int slots, const char* const* stems)
      : b_(b), series_(b.name_series(series)), slots_(slots), stems_(stems) {}
  /// stems[slot] + "[<letter><index>]".
  std::int32_t operator()(int slot, char letter, std::int64_t index) {
    return b_.series_name(series_, index * slots_ + slot, [&] {
      return std::string(stems_[slot]) + "[" + letter + std::to_string(index) + "]";
    });
  }
  /// A name made by `make` (the formatted ones).
  template <class Make>
  std::int32_t operator()(int slot, std::int64_t index, const Make& make) {
    return b_.series_name(series_, index * slots_ + slot, make);
  }

 private:
  Builder& b_;
  std::int32_t series_;
  int slots_;
  const char* const* stems_;
};

}  // namespace cpsim::sim::detail
