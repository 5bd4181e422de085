// Megatron-Core's hybrid CP scheduler, as megatron-core 0.16.1 runs it
// (megatron/core/pipeline_parallel/hybrid_cp_schedule.py, BalancedCPScheduler; REFERENCES.md
// [HybridCP-Megatron]). Checked against the installed package by tests/packing/test_hybrid_cp.py.
//
// Work of a document of l tokens on g ranks: l²/g; its CP size g = gpus_needed(l), the least power
// of two with l/g ≤ max_seqlen_per_dp_cp_rank (lines 44-53). The documents, longest first
// (stable), are scheduled in rounds (next_hdp_group, lines 104-454); each round:
// 1. Buckets (make_buckets_equal, 55-102): k = the number of distinct CP sizes; the documents in
//    order, a bucket closed before a document that would take it past 1.1 × (total work / k), or
//    when no more documents than buckets still to make are left.
// 2. Placement: the first bucket whose front document has a group of its size in this round or
//    enough free ranks for a new one. That document goes to the existing group of its size whose
//    busiest member has least work, unless the free ranks with least work (the first g of the
//    free ranks, by work, stable) promise less (a strict "<"), then to a new group of them. Empty
//    buckets at the front are dropped. Once a document needs fewer ranks than the round's first
//    one, the round ends as soon as max − min work ≤ 5 % of max while documents remain.
// 3. trim_overload (294-343): while the work's slack is over 5 % of the max and no rank is idle,
//    the busiest rank's group gives back its last document when that lowers the slack (and it has
//    more than one); given-back documents go after the other leftovers.
// 4. fill_empty_gpus (345-440): while ranks are idle, the first group (by creation) of the
//    smallest size doubles (at most to all ranks): its documents run on the wider group and the
//    groups after it move up.
// Leftovers start the next round, in their order (no new sort, 456-474). Groups are consecutive
// ranks: a new group takes the lowest free ranks (they all have no work), and growing keeps order.
// Every rank runs its documents of a round one by one, a forward and a backward each, and the
// round ends with a barrier over DP × CP (hybrid_context_parallel_forward_backward, 577-612).
#include "cpsim/planner/hybrid_cp.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <deque>
#include <limits>
#include <numeric>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>

#include "cpsim/planner/evaluate.hpp"

#include "document_groups.hpp"

namespace cpsim::planner {

namespace {

constexpr double kBalanceSlack = 0.05;   // next_hdp_group's `delta`
constexpr double kBucketOverfill = 1.1;  // make_buckets_equal: "projected > target * 1.1"

using document_groups::Document;
using document_groups::work;

class Round {
 public:
  Round(int ranks, std::int64_t max_tokens_per_rank)
      : ranks_(ranks),
        max_tokens_per_rank_(max_tokens_per_rank),
        documents_(static_cast<std::size_t>(ranks)),
        work_(static_cast<std::size_t>(ranks), 0.0),
        group_of_(static_cast<std::size_t>(ranks), -1) {}

  /// Schedules a round from `pending` (in order); returns the documents left for the next ones.
  std::vector<Document> run(const std::vector<Document>& pending) {
    std::vector<std::deque<Document>> buckets = make_buckets(pending);
    std::optional<int> first_cp;
    bool check_balance = false;
    while (!buckets.empty()) {
      std::optional<std::size_t> chosen;
      for (std::size_t b = 0; b < buckets.size(); ++b) {
        if (!buckets[b].empty() && placeable(cp_of(buckets[b].front().length))) {
          chosen = b;
          break;
        }
      }
      if (!chosen) {
        break;
      }
      const Document d = buckets[*chosen].front();
      const int cp = cp_of(d.length);
      if (!first_cp) {
        first_cp = cp;
      }
      place(d, cp);
      buckets[*chosen].pop_front();
      while (!buckets.empty() && buckets.front().empty()) {
        buckets.erase(buckets.begin());
      }
      if (cp < *first_cp) {
        check_balance = true;
      }
      if (check_balance && !buckets.empty() && balanced()) {
        break;
      }
    }
    std::vector<Document> leftovers;
    for (const auto& bucket : buckets) {
      leftovers.insert(leftovers.end(), bucket.begin(), bucket.end());
    }
    trim_overload(leftovers);
    while (fill_idle_ranks()) {
    }
    return leftovers;
  }

  HybridCpRound result(const std::vector<std::int64_t>& lengths) const {
    return document_groups::round_of(documents_, lengths);
  }

