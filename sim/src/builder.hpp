#pragma once
// Internal: emits ops and tensors for every rank at once. Ranks run the same program (CP methods
// of this version are symmetric), so one call creates one op per rank: the op of rank r is
// `base + r`, and likewise for tensors.

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "cpsim/sim/cost_model.hpp"
#include "cpsim/sim/workload.hpp"

namespace cpsim::sim::detail {

/// A tensor on every rank: rank r's tensor is `base + r`. base < 0 means "none".
struct TensorSet {
  TensorId base = kNone;
  bool valid() const { return base != kNone; }
};
/// An op on every rank.
struct OpSet {
  OpId base = kNone;
  bool valid() const { return base != kNone; }
};

enum class Group : std::uint8_t {
  kCp,   ///< the rank's context-parallel group (consecutive ranks)
  kAll,  ///< every rank (FSDP)
};

struct OpSpec {
  std::string name;
  Stream stream = Stream::kCompute;
  OpKind kind = OpKind::kElementwise;
  double time_s = 0.0;
  double flops = 0.0;
  std::int64_t transfer_bytes = 0;
  std::int64_t workspace_bytes = 0;
  MemCategory workspace_category = MemCategory::kOther;
  std::vector<TensorSet> inputs;
  std::vector<TensorSet> outputs;
  std::vector<OpSet> deps;
};

class Builder {
 public:
  Builder(Workload& w, int ranks, int cp_degree, int gpus_per_node);

  void set_phase(Phase p) { phase_ = p; }
  void set_layer(std::int32_t layer) { layer_ = layer; }
  Phase phase() const { return phase_; }

  TensorSet tensor(const std::string& name,
                   std::int64_t bytes,
                   MemCategory category,
                   bool on_host = false);
  OpSet op(const OpSpec& spec);
  /// One collective per group (kCp: one per CP group; kAll: one over all ranks).
  OpSet collective(const OpSpec& spec,
                   Group group,
                   models::Collective kind,
                   const CostModel& cost,
                   std::int64_t size_bytes);
  /// Makes `consumer` read `t` too (keeps `t` alive until `consumer` ends).
  int ranks() const { return ranks_; }
  int cp_degree() const { return cp_; }
  models::Span span_of(Group g) const;

 private:
  Workload& w_;
  int ranks_;
  int cp_;
  int gpus_per_node_;
  Phase phase_ = Phase::kForward;
  std::int32_t layer_ = -1;
};

}  // namespace cpsim::sim::detail
