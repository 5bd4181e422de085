// Packed batches on the command line: `simulate --lengths ... --pack S` (the step over sampled
// batches, per load balancer) and `plan --lengths` (its best configurations ranked again).
#include <algorithm>
#include <cstdint>
#include <functional>
#include <iostream>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cpsim/models/documents.hpp"
#include "cpsim/models/error.hpp"
#include "cpsim/models/units.hpp"
#include "cpsim/planner/batches.hpp"
#include "cpsim/sim/cp_method.hpp"
#include "cpsim/sim/implementation.hpp"

#include "commands.hpp"
#include "common.hpp"
#include "config_options.hpp"
#include "progress.hpp"

namespace cpsim::cli {

namespace {

// What --lengths runs with: one configuration, nothing it would ignore.
void check_batch_arguments(const SimulateArgs& a) {
  if (a.lengths.empty()) {
    throw InputError("--pack", "needs --lengths (the document lengths to pack)");
  }
  if (a.pack.empty()) {
    throw InputError("--lengths", "needs --pack S (the length of the packed sequences)");
  }
  if (a.method.find(',') != std::string::npos || a.method == "all") {
    throw InputError("--method", "one method at a time with --lengths");
  }
  if (a.hardware.find(',') != std::string::npos) {
    throw InputError("--hardware", "one hardware profile at a time with --lengths");
  }
  if (!a.trace.empty()) {
    throw InputError("--trace", "a trace is of one step: leave out --lengths");
  }
  if (!a.gpu_hour_cost.empty() || !a.train_tokens.empty()) {
    throw InputError(a.gpu_hour_cost.empty() ? "--train-tokens" : "--gpu-hour-cost",
                     "the cost of packed batches is not reported yet: leave out --lengths");
  }
}

// Per batch, per round, its CP groups: {"first_rank", "cp", "documents"}.
nlohmann::json hybrid_cp_json(const std::vector<std::vector<planner::HybridCpRound>>& batches) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& rounds : batches) {
    nlohmann::json batch = nlohmann::json::array();
    for (const planner::HybridCpRound& round : rounds) {
      nlohmann::json groups = nlohmann::json::array();
      for (const planner::HybridCpGroup& g : round.groups) {
        groups.push_back({{"first_rank", g.first_rank}, {"cp", g.cp}, {"documents", g.documents}});
      }
      batch.push_back(std::move(groups));
    }
    out.push_back(std::move(batch));
  }
  return out;
}

nlohmann::json balancer_json(const planner::BalancerStudy& b) {
  nlohmann::json j = {{"balancer", std::string(b.balancer.name)},
                      {"runs", std::string(b.balancer.runs)},
                      {"step_time_s", {{"p50", b.p50_s}, {"p95", b.p95_s}, {"max", b.max_s}}},
                      {"tokens_per_s_p50", b.tokens_per_s_p50},
                      {"imbalance", {{"p50", b.imbalance_p50}, {"max", b.imbalance_max}}},
                      {"padding_share", b.padding_share},
                      {"documents_per_sequence", b.documents_per_sequence},
                      {"document_tokens_per_step", b.document_tokens_per_step},
                      {"objective_tokens_per_s", b.objective_tokens_per_s},
                      {"peak_memory_bytes", b.memory.peak_bytes},
                      {"fits", b.memory.fits},
                      {"step_time_s_per_batch", b.step_s},
                      {"imbalance_per_batch", b.imbalance}};
  if (b.balancer.regroups()) {
    j["cp_groups_per_batch"] = hybrid_cp_json(b.hybrid_cp_rounds);
  }
  return j;
}

std::string percent(double share) {
  return fmt::format("{:.1f} %", 100.0 * share);
}

}  // namespace

namespace {

// Records that packed-batch flag `name` was given (each needs --lengths).
std::function<void(const std::string&)> given(SimulateArgs& a, const char* name) {
  return [&a, name](const std::string&) { a.batch_flag = name; };
}

// The flags simulate and plan share.
void add_shared_batch_options(CLI::App* c, SimulateArgs& a) {
  c->add_option("--lengths", a.lengths,
                "packed batches: document lengths from a file (one a line, 8K suffixes allowed; "
                "a .json file: {\"lengths\": [...], \"counts\": [...]}) or "
                "lognormal:median=TOKENS,sigma=NUMBER[,max=TOKENS]; the step-time distribution "
                "per load balancer (docs/PACKING.md)");
  c->add_option("--packing", a.packing,
                "packed batches: concat (a token stream cut every S tokens: Megatron-LM, "
                "TorchTitan's default), greedy (in order, documents longer than S dropped: "
                "ArcticTraining SFT), first-fit (8 open sequences, long documents dropped: "
                "TorchTitan's first-fit)")
      ->capture_default_str()
      ->each(given(a, "--packing"));
  c->add_option("--batches", a.batches, "packed batches: steps sampled")
      ->capture_default_str()
      ->each(given(a, "--batches"));
  c->add_option("--seed", a.seed, "packed batches: seed of the document sampler")
      ->capture_default_str()
      ->each(given(a, "--seed"));
  c->add_option("--objective", a.objective,
                "packed batches: rank load balancers (and plan's configurations) by document "
                "tokens/s at the p50 or the p95 step time")
      ->capture_default_str()
      ->each(given(a, "--objective"));
}

}  // namespace

