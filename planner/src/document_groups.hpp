#pragma once
// What Megatron's hybrid and dynamic CP schedulers share (planner/src/hybrid_cp.cpp,
// planner/src/dynamic_cp.cpp): a document by id and length, its work on a group, and a round
// read back from the documents each rank holds.

#include <cstdint>
#include <vector>

#include "cpsim/planner/hybrid_cp.hpp"

namespace cpsim::planner::document_groups {

struct Document {
  std::size_t id = 0;
  std::int64_t length = 0;
};

/// The schedulers' work of a document of `length` tokens on `cp` ranks: length² / cp.
inline double work(std::int64_t length, int cp) {
  const auto l = static_cast<double>(length);
  return l * l / cp;
}

/// Consecutive ranks holding the same document ids are one group; `lengths` by id.
HybridCpRound round_of(const std::vector<std::vector<std::size_t>>& ids_per_rank,
                       const std::vector<std::int64_t>& lengths);

/// The documents with ids 0..n−1, checked for a schedule over `ranks` (a power of two) with
/// `max_tokens_per_rank`. @throws std::invalid_argument naming `scheduler`.
std::vector<Document> checked_documents(const std::vector<std::int64_t>& lengths,
                                        int ranks,
                                        std::int64_t max_tokens_per_rank,
                                        const char* scheduler);

}  // namespace cpsim::planner::document_groups
