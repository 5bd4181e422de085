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
using models::CheckpointMode;

namespace {

// The saved tensors of `in`'s pipeline stage (saved_bytes), without copying the hardware profile.
std::int64_t saved_of_stage(const sim::ScheduleInputs& in, sim::PipelineStage kind) {
  sim::ScheduleInputs stage;
  stage_into(in, stage, kind);
  return saved_bytes(stage);
}

// At --seq, the candidate whose simulation each pending candidate's is (itself for most): one
// under selective checkpointing of a method whose blocks keep under it what they keep without
// checkpointing (CpScheme::recomputes_selectively) runs, op for op, the step of the same
// candidate without checkpointing, and takes that one's evaluation when it is pending too.
std::vector<std::size_t> simulation_twins(const std::vector<Candidate>& cands,
                                          const std::vector<std::size_t>& pending) {
  std::vector<std::size_t> twin(cands.size());
  std::iota(twin.begin(), twin.end(), std::size_t{0});
  std::unordered_map<std::string_view, std::size_t> without_checkpointing;
  for (const std::size_t i : pending) {
    if (cands[i].recipe.checkpointing == CheckpointMode::kNone) {
      without_checkpointing.emplace(cands[i].label, i);
    }
  }
  for (const std::size_t i : pending) {
    const Candidate& c = cands[i];
    if (c.recipe.checkpointing != CheckpointMode::kSelective ||
        sim::cp_scheme(c.parallel.method).recomputes_selectively(c.parallel)) {
      continue;
    }
    models::TrainingRecipe none = c.recipe;
    none.checkpointing = CheckpointMode::kNone;
    const std::string suffix = " | " + recipe_label(c.recipe);
    if (!c.label.ends_with(suffix)) {
      continue;
    }
    const std::string label =
        c.label.substr(0, c.label.size() - suffix.size()) + " | " + recipe_label(none);
    const auto it = without_checkpointing.find(label);
    if (it != without_checkpointing.end() && cands[it->second].parallel == c.parallel &&
        cands[it->second].recipe == none) {
      twin[i] = it->second;
    }
  }
  return twin;
}

// The work of the threads at --seq: the pending candidates of one stage group together (in
// pending order), and each candidate with the ones whose simulation is its own (`twin`, after it);
// every other candidate alone. A stage group takes the twins of its members.
std::vector<std::vector<std::size_t>> work_items(const std::vector<Candidate>& cands,
                                                 const std::vector<std::size_t>& pending,
                                                 const std::vector<std::size_t>& twin) {
  std::vector<std::vector<std::size_t>> work;
  std::map<std::int64_t, std::size_t> item_of_group;
  std::unordered_map<std::size_t, std::size_t> item_of_candidate;
  for (const std::size_t i : pending) {
    if (twin[i] != i) {
      continue;
    }
    const std::int64_t g = cands[i].stage_group;
    if (g >= 0) {
      const auto [it, added] = item_of_group.emplace(g, work.size());
      if (!added) {
        work[it->second].push_back(i);
        continue;
      }
    }
    item_of_candidate.emplace(i, work.size());
    work.push_back({i});
  }
  for (const std::size_t i : pending) {
    if (twin[i] == i) {
      continue;
    }
    const std::int64_t g = cands[twin[i]].stage_group;
    work[g >= 0 ? item_of_group.at(g) : item_of_candidate.at(twin[i])].push_back(i);
  }
  return work;
}

// What a candidate's evaluation found, for a candidate whose simulation is the same (twin).
void share_evaluation(const Candidate& from, Candidate& to) {
  to.report = from.report;
  to.fits = from.fits;
  to.evaluated = from.evaluated;
  to.error = from.error;
}

// One micro-batch of a stage group's stage (`kind`), stopping where no member can fit any more:
// above the capacity less the smallest lower bound of what a member adds to the stage's peak
// ((factor − 1)·saved, the in-flight micro-batches).
Evaluation run_stage_stopping(std::vector<Candidate>& cands,
                              const std::vector<std::size_t>& item,
                              const EvaluateOptions& options,
                              EvaluationScratch& scratch,
                              sim::ScheduleInputs& in,
                              sim::PipelineStage kind) {
  EvaluateOptions first = options;
  double factor = std::numeric_limits<double>::infinity();
  for (const std::size_t i : item) {
    cands[i].apply_to(in);
    const sim::PipelineShape shape = sim::pipeline_shape(in);
    factor = std::min(factor, kind == sim::PipelineStage::kWithOutputLayer
                                  ? shape.last_stage_activation_factor
                                  : shape.activation_factor);
  }
  cands[item.front()].apply_to(in);
  const auto added = static_cast<std::int64_t>(std::max(0.0, factor - 1.0) *
                                               static_cast<double>(saved_of_stage(in, kind)));
  if (first.stop_above_device_bytes > 0) {
    first.stop_above_device_bytes =
        std::max<std::int64_t>(1, first.stop_above_device_bytes - added);
  }
  return simulate_pipeline_stage_one(in, first, &scratch, kind);
}

// Evaluates the candidates of one stage group at --seq: their stage is simulated once per kind
// (evaluate_pipeline.hpp) and each step composed from the runs; a simulation stopped above the
// capacity rules out every member (the composed peak is at least the stage's). Returns the
// simulations run.
std::int64_t evaluate_stage_group(std::vector<Candidate>& cands,
                                  const std::vector<std::size_t>& item,
                                  const EvaluateOptions& options,
                                  EvaluationScratch& scratch,
                                  sim::ScheduleInputs& in,
                                  const RefusalText& refusal_text) {
  cands[item.front()].apply_to(in);
  StageRuns runs;
  std::int64_t simulations = 0;
  try {
    runs.inner = run_stage_stopping(cands, item, options, scratch, in,
                                    sim::PipelineStage::kWithoutOutputLayer);
    simulations += 1;
    if (runs.inner.report.stopped_early) {
      runs.one = runs.inner;  // over the capacity on the stages before the last: none fits
    } else {
      runs.one = run_stage_stopping(cands, item, options, scratch, in,
                                    sim::PipelineStage::kWithOutputLayer);
      simulations += 1;
    }
    // The second run only times the step: needed only when a member fits.
    bool any_fits = false;
    const bool stopped = runs.one.report.stopped_early || runs.inner.report.stopped_early;
    for (const std::size_t i : item) {
      cands[i].apply_to(in);
      any_fits = any_fits || (!stopped && pipeline_fits(in, runs.one.report, runs.inner.report));
    }
    cands[item.front()].apply_to(in);
    if (any_fits) {
      runs.two = simulate_pipeline_stage_two(in, options, &scratch);
      simulations += 1;
    } else {
      runs.two = runs.one.report;
    }
  } catch (const sim::ConfigError& e) {
    for (const std::size_t i : item) {
      cands[i].error = refusal_text(e);
    }
    return 0;
  } catch (const InputError& e) {
    for (const std::size_t i : item) {
      cands[i].error = e.what();
    }
    return 0;
  }
  for (const std::size_t i : item) {
    Candidate& c = cands[i];
    c.apply_to(in);
    c.report = compose_pipeline(in, runs).report;
    c.fits = c.report.fits();
    c.evaluated = true;
  }
  return simulations;
}

}  // namespace