void add_batch_options(CLI::App* c, SimulateArgs& a) {
  add_shared_batch_options(c, a);
  c->add_option("--pack", a.pack,
                "packed batches: tokens of each packed sequence (the sequence length; --seq, if "
                "given, must agree)");
  c->add_option("--balancer", a.balancer,
                "packed batches: load balancer, or all: head-tail, contiguous, per-document "
                "(with a ring part), hybrid-cp and dynamic-cp (Megatron's: ring, "
                "power-of-two DP x CP ranks), ptrr (PyTorch's PTRR: allgather), heads (Ulysses "
                "alone); those the "
                "implementation's code runs with a document mask (unmasked: it attends across "
                "documents)")
      ->capture_default_str()
      ->each(given(a, "--balancer"));
  c->add_option("--progress", a.progress,
                "packed batches: progress on stderr: auto (in place on a terminal, a log line "
                "every 10 s otherwise, once past 2 s), always, never; default: "
                "$CPSIM_PROGRESS, else auto")
      ->each(given(a, "--progress"));
}

void add_plan_batch_options(CLI::App* c, SimulateArgs& a) {
  add_shared_batch_options(c, a);
}

void check_batch_flags_need_lengths(const SimulateArgs& a) {
  if (a.lengths.empty() && !a.batch_flag.empty()) {
    throw InputError(a.batch_flag, "only with --lengths (packed batches)");
  }
}

planner::BatchOptions batch_options(const SimulateArgs& a) {
  if (a.batches < 1 || a.batches > 100000) {
    throw InputError("--batches", fmt::format("1 to 100000 batches, got {}", a.batches));
  }
  planner::BatchOptions options;
  options.lengths = models::parse_length_distribution(a.lengths, "--lengths");
  options.packing = models::parse_packing(a.packing, "--packing");
  options.batches = a.batches;
  options.seed = a.seed;
  options.objective = planner::parse_batch_objective(a.objective, "--objective");
  return options;
}

