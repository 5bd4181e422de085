// Megatron-LM's dynamic CP scheduler, as its `dev` branch runs it at commit d48bd6b
// (megatron/core/datasets/data_schedule_utils.py: next_hdp_group_packing_aware, 592-831;
// dcp_gpus_needed, 933-936; data_schedule.py: DefaultDynamicCPScheduler, 407-448; REFERENCES.md
// [DynamicCP-Megatron]). Checked against a trace of that code
// (data/schedules/megatron-dynamic-cp.json, scripts/trace_dynamic_cp.py) by
// DynamicCp.ScheduleIsTheTracedUpstreamSchedule.
//
// Each micro-batch, from the documents left (sorted longest first, stable, at every call):
// - cap = the tallest document's length × max_seqlen_per_dp_cp_rank × 1.05: no rank's work
//   (Σ l²/g over its documents) may pass it;
// - the tallest document opens a group of its CP size (the least power of two g with l/g ≤ max
//   tokens per rank) on the first ranks;
// - every other document tries each CP size from its own up to all ranks: joining an existing group
//   of that size whose packed tokens per rank stay ≤ max, or a new group on the free ranks with
//   least work; the placement with the least resulting maximum work under the cap wins (first
//   found on ties, sizes in increasing order, groups in creation order before a new one); a
//   document with none is left for the next micro-batch;
// - while ranks are idle, the first group of the smallest size that has room doubles (its
//   documents on the wider group, the groups after it moved up); when none can, the micro-batch
//   becomes one group of all ranks holding the documents (of all this call's) whose tokens per
//   rank fit, longest first, the others left over.
#include "cpsim/planner/dynamic_cp.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <stdexcept>

#include "cpsim/models/documents.hpp"
#include "cpsim/sim/document_work.hpp"

#include "document_groups.hpp"

namespace cpsim::planner {

namespace {

constexpr double kWorkCapDelta = 0.05;  // _DYNAMIC_CP_WORKLOAD_CAP_DELTA

using document_groups::Document;
using document_groups::work;

class MicroBatch {
 public:
  MicroBatch(int ranks, std::int64_t max_tokens_per_rank)
      : ranks_(ranks),
        max_tokens_(static_cast<double>(max_tokens_per_rank)),
        max_tokens_per_rank_(max_tokens_per_rank),
        documents_(static_cast<std::size_t>(ranks)),
        work_(static_cast<std::size_t>(ranks), 0.0),
        group_of_(static_cast<std::size_t>(ranks), -1) {}

  /// Schedules one micro-batch from `pending` (longest first); returns the documents left.
  std::vector<Document> run(const std::vector<Document>& pending) {
    const double cap =
        static_cast<double>(pending.front().length) * max_tokens_ * (1.0 + kWorkCapDelta);
    std::vector<int> first(static_cast<std::size_t>(cp_of(pending.front().length)));
    std::iota(first.begin(), first.end(), 0);
    open_group(pending.front(), first);
    std::vector<Document> leftovers;
    for (std::size_t i = 1; i < pending.size(); ++i) {
      if (!place(pending[i], cap)) {
        leftovers.push_back(pending[i]);
      }
    }
    while (std::any_of(documents_.begin(), documents_.end(),
                       [](const auto& ids) { return ids.empty(); })) {
      if (!grow_smallest_group()) {
        leftovers = one_group_of_all(pending);
        break;
      }
    }
    return leftovers;
  }

  HybridCpRound result(const std::vector<std::int64_t>& lengths) const {
    return document_groups::round_of(documents_, lengths);
  }

 private:
  struct Group {
    std::vector<int> members;
    int size = 0;
    double tokens_per_rank = 0.0;  // packing_sequence_len
  };
  struct Placement {
    double projected = 0.0;
    int cp = 0;
    std::optional<std::size_t> group;  // empty: a new group of `ranks`
    std::vector<int> ranks;
  };

  int cp_of(std::int64_t length) const { return hybrid_cp_size(length, max_tokens_per_rank_); }

  double projected_max(const std::vector<int>& members, double cost) const {
    double out = 0.0;
    for (int r = 0; r < ranks_; ++r) {
      const bool member = std::find(members.begin(), members.end(), r) != members.end();
      out = std::max(out, work_[static_cast<std::size_t>(r)] + (member ? cost : 0.0));
    }
    return out;
  }

  void assign(const Document& d, const std::vector<int>& ranks, int cp) {
    for (const int r : ranks) {
      documents_[static_cast<std::size_t>(r)].push_back(d.id);
      work_[static_cast<std::size_t>(r)] += work(d.length, cp);
    }
  }

