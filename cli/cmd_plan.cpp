// `cpsim plan`: search methods, degrees and knobs; print the best, the Pareto front and why; emit
// the winner's settings for a training launcher.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cpsim/models/error.hpp"
#include "cpsim/models/units.hpp"
#include "cpsim/planner/emit.hpp"
#include "cpsim/planner/evaluate.hpp"
#include "cpsim/planner/search.hpp"
#include "cpsim/sim/implementation.hpp"

#include "commands.hpp"
#include "common.hpp"
#include "config_flags.hpp"
#include "cost.hpp"
#include "output.hpp"
#include "progress.hpp"
#include "side_by_side.hpp"

namespace cpsim::cli {
namespace {

constexpr int kPlanSchemaVersion = 1;

// Launchers that run each method, best first (the method's table).
std::string launchers_for(models::CpMethod m) {
  return sim::cp_scheme(m).launchers().list();
}

nlohmann::json candidate_json(const planner::Candidate& c, bool max_context) {
  const auto& p = c.parallel;
  const auto& r = c.recipe;
  const sim::CpScheme& method = sim::cp_scheme(p.method);
  nlohmann::json j = {
      {"label", c.label},
      {"method", models::to_string(p.method)},
      {"cp_degree", p.cp_degree},
      {"ulysses_degree", p.ulysses_degree()},
      {"ring_degree", p.ring_degree},
      {"data_parallel", p.data_parallel()},
      {"heads_per_stage", method.uses_heads_per_stage() ? c.report.layout.heads_per_stage : 0},
      {"fpdt_chunk", method.uses_fpdt_chunk() ? p.fpdt_chunk : 0},
      {"ac", models::to_string(r.checkpointing)},
      {"ac_offload", r.checkpoint_offload},
      {"tiled_mlp", r.tiled_mlp},
      {"fused_loss", r.fused_loss},
      {"zero_stage", r.zero_stage},
      {"rope_cache_bytes_per_head_dim", r.rope_cache_bytes_per_head_dim},
      {"rope_cache_per_layer", r.rope_cache_per_layer},
      {"seq_len", p.seq_len},
      {"tokens_per_step", c.report.tokens_per_step},
      {"step_time_s", c.report.step_time_s},
      {"tokens_per_s_per_gpu", c.report.tokens_per_s_per_gpu},
      {"mfu", c.report.mfu},
      {"peak_memory_bytes", c.report.peak_memory_bytes},
      {"host_memory_bytes", c.report.host_memory_bytes},
      {"launchers", launchers_for(p.method)},
  };
  if (p.pp_degree > 1) {  // written only with PP, so that a plan without it reads as before
    j["pp_degree"] = p.pp_degree;
    j["pp_schedule"] = models::to_string(p.pp_schedule);
    j["virtual_stages"] = p.virtual_stages;
    j["pp_first_stage_layers"] = p.pp_first_stage_layers;
    j["pp_last_stage_layers"] = p.pp_last_stage_layers;
    j["micro_batches"] = p.micro_batches;
  }
  if (max_context) {
    j["max_seq_len"] = c.max_seq_len;
    j["binding_constraint"] = c.binding.text;
  }
  return j;
}

std::vector<std::string> row(const planner::Candidate& c, bool max_context) {
  std::vector<std::string> r;
  if (max_context)
    r.push_back(format_length(c.max_seq_len));
  const std::int64_t tokens_per_step = c.report.tokens_per_step;
  r.insert(r.end(), {fmt::format("{:.1f}", c.report.tokens_per_s_per_gpu),
                     format_length(tokens_per_step), format_seconds(c.report.step_time_s),
                     format_bytes(static_cast<double>(c.report.peak_memory_bytes)), c.label});
  return r;
}

}  // namespace

CLI::App* register_plan(CLI::App& app, PlanArgs& a) {
  CLI::App* c = app.add_subcommand(
      "plan",
      "Search methods, degrees and knobs: the fastest configuration at --seq, or the longest "
      "context (default); emit launcher settings");
  add_config_options(c, a.config, /*with_seq=*/false);
  c->add_option("--seq", a.seq, "rank configurations by tokens/s/GPU at this length");
  c->add_flag("--max-context", a.max_context,
              "rank by the longest context, then throughput (default)");
  c->add_option("--methods", a.methods,
                "methods to search: a comma-separated list or all (default: --method when given, "
                "else all)");
  c->add_option("--top", a.top, "configurations to list")->capture_default_str();
  c->add_option("--granularity", a.granularity, "max-context mode: length step")
      ->capture_default_str();
  c->add_option("--max-step-time", a.max_step_time,
                "max-context mode: each configuration's longest length whose step takes at most "
                "this long (90s, 30min, 2h, 1.5d; a plain number is seconds)");
  add_cost_options(c, a.config.gpu_hour_cost, a.config.train_tokens);
  add_plan_batch_options(c, a.config);
  c->add_flag(
      "--fixed-recipe", a.fixed_recipe,
      "--seq mode: keep the recipe's AC, offload, tiling, loss and ZeRO settings instead of "
      "searching them (each of --zero, --ac, --ac-offload, --tiled-mlp, --fused-loss given alone "
      "keeps that one; the longest-context search always keeps the recipe)");
  c->add_flag("--allow-data-parallel", a.allow_data_parallel,
              "--seq mode: also search CP groups smaller than --gpus with the rest data parallel; "
              "each step then trains GPUs/C sequences (tokens/step in the tables), a larger "
              "global batch than one sequence");
  c->add_option("--threads", a.threads, "parallel evaluations")->capture_default_str();
  std::string names;
  for (const planner::LauncherFormat f : planner::launcher_formats()) {
    names += fmt::format("{}{}", names.empty() ? "" : ", ", planner::to_string(f));
  }
  c->add_option("--launcher", a.launcher,
                "search only what this launcher runs from the file cpsim emits for it (as --emit "
                "does), without writing the file: " +
                    names);
  c->add_option("--emit", a.emit,
                "write the best configuration's settings for a launcher: " + names +
                    " (the file names the release it is written for)");
  c->add_option("--launcher-version", a.launcher_version,
                "the release of the --emit/--launcher launcher: torchtitan 0.3.0 (default, a "
                "Python config function), 0.2.2 or 0.2.1 (TOML); the others write one release");
  c->add_option("--dataset", a.dataset,
                "training data for launchers whose file names it (arctic: data.sources): a "
                "Hugging Face dataset id, name:split, or a local path");
  c->add_option("--out", a.out, "file for --emit (default: print it)")->check(output_path_check());
  c->add_flag("--json", a.json, "print JSON instead of text (as --format json)");
  c->add_option("--format", a.format,
                "output: table | json | csv (csv: one row per fitting configuration, best first)")
      ->capture_default_str();
  c->add_option("--progress", a.progress,
                "progress on stderr: auto (in place on a terminal, a log line every 10 s "
                "otherwise, once past 2 s), always (from the start), never; default: "
                "$CPSIM_PROGRESS, else auto");
  c->add_flag(
      "--all", a.all,
      "with --format csv or json: every configuration generated, in search order, with "
      "what became of it (fits, does not fit, pruned by the memory bound, refused) and why");
  return c;
}

namespace {

// The methods to search: --methods, else --method when given (one method or a list), else all.
std::string methods_to_search(const PlanArgs& a) {
  if (!a.methods.empty() && a.config.method_given) {
    throw InputError("--method", "give either --method or --methods");
  }
  if (!a.methods.empty()) {
    return a.methods;
  }
  return a.config.method_given ? a.config.method : "all";
}

// What the command line fixed: the search keeps these (a flag left out is searched).
planner::PlanConstraints fixed_by_flags(const PlanArgs& a) {
  const SimulateArgs& f = a.config;
  planner::PlanConstraints fixed;
  fixed.tp_degree = f.tp_given ? f.tp : 0;
  fixed.ep_degree = f.ep_given ? f.ep : 0;
  fixed.pp_degree = f.pp_given ? f.pp : 0;
  if (!f.pp_schedule.empty()) {
    fixed.pp_schedule = models::parse_pipeline_schedule(f.pp_schedule, "--pp-schedule");
  }
  fixed.virtual_stages = f.virtual_stages;
  fixed.pp_first_stage_layers = f.pp_first_stage_layers;
  fixed.pp_last_stage_layers = f.pp_last_stage_layers;
  fixed.micro_batches = f.micro_batches_given ? f.micro_batches : 0;
  fixed.cp_degree = f.cp_degree;
  fixed.ulysses_degree = f.ulysses_degree;
  fixed.ring_degree = f.ring_degree;
  fixed.heads_per_stage = f.heads_per_stage;
  fixed.fpdt_chunk = f.fpdt_chunk.empty() ? 0 : parse_length(f.fpdt_chunk, "--fpdt-chunk");
  fixed.ring_layout = !f.ring_layout.empty();
  const bool all = a.fixed_recipe;
  fixed.zero_stage = all || f.zero >= 0;
  fixed.checkpointing = all || !f.ac.empty();
  fixed.checkpoint_offload = all || !f.ac_offload.empty();
  fixed.tiled_mlp = all || !f.tiled_mlp.empty();
  fixed.fused_loss = all || !f.fused_loss.empty();
  return fixed;
}

// What the launcher's file changes in the base recipe for the configuration `c` (what --emit's
// search ran instead of the recipe asked for).
std::vector<std::string> launcher_changes(planner::LauncherFormat f,
                                          const sim::ScheduleInputs& base,
                                          const planner::Candidate& c) {
  sim::ScheduleInputs in = base;
  in.parallel = c.parallel;
  return planner::recipe_as_run(f, in).changes;
}

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string out;
  for (const std::string& p : parts) {
    out += out.empty() ? p : separator + p;
  }
  return out;
}

// What launcher `f` runs of the configuration `c`, with what it changes (recipe knobs, the
// implementation); no changes: it runs `c` exactly as simulated. @throws InputError when it cannot
// run the method.
planner::ConfigAsRun run_by(planner::LauncherFormat f,
                            const sim::ScheduleInputs& base,
                            const planner::Candidate& c) {
  const sim::ScheduleInputs in = c.inputs(base);
  const sim::Implementation* impl = sim::requested_implementation(in);
  const std::string simulated = impl != nullptr ? std::string(impl->name()) : "none";
  planner::ConfigAsRun run = planner::config_as_run(f, in, "--launcher");
  if (run.inputs.parallel.implementation != simulated) {
    run.changes.insert(run.changes.begin(), "implementation " + run.inputs.parallel.implementation);
  }
  return run;
}

std::vector<std::string> changes_by(planner::LauncherFormat f,
                                    const sim::ScheduleInputs& base,
                                    const planner::Candidate& c) {
  return run_by(f, base, c).changes;
}

// Empty when the launcher's file can be written for the configuration as it runs it and that
// fits (reserved memory and the margin, as `simulate` decides); else why not.
std::string why_changed_run_misses(planner::LauncherFormat f, const planner::ConfigAsRun& run) {
  try {
    // A file that names its data gets a stand-in: only whether the file can be written matters.
    (void)planner::emit_launcher_config(f, run.inputs, {"", "DATASET"});
  } catch (const InputError& e) {
    return e.what();
  }
  try {
    planner::EvaluateOptions options;
    options.model_allocator = true;
    const sim::StepReport r = planner::evaluate(run.inputs, options).report;
    if (r.fits()) {
      return "";
    }
    return r.binding.empty() ? "does not fit" : "does not fit: " + r.binding;
  } catch (const sim::ConfigError& e) {
    return e.what();
  } catch (const InputError& e) {
    return e.what();
  }
}

bool runs_exactly(planner::LauncherFormat f,
                  const sim::ScheduleInputs& base,
                  const planner::Candidate& c) {
  try {
    return changes_by(f, base, c).empty();
  } catch (const InputError&) {
    return false;
  }
}

// The launchers that run the configuration `c` exactly as simulated (their file sets every knob
// and runs the same implementation), then those that would change it, with what changes.
std::string launchers_as_simulated(const sim::ScheduleInputs& base, const planner::Candidate& c) {
  std::vector<std::string> exact, changed, misses;
  for (const planner::LauncherFormat f : planner::launcher_formats()) {
    try {
      const planner::ConfigAsRun run = run_by(f, base, c);
      const std::string changes = join(run.changes, "; ");
      if (run.changes.empty()) {
        exact.emplace_back(planner::to_string(f));
      } else if (const std::string why = why_changed_run_misses(f, run); why.empty()) {
        changed.push_back(fmt::format("{} ({})", planner::to_string(f), changes));
      } else {
        misses.push_back(fmt::format("{} ({}: {})", planner::to_string(f), changes, why));
      }
    } catch (const InputError&) {
      // cannot run the method
    }
  }
  std::string out =
      exact.empty() ? "none exactly as simulated" : join(exact, ", ") + " exactly as simulated";
  if (!changed.empty()) {
    out += "; with changes: " + join(changed, ", ");
  }
  if (!misses.empty()) {
    out += "; not with the changes its file makes: " + join(misses, ", ");
  }
  return out;
}

// Files the emitted one refers to, printed after it (without --out).
void print_companions(const std::vector<planner::CompanionFile>& companions) {
  for (const planner::CompanionFile& f : companions) {
    std::cout << fmt::format("\n--- {} ({}) ---\n{}", f.path, f.what, f.text);
    if (!f.text.empty() && f.text.back() != '\n')
      std::cout << "\n";
  }
}

}  // namespace