bool check_reserved_memory(const sim::ScheduleInputs& base,
                           const PlanOptions& options,
                           Candidate& candidate,
                           bool max_context) {
  std::int64_t simulations = 0;
  EvaluationScratch scratch;
  return check_reserved(base, options, candidate, max_context, simulations, scratch);
}

namespace {

// Evaluates one candidate without a pipeline: its step at --seq, else its longest context.
// Returns the simulations run.
std::int64_t evaluate_candidate(Candidate& c,
                                const sim::ScheduleInputs& in,
                                const PlanOptions& options,
                                const EvaluateOptions& seq_options,
                                EvaluationScratch& scratch,
                                const RefusalText& refusal_text) {
  std::int64_t simulations = 0;
  try {
    if (options.seq_len) {
      c.report = evaluate(in, seq_options, scratch).report;
      c.fits = c.report.fits();
      simulations = 1;
    } else {
      MaxLenOptions mo;
      mo.granularity = options.granularity;
      mo.max_step_time_s = options.max_step_time_s;
      mo.check_reserved = false;  // the candidates shown are checked below
      mo.threads = 1;             // the candidates already share the threads
      mo.scratch = &scratch;
      mo.refusal_text = refusal_text;
      const MaxLenResult m = max_seq_len(in, mo);
      simulations = m.evaluations;
      c.max_seq_len = m.max_seq_len;
      c.binding = m.binding;
      c.fits = m.max_seq_len > 0;
      if (c.fits) {
        c.report = m.at_max;
        c.parallel.seq_len = m.max_seq_len;
      }
    }
    c.evaluated = true;
  } catch (const sim::ConfigError& e) {
    c.error = refusal_text(e);
  } catch (const InputError& e) {
    c.error = e.what();
  }
  return simulations;
}

}  // namespace

