// `cpsim validate`: predictions against published results (data/validation/*.json).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cpsim/models/error.hpp"
#include "cpsim/models/units.hpp"
#include "cpsim/planner/maxlen.hpp"

#include "commands.hpp"
#include "common.hpp"

namespace cpsim::cli {
namespace {

constexpr int kValidateSchemaVersion = 1;

struct Case {
  std::string id;
  std::string title;
  std::string quantity;
  std::string source;
  std::string skip;
  std::string tolerance_why;
  std::string granularity = "64K";
  double published = 0.0;
  double tolerance = 0.0;
  int row = 0;
  SimulateArgs setup;
};

struct Outcome {
  Case c;
  bool skipped = false;
  bool passed = false;
  double predicted = 0.0;
  double error = 0.0;  // relative
  std::string note;
};

std::string as_text(const nlohmann::json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// Setup keys are the flags of `cpsim simulate` without their dashes.
SimulateArgs parse_setup(const nlohmann::json& s, const std::string& origin) {
  if (!s.is_object()) {
    throw InputError(origin + ":setup", "must be an object of simulate flags");
  }
  SimulateArgs a;
  a.method = "ulysses";
  for (const auto& [key, value] : s.items()) {
    const std::string field = origin + ":setup." + key;
    const std::string text = as_text(value);
    auto integer = [&]() {
      if (!value.is_number_integer())
        throw InputError(field, "must be an integer");
      return value.get<int>();
    };
    if (key == "model")
      a.model = text;
    else if (key == "gpus")
      a.gpus = integer();
    else if (key == "gpus-per-node")
      a.gpus_per_node = integer();
    else if (key == "hardware")
      a.hardware = text;
    else if (key == "method")
      a.method = text;
    else if (key == "seq")
      a.seq = text;
    else if (key == "recipe")
      a.recipe = text;
    else if (key == "heads-per-stage")
      a.heads_per_stage = integer();
    else if (key == "cp-degree")
      a.cp_degree = integer();
    else if (key == "ulysses-degree")
      a.ulysses_degree = integer();
    else if (key == "ring-degree")
      a.ring_degree = integer();
    else if (key == "ring-layout")
      a.ring_layout = text;
    else if (key == "fpdt-chunk")
      a.fpdt_chunk = text;
    else if (key == "fpdt-offload")
      a.fpdt_offload = text;
    else if (key == "ac")
      a.ac = text;
    else if (key == "ac-offload")
      a.ac_offload = text;
    else if (key == "tiled-mlp")
      a.tiled_mlp = text;
    else if (key == "fused-loss")
      a.fused_loss = text;
    else if (key == "attention-kernel")
      a.attention_kernel = text;
    else if (key == "zero")
      a.zero = integer();
    else if (key == "optimizer-offload")
      a.optimizer_offload = text;
    else if (key == "comm-dtype")
      a.comm_dtype = text;
    else
      throw InputError(field, "unknown setup key (use the flags of `cpsim simulate`)");
  }
  return a;
}

Case parse_case(const std::filesystem::path& path) {
  const std::string origin = path.filename().string();
  std::ifstream in(path);
  if (!in) {
    throw InputError(origin, "cannot read the file");
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(buffer.str());
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(origin, fmt::format("malformed JSON at byte {}", e.byte));
  }
  auto need = [&](const char* key) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(key)) {
      throw InputError(origin + ":" + key, "missing");
    }
    return j.at(key);
  };
  if (need("schema") != "cpsim.validation/1") {
    throw InputError(origin + ":schema", "expected \"cpsim.validation/1\"");
  }
  Case c;
  try {
    c.id = need("id").get<std::string>();
    c.title = need("title").get<std::string>();
    c.quantity = need("quantity").get<std::string>();
    c.source = need("source").get<std::string>();
    c.published = need("published").get<double>();
    c.tolerance = need("tolerance").at("relative").get<double>();
    c.tolerance_why = need("tolerance").at("why").get<std::string>();
    if (j.contains("row") && !j.at("row").is_null())
      c.row = j.at("row").get<int>();
    if (j.contains("skip"))
      c.skip = j.at("skip").get<std::string>();
    if (j.contains("granularity"))
      c.granularity = j.at("granularity").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    throw InputError(origin, fmt::format("wrong type: {}", e.what()));
  }
  if (!(c.published > 0.0) || !(c.tolerance > 0.0) || c.tolerance > 1.0) {
    throw InputError(origin + ":published", "published value and tolerance must be positive");
  }
  const std::vector<std::string> quantities = {
      "max_seq_len", "peak_memory_bytes", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu"};
  if (std::find(quantities.begin(), quantities.end(), c.quantity) == quantities.end()) {
    throw InputError(origin + ":quantity", fmt::format("unknown quantity '{}'", c.quantity));
  }
  c.setup = parse_setup(need("setup"), origin);
  return c;
}

Outcome run_case(const Case& c) {
  Outcome o;
  o.c = c;
  if (!c.skip.empty()) {
    o.skipped = true;
    return o;
  }
  SimulateArgs a = c.setup;
  if (c.quantity == "max_seq_len") {
    a.seq = a.seq.empty() ? "64K" : a.seq;
    const sim::ScheduleInputs in = resolve_inputs(a);
    planner::MaxLenOptions opts;
    opts.granularity = parse_length(c.granularity, c.id + ":granularity");
    const planner::MaxLenResult r = planner::max_seq_len(in, opts);
    o.predicted = static_cast<double>(r.max_seq_len);
    o.note = r.binding.text;
  } else {
    const sim::ScheduleInputs in = resolve_inputs(a);
    const sim::StepReport r = planner::evaluate(in).report;
    if (c.quantity == "peak_memory_bytes")
      o.predicted = static_cast<double>(r.peak_memory_bytes);
    if (c.quantity == "tokens_per_s_per_gpu")
      o.predicted = r.tokens_per_s_per_gpu;
    if (c.quantity == "model_tflops_per_gpu")
      o.predicted = r.model_tflops_per_gpu;
    if (c.quantity == "mfu")
      o.predicted = r.mfu;
    o.note = fmt::format("peak at {}", r.peak_op);
  }
  o.error = o.predicted / c.published - 1.0;
  o.passed = std::abs(o.error) <= c.tolerance;
  return o;
}

std::string show(const std::string& quantity, double v) {
  if (quantity == "max_seq_len")
    return format_length(static_cast<std::int64_t>(v));
  if (quantity == "peak_memory_bytes")
    return fmt::format("{:.1f} GB", v / 1e9);
  if (quantity == "mfu")
    return fmt::format("{:.1f} %", 100 * v);
  return fmt::format("{:.1f}", v);
}

}  // namespace

CLI::App* register_validate(CLI::App& app, ValidateArgs& a) {
  CLI::App* c = app.add_subcommand(
      "validate", "Compare predictions with published results (data/validation); exit 1 on a miss");
  c->add_option("--case", a.only, "run only the case with this id");
  c->add_flag("--json", a.json, "print JSON instead of the table");
  return c;
}

int run_validate(const ValidateArgs& a) {
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
    const Case c = parse_case(files[i]);
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
  int passed = 0, failed = 0, skipped = 0;
  for (const Outcome& o : outcomes) {
    (o.skipped ? skipped : o.passed ? passed : failed) += 1;
  }
  if (a.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const Outcome& o : outcomes) {
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
      } else {
        j["status"] = o.passed ? "pass" : "fail";
        j["predicted"] = o.predicted;
        j["relative_error"] = o.error;
        j["tolerance"] = o.c.tolerance;
        j["note"] = o.note;
      }
      list.push_back(j);
    }
    std::cout << nlohmann::json{{"schema_version", kValidateSchemaVersion},
                                {"command", "validate"},
                                {"passed", passed},
                                {"failed", failed},
                                {"skipped", skipped},
                                {"cases", list}}
                     .dump(2)
              << "\n";
  } else {
    std::vector<std::vector<std::string>> rows;
    for (const Outcome& o : outcomes) {
      if (o.skipped) {
        rows.push_back({o.c.id, show(o.c.quantity, o.c.published), "-", "-", "-", "skipped"});
      } else {
        rows.push_back({o.c.id, show(o.c.quantity, o.c.published), show(o.c.quantity, o.predicted),
                        fmt::format("{:+.1f} %", 100 * o.error),
                        fmt::format("±{:.0f} %", 100 * o.c.tolerance), o.passed ? "pass" : "FAIL"});
      }
    }
    std::cout << format_table({"case", "published", "predicted", "error", "tolerance", "result"},
                              rows, {false, true, true, true, true, false});
    std::cout << "\nskipped:\n";
    for (const Outcome& o : outcomes) {
      if (o.skipped)
        std::cout << fmt::format("  {}: {}\n", o.c.id, o.c.skip);
    }
    std::cout << fmt::format("\nvalidate: {} passed, {} failed, {} skipped\n", passed, failed,
                             skipped);
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace cpsim::cli
