// `cpsim maxlen`: the longest sequence a configuration trains, and what stops it going longer.
#include <algorithm>
#include <iostream>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cpsim/models/error.hpp"
#include "cpsim/models/units.hpp"
#include "cpsim/planner/emit.hpp"
#include "cpsim/planner/maxlen.hpp"
#include "cpsim/sim/implementation.hpp"
#include "cpsim/sim/pipeline.hpp"

#include "commands.hpp"
#include "common.hpp"
#include "config_flags.hpp"
#include "cost.hpp"
#include "side_by_side.hpp"

namespace cpsim::cli {
namespace {

constexpr int kMaxLenSchemaVersion = 1;

nlohmann::json binding_json(const planner::BindingConstraint& b) {
  nlohmann::json j = {
      {"kind", planner::to_string(b.kind)}, {"text", b.text}, {"seq_len", b.seq_len}};
  if (b.kind == planner::BindingConstraint::Kind::kGpuMemory) {
    j["rank"] = b.rank;
    j["category"] = b.category;
    j["op"] = b.op;
  }
  if (b.used_bytes > 0) {
    j["used_bytes"] = b.used_bytes;
    j["limit_bytes"] = b.limit_bytes;
  }
  return j;
}

struct Outcome {
  std::string method;
  std::string error;
  sim::ScheduleInputs in;
  planner::MaxLenResult res;
  std::vector<std::string> launcher_changes;  ///< --launcher: what it changed in the recipe
};

// What the step at the answer costs (nothing when no length fits).
StepCost outcome_cost(const Outcome& o, const CostRate& rate) {
  const sim::StepReport& at = o.res.at_max;
  return o.res.max_seq_len > 0
             ? step_cost(rate, at.step_time_s, at.tokens_per_step, o.in.parallel.gpus)
             : StepCost{};
}

nlohmann::json answer_json(const Outcome& o) {
  if (!o.error.empty()) {
    return {{"method", o.method}, {"error", o.error}};
  }
  const auto& r = o.res;
  const sim::Implementation* impl = sim::requested_implementation(o.in);
  return {{"method", o.method},
          {"implementation", impl != nullptr ? nlohmann::json(impl->name()) : nlohmann::json()},
          {"max_seq_len", r.max_seq_len},
          {"step_tokens", r.step},
          {"binding_constraint", binding_json(r.binding)},
          {"peak_memory_bytes", r.max_seq_len > 0 ? r.at_max.peak_memory_bytes : 0},
          {"step_time_s", r.max_seq_len > 0 ? r.at_max.step_time_s : 0.0},
          {"tokens_per_s_per_gpu", r.max_seq_len > 0 ? r.at_max.tokens_per_s_per_gpu : 0.0},
          {"host_memory_bytes", r.max_seq_len > 0 ? r.at_max.host_memory_bytes : 0},
          {"reserved_memory_bytes", r.max_seq_len > 0 ? r.at_max.reserved_peak_bytes : 0},
          {"gpu_margin_bytes", o.in.margin.gpu_bytes},
          {"host_margin_bytes", o.in.margin.host_bytes},
          {"headroom_bytes", r.headroom_bytes},
          {"launcher_changes", o.launcher_changes},
          {"evaluations", r.evaluations},
          {"monotone", r.monotone},
          {"warnings", r.warnings}};
}

// 0 when some length fits for at least one method, else kExitDoesNotFit.
int maxlen_status(const std::vector<Outcome>& outcomes) {
  const bool one_fits = std::any_of(outcomes.begin(), outcomes.end(), [](const Outcome& o) {
    return o.error.empty() && o.res.max_seq_len > 0;
  });
  return one_fits ? 0 : kExitDoesNotFit;
}

}  // namespace

CLI::App* register_maxlen(CLI::App& app, MaxLenArgs& a) {
  CLI::App* c = app.add_subcommand(
      "maxlen", "The longest sequence a configuration can train, and the constraint that binds");
  c->footer(
      "Exit status 3 when not even the shortest length searched fits (with several methods: for "
      "none of them), after printing the answer; 2 for bad input.");
  add_config_options(c, a.config, /*with_seq=*/false);
  c->add_option("--granularity", a.granularity,
                "lengths searched are multiples of this (and of what the method requires)")
      ->capture_default_str();
  std::string launchers;
  for (const planner::LauncherFormat f : planner::launcher_formats()) {
    launchers += fmt::format("{}{}", launchers.empty() ? "" : ", ", planner::to_string(f));
  }
  c->add_option("--launcher", a.launcher,
                "answer for the configuration as this launcher runs it from the file cpsim emits "
                "(its recipe knobs and implementation): " +
                    launchers);
  c->add_option("--max-step-time", a.max_step_time,
                "the longest length whose step takes at most this long (90s, 30min, 2h, 1.5d; a "
                "plain number is seconds); the step-time cap binds where memory allows longer");
  add_cost_options(c, a.config.gpu_hour_cost, a.config.train_tokens);
  c->add_flag("--json", a.json, "print JSON instead of text");
  return c;
}

namespace {

// The longest context of method `m` (as `launcher` runs it when given). With several methods a
// refusal is that method's outcome; with one it is the command's error.
Outcome search_method(const MaxLenArgs& a,
                      const std::string& m,
                      bool several,
                      const std::optional<planner::LauncherFormat>& launcher,
                      const planner::MaxLenOptions& opts) {
  Outcome o;
  o.method = m;
  SimulateArgs cfg = several ? config_for_method(a.config, m) : a.config;
  cfg.method = m;
  cfg.seq = "64K";  // replaced by the search; any valid length resolves the other flags
  try {
    o.in = resolve_inputs(cfg);
    o.method = models::to_string(o.in.parallel.method);  // --impl alone picks its method
    if (launcher) {
      planner::ConfigAsRun run = planner::config_as_run(*launcher, o.in, "--launcher");
      o.in = std::move(run.inputs);
      o.launcher_changes = std::move(run.changes);
    }
    o.res = planner::max_seq_len(o.in, opts);
  } catch (const sim::ConfigError& e) {
    if (!several)
      throw;
    o.error = refusal_text(e);
  } catch (const InputError& e) {
    if (!several)
      throw;
    o.error = e.what();
  }
  return o;
}

nlohmann::json maxlen_json(const std::vector<Outcome>& outcomes,
                           const planner::MaxLenOptions& opts,
                           const std::optional<CostRate>& rate) {
  auto outcome_json = [&](const Outcome& o) {
    nlohmann::json j = answer_json(o);
    if (opts.max_step_time_s > 0) {
      j["max_step_time_s"] = opts.max_step_time_s;
    }
    if (rate && o.error.empty()) {
      j["cost"] = cost_json(*rate, outcome_cost(o, *rate));
    }
    return j;
  };
  if (outcomes.size() == 1) {
    nlohmann::json j = outcome_json(outcomes[0]);
    j["schema_version"] = kMaxLenSchemaVersion;
    j["command"] = "maxlen";
    return j;
  }
  nlohmann::json list = nlohmann::json::array();
  for (const Outcome& o : outcomes)
    list.push_back(outcome_json(o));
  return nlohmann::json{
      {"schema_version", kMaxLenSchemaVersion}, {"command", "maxlen"}, {"methods", list}};
}

// One method's answer: the longest context, what binds, the step there and the search.
void print_outcome(const MaxLenArgs& a, const Outcome& o, const std::optional<CostRate>& rate) {
  if (!o.error.empty()) {
    std::cout << fmt::format("{}: cannot run: {}\n\n", o.method, o.error);
    return;
  }
  const auto& r = o.res;
  const sim::Implementation* impl = sim::requested_implementation(o.in);
  // The degrees searched with (usp's default is Ulysses over every GPU, ring 1: plan lists that
  // split as ulysses and searches usp's mixed ones).
  const sim::CpScheme& method = sim::cp_scheme(o.in.parallel.method);
  std::cout << fmt::format("{} on {} x {}, {}, recipe {}, implementation {}\n", o.in.model.name,
                           o.in.parallel.gpus, o.in.hardware.name,
                           method.label(sim::LabelStyle::kSearch, o.in.parallel, nullptr),
                           o.in.recipe.name, impl != nullptr ? impl->name() : "none");
  if (o.in.parallel.pp_degree > 1) {
    const sim::PipelineShape s = sim::pipeline_shape(o.in);
    const bool uneven =
        o.in.parallel.pp_first_stage_layers > 0 || o.in.parallel.pp_last_stage_layers > 0;
    std::cout << fmt::format(
        "  PP {} ({}), {}\n", o.in.parallel.pp_degree, models::to_string(o.in.parallel.pp_schedule),
        uneven ? fmt::format("{}/{}/{} blocks on the first/middle/last stages",
                             s.first_stage_layers, s.middle_stage_layers, s.last_stage_layers)
               : fmt::format("{} blocks per stage", s.stage_layers));
  }
  if (o.in.model.is_moe()) {
    std::cout << fmt::format(
        "  experts: EP {}, {} of the {} on each GPU\n", o.in.parallel.ep_degree,
        o.in.model.moe.experts / std::max(1, o.in.parallel.ep_degree), o.in.model.moe.experts);
  }
  if (o.in.parallel.tp_degree > 1 || o.in.parallel.micro_batches > 1) {
    std::cout << fmt::format("  TP {} (sequence parallel) x CP {}, {} micro-batch(es) per step\n",
                             o.in.parallel.tp_degree, o.in.parallel.cp_degree,
                             o.in.parallel.micro_batches);
  }
  if (r.max_seq_len == 0) {
    std::cout << fmt::format("  not even {} tokens fit\n  binding constraint   {}\n\n",
                             format_length(r.step), r.binding.text);
    return;
  }
  std::cout << fmt::format("  longest context      {} ({} tokens; searched in steps of {})\n",
                           format_length(r.max_seq_len), r.max_seq_len, format_length(r.step));
  std::cout << fmt::format("  binding constraint   {}\n", r.binding.text);
  if (!a.launcher.empty()) {
    std::string changes;
    for (const std::string& c : o.launcher_changes) {
      changes += (changes.empty() ? ": " : "; ") + c;
    }
    std::cout << fmt::format("  launcher             {} runs the recipe {}{}\n", a.launcher,
                             changes.empty() ? "unchanged" : "changed", changes);
  }
  std::cout << fmt::format(
      "  at the longest       peak {}, reserved {} (headroom {} beyond a {} margin), step {}, "
      "{:.1f} tokens/s/GPU, host {} per node\n",
      format_bytes(static_cast<double>(r.at_max.peak_memory_bytes)),
      format_bytes(static_cast<double>(r.at_max.reserved_peak_bytes)),
      format_bytes(static_cast<double>(r.headroom_bytes)),
      format_bytes(static_cast<double>(r.at_max.gpu_margin_bytes)),
      format_seconds(r.at_max.step_time_s), r.at_max.tokens_per_s_per_gpu,
      format_bytes(static_cast<double>(r.at_max.host_memory_bytes)));
  if (rate) {
    std::cout << cost_lines(*rate, outcome_cost(o, *rate), "  ");
  }
  std::cout << fmt::format("  searched             {} simulations{}\n", r.evaluations,
                           r.monotone ? ", memory monotone around the limit" : "");
  for (const auto& w : r.warnings) {
    std::cout << "  warning: " << w << "\n";
  }
  std::cout << "\n";
}

}  // namespace

int run_maxlen(const MaxLenArgs& a) {
  planner::MaxLenOptions opts;
  opts.granularity = parse_length(a.granularity, "--granularity");
  if (!a.max_step_time.empty()) {
    opts.max_step_time_s = parse_duration_s(a.max_step_time, "--max-step-time");
  }
  const std::optional<CostRate> rate =
      parse_cost_rate(a.config.gpu_hour_cost, a.config.train_tokens);
  opts.refusal_text = refusal_text;
  const std::vector<std::string> methods = split_methods(a.config.method, "--method");
  std::optional<planner::LauncherFormat> launcher;
  if (!a.launcher.empty()) {
    launcher = planner::parse_launcher_format(a.launcher, "--launcher");
  }
  auto search_every_method = [&](const MaxLenArgs& on) {
    std::vector<Outcome> out;
    for (const std::string& m : methods) {
      out.push_back(search_method(on, m, methods.size() > 1, launcher, opts));
    }
    return out;
  };
  if (const std::vector<std::string> profiles = hardware_profiles(a.config.hardware);
      profiles.size() > 1) {
    std::vector<HardwareAnswer> answers;
    int status = kExitDoesNotFit;
    for (const std::string& hardware : profiles) {
      MaxLenArgs on = a;
      on.config.hardware = hardware;
      const std::vector<Outcome> outcomes = search_every_method(on);
      answers.push_back({hardware, maxlen_json(outcomes, opts, rate)});
      status = std::min(status, maxlen_status(outcomes));
    }
    std::cout << (a.json ? side_by_side_json("maxlen", answers).dump(2) + "\n"
                         : side_by_side_table("maxlen", answers));
    return status;
  }
  const std::vector<Outcome> outcomes = search_every_method(a);
  if (a.json) {
    std::cout << maxlen_json(outcomes, opts, rate).dump(2) << "\n";
  } else {
    for (const Outcome& o : outcomes) {
      print_outcome(a, o, rate);
    }
  }
  return maxlen_status(outcomes);
}

}  // namespace cpsim::cli
