// plan(): the search, part by part (search_parts.hpp).
#include "cpsim/planner/search.hpp"

#include <algorithm>
#include <utility>
#include <vector>

#include "search_parts.hpp"

namespace cpsim::planner {

using namespace search_parts;

PlanResult plan(const sim::ScheduleInputs& base, const PlanOptions& options) {
  const RefusalText refusal_text =
      options.refusal_text ? options.refusal_text : RefusalText(default_refusal_text);
  PlanResult res;
  res.max_context = !options.seq_len.has_value();
  std::vector<Candidate> cands = enumerate_candidates(base, options);
  res.generated = static_cast<std::int64_t>(cands.size());
  const std::int64_t capacity = base.hardware.hbm_capacity_bytes - base.margin.gpu_bytes;

  // Cheap checks first: invalid combinations and memory lower bounds (screen), then the closest
  // miss offered in the candidates' order.
  ClosestMiss miss;
  const Screened screened = screen(base, options, refusal_text, cands);
  std::vector<std::size_t> pending;
  for (std::size_t i = 0; i < cands.size(); ++i) {
    const Candidate& c = cands[i];
    if (c.pruned) {
      miss.offer(c, c.parallel.seq_len, "GPU", screened.bound[i], capacity, true);
    } else if (c.error.empty()) {
      pending.push_back(i);
    }
  }
  const WorkPlan work = plan_work(cands, pending, screened.cost, options.seq_len.has_value());
  res.simulations =
      evaluate_work(base, options, refusal_text, capacity, work, pending.size(), cands);
  count_and_offer_misses(cands, capacity, res, miss);

  // The fitting candidates in the plan's order, moved once (a sort of the candidates themselves
  // would move each of them many times).
  std::vector<std::size_t> fitting;
  for (std::size_t i = 0; i < cands.size(); ++i) {
    if (cands[i].evaluated && cands[i].fits) {
      fitting.push_back(i);
    }
  }
  std::stable_sort(fitting.begin(), fitting.end(), [&](std::size_t a, std::size_t b) {
    return ranks_before(cands[a], cands[b], res.max_context);
  });
  rank_checking_reserved(base, options, cands, std::move(fitting), res, miss);
  if (res.ranked.empty()) {
    res.closest_miss = miss.text();
    if (res.generated > 0 && res.refused == res.generated) {
      res.every_candidate_refused = cands.front().error;
    }
  }
  res.why_best = why_best(res);
  res.methods_without_fit = methods_without_fit(options.methods, cands, res.best_per_method);
  return res;
}

}  // namespace cpsim::planner