 private:
  int cp_of(std::int64_t length) const { return hybrid_cp_size(length, max_tokens_per_rank_); }
  double estimate(std::int64_t length) const { return work(length, cp_of(length)); }

  std::vector<std::deque<Document>> make_buckets(const std::vector<Document>& pending) const {
    std::set<int> sizes;
    double total = 0.0;
    for (const Document& d : pending) {
      sizes.insert(cp_of(d.length));
      total += estimate(d.length);
    }
    const auto k = static_cast<std::int64_t>(sizes.size());
    const double target = total / static_cast<double>(k);
    std::vector<std::deque<Document>> buckets;
    std::deque<Document> current;
    double current_work = 0.0;
    std::int64_t remaining_k = k;
    const auto n = static_cast<std::int64_t>(pending.size());
    for (std::int64_t i = 0; i < n; ++i) {
      const Document& d = pending[static_cast<std::size_t>(i)];
      const double w = estimate(d.length);
      const bool too_much = current_work + w > target * kBucketOverfill;
      const bool save_for_others = n - i <= remaining_k - static_cast<std::int64_t>(buckets.size());
      if (!current.empty() && (too_much || save_for_others)) {
        buckets.push_back(std::move(current));
        current.clear();
        current_work = 0.0;
        --remaining_k;
      }
      current.push_back(d);
      current_work += w;
    }
    if (!current.empty()) {
      buckets.push_back(std::move(current));
    }
    return buckets;
  }

  std::vector<int> free_ranks() const {
    std::vector<int> out;
    for (int r = 0; r < ranks_; ++r) {
      if (group_of_[static_cast<std::size_t>(r)] < 0) {
        out.push_back(r);
      }
    }
    return out;
  }

  bool placeable(int cp) const {
    return std::find(size_.begin(), size_.end(), cp) != size_.end() ||
           static_cast<int>(free_ranks().size()) >= cp;
  }

  void place(const Document& d, int cp) {
    std::optional<std::size_t> best;
    double best_load = std::numeric_limits<double>::infinity();
    for (std::size_t g = 0; g < size_.size(); ++g) {
      if (size_[g] != cp) {
        continue;
      }
      double load = 0.0;
      for (const int r : members_[g]) {
        load = std::max(load, work_[static_cast<std::size_t>(r)]);
      }
      if (load < best_load) {
        best_load = load;
        best = g;
      }
    }
    std::vector<int> chosen;
    std::vector<int> free = free_ranks();
    if (static_cast<int>(free.size()) >= cp) {
      std::stable_sort(free.begin(), free.end(), [&](int a, int b) {
        return work_[static_cast<std::size_t>(a)] < work_[static_cast<std::size_t>(b)];
      });
      free.resize(static_cast<std::size_t>(cp));
      if (work_[static_cast<std::size_t>(free.back())] < best_load) {
        best.reset();
        chosen = free;
      }
    }
    if (best) {
      chosen = members_[*best];
    } else {
      for (const int r : chosen) {
        group_of_[static_cast<std::size_t>(r)] = static_cast<int>(size_.size());
      }
      members_.push_back(chosen);
      size_.push_back(cp);
    }
    const double cost = estimate(d.length);
    for (const int r : chosen) {
      documents_[static_cast<std::size_t>(r)].push_back(d.id);
      work_[static_cast<std::size_t>(r)] += cost;
    }
    ids_.push_back(d);
  }

  bool balanced() const {
    const auto [lo, hi] = std::minmax_element(work_.begin(), work_.end());
    return *hi - *lo <= kBalanceSlack * *hi;
  }

  void trim_overload(std::vector<Document>& leftovers) {
    for (;;) {
      const auto [lo, hi] = std::minmax_element(work_.begin(), work_.end());
      const double slack = *hi - *lo;
      if (slack <= kBalanceSlack * *hi || *lo == 0.0) {
        return;
      }
      const auto busiest = static_cast<std::size_t>(hi - work_.begin());
      const auto group = static_cast<std::size_t>(group_of_[busiest]);
      if (documents_[busiest].size() <= 1) {
        return;
      }
      const Document last = document(documents_[busiest].back());
      const double cost = estimate(last.length);
      std::vector<double> projected = work_;
      for (const int r : members_[group]) {
        projected[static_cast<std::size_t>(r)] -= cost;
      }
      const auto [plo, phi] = std::minmax_element(projected.begin(), projected.end());
      if (!(*phi - *plo < slack)) {
        return;
      }
      for (const int r : members_[group]) {
        documents_[static_cast<std::size_t>(r)].pop_back();
        work_[static_cast<std::size_t>(r)] -= cost;
      }
      leftovers.push_back(last);
    }
  }

