// `cpsim sweep` and `cpsim report`: every method over a range of sequence lengths, as a table, CSV
// or JSON (sweep), or as one self-contained HTML page with charts (report).
#include <algorithm>
#include <iostream>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cpsim/models/error.hpp"
#include "cpsim/models/units.hpp"
#include "cpsim/planner/evaluate.hpp"
#include "cpsim/planner/maxlen.hpp"

#include "commands.hpp"
#include "common.hpp"
#include "config_flags.hpp"
#include "output.hpp"
#include "progress.hpp"
#include "report_html.hpp"

namespace cpsim::cli {
namespace {

constexpr int kSweepSchemaVersion = 1;
constexpr const char* kDefaultSweep = "128K..8M";

// Powers of two between the bounds of "LO..HI" (both included when they are powers of two).
std::vector<std::int64_t> parse_sweep(const std::string& text) {
  const std::size_t dots = text.find("..");
  const std::string usage =
      fmt::format("expected LO..HI with lengths such as 128K..8M, got '{}'", text);
  if (dots == std::string::npos || dots == 0 || dots + 2 >= text.size()) {
    throw InputError("--sweep", usage);
  }
  const std::string lo_text = text.substr(0, dots);
  const std::string hi_text = text.substr(dots + 2);
  if (lo_text.find('.') != std::string::npos || hi_text.find('.') != std::string::npos) {
    throw InputError("--sweep", usage);
  }
  const std::int64_t lo = parse_length(lo_text, "--sweep");
  const std::int64_t hi = parse_length(hi_text, "--sweep");
  if (lo > hi) {
    throw InputError("--sweep",
                     fmt::format("the lower bound {} is above the upper bound {} in '{}'", lo_text,
                                 hi_text, text));
  }
  std::vector<std::int64_t> out;
  for (std::int64_t p = 1; p <= hi; p *= 2) {
    if (p >= lo) {
      out.push_back(p);
    }
  }
  if (out.empty()) {
    throw InputError("--sweep", fmt::format("no power of two between {} and {}", lo_text, hi_text));
  }
  return out;
}

std::vector<std::int64_t> sweep_lengths(const ReportArgs& a) {
  if (!a.seq.empty() && !a.sweep.empty()) {
    throw InputError("--sweep", "give either --seq (one length) or --sweep (a range), not both");
  }
  if (!a.seq.empty()) {
    return {parse_length(a.seq, "--seq")};
  }
  return parse_sweep(a.sweep.empty() ? kDefaultSweep : a.sweep);
}

// Canonical method names, in the order given, without repeats.
std::vector<std::string> sweep_methods(const ReportArgs& a) {
  std::vector<std::string> out;
  for (const std::string& m : split_methods(a.methods, "--methods")) {
    const std::string name = models::to_string(models::parse_cp_method(m, "--methods"));
    if (std::find(out.begin(), out.end(), name) == out.end()) {
      out.push_back(name);
    }
  }
  return out;
}

// Errors in flags every method shares stop the command; the others are one method's problem.
bool is_shared_field(const std::string& f) {
  static const std::vector<std::string> kShared = {
      "--gpus",       "--gpus-per-node",     "--hardware",      "--recipe",
      "--ac",         "--ac-offload",        "--tiled-mlp",     "--fused-loss",
      "--zero",       "--optimizer-offload", "--comm-dtype",    "--attention-kernel",
      "--cp-degree",  "--ring-layout",       "--param-offload", "--norm-kernel",
      "--mlp-kernel", "--int32-indexing"};
  return std::find(kShared.begin(), kShared.end(), f) != kShared.end() ||
         f.find(".json") != std::string::npos;
}

std::string degrees_text(const sim::ScheduleInputs& in, const sim::HeadLayout* layout) {
  const auto& p = in.parallel;
  std::string s = sim::cp_scheme(p.method).label(sim::LabelStyle::kDegrees, p, layout);
  if (p.data_parallel() > 1) {
    s += fmt::format(", {} data-parallel replicas", p.data_parallel());
  }
  return s;
}

struct Sweep {
  std::vector<std::int64_t> lengths;
  std::vector<MethodSweep> methods;
};

// Runs every (method, length). @throws InputError for shared flags, for a single method that
// cannot run, or when nothing at all can run.
// One method's inputs and degrees at the sweep's first length; a refusal that does not depend on
// the length is the method's error (the command's, with one method or a shared flag).
MethodSweep method_inputs(const ReportArgs& a,
                          const std::string& method,
                          std::int64_t first_length,
                          bool several) {
  MethodSweep ms;
  ms.method = method;
  SimulateArgs cfg = config_for_method(a.config, method);
  cfg.seq = std::to_string(first_length);
  // usp's default split is Ulysses over the whole group with ring 1: the ulysses line itself.
  // Beside ulysses the report draws a mixed split (ring 2) unless the degrees are given.
  const bool mixed_usp =
      several && method == "usp" && a.config.ring_degree == 0 && a.config.ulysses_degree == 0;
  if (mixed_usp) {
    cfg.ring_degree = 2;
  }
  try {
    ms.inputs = resolve_inputs(cfg);
    const sim::LayoutCheck checked = sim::check_head_layout(ms.inputs);
    if (!checked.issue) {
      ms.degrees = degrees_text(ms.inputs, &checked.layout);
    } else if (checked.issue->quantity == sim::Quantity::kSeqLen ||
               checked.issue->quantity == sim::Quantity::kSeqLenMultiple) {
      ms.degrees = degrees_text(ms.inputs, nullptr);  // only this length is wrong
    } else {
      throw flag_error(sim::ConfigError(*checked.issue, ms.inputs.parallel));
    }
  } catch (const InputError& e) {
    if (is_shared_field(e.field()) || !several) {
      throw;
    }
    ms.error = e.what();
  }
  return ms;
}

// One point of the sweep; a refusal is the point's error, and the first one is kept.
SweepPoint sweep_point(const MethodSweep& ms,
                       std::int64_t len,
                       std::optional<InputError>& first_point_error) {
  SweepPoint pt;
  pt.seq_len = len;
  sim::ScheduleInputs in = ms.inputs;
  in.parallel.seq_len = len;
  try {
    planner::EvaluateOptions with_allocator;  // "fits" is decided on the reserved memory
    with_allocator.model_allocator = true;
    pt.report = planner::evaluate(in, with_allocator).report;
  } catch (const sim::ConfigError& e) {
    const InputError flagged = flag_error(e);
    pt.error = flagged.what();
    if (!first_point_error) {
      first_point_error = flagged;
    }
  } catch (const InputError& e) {
    pt.error = e.what();
    if (!first_point_error) {
      first_point_error = e;
    }
  }
  return pt;
}

Sweep run_points(const ReportArgs& a, Progress& progress) {
  if (a.config.hardware.find(',') != std::string::npos) {
    throw InputError("--hardware",
                     "sweep and report take one profile (simulate, maxlen and plan "
                     "compare several side by side)");
  }
  Sweep sw;
  sw.lengths = sweep_lengths(a);
  const std::vector<std::string> methods = sweep_methods(a);
  {
    // Loading errors name the flag and stop every method.
    const models::DataDir data = data_dir();
    (void)models::load_model(a.config.model, data);
    (void)models::load_hardware(a.config.hardware, data);
    (void)models::load_recipe(recipe_for(a.config), data);
  }
  std::optional<InputError> first_point_error;
  bool any = false;
  const std::size_t total = methods.size() * sw.lengths.size();
  std::size_t done = 0;
  for (const std::string& method : methods) {
    MethodSweep ms = method_inputs(a, method, sw.lengths.front(), methods.size() > 1);
    for (std::int64_t len : sw.lengths) {
      ++done;
      if (!ms.error.empty()) {
        SweepPoint pt;
        pt.seq_len = len;
        pt.error = ms.error;
        ms.points.push_back(std::move(pt));
        continue;
      }
      progress.update(fmt::format("{} at {} ({}/{})", method, format_length(len), done, total));
      ms.points.push_back(sweep_point(ms, len, first_point_error));
      any = any || ms.points.back().error.empty();
    }
    sw.methods.push_back(std::move(ms));
  }
  if (!any) {
    const bool all_methods_fail =
        std::all_of(sw.methods.begin(), sw.methods.end(),
                    [](const MethodSweep& m) { return !m.error.empty(); });
    if (all_methods_fail || !first_point_error) {
      throw InputError("--methods",
                       "no method can run this configuration: " + sw.methods.front().error);
    }
    throw *first_point_error;
  }
  return sw;
}

void print_table(const Sweep& sw) {
  const MethodSweep* ref = nullptr;
  for (const auto& m : sw.methods) {
    if (m.error.empty()) {
      ref = &m;
      break;
    }
  }
  if (ref != nullptr) {
    std::cout << fmt::format("{} on {} x {}, recipe {}\n\n", ref->inputs.model.name,
                             ref->inputs.parallel.gpus, ref->inputs.hardware.name,
                             ref->inputs.recipe.name);
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& m : sw.methods) {
    for (const auto& pt : m.points) {
      if (!pt.error.empty()) {
        rows.push_back({m.method, format_length(pt.seq_len), "-", "-", "-", "-", "-", "-",
                        "cannot run: " + pt.error});
        continue;
      }
      const auto& r = pt.report;
      rows.push_back({m.method, format_length(pt.seq_len), format_seconds(r.step_time_s),
                      fmt::format("{:.1f}", r.tokens_per_s_per_gpu),
                      fmt::format("{:.1f}", 100.0 * r.mfu),
                      format_bytes(static_cast<double>(r.peak_memory_bytes)),
                      format_bytes(static_cast<double>(r.host_memory_bytes)),
                      r.fits() ? "yes" : "NO", r.binding});
    }
  }
  std::cout << format_table(
      {"method", "seq", "step", "tok/s/GPU", "MFU %", "peak GPU", "host/node", "fits", "binding"},
      rows, {false, true, true, true, true, true, true, false, false});
}

void print_csv(const Sweep& sw) {
  std::cout << "method,seq_len,step_time_s,tokens_per_s_per_gpu,model_tflops_per_gpu,mfu,"
               "peak_memory_bytes,host_memory_bytes,fits,binding,error\n";
  for (const auto& m : sw.methods) {
    for (const auto& pt : m.points) {
      if (!pt.error.empty()) {
        std::cout << fmt::format("{},{},,,,,,,,,{}\n", m.method, pt.seq_len, csv_field(pt.error));
        continue;
      }
      const auto& r = pt.report;
      std::cout << fmt::format("{},{},{},{},{},{},{},{},{},{},\n", m.method, pt.seq_len,
                               r.step_time_s, r.tokens_per_s_per_gpu, r.model_tflops_per_gpu, r.mfu,
                               r.peak_memory_bytes, r.host_memory_bytes,
                               r.fits() ? "true" : "false", csv_field(r.binding));
    }
  }
}

void print_json(const Sweep& sw) {
  using nlohmann::json;
  json rows = json::array();
  json methods = json::array();
  for (const auto& m : sw.methods) {
    methods.push_back(m.error.empty()
                          ? json{{"method", m.method}, {"degrees", m.degrees}, {"error", nullptr}}
                          : json{{"method", m.method}, {"error", m.error}});
    for (const auto& pt : m.points) {
      if (!pt.error.empty()) {
        rows.push_back({{"method", m.method},
                        {"seq_len", pt.seq_len},
                        {"step_time_s", nullptr},
                        {"tokens_per_s_per_gpu", nullptr},
                        {"model_tflops_per_gpu", nullptr},
                        {"mfu", nullptr},
                        {"peak_memory_bytes", nullptr},
                        {"host_memory_bytes", nullptr},
                        {"fits", nullptr},
                        {"binding_constraint", nullptr},
                        {"error", pt.error}});
        continue;
      }
      const auto& r = pt.report;
      rows.push_back({{"method", m.method},
                      {"seq_len", pt.seq_len},
                      {"step_time_s", r.step_time_s},
                      {"tokens_per_s_per_gpu", r.tokens_per_s_per_gpu},
                      {"model_tflops_per_gpu", r.model_tflops_per_gpu},
                      {"mfu", r.mfu},
                      {"peak_memory_bytes", r.peak_memory_bytes},
                      {"host_memory_bytes", r.host_memory_bytes},
                      {"fits", r.fits()},
                      {"fits_gpu", r.fits_gpu},
                      {"fits_host", r.fits_host},
                      {"binding_constraint", r.binding.empty() ? json(nullptr) : json(r.binding)},
                      {"error", nullptr}});
    }
  }
  json config = json::object();
  for (const auto& m : sw.methods) {
    if (m.error.empty()) {
      config = {{"model", m.inputs.model.name},
                {"hardware", m.inputs.hardware.name},
                {"gpus", m.inputs.parallel.gpus},
                {"gpus_per_node", m.inputs.parallel.gpus_per_node},
                {"recipe", m.inputs.recipe.name}};
      break;
    }
  }
  config["lengths"] = sw.lengths;
  config["methods"] = methods;
  std::cout << json{{"schema_version", kSweepSchemaVersion},
                    {"command", "sweep"},
                    {"config", config},
                    {"rows", rows}}
                   .dump(2)
            << "\n";
}

void add_sweep_options(CLI::App* c, ReportArgs& a) {
  add_config_options(c, a.config, /*with_seq=*/false);
  // A sweep takes a list of methods: --methods, with --method kept as its synonym.
  c->remove_option(c->get_option("--method"));
  c->add_option("--methods,--method", a.methods,
                "methods: ulysses | upipe | ring | allgather | fpdt | usp, a comma-separated "
                "list, or all")
      ->capture_default_str();
  c->add_option("--seq", a.seq, "one sequence length instead of a sweep (131072, 128K, 3M)");
  c->add_option("--sweep", a.sweep,
                "sequence lengths LO..HI: the powers of two between the bounds (default: "
                "128K..8M when --seq is not given)");
}

}  // namespace

CLI::App* register_sweep(CLI::App& app, ReportArgs& a) {
  CLI::App* c = app.add_subcommand(
      "sweep", "Step time, throughput, peak memory and fit of each method over sequence lengths");
  add_sweep_options(c, a);
  c->add_option("--format", a.format, "output: table | csv | json")->capture_default_str();
  c->add_option("--progress", a.progress,
                "progress on stderr: auto (in place on a terminal, a log line every 10 s "
                "otherwise, once past 2 s), always (from the start), never; default: "
                "$CPSIM_PROGRESS, else auto");
  return c;
}

int run_sweep(const ReportArgs& a) {
  if (a.format != "table" && a.format != "csv" && a.format != "json") {
    throw InputError("--format", fmt::format("expected table, csv or json, got '{}'", a.format));
  }
  Progress progress("sweep", parse_progress_mode(a.progress));
  const Sweep sw = run_points(a, progress);
  progress.clear();
  if (a.format == "csv") {
    print_csv(sw);
  } else if (a.format == "json") {
    print_json(sw);
  } else {
    print_table(sw);
  }
  return 0;
}

CLI::App* register_report(CLI::App& app, ReportArgs& a) {
  CLI::App* c = app.add_subcommand(
      "report",
      "Write one self-contained HTML page: memory and timeline of one step, throughput and peak "
      "memory vs length, longest context per method, and the configuration");
  add_sweep_options(c, a);
  c->add_option("--progress", a.progress,
                "progress on stderr: auto (in place on a terminal, a log line every 10 s "
                "otherwise, once past 2 s), always (from the start), never; default: "
                "$CPSIM_PROGRESS, else auto");
  add_plan_batch_options(c, a.config);
  c->add_option("--html", a.html, "the HTML file to write (- = standard output)")
      ->required()
      ->check(output_path_check());
  c->add_option("--detail-method", a.detail_method,
                "method of the memory and timeline charts (default: the first that runs)");
  c->add_option("--detail-seq", a.detail_seq,
                "length of the memory and timeline charts (default: the longest swept length "
                "that fits)");
  return c;
}

namespace {

// --detail-method as the sweep spells it (empty: not given), refused when not swept.
std::string detail_method_of(const ReportArgs& a) {
  if (a.detail_method.empty()) {
    return "";
  }
  const std::string method =
      models::to_string(models::parse_cp_method(a.detail_method, "--detail-method"));
  const std::vector<std::string> methods = sweep_methods(a);
  if (std::find(methods.begin(), methods.end(), method) == methods.end()) {
    throw InputError("--detail-method",
                     fmt::format("'{}' is not among --methods {}", a.detail_method, a.methods));
  }
  return method;
}

// Each method's longest context (methods that ran).
void search_longest_contexts(Sweep& sw,
                             const planner::MaxLenOptions& max_opts,
                             Progress& progress) {
  for (auto& m : sw.methods) {
    if (!m.error.empty()) {
      continue;
    }
    progress.update(fmt::format("longest context of {}", m.method));
    try {
      m.max = planner::max_seq_len(m.inputs, max_opts);
    } catch (const sim::ConfigError& e) {
      m.max_error = refusal_text(e);
    } catch (const InputError& e) {
      m.max_error = e.what();
    }
    m.has_max = true;
  }
}

// The method of the memory and timeline charts: --detail-method, else the first that runs.
const MethodSweep* detail_pick(const Sweep& sw, const std::string& detail_method) {
  for (const auto& m : sw.methods) {
    const bool runs =
        m.error.empty() && std::any_of(m.points.begin(), m.points.end(),
                                       [](const SweepPoint& p) { return p.error.empty(); });
    if (!detail_method.empty() ? m.method == detail_method : runs) {
      if (!m.error.empty()) {
        throw InputError("--detail-method", fmt::format("{} cannot run: {}", m.method, m.error));
      }
      return &m;
    }
  }
  return nullptr;
}

// The length of the charted step: --detail-seq, else the longest that fits, else the shortest
// that runs; 0 when none does.
std::int64_t detail_length(const MethodSweep& pick, const std::optional<std::int64_t>& detail_seq) {
  if (detail_seq) {
    return *detail_seq;
  }
  std::int64_t len = 0;
  for (const auto& p : pick.points) {
    if (p.error.empty() && p.report.fits()) {
      len = p.seq_len;
    }
  }
  if (len == 0) {
    for (const auto& p : pick.points) {
      if (p.error.empty()) {
        return p.seq_len;
      }
    }
  }
  return len;
}

// One step of `pick` at `len`, with its trace and the allocator model; a refusal at a
// --detail-seq the user gave names that flag.
// The detail configuration over packed batches (--lengths).
BatchDetail batch_detail(const ReportArgs& a,
                         const MethodSweep& pick,
                         std::int64_t len,
                         Progress& progress) {
  BatchDetail b;
  b.method = pick.method;
  b.seq_len = len;
  b.options = batch_options(a.config);
  sim::ScheduleInputs in = pick.inputs;
  in.parallel.seq_len = len;
  b.study = planner::study_batches(in, b.options, [&](int done, int total) {
    progress.update(fmt::format("packed batches: {} of {}", done, total));
  });
  return b;
}

StepDetail detail_step(const MethodSweep& pick,
                       std::int64_t len,
                       const std::optional<std::int64_t>& detail_seq) {
  sim::ScheduleInputs in = pick.inputs;
  in.parallel.seq_len = len;
  planner::EvaluateOptions opts;
  opts.keep_trace = true;
  opts.model_allocator = true;
  try {
    return StepDetail{pick.method, len, planner::evaluate(in, opts)};
  } catch (const sim::ConfigError& e) {
    if (!detail_seq) {
      throw;
    }
    throw InputError("--detail-seq", e.what());
  } catch (const InputError& e) {
    if (!detail_seq) {
      throw;
    }
    const std::string what = e.what();
    throw InputError("--detail-seq", what.substr(std::min(what.size(), e.field().size() + 2)));
  }
}

}  // namespace

int run_report(const ReportArgs& a) {
  check_batch_flags_need_lengths(a.config);
  std::optional<std::int64_t> detail_seq;
  if (!a.detail_seq.empty()) {
    detail_seq = parse_length(a.detail_seq, "--detail-seq");
  }
  const std::string detail_method = detail_method_of(a);
  Progress progress("report", parse_progress_mode(a.progress));
  Sweep sw = run_points(a, progress);

  ReportPage page;
  page.version = std::string("cpsim ") + CPSIM_VERSION;
  page.lengths = sw.lengths;
  planner::MaxLenOptions max_opts;
  max_opts.refusal_text = refusal_text;
  page.max_granularity = max_opts.granularity;
  search_longest_contexts(sw, max_opts, progress);
  if (const MethodSweep* pick = detail_pick(sw, detail_method)) {
    if (const std::int64_t len = detail_length(*pick, detail_seq); len > 0) {
      progress.update(fmt::format("one step of {} at {}", pick->method, format_length(len)));
      page.detail = detail_step(*pick, len, detail_seq);
      if (!a.config.lengths.empty()) {
        page.batches = batch_detail(a, *pick, len, progress);
      }
    }
  }

  const MethodSweep* ref = nullptr;
  for (const auto& m : sw.methods) {
    if (m.error.empty()) {
      ref = &m;
      break;
    }
  }
  page.title = fmt::format("cpsim report: {} on {} × {}", ref->inputs.model.name,
                           ref->inputs.parallel.gpus, ref->inputs.hardware.name);
  page.methods = std::move(sw.methods);
  const std::string html = render_report_html(page);
  progress.clear();
  write_output(a.html, html, "--html");
  (a.html == "-" ? std::cerr : std::cout) << fmt::format(
      "report written to {} ({} method{}, {} length{}, {})\n", a.html, page.methods.size(),
      page.methods.size() == 1 ? "" : "s", page.lengths.size(), page.lengths.size() == 1 ? "" : "s",
      format_bytes(static_cast<double>(html.size())));
  return 0;
}

}  // namespace cpsim::cli