  void open_group(const Document& d, const std::vector<int>& ranks) {
    const auto cp = static_cast<int>(ranks.size());
    for (const int r : ranks) {
      group_of_[static_cast<std::size_t>(r)] = static_cast<int>(groups_.size());
    }
    groups_.push_back({ranks, cp, static_cast<double>(d.length) / cp});
    assign(d, ranks, cp);
  }

  bool place(const Document& d, double cap) {
    std::optional<Placement> best;
    for (int cp = cp_of(d.length); cp <= ranks_; cp *= 2) {
      const double cost = work(d.length, cp);
      const double per_rank = static_cast<double>(d.length) / cp;
      for (std::size_t g = 0; g < groups_.size(); ++g) {
        if (groups_[g].size != cp || groups_[g].tokens_per_rank + per_rank > max_tokens_) {
          continue;
        }
        const double projected = projected_max(groups_[g].members, cost);
        if (projected <= cap && (!best || projected < best->projected)) {
          best = Placement{projected, cp, g, {}};
        }
      }
      std::vector<int> free;
      for (int r = 0; r < ranks_; ++r) {
        if (group_of_[static_cast<std::size_t>(r)] < 0) {
          free.push_back(r);
        }
      }
      if (static_cast<int>(free.size()) >= cp) {
        std::stable_sort(free.begin(), free.end(), [&](int a, int b) {
          return work_[static_cast<std::size_t>(a)] < work_[static_cast<std::size_t>(b)];
        });
        free.resize(static_cast<std::size_t>(cp));
        const double projected = projected_max(free, cost);
        if (projected <= cap && (!best || projected < best->projected)) {
          best = Placement{projected, cp, std::nullopt, free};
        }
      }
    }
    if (!best) {
      return false;
    }
    if (best->group) {
      Group& g = groups_[*best->group];
      g.tokens_per_rank += static_cast<double>(d.length) / best->cp;
      assign(d, g.members, best->cp);
    } else {
      open_group(d, best->ranks);
    }
    return true;
  }

  // fill_empty_gpus_once: false when no group of the smallest size can double.
  bool grow_smallest_group() {
    const auto idle = std::find_if(documents_.begin(), documents_.end(),
                                   [](const auto& ids) { return ids.empty(); });
    const auto first_idle = static_cast<int>(idle - documents_.begin());
    assert(std::all_of(idle, documents_.end(), [](const auto& ids) { return ids.empty(); }));
    int smallest = std::numeric_limits<int>::max();
    for (const Group& g : groups_) {
      smallest = std::min(smallest, g.size);
    }
    const int grown = std::min(2 * smallest, ranks_);
    const int added = grown - smallest;
    for (Group& g : groups_) {
      if (g.size != smallest) {
        continue;
      }
      const int start = g.members.front(), end = g.members.back();
      if (end + 1 > first_idle || end + added >= ranks_) {
        continue;
      }
      // The ranks' work (exec_times) is not read once the documents are placed: not moved.
      std::vector<std::vector<std::size_t>> moved(static_cast<std::size_t>(ranks_));
      for (int r = 0; r < start; ++r) {
        moved[static_cast<std::size_t>(r)] = documents_[static_cast<std::size_t>(r)];
      }
      for (int r = start; r <= end + added; ++r) {
        moved[static_cast<std::size_t>(r)] = documents_[static_cast<std::size_t>(end)];
      }
      for (int r = end + 1; r < first_idle; ++r) {
        moved[static_cast<std::size_t>(r + added)] = documents_[static_cast<std::size_t>(r)];
      }
      for (Group& other : groups_) {
        if (&other != &g && other.members.front() > end) {
          for (int& r : other.members) {
            r += added;
          }
        }
      }
      g.size = grown;
      g.members.resize(static_cast<std::size_t>(grown));
      std::iota(g.members.begin(), g.members.end(), start);
      documents_ = std::move(moved);
      return true;
    }
    return false;
  }

  // fill_with_full_dpxcp_group: one group of every rank; returns the documents it cannot hold.
  std::vector<Document> one_group_of_all(const std::vector<Document>& pending) {
    std::vector<std::size_t> selected;
    std::vector<Document> left;
    double per_rank = 0.0;
    for (const Document& d : pending) {
      const double share = static_cast<double>(d.length) / ranks_;
      if (per_rank + share <= max_tokens_) {
        selected.push_back(d.id);
        per_rank += share;
      } else {
        left.push_back(d);
      }
    }
    // The longest document fits all ranks (its CP size is at most the rank count).
    assert(!selected.empty());
    documents_.assign(static_cast<std::size_t>(ranks_), selected);
    return left;
  }

