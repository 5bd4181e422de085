#pragma once
// Internal: what the CP implementations share, and the registry's list of them.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cpsim/sim/cp_method.hpp"

namespace cpsim::sim::methods {

/// Base of the implementations whose layer attention is the Ulysses scheme of the step builder
/// (all-to-all over the Ulysses group, then one call, a ring or an all-gather over the ring group:
/// attention_ulysses.cpp and attention_core.cpp): ulysses, usp, ring and all-gather.
class UlyssesScheme : public CpScheme {
 public:
  void attention_forward(detail::StepBuilder& b,
                         detail::SavedLayer& sv,
                         detail::TensorSet params,
                         bool grad) const override;
  detail::InputGrad attention_backward(detail::StepBuilder& b,
                                       const detail::SavedLayer& sv,
                                       detail::TensorSet d_o,
                                       detail::TensorSet params,
                                       detail::TensorSet grads) const override;
};

/// Base of ring and all-gather: no Ulysses part, the ring is the whole CP group (one search
/// candidate per CP degree), labels from the method's words.
class WholeRingImplementation : public UlyssesScheme {
 public:
  bool has_ulysses_part() const override { return false; }
  bool has_ring_part() const override { return true; }
  std::optional<ConfigIssue> check_ring_degree(const models::ParallelConfig& p) const override;
  void search_candidates(const models::ParallelConfig& base,
                         const SearchSpace& space,
                         std::vector<models::ParallelConfig>& out) const override;
  std::string label(LabelStyle style,
                    const models::ParallelConfig& p,
                    const HeadLayout* layout) const override;

 protected:
  /// The words of the labels: "ring" in search labels and degrees, "Ring attention" in
  /// descriptions.
  struct Words {
    std::string_view search;
    std::string_view description;
    std::string_view degrees;
  };
  virtual Words words() const = 0;
};

/// One factory per implementation file; the registry (registry.cpp) lists them.
const CpScheme& ulysses();
const CpScheme& upipe();
const CpScheme& ring();
const CpScheme& allgather();
const CpScheme& fpdt();
const CpScheme& usp();

/// Divisors of n, ascending.
std::vector<int> divisors(int n);

/// The multiple of the CP degree that the token layout needs: 2C for a zigzag ring, else C.
std::int64_t layout_seq_multiple(const models::ParallelConfig& p);

/// Ulysses and FPDT: the ring degree must be 1.
std::optional<ConfigIssue> no_ring(const models::ParallelConfig& p);
/// Ring and all-gather: the ring is the whole CP group.
std::optional<ConfigIssue> whole_ring(const models::ParallelConfig& p);

/// " dp2" style suffixes are the callers'; this is "(u4 x r2)".
std::string degrees_pair(const models::ParallelConfig& p);

}  // namespace cpsim::sim::methods