  // One step of fill_empty_gpus; false when no rank is idle.
  bool fill_idle_ranks() {
    const auto idle = std::find_if(documents_.begin(), documents_.end(),
                                   [](const auto& ids) { return ids.empty(); });
    if (idle == documents_.end()) {
      return false;
    }
    const auto first_idle = static_cast<int>(idle - documents_.begin());
    const int smallest = *std::min_element(size_.begin(), size_.end());
    const int grown = std::min(2 * smallest, ranks_);
    const int added = grown - smallest;
    const auto g =
        static_cast<std::size_t>(std::find(size_.begin(), size_.end(), smallest) - size_.begin());
    const int start = members_[g].front();
    const int end = members_[g].back();
    // With a power-of-two rank count the idle ranks are a multiple of the smallest size: room.
    assert(first_idle - 1 + added < ranks_);
    std::vector<std::vector<std::size_t>> moved(static_cast<std::size_t>(ranks_));
    std::vector<double> moved_work(static_cast<std::size_t>(ranks_), 0.0);
    for (int r = 0; r < start; ++r) {
      moved[static_cast<std::size_t>(r)] = documents_[static_cast<std::size_t>(r)];
      moved_work[static_cast<std::size_t>(r)] = work_[static_cast<std::size_t>(r)];
    }
    const auto& group_ids = documents_[static_cast<std::size_t>(end)];
    for (int r = start; r <= end + added; ++r) {
      moved[static_cast<std::size_t>(r)] = group_ids;
      moved_work[static_cast<std::size_t>(r)] = work(document(group_ids.front()).length, grown);
    }
    for (int r = end + 1; r < first_idle; ++r) {
      moved[static_cast<std::size_t>(r + added)] = documents_[static_cast<std::size_t>(r)];
      moved_work[static_cast<std::size_t>(r + added)] = work_[static_cast<std::size_t>(r)];
    }
    size_[g] = grown;
    members_[g].resize(static_cast<std::size_t>(grown));
    std::iota(members_[g].begin(), members_[g].end(), start);
    for (std::size_t later = g + 1; later < members_.size(); ++later) {
      for (int& r : members_[later]) {
        r += added;
      }
    }
    documents_ = std::move(moved);
    work_ = std::move(moved_work);
    return true;
  }

  Document document(std::size_t id) const {
    const auto it =
        std::find_if(ids_.begin(), ids_.end(), [&](const Document& d) { return d.id == id; });
    assert(it != ids_.end());
    return *it;
  }

  int ranks_;
  std::int64_t max_tokens_per_rank_;
  std::vector<std::vector<std::size_t>> documents_;  // per rank: document ids, in order
  std::vector<double> work_;                         // per rank: Σ l²/g (exec_times)
  std::vector<int> group_of_;                        // per rank: group index, -1 while free
  std::vector<std::vector<int>> members_;            // per group, in creation order
  std::vector<int> size_;                            // per group
  std::vector<Document> ids_;                        // the documents placed in this round
};

}  // namespace

int hybrid_cp_size(std::int64_t length, std::int64_t max_tokens_per_rank) {
  const double exponent =
      std::ceil(std::log2(static_cast<double>(length) / static_cast<double>(max_tokens_per_rank)));
  return exponent <= 0.0 ? 1 : 1 << static_cast<int>(exponent);
}

std::vector<HybridCpRound> schedule_hybrid_cp(const std::vector<std::int64_t>& documents,
                                              int ranks,
                                              std::int64_t max_tokens_per_rank) {
  std::vector<Document> all = document_groups::checked_documents(
      documents, ranks, max_tokens_per_rank, "schedule_hybrid_cp");
  std::vector<Document> pending = all;
  std::stable_sort(pending.begin(), pending.end(),
                   [](const Document& a, const Document& b) { return a.length > b.length; });
  std::vector<HybridCpRound> rounds;
  while (!pending.empty()) {
    Round round(ranks, max_tokens_per_rank);
    std::vector<Document> left = round.run(pending);
    // The first bucket's front always finds every rank free: a round places a document.
    assert(left.size() < pending.size());
    rounds.push_back(round.result(documents));
    pending = std::move(left);
  }
  return rounds;
}

}  // namespace cpsim::planner