namespace {

// Flag combinations refused before anything is read.
void check_plan_flags(PlanArgs& a) {
  if (a.format != "table" && a.format != "json" && a.format != "csv") {
    throw InputError("--format", fmt::format("expected table, json or csv, got '{}'", a.format));
  }
  if (a.json && a.format == "csv") {
    throw InputError("--json", "give --json or --format csv, not both");
  }
  a.json = a.json || a.format == "json";
  if (a.all && !a.json && a.format != "csv") {
    throw InputError("--all", "only with --format csv or json: the tables show the best");
  }
  if (!a.seq.empty() && a.max_context) {
    throw InputError("--max-context", "give either --seq or --max-context");
  }
  if (a.top < 1 || a.top > 1000) {
    throw InputError("--top", "must be between 1 and 1000");
  }
  if (a.threads < 1 || a.threads > 256) {
    throw InputError("--threads", "must be between 1 and 256");
  }
  if (!a.out.empty() && a.emit.empty()) {
    throw InputError("--out", "needs --emit FORMAT");
  }
  if (!a.max_step_time.empty() && !a.seq.empty()) {
    throw InputError("--max-step-time",
                     "caps a longest-context answer; with --seq the plan ranks by step time");
  }
  check_batch_flags_need_lengths(a.config);
  if (!a.config.lengths.empty() && (!a.emit.empty() || !a.launcher.empty())) {
    throw InputError("--lengths", fmt::format("not with {} yet: the launcher files do not set the "
                                              "packing and the load balancer cpsim would rank by",
                                              a.emit.empty() ? "--launcher" : "--emit"));
  }
  if (!a.config.lengths.empty() && a.seq.empty()) {
    throw InputError("--lengths",
                     "needs --seq (the packed sequence's length): packed batches "
                     "rank the configurations at that length");
  }
  if (a.fixed_recipe && a.seq.empty()) {
    throw InputError("--fixed-recipe",
                     "only with --seq: the longest-context search always keeps the recipe");
  }
  if (!a.launcher.empty() && !a.emit.empty() && a.launcher != a.emit) {
    throw InputError("--launcher",
                     fmt::format("'{}' is not the launcher of --emit '{}'", a.launcher, a.emit));
  }
  // Only ArcticTraining's file names its data (data.sources); elsewhere the flag would be dropped.
  if (!a.dataset.empty() && a.emit != "arctic") {
    throw InputError("--dataset", "only --emit arctic writes the training data (data.sources)");
  }
}

// What the search runs on: the base inputs, the options and the launcher it searches for.
struct PlanSetup {
  sim::ScheduleInputs base;
  planner::PlanOptions opts;
  std::string launcher;  ///< --emit, else --launcher; empty: none
  const char* launcher_flag = "--launcher";
  std::optional<planner::LauncherFormat> format;
  std::optional<CostRate> cost;  ///< --gpu-hour-cost
};

// The methods searched: those asked for that --impl runs.
std::vector<models::CpMethod> searched_methods(const PlanArgs& a) {
  const sim::Implementation* impl = sim::find_implementation(a.config.impl);
  const std::string methods = methods_to_search(a);
  const char* methods_flag = a.methods.empty() && a.config.method_given ? "--method" : "--methods";
  std::vector<models::CpMethod> out, named;
  for (const std::string& m : split_methods(methods, methods_flag)) {
    const models::CpMethod id = models::parse_cp_method(m, methods_flag);
    if (std::find(named.begin(), named.end(), id) != named.end()) {
      throw InputError(methods_flag, fmt::format("{} names a method listed before it", m));
    }
    named.push_back(id);
    if (impl == nullptr || impl->runs(id)) {  // --impl searches the methods it runs
      out.push_back(id);
    }
  }
  if (out.empty()) {
    throw InputError("--impl",
                     fmt::format("{} runs none of {} {}", a.config.impl, methods_flag, methods));
  }
  return out;
}

// Keeps only the methods the launcher of --emit/--launcher runs; none of them: says which
// launchers run them.
void keep_methods_the_launcher_runs(const PlanSetup& s, std::vector<models::CpMethod>& methods) {
  std::vector<models::CpMethod> runs;
  std::string others;
  for (const models::CpMethod m : methods) {
    if (sim::cp_scheme(m).launchers().runs_on(s.launcher)) {
      runs.push_back(m);
    } else {
      others += fmt::format("{}{} (launchers: {})", others.empty() ? "" : "; ",
                            models::to_string(m), launchers_for(m));
    }
  }
  if (runs.empty()) {
    throw InputError(s.launcher_flag, fmt::format("{} cannot run {}", s.launcher, others));
  }
  methods = std::move(runs);
}

PlanSetup plan_setup(const PlanArgs& a) {
  PlanSetup s;
  // --emit X searches as --launcher X does, then writes X's file.
  s.launcher = a.emit.empty() ? a.launcher : a.emit;
  s.launcher_flag = a.emit.empty() ? "--launcher" : "--emit";
  if (!a.launcher_version.empty() && s.launcher.empty()) {
    throw InputError("--launcher-version", "needs --emit or --launcher");
  }
  if (!s.launcher.empty()) {
    s.format = planner::parse_launcher_format(s.launcher, s.launcher_flag, a.launcher_version);
    s.launcher = planner::to_string(*s.format);  // the release's name in the launcher tables
    const sim::Implementation* impl = sim::find_implementation(a.config.impl);
    if (impl != nullptr && !impl->runs_on(s.launcher)) {
      throw InputError("--impl", fmt::format("{} does not run {} (see `cpsim implementations`)",
                                             s.launcher, impl->name()));
    }
  }
  planner::PlanOptions& opts = s.opts;
  opts.methods = searched_methods(a);
  SimulateArgs cfg = a.config;
  cfg.method = models::to_string(opts.methods.front());
  cfg.seq = a.seq.empty() ? "64K" : a.seq;
  s.base = resolve_inputs(config_for_method(cfg, cfg.method));
  // Knobs of a method other than the first searched: the base keeps them for the methods that
  // read them (config_for_method dropped them for the first).
  if (!a.config.ring_layout.empty()) {
    s.base.parallel.ring_layout = models::parse_ring_layout(a.config.ring_layout, "--ring-layout");
  }
  if (!a.config.fpdt_offload.empty()) {
    s.base.parallel.fpdt_offload = parse_switch(a.config.fpdt_offload, "--fpdt-offload");
  }
  if (!a.seq.empty()) {
    opts.seq_len = parse_length(a.seq, "--seq");
  }
  opts.granularity = parse_length(a.granularity, "--granularity");
  if (!a.max_step_time.empty()) {
    opts.max_step_time_s = parse_duration_s(a.max_step_time, "--max-step-time");
  }
  s.cost = parse_cost_rate(a.config.gpu_hour_cost, a.config.train_tokens);
  opts.vary_recipe = !a.fixed_recipe;
  opts.fixed = fixed_by_flags(a);
  if (a.allow_data_parallel && a.seq.empty()) {
    throw InputError("--allow-data-parallel",
                     "only with --seq: the longest context uses every GPU in one CP group");
  }
  opts.allow_data_parallel = a.allow_data_parallel;
  opts.launcher = s.format;  // --emit: search only what that launcher's file runs
  if (s.format) {
    keep_methods_the_launcher_runs(s, opts.methods);
    if (opts.fixed.ep_degree > 1 && !planner::launcher_writes_expert_parallel(*s.format)) {
      throw InputError("--ep", fmt::format("{} files set no expert parallelism (--ep {}); "
                                           "launchers that do: megatron, torchtitan, "
                                           "torchtitan-main",
                                           s.launcher, opts.fixed.ep_degree));
    }
  }
  opts.refusal_text = refusal_text;
  opts.keep_all = a.all;
  opts.threads = a.threads;
  opts.top = a.top;
  return s;
}

// Nothing fits: one line naming the closest configuration (and, where the launcher runs pipeline
// parallelism that the search left out, how to search it).
[[noreturn]] void throw_nothing_fits(const PlanArgs& a,
                                     const PlanSetup& s,
                                     const planner::PlanResult& res) {
  if (const std::string& refusal = res.every_candidate_refused; !refusal.empty()) {
    // "--flag: why": every configuration searched breaks the same rule of the inputs.
    const std::size_t colon = refusal.find(": ");
    const bool named = refusal.starts_with("--") && colon != std::string::npos;
    throw InputError(named ? refusal.substr(0, colon) : std::string(s.launcher_flag),
                     fmt::format("every configuration searched is refused: {}",
                                 named ? refusal.substr(colon + 2) : refusal));
  }
  std::string closest = res.closest_miss.empty() ? "" : "; " + res.closest_miss;
  const planner::PlanOptions& opts = s.opts;
  if (s.format && planner::launcher_writes_pipeline(*s.format) && opts.seq_len &&
      !opts.allow_data_parallel && opts.fixed.pp_degree == 0 && opts.fixed.micro_batches == 0) {
    closest += fmt::format(
        "; pipeline parallelism, which {} runs, was not searched: its step holds at least P "
        "sequences (--allow-data-parallel lets the search grow the batch, --pp and "
        "--micro-batches fix it)",
        s.launcher);
  }
  throw DoesNotFit(a.seq.empty() ? "--methods" : "--seq",
                   a.seq.empty()
                       ? fmt::format("no configuration of {} on {} GPUs fits even the shortest "
                                     "length searched{}",
                                     s.base.model.name, s.base.parallel.gpus, closest)
                       : fmt::format("no configuration fits at this length{}; try `cpsim plan "
                                     "--max-context`",
                                     closest));
}

// The launcher file of --emit: for the best configuration the launcher can run.
struct Emitted {
  std::optional<planner::Candidate> candidate;
  std::string text;
  std::string notes;                               ///< "  note: ...\n" lines
  std::vector<planner::CompanionFile> companions;  ///< written beside --out (or printed)
};

Emitted emit_best(const PlanArgs& a, const PlanSetup& s, const planner::PlanResult& res) {
  Emitted out;
  std::string first_refusal;
  for (planner::Candidate c : res.ranked) {
    // A row the plan did not show has fitted on its allocated peak only: check it as shown rows
    // are checked before writing it.
    if (!c.reserved_checked) {
      planner::check_reserved_memory(s.base, s.opts, c, res.max_context);
      if (!c.fits) {
        continue;
      }
    }
    try {
      const planner::EmittedConfig e =
          planner::emit_launcher_config(*s.format, c.inputs(s.base), {a.out, a.dataset});
      out.candidate = std::move(c);
      out.text = e.text;
      out.companions = e.companions;
      for (const auto& n : e.notes)
        out.notes += "  note: " + n + "\n";
      break;
    } catch (const InputError& e) {
      if (e.field() != "--emit") {
        throw;  // an input the launcher's file needs (--dataset, --model): every row needs it
      }
      if (first_refusal.empty())
        first_refusal = e.what();
    }
  }
  if (!out.candidate) {
    throw InputError("--emit", first_refusal.substr(first_refusal.find(':') + 2));
  }
  if (!a.out.empty()) {
    // The companions first: the main file names them, so it lands only once they exist.
    for (const planner::CompanionFile& f : out.companions) {
      if (a.out != "-") {
        write_output(f.path, f.text, "--out");
      }
    }
    write_output(a.out, out.text, "--out");
  }
  return out;
}

// What became of a configuration of the search, and why.
std::pair<std::string, std::string> status_of(const planner::Candidate& c, bool max_context) {
  if (!c.error.empty()) {
    return {"refused", c.error};
  }
  if (c.pruned) {
    return {"pruned", c.prune_reason};
  }
  if (!c.evaluated) {
    return {"not evaluated", ""};
  }
  if (c.fits) {
    return {"fits", max_context ? c.binding.text : ""};
  }
  return {"does not fit", max_context ? c.binding.text : c.report.binding};
}

// One CSV row per configuration: its degrees and knobs, the step, what became of it.
void print_plan_csv(const planner::PlanResult& res, const std::vector<planner::Candidate>& rows) {
  std::cout << "label,method,cp_degree,ulysses_degree,ring_degree,tp_degree,pp_degree,"
               "micro_batches,data_parallel,fpdt_chunk,ac,ac_offload,tiled_mlp,fused_loss,"
               "zero_stage,seq_len,max_seq_len,tokens_per_step,step_time_s,tokens_per_s_per_gpu,"
               "peak_memory_bytes,reserved_peak_bytes,host_memory_bytes,status,why\n";
  for (const planner::Candidate& c : rows) {
    const models::ParallelConfig& p = c.parallel;
    const models::TrainingRecipe& r = c.recipe;
    const auto [status, why] = status_of(c, res.max_context);
    const bool ran = c.evaluated && c.error.empty();
    const sim::StepReport& rep = c.report;
    std::cout << fmt::format(
        "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},", csv_field(c.label),
        models::to_string(p.method), p.cp_degree, p.ulysses_degree(), p.ring_degree, p.tp_degree,
        p.pp_degree, p.micro_batches, p.data_parallel(),
        sim::cp_scheme(p.method).uses_fpdt_chunk() ? p.fpdt_chunk : 0,
        models::to_string(r.checkpointing), r.checkpoint_offload, r.tiled_mlp, r.fused_loss,
        r.zero_stage, p.seq_len, res.max_context && c.fits ? c.max_seq_len : 0);
    if (ran) {
      std::cout << fmt::format("{},{},{},{},{},{},", rep.tokens_per_step, rep.step_time_s,
                               rep.tokens_per_s_per_gpu, rep.peak_memory_bytes,
                               rep.reserved_checked ? rep.reserved_peak_bytes : 0,
                               rep.host_memory_bytes);
    } else {
      std::cout << ",,,,,,";
    }
    std::cout << fmt::format("{},{}\n", status, csv_field(why));
  }
}

nlohmann::json methods_without_fit_json(const planner::PlanResult& res) {
  nlohmann::json out = nlohmann::json::array();
  for (const planner::PlanResult::MethodWithoutFit& m : res.methods_without_fit) {
    out.push_back({{"method", models::to_string(m.method)}, {"why", m.why}});
  }
  return out;
}

nlohmann::json plan_json(const PlanArgs& a,
                         const PlanSetup& s,
                         const planner::PlanResult& res,
                         const Emitted& emitted) {
  // A candidate's JSON, with what its step costs under --gpu-hour-cost.
  auto priced = [&](const planner::Candidate& c, bool max_context) {
    nlohmann::json row = candidate_json(c, max_context);
    if (s.cost) {
      const bool ran = c.evaluated && c.error.empty() && c.fits;
      row["cost"] =
          cost_json(*s.cost, ran ? step_cost(*s.cost, c.report.step_time_s,
                                             c.report.tokens_per_step, s.base.parallel.gpus)
                                 : StepCost{});
    }
    return row;
  };
  nlohmann::json top = nlohmann::json::array(), pareto = nlohmann::json::array(),
                 per_method = nlohmann::json::array();
  for (std::size_t i = 0; i < res.ranked.size() && static_cast<int>(i) < a.top; ++i) {
    top.push_back(priced(res.ranked[i], res.max_context));
  }
  for (const auto& c : res.pareto)
    pareto.push_back(priced(c, res.max_context));
  for (const auto& c : res.best_per_method)
    per_method.push_back(priced(c, res.max_context));
  const sim::ScheduleInputs& base = s.base;
  nlohmann::json j = {
      {"schema_version", kPlanSchemaVersion},
      {"command", "plan"},
      {"mode", res.max_context ? "max_context" : "seq"},
      {"model", base.model.name},
      {"hardware", base.hardware.name},
      {"gpus", base.parallel.gpus},
      {"memory_margin",
       {{"gpu_bytes", base.margin.gpu_bytes}, {"host_bytes", base.margin.host_bytes}}},
      {"counts",
       {{"generated", res.generated},
        {"refused", res.refused},
        {"pruned", res.pruned},
        {"evaluated", res.evaluated},
        {"simulations", res.simulations}}},
      {"best", priced(res.ranked.front(), res.max_context)},
      {"why_best", res.why_best},
      {"top", top},
      {"pareto", pareto},
      {"best_per_method", per_method},
      {"methods_without_fit", methods_without_fit_json(res)},
  };
  if (s.opts.seq_len)
    j["seq_len"] = *s.opts.seq_len;
  if (s.opts.max_step_time_s > 0)
    j["max_step_time_s"] = s.opts.max_step_time_s;
  if (emitted.candidate) {
    nlohmann::json files = nlohmann::json::array();
    for (const planner::CompanionFile& f : emitted.companions) {
      files.push_back({{"file", f.path},
                       {"what", f.what},
                       {"text", a.out.empty() || a.out == "-" ? f.text : ""}});
    }
    j["emitted"] = {{"format", s.launcher},
                    {"label", emitted.candidate->label},
                    {"file", a.out},
                    {"text", a.out.empty() ? emitted.text : ""},
                    {"companions", files},
                    {"searched_as_run", launcher_changes(*s.format, base, res.ranked.front())}};
  }
  if (a.all) {
    nlohmann::json all = nlohmann::json::array();
    for (const planner::Candidate& c : res.all) {
      nlohmann::json row = priced(c, res.max_context);
      const auto [status, why] = status_of(c, res.max_context);
      row["status"] = status;
      row["why"] = why;
      all.push_back(std::move(row));
    }
    j["all"] = std::move(all);
  }
  return j;
}

// The header, then the tables: best per method, top N, Pareto front.
void print_plan_tables(const PlanArgs& a,
                       const PlanSetup& s,
                       const planner::PlanResult& res,
                       double wall_s) {
  const sim::ScheduleInputs& base = s.base;
  std::cout << fmt::format("plan: {} on {} x {}, {}, base recipe {}\n", base.model.name,
                           base.parallel.gpus, base.hardware.name,
                           res.max_context
                               ? "longest context (then throughput)"
                               : fmt::format("tokens/s/GPU at {}", format_length(*s.opts.seq_len)),
                           base.recipe.name);
  std::cout << fmt::format(
      "  fits = the caching allocator's reserved memory leaves {} free on every GPU and host "
      "memory leaves {} free per node (--memory-margin, --host-memory-margin)\n",
      format_bytes(static_cast<double>(base.margin.gpu_bytes)),
      format_bytes(static_cast<double>(base.margin.host_bytes)));
  std::cout << fmt::format(
      "  {} configurations: {} refused (invalid for the model or GPUs), {} pruned "
      "by the memory lower bound, {} evaluated ({} simulations, {:.2f} s, {:.0f} "
      "simulations/s)\n\n",
      res.generated, res.refused, res.pruned, res.evaluated, res.simulations, wall_s,
      static_cast<double>(res.simulations) / std::max(wall_s, 1e-9));
  const bool mc = res.max_context;
  std::vector<std::string> header;
  if (mc)
    header.push_back("max context");
  header.insert(header.end(), {"tok/s/GPU", "tokens/step", "step", "peak", "configuration"});
  std::vector<bool> numeric(header.size(), true);
  numeric.back() = false;
  auto print = [&](const std::string& title, const std::vector<planner::Candidate>& list,
                   int limit) {
    std::vector<std::vector<std::string>> rows;
    for (std::size_t i = 0; i < list.size() && static_cast<int>(i) < limit; ++i) {
      rows.push_back(row(list[i], mc));
    }
    std::cout << title << "\n" << format_table(header, rows, numeric) << "\n";
  };
  print("best per method:", res.best_per_method, 100);
  std::string notes;
  for (const planner::PlanResult::MethodWithoutFit& m : res.methods_without_fit) {
    notes += fmt::format("  no {} row: {}\n", models::to_string(m.method), m.why);
  }
  if (std::find(s.opts.methods.begin(), s.opts.methods.end(), models::CpMethod::kUsp) !=
      s.opts.methods.end()) {
    notes += "  usp is searched with 1 < ring < C: its two ends are the ulysses and ring rows\n";
  }
  if (!notes.empty()) {
    std::cout << notes << "\n";
  }
  print(fmt::format("top {}:", std::min<int>(a.top, static_cast<int>(res.ranked.size()))),
        res.ranked, a.top);
  print(mc ? "Pareto front (max context vs throughput):"
           : "Pareto front (throughput vs peak memory):",
        res.pareto, 100);
}

// The file of --emit, printed or where it was written.
void print_emitted(const PlanArgs& a,
                   const PlanSetup& s,
                   const planner::Candidate& best,
                   const Emitted& emitted) {
  if (emitted.candidate->label != best.label) {
    std::cout << fmt::format(
        "\n{} cannot run the best configuration; emitted the best it can run: {}\n", s.launcher,
        emitted.candidate->label);
  }
  if (a.out.empty()) {
    std::cout << fmt::format("\n--- {} settings ---\n{}", s.launcher, emitted.text);
    if (!emitted.text.empty() && emitted.text.back() != '\n')
      std::cout << "\n";
    print_companions(emitted.companions);
  } else {
    std::cout << fmt::format("\n{} settings written to {}\n", s.launcher, a.out);
    for (const planner::CompanionFile& f : emitted.companions) {
      if (a.out != "-") {
        std::cout << fmt::format("  with {}: {}\n", f.path, f.what);
      }
    }
  }
  std::cout << emitted.notes;
}

// Settings of the recommended configuration for the first launcher that runs it exactly as
// simulated; none does: how to plan for one.
void print_settings_of(const PlanArgs& a, const PlanSetup& s, const planner::Candidate& best) {
  const sim::CpScheme& method = sim::cp_scheme(best.parallel.method);
  for (const planner::LauncherFormat f : planner::launcher_formats()) {
    if (!method.launchers().runs_on(planner::to_string(f)) || !runs_exactly(f, s.base, best)) {
      continue;
    }
    try {
      const planner::EmittedConfig e =
          planner::emit_launcher_config(f, best.inputs(s.base), {"", a.dataset});
      std::cout << fmt::format("\n--- {} settings for the recommended configuration ---\n{}",
                               planner::to_string(f), e.text);
      if (!e.text.empty() && e.text.back() != '\n')
        std::cout << "\n";
      print_companions(e.companions);
      for (const auto& n : e.notes)
        std::cout << "  note: " << n << "\n";
      return;
    } catch (const InputError&) {
      continue;  // this launcher cannot express the configuration: try the next
    }
  }
  const sim::LauncherSupport launchers = sim::cp_scheme(best.parallel.method).launchers();
  if (launchers.runs.empty()) {
    std::cout << fmt::format("\n{}: {}\n", models::to_string(best.parallel.method),
                             launchers.sentence());
    return;
  }
  std::cout << fmt::format(
      "\nno launcher runs this configuration exactly as simulated: `cpsim plan --launcher X` "
      "(or --emit X --out FILE) searches only what X runs from its file ({})\n",
      launchers_for(best.parallel.method));
}

// When no launcher runs the recommendation exactly as simulated: the best configuration one does.
void print_best_run_exactly(const PlanSetup& s, const planner::PlanResult& res) {
  const auto runs_best = [&](const planner::Candidate& c) {
    std::vector<std::string> names;
    for (const planner::LauncherFormat f : planner::launcher_formats()) {
      if (sim::cp_scheme(c.parallel.method).launchers().runs_on(planner::to_string(f)) &&
          runs_exactly(f, s.base, c)) {
        names.emplace_back(planner::to_string(f));
      }
    }
    return names;
  };
  if (!runs_best(res.ranked.front()).empty()) {
    return;
  }
  for (const planner::Candidate& c : res.ranked) {
    if (const std::vector<std::string> names = runs_best(c); !names.empty()) {
      std::cout << fmt::format(
          "  the best a launcher runs exactly as simulated: {} ({}){}\n", c.label,
          join(names, ", "),
          res.max_context ? fmt::format(", longest context {}", format_length(c.max_seq_len)) : "");
      return;
    }
  }
  std::cout << "  no configuration found runs in a launcher exactly as simulated: `cpsim plan "
               "--launcher X` searches what X runs from its file\n";
}

// The recommendation, why, which launchers run it, and its settings (or the emitted file).
void print_recommendation(const PlanArgs& a,
                          const PlanSetup& s,
                          const planner::PlanResult& res,
                          const Emitted& emitted) {
  const planner::Candidate& best = res.ranked.front();
  std::cout << fmt::format("recommended: {}\n", best.label);
  if (res.max_context) {
    std::cout << fmt::format("  longest context {}; limited by {}\n",
                             format_length(best.max_seq_len), best.binding.text);
  }
  if (s.cost) {
    std::cout << cost_lines(*s.cost,
                            step_cost(*s.cost, best.report.step_time_s, best.report.tokens_per_step,
                                      s.base.parallel.gpus),
                            "  ");
  }
  if (!res.why_best.empty()) {
    std::cout << "  why: " << res.why_best << "\n";
  }
  if (s.format) {
    const std::vector<std::string> changes = launcher_changes(*s.format, s.base, best);
    std::cout << fmt::format("  searched as {} runs its file{}{}\n", s.launcher,
                             changes.empty() ? "" : ": ", join(changes, "; "));
  } else {
    std::cout << fmt::format("  launchers that run it: {}\n", launchers_as_simulated(s.base, best));
    print_best_run_exactly(s, res);
  }
  if (emitted.candidate) {
    print_emitted(a, s, best, emitted);
  } else {
    print_settings_of(a, s, best);
  }
}

// The plan's search, with progress on stderr.
planner::PlanResult search_with_progress(PlanSetup& s, ProgressMode mode, const std::string& what) {
  Progress progress(what, mode);
  s.opts.on_progress = [&progress](std::int64_t done, std::int64_t total) {
    progress.update(fmt::format(
        "{} of {} configurations evaluated ({:.0f} %)", done, total,
        100.0 * static_cast<double>(done) / static_cast<double>(std::max<std::int64_t>(1, total))));
  };
  planner::PlanResult res = planner::plan(s.base, s.opts);
  progress.clear();
  s.opts.on_progress = nullptr;
  return res;
}

// The same plan on each profile of `--hardware a,b,...`, side by side (the best of each). A
// profile nothing fits on is an answer there; nothing fitting on any is the command's.
int run_side_by_side(const PlanArgs& args,
                     const std::vector<std::string>& profiles,
                     ProgressMode progress_mode) {
  if (!args.emit.empty()) {
    throw InputError("--hardware", "--emit writes one launcher file: give one hardware profile");
  }
  if (args.format == "csv") {
    throw InputError("--format",
                     "csv lists one profile's configurations: give one --hardware "
                     "(--json compares several)");
  }
  std::vector<HardwareAnswer> answers;
  std::string nothing_fits;
  for (const std::string& hardware : profiles) {
    PlanArgs a = args;
    a.config.hardware = hardware;
    check_plan_flags(a);
    PlanSetup s = plan_setup(a);
    const planner::PlanResult res = search_with_progress(s, progress_mode, "plan " + hardware);
    try {
      if (res.ranked.empty()) {
        throw_nothing_fits(a, s, res);
      }
      answers.push_back({hardware, plan_json(a, s, res, Emitted{})});
    } catch (const DoesNotFit& e) {
      answers.push_back(
          {hardware,
           {{"error", {{"kind", "does_not_fit"}, {"field", e.field()}, {"message", e.what()}}}}});
      nothing_fits += fmt::format("{}{}: {}", nothing_fits.empty() ? "" : "; ", hardware, e.what());
    }
  }
  if (nothing_fits.size() > 0 && std::all_of(answers.begin(), answers.end(), [](const auto& h) {
        return h.answer.contains("error");
      })) {
    throw DoesNotFit("--hardware", "on no profile: " + nothing_fits);
  }
  std::cout << (args.json ? side_by_side_json("plan", answers).dump(2) + "\n"
                          : side_by_side_table("plan", answers));
  return 0;
}

}  // namespace

