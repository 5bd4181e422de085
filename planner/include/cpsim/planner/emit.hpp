#pragma once
/// @file Launcher settings for a planned configuration: paste-ready files and flags for TorchTitan,
/// the UPipe reference code, DeepSpeed / Megatron-DeepSpeed, HF Accelerate, Megatron-LM and
/// ArcticTraining (key names from the sources in docs/REFERENCES.md, "Launchers").

#include <string>
#include <vector>

#include "cpsim/sim/schedule.hpp"

namespace cpsim::planner {

enum class LauncherFormat {
  kTorchTitan,     ///< TorchTitan v0.2.x TOML job config
  kUntiedUlysses,  ///< command-line arguments of the UPipe reference code (TorchTitan fork)
  kDeepSpeed,      ///< ds_config JSON, plus Megatron-DeepSpeed flags for FPDT
  kAccelerate,     ///< accelerate config YAML with ParallelismConfig keys
  kMegatron,       ///< Megatron-LM command-line arguments
  kArctic,         ///< ArcticTraining recipe YAML
};
const char* to_string(LauncherFormat f);
/// Names: torchtitan, untied-ulysses, deepspeed, accelerate, megatron, arctic.
/// @throws InputError(field) listing the known names.
LauncherFormat parse_launcher_format(const std::string& text, const std::string& field);

struct EmittedConfig {
  std::string text;                ///< file contents (TOML, JSON, YAML) or a shell argument list
  std::string suggested_filename;  ///< e.g. "cpsim_torchtitan.toml"
  std::vector<std::string> notes;  ///< what the launcher cannot express, and simplifications
};

/// Renders the configuration for one launcher.
/// @throws InputError("--emit") when that launcher cannot run the method (or a knob of the
///         configuration), naming a launcher that can.
EmittedConfig emit_launcher_config(LauncherFormat format, const sim::ScheduleInputs& config);

}  // namespace cpsim::planner
