// `cpsim validate`: predictions against published results (data/validation/*.json).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cpsim/models/error.hpp"
#include "cpsim/models/units.hpp"
#include "cpsim/planner/maxlen.hpp"
#include "cpsim/planner/validation_case.hpp"

#include "commands.hpp"
#include "common.hpp"
#include "config_flags.hpp"

namespace cpsim::cli {
namespace {

constexpr int kValidateSchemaVersion = 1;

using Case = planner::ValidationCase;

struct Outcome {
  Case c;
  bool skipped = false;
  bool passed = false;
  double predicted = 0.0;
  double error = 0.0;  // relative
  /// The band applied: the case's, or for a longest context one search step of the published
  /// length where that is wider (a search answers in whole steps).
  double tolerance = 0.0;
  std::string note;
};

// The case's set-up as the flags of `cpsim simulate`; keys it does not give keep their defaults.
SimulateArgs simulate_args(const planner::ValidationSetup& s) {
  SimulateArgs a;
  auto set = [](auto& to, const auto& from) {
    if (from)
      to = *from;
  };
  a.method = s.method;
  set(a.model, s.model);
  set(a.gpus, s.gpus);
  set(a.gpus_per_node, s.gpus_per_node);
  set(a.hardware, s.hardware);
  set(a.seq, s.seq);
  set(a.recipe, s.recipe);
  set(a.heads_per_stage, s.heads_per_stage);
  set(a.cp_degree, s.cp_degree);
  set(a.ulysses_degree, s.ulysses_degree);
  set(a.ring_degree, s.ring_degree);
  set(a.ring_layout, s.ring_layout);
  set(a.fpdt_chunk, s.fpdt_chunk);
  set(a.fpdt_offload, s.fpdt_offload);
  set(a.ac, s.ac);
  set(a.ac_offload, s.ac_offload);
  set(a.tiled_mlp, s.tiled_mlp);
  set(a.fused_loss, s.fused_loss);
  set(a.attention_kernel, s.attention_kernel);
  set(a.zero, s.zero);
  set(a.optimizer_offload, s.optimizer_offload);
  set(a.comm_dtype, s.comm_dtype);
  set(a.param_offload, s.param_offload);
  set(a.norm_kernel, s.norm_kernel);
  set(a.rope_kernel, s.rope_kernel);
  set(a.mlp_kernel, s.mlp_kernel);
  set(a.int32_indexing, s.int32_indexing);
  set(a.fp8, s.fp8);
  set(a.tp, s.tp);
  set(a.micro_batches, s.micro_batches);
  set(a.pp, s.pp);
  set(a.pp_schedule, s.pp_schedule);
  set(a.virtual_stages, s.virtual_stages);
  set(a.pp_first_stage_layers, s.pp_first_stage_layers);
  set(a.pp_last_stage_layers, s.pp_last_stage_layers);
  a.impl = s.impl;
  a.method_given = true;
  return a;
}

/// The peak's activations, attention intermediates and other step tensors: the quantity
/// activation_peak_bytes (planner/src/validation_case.cpp).
std::int64_t step_tensor_bytes_at_peak(const sim::StepReport& r) {
  std::int64_t bytes = 0;
  for (const sim::MemCategory c :
       {sim::MemCategory::kActivations, sim::MemCategory::kAttention, sim::MemCategory::kOther}) {
    bytes += r.breakdown_at_peak[static_cast<std::size_t>(c)];
  }
  return bytes;
}

Outcome run_case(const Case& c) {
  Outcome o;
  o.c = c;
  o.tolerance = c.tolerance;
  if (!c.skip.empty()) {
    o.skipped = true;
    return o;
  }
  SimulateArgs a = simulate_args(c.setup);
  if (c.quantity == "max_seq_len") {
    a.seq = a.seq.empty() ? "64K" : a.seq;
    const sim::ScheduleInputs in = resolve_inputs(a);
    planner::MaxLenOptions opts;
    opts.granularity = parse_length(c.granularity, c.id + ":granularity");
    opts.refusal_text = refusal_text;
    const planner::MaxLenResult r = planner::max_seq_len(in, opts);
    o.predicted = static_cast<double>(r.max_seq_len);
    // No length fitting is no answer, whatever the step.
    o.tolerance = r.max_seq_len > 0
                      ? std::max(c.tolerance, static_cast<double>(r.step) / c.published)
                      : c.tolerance;
    o.note = r.binding.text;
  } else {
    const sim::ScheduleInputs in = resolve_inputs(a);
    planner::EvaluateOptions opts;
    opts.model_allocator = c.quantity == "reserved_memory_bytes";
    const sim::StepReport r = planner::evaluate(in, opts).report;
    if (c.quantity == "peak_memory_bytes")
      o.predicted = static_cast<double>(r.peak_memory_bytes);
    if (c.quantity == "reserved_memory_bytes")
      o.predicted = static_cast<double>(r.reserved_peak_bytes);
    if (c.quantity == "activation_peak_bytes")
      o.predicted = static_cast<double>(step_tensor_bytes_at_peak(r));
    if (c.quantity == "tokens_per_s_per_gpu")
      o.predicted = r.tokens_per_s_per_gpu;
    if (c.quantity == "model_tflops_per_gpu")
      o.predicted = r.model_tflops_per_gpu;
    if (c.quantity == "mfu")
      o.predicted = r.mfu;
    o.note = fmt::format("peak at {}", r.peak_op);
  }
  // (p − q)/q rather than p/q − 1: a prediction exactly at the band's edge stays inside it.
  o.error = (o.predicted - c.published) / c.published;
  o.passed = c.bound == "lower" ? o.error >= -o.tolerance : std::abs(o.error) <= o.tolerance;
  return o;
}

std::string show(const std::string& quantity, double v) {
  if (quantity == "max_seq_len")
    return format_length(static_cast<std::int64_t>(v));
  if (quantity == "peak_memory_bytes")
    return fmt::format("{:.1f} GB", v / 1e9);
  if (quantity == "reserved_memory_bytes" || quantity == "activation_peak_bytes")  // GiB
    return fmt::format("{:.1f} GiB", v / static_cast<double>(std::int64_t{1} << 30));
  if (quantity == "mfu")
    return fmt::format("{:.1f} %", 100 * v);
  return fmt::format("{:.1f}", v);
}

// The shared gaps the failing cases cite, each once, by key.
std::map<std::string, std::string> failing_shared_gaps(const std::vector<Outcome>& outcomes) {
  std::map<std::string, std::string> shared;
  for (const Outcome& o : outcomes) {
    if (!o.skipped && !o.passed) {
      for (const auto& g : o.c.shared_gaps)
        shared.emplace(g.key, g.text);
    }
  }
  return shared;
}

}  // namespace

CLI::App* register_validate(CLI::App& app, ValidateArgs& a) {
  CLI::App* c = app.add_subcommand(
      "validate", "Compare predictions with published results (data/validation); exit 1 on a miss");
  c->add_option("--case", a.only, "run only the case with this id");
  c->add_flag("--json", a.json, "print JSON instead of the table");
  return c;
}

namespace {

struct Tally {
  int passed = 0, failed = 0, skipped = 0;
};

Tally tally(const std::vector<Outcome>& outcomes) {
  Tally t;
  for (const Outcome& o : outcomes) {
    (o.skipped ? t.skipped : o.passed ? t.passed : t.failed) += 1;
  }
  return t;
}

// Runs the cases of data/validation (one, with --case), in file-name order.
std::vector<Outcome> run_cases(const ValidateArgs& a) {
  const std::filesystem::path dir = data_dir().root / "validation";
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".json")
      files.push_back(e.path());
  }
  if (ec || files.empty()) {
    throw InputError("validation", fmt::format("no cases found in {}", dir.string()));
  }
  std::sort(files.begin(), files.end());
  std::vector<Outcome> outcomes;
  const bool tty = isatty(STDERR_FILENO) != 0;
  for (std::size_t i = 0; i < files.size(); ++i) {
    const Case c = planner::load_validation_case(files[i]);
    if (!a.only.empty() && c.id != a.only)
      continue;
    if (tty)
      std::cerr << fmt::format("\rvalidate: {}/{} {:<50}", i + 1, files.size(), c.id) << std::flush;
    outcomes.push_back(run_case(c));
  }
  if (tty)
    std::cerr << "\r" << std::string(70, ' ') << "\r" << std::flush;
  if (outcomes.empty()) {
    throw InputError("--case", fmt::format("no case with id '{}'", a.only));
  }
  return outcomes;
}