int run_simulate_batches(const SimulateArgs& a) {
  check_batch_arguments(a);
  SimulateArgs on = a;
  const std::int64_t pack = parse_length(a.pack, "--pack");
  if (a.seq_given && parse_length(a.seq, "--seq") != pack) {
    throw InputError("--seq", fmt::format("--seq {} and --pack {} disagree: the packed sequence "
                                          "is the sequence (give one of them)",
                                          a.seq, a.pack));
  }
  on.seq = a.pack;
  planner::BatchOptions options = batch_options(a);
  const ProgressMode mode = parse_progress_mode(a.progress);
  const sim::ScheduleInputs in = resolve_inputs(on);
  // The packed sequence's length is --pack's: a length the configuration refuses names it.
  if (const sim::LayoutCheck checked = sim::check_head_layout(in);
      checked.issue && (checked.issue->quantity == sim::Quantity::kSeqLen ||
                        checked.issue->quantity == sim::Quantity::kSeqLenMultiple)) {
    throw InputError("--pack", checked.issue->message);
  }
  if (a.balancer != "all") {
    options.balancers.push_back(planner::load_balancer(in, a.balancer, "--balancer"));
  }
  Progress progress("simulate", mode);
  const planner::BatchStudy study = planner::study_batches(in, options, [&](int done, int total) {
    progress.update(fmt::format("batch {} of {}", done, total));
  });
  progress.clear();

  const sim::HeadLayout layout = sim::derive_head_layout(in);
  const std::string method =
      sim::cp_scheme(in.parallel.method).label(sim::LabelStyle::kDescription, in.parallel, &layout);
  const planner::BalancerStudy& best = study.best();
  if (a.json) {
    nlohmann::json j;
    j["model"] = in.model.name;
    j["gpus"] = in.parallel.gpus;
    j["hardware"] = in.hardware.name;
    j["method"] = method;
    const sim::Implementation* impl = sim::checked_layout(in).implementation;
    j["implementation"] = impl == nullptr ? std::string("none") : std::string(impl->name());
    j["sequence_tokens"] = in.parallel.seq_len;
    j["lengths"] = {{"source", options.lengths.origin},
                    {"mean_tokens", options.lengths.mean_tokens()}};
    j["packing"] = models::to_string(options.packing);
    j["batches"] = options.batches;
    j["seed"] = options.seed;
    j["sequences_per_step"] = study.sequences_per_batch;
    j["one_document"] = {{"step_time_s", study.one_document_step_s},
                         {"tokens_per_s", study.one_document_tokens_per_s}};
    j["balancers"] = nlohmann::json::array();
    for (const planner::BalancerStudy& b : study.balancers) {
      j["balancers"].push_back(balancer_json(b));
    }
    j["objective"] = planner::to_string(options.objective);
    j["recommended"] = std::string(best.balancer.name);
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::string o;
  o += fmt::format("{} on {} x {}, {}, packed sequences of {} ({} tokens)\n", in.model.name,
                   in.parallel.gpus, in.hardware.name, method, format_length(in.parallel.seq_len),
                   in.parallel.seq_len);
  o += fmt::format(
      "  documents from {} (mean {:.0f} tokens), {} packing, {} batches (seed {}), "
      "{} sequence{} per step\n",
      options.lengths.origin, options.lengths.mean_tokens(), models::to_string(options.packing),
      options.batches, options.seed, study.sequences_per_batch,
      study.sequences_per_batch > 1 ? "s" : "");
  const sim::Implementation* impl = sim::checked_layout(in).implementation;
  o += fmt::format("  implementation {}\n",
                   impl == nullptr ? std::string("none: the method's scheme with a document mask")
                                   : std::string(impl->name()));
  o += fmt::format("  one document per sequence: step {}, {:.0f} tokens/s\n\n",
                   format_seconds(study.one_document_step_s), study.one_document_tokens_per_s);
  std::vector<std::vector<std::string>> rows;
  for (const planner::BalancerStudy& b : study.balancers) {
    rows.push_back({std::string(b.balancer.name), format_seconds(b.p50_s), format_seconds(b.p95_s),
                    format_seconds(b.max_s), fmt::format("{:.0f}", b.tokens_per_s_p50),
                    fmt::format("{:.2f}", b.imbalance_p50), fmt::format("{:.2f}", b.imbalance_max),
                    percent(b.padding_share), fmt::format("{:.1f}", b.documents_per_sequence),
                    format_bytes(static_cast<double>(b.memory.peak_bytes)) +
                        (b.memory.fits ? "" : " (does not fit)")});
  }
  o += indent_lines(
      format_table({"load balancer", "step p50", "p95", "max", "tokens/s p50", "imbalance p50",
                    "max", "padding", "docs/seq", "peak memory"},
                   rows, {false, true, true, true, true, true, true, true, true, true}),
      "  ");
  o += "\n";
  for (const planner::BalancerStudy& b : study.balancers) {
    o += fmt::format("  {}: {}\n", b.balancer.name, b.balancer.runs);
    if (!b.balancer.masked) {
      o += "    every step is the one-document step (no document mask); --impl none gives the "
           "method's scheme with one\n";
    }
  }
  o += fmt::format(
      "\n  recommended: {} (most document tokens/s at the {} step time: {:.0f}; "
      "p50 step {} vs {} for one document)\n",
      best.balancer.name, planner::to_string(options.objective), best.objective_tokens_per_s,
      format_seconds(best.p50_s), format_seconds(study.one_document_step_s));
  o += "  imbalance: the busiest CP rank's attention work over the mean, in the step's slowest "
       "sequence";
  for (const planner::BalancerStudy& b : study.balancers) {
    if (b.balancer.regroup == planner::LoadBalancer::Regroup::kHybridCp) {
      o += "; hybrid-cp: over the DP x CP ranks, summed over the rounds";
    } else if (b.balancer.regroup == planner::LoadBalancer::Regroup::kDynamicCp) {
      o += "; dynamic-cp: the busiest of the DP x CP ranks over the step";
    }
  }
  o += "\n";
  const bool regrouped =
      std::any_of(study.balancers.begin(), study.balancers.end(),
                  [](const planner::BalancerStudy& b) { return b.balancer.regroups(); });
  o += fmt::format(
      "  peak memory: the highest allocated peak of the steps simulated{}: as long a sequence "
      "holds as much, up to what the timing keeps in flight (docs/PACKING.md)\n",
      regrouped ? " (hybrid-cp, dynamic-cp: of every group's)" : "");
  std::cout << o;
  return 0;
}

PlanBatches rank_plan_by_batches(const SimulateArgs& a,
                                 const sim::ScheduleInputs& base,
                                 int top,
                                 std::vector<planner::Candidate>& ranked,
                                 std::string& why_best,
                                 const std::function<void(int, int)>& progress) {
  PlanBatches out;
  out.options = batch_options(a);
  out.candidates =
      planner::batch_candidates(base, ranked, static_cast<std::size_t>(std::max(top, 5)));
  if (out.candidates.empty()) {
    throw InputError("--lengths",
                     fmt::format("packed batches apply to none of the plan's first {} "
                                 "configurations (their code's handling of documents was not "
                                 "read); --impl none ranks the methods' schemes with a mask",
                                 std::min<std::size_t>(ranked.size(), 50)));
  }
  out.ranking = planner::rank_by_batches(base, out.candidates, out.options, progress);
  // The studied configurations that answered, in the ranking's order, then the plan's others.
  std::vector<planner::Candidate> reordered;
  std::vector<std::string> answered;
  for (const planner::BatchRanking& r : out.ranking) {
    if (r.refused.empty()) {
      reordered.push_back(out.candidates[r.candidate]);
      answered.push_back(out.candidates[r.candidate].label);
    }
  }
  for (planner::Candidate& c : ranked) {
    if (std::find(answered.begin(), answered.end(), c.label) == answered.end()) {
      reordered.push_back(std::move(c));
    }
  }
  ranked = std::move(reordered);
  const planner::BatchRanking& first = out.ranking.front();
  if (first.refused.empty()) {
    const planner::BalancerStudy& b = first.study.best();
    why_best = fmt::format(
        "over {} packed batches ({}), {:.0f} document tokens/s at the {} step time with the {} "
        "load balancer",
        out.options.batches, out.options.lengths.origin, b.objective_tokens_per_s,
        planner::to_string(out.options.objective), b.balancer.name);
    if (out.ranking.size() > 1 && out.ranking[1].refused.empty()) {
      why_best += fmt::format(" vs {:.0f} for the runner-up",
                              out.ranking[1].study.best().objective_tokens_per_s);
    }
  }
  return out;
}

std::string plan_batches_table(const PlanBatches& b) {
  std::vector<std::vector<std::string>> rows;
  for (const planner::BatchRanking& r : b.ranking) {
    const planner::Candidate& c = b.candidates[r.candidate];
    if (!r.refused.empty()) {
      rows.push_back({c.label, "-", "-", "-", "-", "-", format_seconds(c.report.step_time_s)});
      continue;
    }
    const planner::BalancerStudy& best = r.study.best();
    rows.push_back({c.label, std::string(best.balancer.name), format_seconds(best.p50_s),
                    format_seconds(best.p95_s), fmt::format("{:.0f}", best.objective_tokens_per_s),
                    fmt::format("{:.2f}", best.imbalance_p50),
                    format_seconds(r.study.one_document_step_s)});
  }
  std::string o = fmt::format(
      "packed batches: {} batches of documents from {}, {} packing, seed {}; ranked by document "
      "tokens/s at the {} step time\n",
      b.options.batches, b.options.lengths.origin, models::to_string(b.options.packing),
      b.options.seed, planner::to_string(b.options.objective));
  o += indent_lines(
      format_table({"configuration", "balancer", "step p50", "p95",
                    fmt::format("tokens/s @{}", planner::to_string(b.options.objective)),
                    "imbalance", "one document"},
                   rows, {false, false, true, true, true, true, true}),
      "  ");
  for (const planner::BatchRanking& r : b.ranking) {
    if (!r.refused.empty()) {
      o += fmt::format("  {}: {}\n", b.candidates[r.candidate].label, r.refused);
    }
  }
  return o;
}

nlohmann::json plan_batches_json(const PlanBatches& b) {
  nlohmann::json j;
  j["lengths"] = {{"source", b.options.lengths.origin},
                  {"mean_tokens", b.options.lengths.mean_tokens()}};
  j["packing"] = models::to_string(b.options.packing);
  j["batches"] = b.options.batches;
  j["seed"] = b.options.seed;
  j["objective"] = planner::to_string(b.options.objective);
  j["ranking"] = nlohmann::json::array();
  for (const planner::BatchRanking& r : b.ranking) {
    nlohmann::json e;
    e["configuration"] = b.candidates[r.candidate].label;
    if (!r.refused.empty()) {
      e["refused"] = r.refused;
    } else {
      e["one_document_step_time_s"] = r.study.one_document_step_s;
      e["recommended_balancer"] = std::string(r.study.best().balancer.name);
      e["balancers"] = nlohmann::json::array();
      for (const planner::BalancerStudy& s : r.study.balancers) {
        e["balancers"].push_back(balancer_json(s));
      }
    }
    j["ranking"].push_back(std::move(e));
  }
  return j;
}

}  // namespace cpsim::cli
