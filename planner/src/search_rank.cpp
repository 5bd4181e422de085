#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/units.hpp"
#include "cpsim/sim/implementation.hpp"
#include "cpsim/sim/pipeline.hpp"

#include "evaluate_pipeline.hpp"
#include "search_parts.hpp"

namespace cpsim::planner {

using namespace search_parts;

namespace {

// One pass over the candidates at(0..n−1) (sorted best first by the plan's order), giving the
// positions of the front: with the primary key p (max context: the length; else throughput) and
// the secondary q (throughput; else −peak), both higher is better, a candidate is dominated
// exactly when one with a higher p has q at least as high, or one with the same p has a higher q.
// Candidates of equal p are adjacent and the first of them has the highest q, so it suffices to
// keep the best q among higher p and the first q of the group.
template <class At>
std::vector<std::size_t> pareto_positions(std::size_t n, const At& at, bool max_context) {
  auto primary = [max_context](const Candidate& c) {
    return max_context ? static_cast<double>(c.max_seq_len) : c.report.tokens_per_s_per_gpu;
  };
  auto secondary = [max_context](const Candidate& c) {
    return max_context ? c.report.tokens_per_s_per_gpu
                       : -static_cast<double>(c.report.peak_memory_bytes);
  };
  std::vector<std::size_t> front;
  double best_above = -std::numeric_limits<double>::infinity();  // best q among higher p
  std::size_t group = 0;                                         // first of the current p
  for (std::size_t i = 0; i < n; ++i) {
    if (primary(at(i)) != primary(at(group))) {
      for (std::size_t j = group; j < i; ++j) {
        best_above = std::max(best_above, secondary(at(j)));
      }
      group = i;
    }
    const double q = secondary(at(i));
    if (q > best_above && q >= secondary(at(group))) {
      front.push_back(i);
    }
  }
  return front;
}

}  // namespace

std::vector<Candidate> pareto_front(const std::vector<Candidate>& ranked, bool max_context) {
  std::vector<Candidate> front;
  const auto at = [&ranked](std::size_t i) -> const Candidate& { return ranked[i]; };
  for (const std::size_t i : pareto_positions(ranked.size(), at, max_context)) {
    front.push_back(ranked[i]);
  }
  return front;
}

namespace {

// Checks the reserved memory of `cands` on the plan's threads (each check is independent of the
// others: the outcome is the same in any order); true when one moved. Rethrows the first
// candidate's error, in the order given.
bool check_reserved_all(const sim::ScheduleInputs& base,
                        const PlanOptions& options,
                        const std::vector<Candidate*>& cands,
                        bool max_context,
                        std::int64_t& simulations) {
  std::vector<char> moved(cands.size(), 0);
  std::vector<std::int64_t> sims(cands.size(), 0);
  for_each_index(
      options.threads, cands.size(), [] { return EvaluationScratch{}; },
      [&](EvaluationScratch& scratch, std::size_t i) {
        moved[i] = check_reserved(base, options, *cands[i], max_context, sims[i], scratch) ? 1 : 0;
      });
  simulations += std::accumulate(sims.begin(), sims.end(), std::int64_t{0});
  return std::find(moved.begin(), moved.end(), 1) != moved.end();
}

// The Pareto front of the candidates `order` (indices into `cands`, in the plan's order), as
// indices into `cands`.
std::vector<std::size_t> front_of(const std::vector<Candidate>& cands,
                                  const std::vector<std::size_t>& order,
                                  bool max_context) {
  auto at = [&cands, &order](std::size_t i) -> const Candidate& { return cands[order[i]]; };
  std::vector<std::size_t> front;
  for (const std::size_t i : pareto_positions(order.size(), at, max_context)) {
    front.push_back(order[i]);
  }
  return front;
}

// Each method's first candidate of `order`, in the methods' order (methods without one left
// out), as indices into `cands`.
std::vector<std::size_t> best_per_method_of(const std::vector<Candidate>& cands,
                                            const std::vector<std::size_t>& order,
                                            const std::vector<const sim::CpScheme*>& methods) {
  std::vector<std::size_t> first(methods.size(), cands.size());
  std::size_t found = 0;
  for (std::size_t k = 0; k < order.size() && found < methods.size(); ++k) {
    for (std::size_t m = 0; m < methods.size(); ++m) {
      if (first[m] == cands.size() && cands[order[k]].parallel.method == methods[m]->id()) {
        first[m] = order[k];
        ++found;
      }
    }
  }
  std::vector<std::size_t> out;
  std::copy_if(first.begin(), first.end(), std::back_inserter(out),
               [&cands](std::size_t i) { return i < cands.size(); });
  return out;
}

}  // namespace

namespace search_parts {

std::string explain(const Candidate& best, const Candidate& second, bool max_context) {
  const sim::StepReport& a = best.report;
  const sim::StepReport& b = second.report;
  const auto compute = static_cast<std::size_t>(sim::Stream::kCompute);
  if (max_context && best.max_seq_len != second.max_seq_len) {
    return fmt::format(
        "{} reaches {} vs {} for {}: one step longer the runner-up is stopped by {}; at its own "
        "limit the best has {} of headroom beyond the margin",
        best.label, format_length(best.max_seq_len), format_length(second.max_seq_len),
        second.label, second.binding.text, format_bytes(static_cast<double>(a.gpu_headroom_bytes)));
  }
  const double gain = b.tokens_per_s_per_gpu > 0
                          ? 100.0 * (a.tokens_per_s_per_gpu / b.tokens_per_s_per_gpu - 1.0)
                          : 0.0;
  return fmt::format(
      "{} is {:.1f} % faster than {}: compute {} vs {} per step (kernel efficiency and "
      "recomputation), time not covered by compute {} vs {} (exposed communication and copies); "
      "peak memory {} vs {}",
      best.label, gain, second.label, format_seconds(a.stream_busy_s[compute]),
      format_seconds(b.stream_busy_s[compute]), format_seconds(a.exposed_comm_s),
      format_seconds(b.exposed_comm_s), format_bytes(static_cast<double>(a.peak_memory_bytes)),
      format_bytes(static_cast<double>(b.peak_memory_bytes)));
}

/// Offers one evaluated candidate that does not fit to `miss`.
void offer_miss(const Candidate& c, bool max_context, std::int64_t capacity, ClosestMiss& miss) {
  if (max_context) {
    const BindingConstraint& b = c.binding;
    if (b.kind == BindingConstraint::Kind::kGpuMemory) {
      miss.offer(c, b.seq_len, "GPU", b.used_bytes, b.limit_bytes, false);
    } else if (b.kind == BindingConstraint::Kind::kHostMemory) {
      miss.offer(c, b.seq_len, "host (per node)", b.used_bytes, b.limit_bytes, false);
    } else {
      miss.offer_other(c, b.text);
    }
    return;
  }
  const sim::StepReport& r = c.report;
  if (r.peak_memory_bytes > capacity) {
    miss.offer(c, c.parallel.seq_len, "GPU", r.peak_memory_bytes, capacity, r.stopped_early);
  } else if (!r.fits_host) {
    miss.offer(c, c.parallel.seq_len, "host (per node)", r.host_memory_bytes, r.host_capacity_bytes,
               false);
  } else {
    miss.offer_other(c, r.kernel_limit);
  }
}

// Runs `worker` on min(threads, items) threads, this one among them, and waits for all of them.
void run_workers(int threads, std::size_t items, const std::function<void()>& worker) {
  const int n = std::max(1, std::min<int>(threads, static_cast<int>(items)));
  std::vector<std::thread> pool;
  for (int t = 1; t < n; ++t) {
    pool.emplace_back(worker);
  }
  worker();
  for (auto& t : pool) {
    t.join();
  }
}

// Checks one candidate's reserved memory (once); true when that moved it (a shorter longest
// context, or no longer fitting).
bool check_reserved(const sim::ScheduleInputs& base,
                    const PlanOptions& options,
                    Candidate& c,
                    bool max_context,
                    std::int64_t& simulations,
                    EvaluationScratch& scratch) {
  if (c.reserved_checked) {
    return false;
  }
  c.reserved_checked = true;
  const sim::ScheduleInputs in = c.inputs(base);
  if (!max_context) {
    EvaluateOptions logged;
    logged.model_allocator = true;
    simulations += 1;
    c.report = evaluate(in, logged, scratch).report;
    c.fits = c.report.fits();
    return !c.fits;
  }
  MaxLenResult m;
  m.step = std::lcm(options.granularity, required_multiple(in));
  m.max_seq_len = c.max_seq_len;
  m.at_max = c.report;
  m.binding = c.binding;
  check_reserved_memory(in, m, &scratch);
  simulations += m.evaluations;
  const bool changed = m.max_seq_len != c.max_seq_len;
  c.max_seq_len = m.max_seq_len;
  c.binding = m.binding;
  c.report = m.at_max;
  c.fits = m.max_seq_len > 0;
  if (c.fits) {
    c.parallel.seq_len = m.max_seq_len;
  }
  return changed;
}

bool ranks_before(const Candidate& a, const Candidate& b, bool max_context) {
  if (max_context && a.max_seq_len != b.max_seq_len)
    return a.max_seq_len > b.max_seq_len;
  if (a.report.tokens_per_s_per_gpu != b.report.tokens_per_s_per_gpu)
    return a.report.tokens_per_s_per_gpu > b.report.tokens_per_s_per_gpu;
  if (a.report.peak_memory_bytes != b.report.peak_memory_bytes)
    return a.report.peak_memory_bytes < b.report.peak_memory_bytes;
  return a.label < b.label;
}

// Ranks the fitting candidates `order` (indices into `cands`, sorted by the plan's order) and
// checks the reserved memory of every candidate the plan shows (the top, each method's best, the
// Pareto front, the runner-up), best first; a check that moves a candidate re-ranks and goes on
// until every shown one is checked. The allocated peak bounds the reserved memory from below, so
// unchecked candidates can only move down: none of them belongs above a checked one. The ranking
// works on indices (a check moves a few of tens of thousands); the candidates are moved into
// `res` once, at the end.
void rank_checking_reserved(const sim::ScheduleInputs& base,
                            const PlanOptions& options,
                            std::vector<Candidate>& cands,
                            std::vector<std::size_t> order,
                            PlanResult& res,
                            ClosestMiss& miss) {
  const bool mc = res.max_context;
  auto better = [&cands, mc](std::size_t a, std::size_t b) {
    return ranks_before(cands[a], cands[b], mc);
  };
  const std::vector<const sim::CpScheme*> methods = methods_of(options);
  std::vector<char> shown(cands.size(), 0);
  std::vector<std::size_t> front, per_method;  // indices into cands
  for (;;) {
    if (!std::is_sorted(order.begin(), order.end(), better)) {
      std::stable_sort(order.begin(), order.end(), better);
    }
    front = front_of(cands, order, mc);
    per_method = best_per_method_of(cands, order, methods);
    const std::size_t top =
        std::min(order.size(), static_cast<std::size_t>(std::max(2, options.top)));
    for (std::size_t k = 0; k < top; ++k) {
      shown[order[k]] = 1;
    }
    for (const std::size_t i : front) {
      shown[i] = 1;
    }
    for (const std::size_t i : per_method) {
      shown[i] = 1;
    }
    std::vector<Candidate*> to_check;
    for (const std::size_t i : order) {
      if (shown[i] != 0) {
        shown[i] = 0;
        if (!cands[i].reserved_checked) {
          to_check.push_back(&cands[i]);
        }
      }
    }
    bool moved = check_reserved_all(base, options, to_check, mc, res.simulations);
    // Those that no longer fit leave the ranking, in order.
    for (const std::size_t i : order) {
      if (!cands[i].fits) {
        offer_miss(cands[i], mc, base.hardware.hbm_capacity_bytes - base.margin.gpu_bytes, miss);
        moved = true;
      }
    }
    std::erase_if(order, [&cands](std::size_t i) { return !cands[i].fits; });
    if (!moved) {
      break;
    }
  }
  for (const std::size_t i : front) {
    res.pareto.push_back(cands[i]);
  }
  for (const std::size_t i : per_method) {
    res.best_per_method.push_back(cands[i]);
  }
  if (options.keep_all) {
    res.all = cands;
  }
  res.ranked.reserve(order.size());
  for (const std::size_t i : order) {
    res.ranked.push_back(std::move(cands[i]));
  }
}

}  // namespace search_parts

}  // namespace cpsim::planner
