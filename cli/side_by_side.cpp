#include "side_by_side.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/units.hpp"

#include "commands.hpp"
#include "common.hpp"

namespace cpsim::cli {

namespace {

using nlohmann::json;

std::string bytes_cell(const json& j, const char* key) {
  return j.contains(key) ? format_bytes(j.at(key).get<double>()) : "-";
}

std::string seconds_cell(const json& j, const char* key) {
  const double s = j.value(key, 0.0);
  return s > 0 ? format_seconds(s) : "-";
}

std::string rate_cell(const json& j) {
  return fmt::format("{:.1f}", j.value("tokens_per_s_per_gpu", 0.0));
}

// The cost of a billion tokens, where the answer priced its step.
std::string cost_cell(const json& j) {
  if (!j.contains("cost") || j.at("cost").value("per_billion_tokens", 0.0) <= 0) {
    return "-";
  }
  return fmt::format("{:.2f}", j.at("cost").at("per_billion_tokens").get<double>());
}

// Whether an answer (or a method or the best configuration in it) carries a cost.
bool has_cost(const json& j) {
  if (j.contains("cost")) {
    return true;
  }
  for (const char* list : {"comparison", "methods"}) {
    if (j.contains(list) && std::any_of(j.at(list).begin(), j.at(list).end(), has_cost)) {
      return true;
    }
  }
  return j.contains("best") && has_cost(j.at("best"));
}

bool priced(const std::vector<HardwareAnswer>& answers) {
  return std::any_of(answers.begin(), answers.end(),
                     [](const HardwareAnswer& a) { return has_cost(a.answer); });
}

// The answers of one profile as rows: one per method (a comparison lists several).
std::vector<json> per_method(const json& answer, const char* list_key) {
  if (answer.contains(list_key)) {
    return answer.at(list_key).get<std::vector<json>>();
  }
  return {answer};
}

std::string error_text(const json& j) {
  const json& e = j.at("error");
  return e.is_object() ? e.value("message", "") : e.get<std::string>();
}

// The table, its last column (the cost) dropped when no answer was priced.
std::string table_without_cost_unless(bool with_cost,
                                      std::vector<std::string> header,
                                      std::vector<std::vector<std::string>> rows,
                                      std::vector<bool> numeric) {
  if (!with_cost) {
    header.pop_back();
    numeric.pop_back();
    for (auto& r : rows) {
      r.pop_back();
    }
  }
  return format_table(header, rows, numeric);
}

std::string simulate_table(const std::vector<HardwareAnswer>& answers, bool with_cost) {
  std::vector<std::vector<std::string>> rows;
  for (const HardwareAnswer& a : answers) {
    for (const json& r : per_method(a.answer, "comparison")) {
      const std::string method = r.contains("config") ? r.at("config").value("method", "") : "";
      if (r.contains("error")) {
        rows.push_back({a.hardware, method, "-", "-", "-", "-", "-", "cannot run", ""});
        continue;
      }
      rows.push_back({a.hardware, method, seconds_cell(r, "step_time_s"), rate_cell(r),
                      fmt::format("{:.1f}", 100.0 * r.value("mfu", 0.0)),
                      bytes_cell(r, "peak_memory_bytes"), bytes_cell(r, "reserved_memory_bytes"),
                      r.value("fits", false) ? "yes" : "NO", cost_cell(r)});
    }
  }
  std::vector<std::string> header = {"hardware", "method",   "step", "tok/s/GPU",  "MFU %",
                                     "peak GPU", "reserved", "fits", "cost/1B tok"};
  std::vector<bool> numeric = {false, false, true, true, true, true, true, false, true};
  return table_without_cost_unless(with_cost, std::move(header), std::move(rows), numeric);
}

std::string maxlen_table(const std::vector<HardwareAnswer>& answers, bool with_cost) {
  std::vector<std::vector<std::string>> rows;
  for (const HardwareAnswer& a : answers) {
    for (const json& r : per_method(a.answer, "methods")) {
      const std::string method = r.value("method", "");
      if (r.contains("error")) {
        rows.push_back(
            {a.hardware, method, "-", "-", "-", "-", "cannot run: " + error_text(r), ""});
        continue;
      }
      const auto len = r.value("max_seq_len", std::int64_t{0});
      rows.push_back({a.hardware, method, len > 0 ? format_length(len) : "none",
                      seconds_cell(r, "step_time_s"), rate_cell(r),
                      bytes_cell(r, "reserved_memory_bytes"),
                      r.at("binding_constraint").value("kind", ""), cost_cell(r)});
    }
  }
  std::vector<std::string> header = {"hardware",  "method",   "max context", "step",
                                     "tok/s/GPU", "reserved", "bound by",    "cost/1B tok"};
  std::vector<bool> numeric = {false, false, true, true, true, true, false, true};
  return table_without_cost_unless(with_cost, std::move(header), std::move(rows), numeric);
}

std::string plan_table(const std::vector<HardwareAnswer>& answers, bool with_cost) {
  std::vector<std::vector<std::string>> rows;
  for (const HardwareAnswer& a : answers) {
    if (a.answer.contains("error")) {
      rows.push_back({a.hardware, "nothing fits: " + error_text(a.answer), "-", "-", "-", "-", ""});
      continue;
    }
    const json& b = a.answer.at("best");
    const bool max_context = a.answer.value("mode", "") == "max_context";
    rows.push_back(
        {a.hardware, b.value("label", ""),
         format_length(b.value(max_context ? "max_seq_len" : "seq_len", std::int64_t{0})),
         seconds_cell(b, "step_time_s"), rate_cell(b), bytes_cell(b, "peak_memory_bytes"),
         cost_cell(b)});
  }
  std::vector<std::string> header = {"hardware",  "best configuration", "context",    "step",
                                     "tok/s/GPU", "peak GPU",           "cost/1B tok"};
  std::vector<bool> numeric = {false, false, true, true, true, true, true};
  return table_without_cost_unless(with_cost, std::move(header), std::move(rows), numeric);
}

}  // namespace

std::vector<std::string> hardware_profiles(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = text.find(',', start);
    std::string name =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (name.empty()) {
      throw InputError("--hardware", "empty name in the list");
    }
    if (std::find(out.begin(), out.end(), name) != out.end()) {
      throw InputError("--hardware", fmt::format("{} is listed twice", name));
    }
    out.push_back(std::move(name));
    if (comma == std::string::npos) {
      return out;
    }
    start = comma + 1;
  }
}

nlohmann::json side_by_side_json(const std::string& command,
                                 const std::vector<HardwareAnswer>& answers) {
  json list = json::array();
  for (const HardwareAnswer& a : answers) {
    list.push_back({{"hardware", a.hardware}, {"answer", a.answer}});
  }
  return {{"schema_version", 1}, {"command", command}, {"hardware_compared", list}};
}

std::string side_by_side_table(const std::string& command,
                               const std::vector<HardwareAnswer>& answers) {
  const bool with_cost = priced(answers);
  std::string table = command == "simulate" ? simulate_table(answers, with_cost)
                      : command == "maxlen" ? maxlen_table(answers, with_cost)
                                            : plan_table(answers, with_cost);
  return table + "\n(one --hardware at a time gives each answer in full; --json gives them all)\n";
}

}  // namespace cpsim::cli