namespace search_parts {

// The cheap checks of every candidate, on the plan's threads (each candidate on its own, in
// blocks of consecutive candidates; one reused copy of the base inputs per thread, a candidate
// holds only what it changes): its length (the plan's, or the first step of the longest-context
// search), the head layout and the recipe (refusals set `error`), and at --seq the memory lower
// bound (over the capacity: `pruned`).
Screened screen(const sim::ScheduleInputs& base,
                const PlanOptions& options,
                const RefusalText& refusal_text,
                std::vector<Candidate>& cands) {
  const std::int64_t capacity = base.hardware.hbm_capacity_bytes - base.margin.gpu_bytes;
  Screened out;
  out.cost.assign(cands.size(), 0);
  out.bound.assign(cands.size(), 0);
  constexpr std::size_t kBlock = 1024;
  struct Probes {
    sim::ScheduleInputs probe;
    sim::ScheduleInputs stage_probe;  // a pipeline's stage, for its bound
  };
  const std::size_t blocks = (cands.size() + kBlock - 1) / kBlock;
  for_each_index(
      options.threads, blocks,
      [&base] {
        return Probes{base, base};
      },
      [&](Probes& probes, std::size_t b) {
        sim::ScheduleInputs& probe = probes.probe;
        for (std::size_t i = b * kBlock; i < std::min(cands.size(), (b + 1) * kBlock); ++i) {
          Candidate& c = cands[i];
          c.apply_to(probe);
          c.parallel.seq_len = options.seq_len
                                   ? *options.seq_len
                                   : std::lcm(options.granularity, required_multiple(probe));
          probe.parallel.seq_len = c.parallel.seq_len;
          if (sim::LayoutCheck checked = sim::check_head_layout(probe); checked.issue) {
            c.error = refusal_text(sim::ConfigError(std::move(*checked.issue), probe.parallel));
            continue;
          }
          try {
            probe.recipe.validate();
          } catch (const InputError& e) {
            c.error = e.what();
            continue;
          }
          if (options.seq_len) {
            const std::int64_t bound = memory_lower_bound(probe, probes.stage_probe);
            if (bound > capacity) {
              c.pruned = true;
              c.prune_reason = "memory lower bound exceeds the GPU";
              out.bound[i] = bound;
              continue;
            }
          }
          out.cost[i] = cost_estimate(probe);
        }
      });
  return out;
}

WorkPlan plan_work(const std::vector<Candidate>& cands,
                   const std::vector<std::size_t>& pending,
                   const std::vector<std::int64_t>& cost,
                   bool at_seq) {
  WorkPlan w;
  if (at_seq) {
    w.items = work_items(cands, pending, simulation_twins(cands, pending));
  } else {
    for (const std::size_t i : pending) {
      w.items.push_back({i});
    }
  }
  w.order.resize(w.items.size());
  std::iota(w.order.begin(), w.order.end(), std::size_t{0});
  std::stable_sort(w.order.begin(), w.order.end(), [&](std::size_t a, std::size_t b) {
    return cost[w.items[a].front()] > cost[w.items[b].front()];
  });
  return w;
}

// Evaluates the work items on the plan's threads; returns the simulations run.
std::int64_t evaluate_work(const sim::ScheduleInputs& base,
                           const PlanOptions& options,
                           const RefusalText& refusal_text,
                           std::int64_t capacity,
                           const WorkPlan& work,
                           std::size_t pending,
                           std::vector<Candidate>& cands) {
  std::atomic<std::size_t> next{0};
  std::atomic<std::int64_t> simulations{0};
  // A configuration over the GPU's memory is dropped whatever its speed: its simulation stops as
  // soon as the memory passes the capacity (the ranking is unchanged; only time is saved).
  EvaluateOptions seq_options;
  seq_options.stop_above_device_bytes = std::max<std::int64_t>(1, capacity);
  std::mutex progress_mutex;
  std::int64_t progressed = 0;
  auto progress = [&](std::size_t candidates) {
    if (options.on_progress) {
      const std::lock_guard<std::mutex> lock(progress_mutex);
      progressed += static_cast<std::int64_t>(candidates);
      options.on_progress(progressed, static_cast<std::int64_t>(pending));
    }
  };
  auto worker = [&]() {
    EvaluationScratch scratch;
    sim::ScheduleInputs in = base;  // this thread's inputs, one candidate at a time
    for (std::size_t k = next++; k < work.order.size(); k = next++) {
      const std::vector<std::size_t>& item = work.items[work.order[k]];
      if (options.seq_len && cands[item.front()].parallel.pp_degree > 1) {
        simulations += evaluate_stage_group(cands, item, seq_options, scratch, in, refusal_text);
        progress(item.size());
        continue;
      }
      Candidate& c = cands[item.front()];
      c.apply_to(in);
      simulations += evaluate_candidate(c, in, options, seq_options, scratch, refusal_text);
      for (std::size_t t = 1; t < item.size(); ++t) {
        share_evaluation(c, cands[item[t]]);
      }
      progress(item.size());
    }
  };
  run_workers(options.threads, work.order.size(), worker);
  return simulations;
}

// The counts of the result, and the misses offered in the candidates' order.
void count_and_offer_misses(std::vector<Candidate>& cands,
                            std::int64_t capacity,
                            PlanResult& res,
                            ClosestMiss& miss) {
  for (Candidate& c : cands) {
    res.pruned += c.pruned ? 1 : 0;
    res.refused += c.error.empty() ? 0 : 1;
    res.evaluated += c.evaluated ? 1 : 0;
    if (c.evaluated && !c.fits) {
      offer_miss(c, res.max_context, capacity, miss);
    } else if (!c.error.empty()) {
      miss.offer_other(c, c.error);
    }
  }
}

// The methods searched without a row in best_per_method, and why.
std::vector<PlanResult::MethodWithoutFit> methods_without_fit(
    const std::vector<models::CpMethod>& methods,
    const std::vector<Candidate>& cands,
    const std::vector<Candidate>& best_per_method) {
  std::vector<PlanResult::MethodWithoutFit> out;
  for (const models::CpMethod m : methods) {
    const bool shown = std::any_of(best_per_method.begin(), best_per_method.end(),
                                   [m](const Candidate& c) { return c.parallel.method == m; });
    if (shown) {
      continue;
    }
    std::string first_refusal;
    std::int64_t tried = 0;
    for (const Candidate& c : cands) {
      if (c.parallel.method != m) {
        continue;
      }
      if (c.error.empty()) {
        ++tried;
      } else if (first_refusal.empty()) {
        first_refusal = c.error;
      }
    }
    out.push_back({m, tried > 0 ? fmt::format("none of its {} configurations fits", tried)
                      : first_refusal.empty() ? "no configuration to search"
                                              : first_refusal});
  }
  return out;
}

// Why the best beats the runner-up: the best configuration of another method when there is one
// ("why this method" is the question; variants of the winner differ by little).
std::string why_best(const PlanResult& res) {
  if (res.ranked.size() < 2) {
    return "";
  }
  const Candidate* runner = &res.ranked[1];
  for (const Candidate& c : res.ranked) {
    if (c.parallel.method != res.ranked[0].parallel.method) {
      runner = &c;
      break;
    }
  }
  return explain(res.ranked[0], *runner, res.max_context);
}

}  // namespace search_parts

}  // namespace cpsim::planner