  int ranks_;
  double max_tokens_;
  std::int64_t max_tokens_per_rank_;
  std::vector<std::vector<std::size_t>> documents_;  // per rank: document ids, in order
  std::vector<double> work_;                         // per rank: Σ l²/g (exec_times)
  std::vector<int> group_of_;                        // per rank: group index, -1 while free
  std::vector<Group> groups_;                        // in creation order
};

std::vector<Document> longest_first(std::vector<Document> documents) {
  std::stable_sort(documents.begin(), documents.end(),
                   [](const Document& a, const Document& b) { return a.length > b.length; });
  return documents;
}

}  // namespace

std::vector<HybridCpRound> schedule_dynamic_cp(const std::vector<std::int64_t>& documents,
                                               int ranks,
                                               std::int64_t max_tokens_per_rank) {
  std::vector<Document> pending = document_groups::checked_documents(
      documents, ranks, max_tokens_per_rank, "schedule_dynamic_cp");
  std::vector<HybridCpRound> out;
  while (!pending.empty()) {
    pending = longest_first(std::move(pending));
    MicroBatch micro_batch(ranks, max_tokens_per_rank);
    std::vector<Document> left = micro_batch.run(pending);
    assert(left.size() < pending.size());
    out.push_back(micro_batch.result(documents));
    pending = std::move(left);
  }
  return out;
}

DynamicCpTimer::DynamicCpTimer(const sim::ScheduleInputs& in) : base_(in) {
  const models::ParallelConfig& p = in.parallel;
  base_.documents = {};
  base_.parallel.micro_batches = 1;
  ranks_ = p.data_parallel() * p.cp_degree;
  max_tokens_per_rank_ = p.seq_len / p.cp_degree;
  span_multiple_ = 2 * std::int64_t{ranks_} * p.tp_degree;
  const double one_micro_batch_step_s = memory_.step_s(base_, scratch_);
  outside_micro_batches_s_ =
      one_micro_batch_step_s - micro_batch_s(HybridCpGroup{0, p.cp_degree, {p.seq_len}});
}

double DynamicCpTimer::micro_batch_s(const HybridCpGroup& group) {
  sim::ScheduleInputs in = base_;
  std::int64_t tokens = 0;
  for (const std::int64_t l : group.documents) {
    tokens += l;
  }
  in.parallel.cp_degree = group.cp;
  in.parallel.ring_degree = group.cp;
  in.parallel.seq_len = tokens;
  in.parallel.micro_batches = 1;
  in.documents =
      sim::document_work(models::PackedSequence{group.documents, span_multiple_}, tokens, group.cp,
                         models::RingLayout::kZigzag, sim::DocumentSplit::kPerDocument);
  const double one_s = memory_.step_s(in, scratch_);
  in.parallel.micro_batches = 2;
  return memory_.step_s(in, scratch_) - one_s;
}

HybridCpStep DynamicCpTimer::step(const std::vector<std::int64_t>& documents) {
  HybridCpStep out;
  out.rounds = schedule_dynamic_cp(documents, ranks_, max_tokens_per_rank_);
  std::vector<double> finish(static_cast<std::size_t>(ranks_), 0.0);
  std::vector<double> attention(static_cast<std::size_t>(ranks_), 0.0);
  for (const HybridCpRound& round : out.rounds) {
    for (const HybridCpGroup& g : round.groups) {
      const auto first = finish.begin() + g.first_rank;
      const double start = *std::max_element(first, first + g.cp);
      const double end = start + micro_batch_s(g);
      std::fill(first, first + g.cp, end);
      double group_work = 0.0;
      for (const std::int64_t l : g.documents) {
        group_work += work(l, g.cp) / 2.0;  // causal: l²/2 over the group's g ranks
      }
      const auto at = attention.begin() + g.first_rank;
      std::for_each(at, at + g.cp, [&](double& w) { w += group_work; });
    }
  }
  out.step_s = *std::max_element(finish.begin(), finish.end()) + outside_micro_batches_s_;
  const double mean =
      std::accumulate(attention.begin(), attention.end(), 0.0) / static_cast<double>(ranks_);
  out.imbalance = mean > 0.0 ? *std::max_element(attention.begin(), attention.end()) / mean : 1.0;
  return out;
}

}  // namespace cpsim::planner