nlohmann::json outcome_json(const Outcome& o) {
  nlohmann::json j = {{"id", o.c.id},
                      {"title", o.c.title},
                      {"quantity", o.c.quantity},
                      {"published", o.c.published},
                      {"source", o.c.source}};
  if (o.c.row > 0)
    j["row"] = o.c.row;
  if (o.skipped) {
    j["status"] = "skipped";
    j["reason"] = o.c.skip;
    return j;
  }
  j["status"] = o.passed ? "pass" : "fail";
  j["predicted"] = o.predicted;
  j["relative_error"] = o.error;
  j["tolerance"] = o.tolerance;
  j["bound"] = o.c.bound;
  j["note"] = o.note;
  if (!o.passed) {
    j["open_gap"] = o.c.open_gap;
    nlohmann::json keys = nlohmann::json::array();
    for (const auto& g : o.c.shared_gaps)
      keys.push_back(g.key);
    j["shared_gaps"] = keys;
  }
  return j;
}

void print_validate_json(const std::vector<Outcome>& outcomes, const Tally& t) {
  nlohmann::json list = nlohmann::json::array();
  for (const Outcome& o : outcomes) {
    list.push_back(outcome_json(o));
  }
  nlohmann::json shared = nlohmann::json::object();
  for (const auto& [key, text] : failing_shared_gaps(outcomes))
    shared[key] = text;
  std::cout << nlohmann::json{{"schema_version", kValidateSchemaVersion},
                              {"command", "validate"},
                              {"passed", t.passed},
                              {"failed", t.failed},
                              {"skipped", t.skipped},
                              {"cases", list},
                              {"shared_gaps", shared}}
                   .dump(2)
            << "\n";
}

