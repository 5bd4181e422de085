#pragma once
// `--hardware a,b,...` in simulate, maxlen and plan: the same question on several hardware
// profiles, answered side by side. Each profile's answer is the command's JSON for that profile
// alone; the text is one table built from those answers (one --hardware shows an answer in full).

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cpsim::cli {

/// The profiles --hardware names: one, or a comma-separated list without repeats.
/// @throws InputError("--hardware") for an empty name or a repeat.
std::vector<std::string> hardware_profiles(const std::string& text);

struct HardwareAnswer {
  std::string hardware;
  /// The command's JSON answer for this profile alone, or {"error": {kind, field, message}}.
  nlohmann::json answer;
};

/// JSON: {"schema_version": 1, "command": C, "hardware_compared": [{"hardware": H, "answer": A}]}.
nlohmann::json side_by_side_json(const std::string& command,
                                 const std::vector<HardwareAnswer>& answers);

/// One table, a row per profile (and method), from the answers' JSON: `command` is simulate,
/// maxlen or plan.
std::string side_by_side_table(const std::string& command,
                               const std::vector<HardwareAnswer>& answers);

}  // namespace cpsim::cli
