#pragma once
// The parts of the plan search (planner/src/search.cpp runs them in order), internal to the
// planner: enumeration of the candidates (search_enumerate.cpp), the memory lower bound
// (search_memory_bound.cpp), evaluation of the work items on the plan's threads
// (search_evaluate_candidates.cpp), and ranking, the reserved-memory checks and the explanation
// (search_rank.cpp).

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cpsim/models/units.hpp"
#include "cpsim/planner/evaluate.hpp"
#include "cpsim/planner/search.hpp"
#include "cpsim/sim/pipeline.hpp"

namespace cpsim::planner::search_parts {

/// The candidate nearest to fitting among those that do not: the smallest ratio of memory needed
/// to memory usable (GPU or host, whichever misses), for the message when nothing fits.
class ClosestMiss {
 public:
  /// `at_least`: `need` is a lower bound (pruned, or a simulation stopped above capacity).
  void offer(const Candidate& c,
             std::int64_t seq_len,
             const char* memory,
             std::int64_t need,
             std::int64_t usable,
             bool at_least) {
    const double ratio = usable > 0 ? static_cast<double>(need) / static_cast<double>(usable)
                                    : std::numeric_limits<double>::infinity();
    if (!text_.empty() && !(ratio < ratio_)) {
      return;
    }
    ratio_ = ratio;
    text_ =
        fmt::format("the closest, {}, needs {}{} of {} memory at {} against {} usable ({} over)",
                    c.label, at_least ? "at least " : "", format_bytes(static_cast<double>(need)),
                    memory, format_length(seq_len), format_bytes(static_cast<double>(usable)),
                    format_bytes(static_cast<double>(need - usable)));
  }
  /// A candidate that misses for another reason (kernel limits) or was refused.
  void offer_other(const Candidate& c, const std::string& why) {
    if (other_.empty()) {
      other_ = fmt::format("{}: {}", c.label, why);
    }
  }
  std::string text() const { return text_.empty() ? other_ : text_; }

 private:
  double ratio_ = std::numeric_limits<double>::infinity();
  std::string text_, other_;
};

// What screen() found: per candidate, its cost estimate (evaluated ones) and the memory lower
// bound that pruned it.
struct Screened {
  std::vector<std::int64_t> cost;
  std::vector<std::int64_t> bound;
};

// The work items (one candidate, or at --seq the candidates of one pipeline stage group and
// those whose simulation is another's, with it), longest first by the screen's cost estimate
// (each result goes to its own candidate: the order changes only the wall time).
struct WorkPlan {
  std::vector<std::vector<std::size_t>> items;
  std::vector<std::size_t> order;
};

// Every registered implementation, or the ones asked for, in registry order.
std::vector<const sim::CpScheme*> methods_of(const PlanOptions& options);

/// A rough count of the ops one evaluation simulates per block (order of magnitude only: it sorts
/// the work of the threads, longest first, so that none is left with a long one at the end).
std::int64_t cost_estimate(const sim::ScheduleInputs& in);

std::string recipe_label(const models::TrainingRecipe& r);

// The tensors every block saves in the forward and holds to its backward (see above).
std::int64_t saved_bytes(const sim::ScheduleInputs& in);

// `scratch` (a copy of `in` but for the model, recipe, parallel configuration and margin) becomes
// the stage `in` simulates with one micro-batch, without copying the hardware profile.
void stage_into(const sim::ScheduleInputs& in,
                sim::ScheduleInputs& scratch,
                sim::PipelineStage stage);

std::string explain(const Candidate& best, const Candidate& second, bool max_context);

/// Offers one evaluated candidate that does not fit to `miss`.
void offer_miss(const Candidate& c, bool max_context, std::int64_t capacity, ClosestMiss& miss);

// Runs `worker` on min(threads, items) threads, this one among them, and waits for all of them.
void run_workers(int threads, std::size_t items, const std::function<void()>& worker);

// Checks one candidate's reserved memory (once); true when that moved it (a shorter longest
// context, or no longer fitting).
bool check_reserved(const sim::ScheduleInputs& base,
                    const PlanOptions& options,
                    Candidate& c,
                    bool max_context,
                    std::int64_t& simulations,
                    EvaluationScratch& scratch);

bool ranks_before(const Candidate& a, const Candidate& b, bool max_context);

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
                            ClosestMiss& miss);

// The cheap checks of every candidate, on the plan's threads (each candidate on its own, in
// blocks of consecutive candidates; one reused copy of the base inputs per thread, a candidate
// holds only what it changes): its length (the plan's, or the first step of the longest-context
// search), the head layout and the recipe (refusals set `error`), and at --seq the memory lower
// bound (over the capacity: `pruned`).
Screened screen(const sim::ScheduleInputs& base,
                const PlanOptions& options,
                const RefusalText& refusal_text,
                std::vector<Candidate>& cands);

WorkPlan plan_work(const std::vector<Candidate>& cands,
                   const std::vector<std::size_t>& pending,
                   const std::vector<std::int64_t>& cost,
                   bool at_seq);

// Evaluates the work items on the plan's threads; returns the simulations run.
std::int64_t evaluate_work(const sim::ScheduleInputs& base,
                           const PlanOptions& options,
                           const RefusalText& refusal_text,
                           std::int64_t capacity,
                           const WorkPlan& work,
                           std::size_t pending,
                           std::vector<Candidate>& cands);

// The counts of the result, and the misses offered in the candidates' order.
void count_and_offer_misses(std::vector<Candidate>& cands,
                            std::int64_t capacity,
                            PlanResult& res,
                            ClosestMiss& miss);

// The methods searched without a row in best_per_method, and why.
std::vector<PlanResult::MethodWithoutFit> methods_without_fit(
    const std::vector<models::CpMethod>& methods,
    const std::vector<Candidate>& cands,
    const std::vector<Candidate>& best_per_method);

// Why the best beats the runner-up: the best configuration of another method when there is one
// ("why this method" is the question; variants of the winner differ by little).
std::string why_best(const PlanResult& res);

// Runs item(state, i) for i in [0, n) on the plan's threads, each thread with its own state
// (make_state()); every item runs, and the error of the first failing item, in index order, is
// rethrown afterwards (as one thread in order would have met it).
template <class MakeState, class Item>
void for_each_index(int threads, std::size_t n, const MakeState& make_state, const Item& item) {
  std::vector<std::exception_ptr> errors(n);
  std::atomic<std::size_t> next{0};
  auto worker = [&]() {
    auto state = make_state();
    for (std::size_t i = next++; i < n; i = next++) {
      try {
        item(state, i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  run_workers(threads, n, worker);
  for (const std::exception_ptr& e : errors) {
    if (e) {
      std::rethrow_exception(e);
    }
  }
}

}  // namespace cpsim::planner::search_parts