int run_plan(const PlanArgs& args) {
  PlanArgs a = args;
  const ProgressMode progress_mode = parse_progress_mode(a.progress);
  if (const std::vector<std::string> profiles = hardware_profiles(a.config.hardware);
      profiles.size() > 1) {
    if (!a.config.lengths.empty()) {
      throw InputError("--hardware", "one hardware profile at a time with --lengths");
    }
    a.json = a.json || a.format == "json";
    return run_side_by_side(a, profiles, progress_mode);
  }
  check_plan_flags(a);
  PlanSetup s = plan_setup(a);
  const auto t0 = std::chrono::steady_clock::now();
  planner::PlanResult res = search_with_progress(s, progress_mode, "plan");
  if (res.ranked.empty()) {
    throw_nothing_fits(a, s, res);
  }
  std::optional<PlanBatches> batches;
  if (!a.config.lengths.empty()) {
    Progress progress("plan", progress_mode);
    batches = rank_plan_by_batches(
        a.config, s.base, a.top, res.ranked, res.why_best, [&progress](int done, int total) {
          progress.update(fmt::format("packed batches: {} of {} configurations", done, total));
        });
  }
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const Emitted emitted = s.format ? emit_best(a, s, res) : Emitted{};
  if (a.json) {
    nlohmann::json j = plan_json(a, s, res, emitted);
    if (batches) {
      j["packed_batches"] = plan_batches_json(*batches);
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  if (a.format == "csv") {
    print_plan_csv(res, a.all ? res.all : res.ranked);
    return 0;
  }
  print_plan_tables(a, s, res, wall_s);
  if (batches) {
    std::cout << "\n" << plan_batches_table(*batches) << "\n";
  }
  print_recommendation(a, s, res, emitted);
  return 0;
}

}  // namespace cpsim::cli