void print_validate_table(const std::vector<Outcome>& outcomes) {
  std::vector<std::vector<std::string>> rows;
  for (const Outcome& o : outcomes) {
    if (o.skipped) {
      rows.push_back({o.c.id, show(o.c.quantity, o.c.published), "-", "-", "-", "skipped"});
    } else {
      rows.push_back({o.c.id, show(o.c.quantity, o.c.published), show(o.c.quantity, o.predicted),
                      fmt::format("{:+.1f} %", 100 * o.error),
                      o.c.bound == "lower" ? fmt::format("≥ −{:.0f} %", 100 * o.tolerance)
                                           : fmt::format("±{:.0f} %", 100 * o.tolerance),
                      o.passed ? "pass" : "FAIL"});
    }
  }
  std::cout << format_table({"case", "published", "predicted", "error", "tolerance", "result"},
                            rows, {false, true, true, true, true, false});
}

// Why each failing case misses, the findings they share, why each skipped case is skipped.
void print_reasons(const std::vector<Outcome>& outcomes) {
  std::cout << "\nfailing:\n";
  for (const Outcome& o : outcomes) {
    if (!o.skipped && !o.passed) {
      std::string cited;
      for (const auto& g : o.c.shared_gaps)
        cited += (cited.empty() ? " (see also: " : ", ") + g.key;
      std::cout << fmt::format("  {}: {}{}\n", o.c.id,
                               o.c.open_gap.empty() ? "no known cause" : o.c.open_gap,
                               cited.empty() ? "" : cited + ")");
    }
  }
  const auto shared = failing_shared_gaps(outcomes);
  if (!shared.empty()) {
    std::cout << "\nfindings the failing cases share:\n";
    for (const auto& [key, text] : shared)
      std::cout << fmt::format("  {}: {}\n", key, text);
  }
  std::cout << "\nskipped:\n";
  for (const Outcome& o : outcomes) {
    if (o.skipped)
      std::cout << fmt::format("  {}: {}\n", o.c.id, o.c.skip);
  }
}

}  // namespace

int run_validate(const ValidateArgs& a) {
  const std::vector<Outcome> outcomes = run_cases(a);
  const Tally t = tally(outcomes);
  if (a.json) {
    print_validate_json(outcomes, t);
  } else {
    print_validate_table(outcomes);
    print_reasons(outcomes);
    std::cout << fmt::format("\nvalidate: {} passed, {} failed, {} skipped\n", t.passed, t.failed,
                             t.skipped);
  }
  return t.failed == 0 ? 0 : 1;
}

}  // namespace cpsim::cli