namespace cpsim::planner {

double StepsMemory::step_s(const sim::ScheduleInputs& in, EvaluationScratch& scratch) {
  const Evaluation e = evaluate(in, {}, scratch);
  peak_bytes = std::max(peak_bytes, e.report.peak_memory_bytes);
  fits = fits && e.report.fits();
  return e.report.step_time_s;
}

HybridCpTimer::HybridCpTimer(const sim::ScheduleInputs& in) : base_(in) {
  const models::ParallelConfig& p = in.parallel;
  base_.documents = {};
  base_.parallel.micro_batches = 1;
  ranks_ = p.data_parallel() * p.cp_degree;
  max_tokens_per_rank_ = p.seq_len / p.cp_degree;
  const double one_micro_batch_step_s = memory_.step_s(base_, scratch_);
  outside_micro_batches_s_ = one_micro_batch_step_s - micro_batch_s(p.seq_len, p.cp_degree);
}

double HybridCpTimer::micro_batch_s(std::int64_t length, int cp) {
  const auto key = std::make_pair(length, cp);
  if (const auto it = micro_batch_cache_.find(key); it != micro_batch_cache_.end()) {
    return it->second;
  }
  sim::ScheduleInputs in = base_;
  in.parallel.cp_degree = cp;
  in.parallel.ring_degree = cp;
  in.parallel.seq_len = length;
  in.parallel.micro_batches = 1;
  const double one_s = memory_.step_s(in, scratch_);
  in.parallel.micro_batches = 2;
  const double two_s = memory_.step_s(in, scratch_);
  micro_batch_cache_.emplace(key, two_s - one_s);
  return two_s - one_s;
}

HybridCpStep HybridCpTimer::step(const std::vector<std::int64_t>& documents) {
  HybridCpStep out;
  out.rounds = schedule_hybrid_cp(documents, ranks_, max_tokens_per_rank_);
  double waited_work = 0.0, mean_work = 0.0;
  out.step_s = outside_micro_batches_s_;
  for (const HybridCpRound& round : out.rounds) {
    double busiest_s = 0.0, busiest_work = 0.0, round_work = 0.0;
    for (const HybridCpGroup& g : round.groups) {
      double group_s = 0.0, group_work = 0.0;
      for (const std::int64_t length : g.documents) {
        group_s += micro_batch_s(length, g.cp);
        group_work += work(length, g.cp) / 2.0;  // causal: l²/2 over the group's g ranks
      }
      busiest_s = std::max(busiest_s, group_s);
      busiest_work = std::max(busiest_work, group_work);
      round_work += group_work * g.cp;
    }
    out.step_s += busiest_s;
    waited_work += busiest_work;
    mean_work += round_work / ranks_;
  }
  out.imbalance = mean_work > 0.0 ? waited_work / mean_work : 1.0;
  return out;
}

}  // namespace cpsim::planner

namespace cpsim::planner::document_groups {

HybridCpRound round_of(const std::vector<std::vector<std::size_t>>& ids_per_rank,
                       const std::vector<std::int64_t>& lengths) {
  HybridCpRound out;
  const auto ranks = static_cast<int>(ids_per_rank.size());
  for (int r = 0; r < ranks;) {
    const auto& ids = ids_per_rank[static_cast<std::size_t>(r)];
    int end = r + 1;
    while (end < ranks && ids_per_rank[static_cast<std::size_t>(end)] == ids) {
      ++end;
    }
    HybridCpGroup g{r, end - r, {}};
    for (const std::size_t id : ids) {
      g.documents.push_back(lengths[id]);
    }
    out.groups.push_back(std::move(g));
    r = end;
  }
  return out;
}

std::vector<Document> checked_documents(const std::vector<std::int64_t>& lengths,
                                        int ranks,
                                        std::int64_t max_tokens_per_rank,
                                        const char* scheduler) {
  if (ranks < 1 || (ranks & (ranks - 1)) != 0 || max_tokens_per_rank < 1) {
    throw std::invalid_argument(std::string(scheduler) +
                                ": a power-of-two rank count and a positive length per rank");
  }
  std::vector<Document> out;
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 1 || hybrid_cp_size(lengths[i], max_tokens_per_rank) > ranks) {
      throw std::invalid_argument(std::string(scheduler) +
                                  ": a document needs more ranks than there are");
    }
    out.push_back({i, lengths[i]});
  }
  return out;
}

}  // namespace cpsim::planner::document_groups
