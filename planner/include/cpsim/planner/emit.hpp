#pragma once
/// @file Launcher settings for a planned configuration: paste-ready files and flags for TorchTitan,
/// TorchTitan main's Python config functions, the UPipe reference code, DeepSpeed /
/// Megatron-DeepSpeed, HF Accelerate, Megatron-LM, ArcticTraining and NeMo (key names from the
/// sources in docs/REFERENCES.md, "Launchers").

#include <span>
#include <string>
#include <vector>

#include "cpsim/sim/schedule.hpp"

namespace cpsim::planner {

enum class LauncherFormat {
  kTorchTitan,      ///< TorchTitan 0.3.0, the current release: a Python module, one config function
  kTorchTitan022,   ///< TorchTitan v0.2.2: TOML job config (its training ignores the rotate method)
  kTorchTitan021,   ///< TorchTitan v0.2.1: TOML job config (the rotate method drives training)
  kTorchTitanMain,  ///< TorchTitan main @ b5bcd76 (unreleased): a Python config function
  kUntiedUlysses,   ///< command-line arguments of the UPipe reference code (TorchTitan fork)
  kDeepSpeed,       ///< ds_config JSON, plus Megatron-DeepSpeed flags for FPDT
  kAccelerate,      ///< accelerate config YAML with ParallelismConfig keys
  kMegatron,        ///< Megatron-LM command-line arguments
  kArctic,          ///< ArcticTraining recipe YAML
  kNeMo,            ///< NeMo 2.0: a Python module with one pretrain-recipe function
};
/// The name `--emit` takes and the methods' launcher tables use: torchtitan, torchtitan-0.2.2,
/// torchtitan-0.2.1, torchtitan-main, untied-ulysses, deepspeed, accelerate, megatron, arctic,
/// nemo.
const char* to_string(LauncherFormat f);
/// The launcher release (or commit) the file is written for, named in its header: "TorchTitan
/// 0.3.0", "DeepSpeed 0.19.8 and Megatron-DeepSpeed @ 4efb479", ...
const char* launcher_target(LauncherFormat f);
/// Every launcher, in the order lists and messages name them.
std::span<const LauncherFormat> launcher_formats();
/// A launcher by name, and by release where it writes several (`--launcher-version`: torchtitan
/// 0.3.0, the default, 0.2.2 or 0.2.1; "torchtitan-0.2.2" names one directly). An empty `version`
/// is the launcher's default.
/// @throws InputError(field) listing the known names; InputError("--launcher-version") listing the
/// releases the launcher writes.
LauncherFormat parse_launcher_format(const std::string& text,
                                     const std::string& field,
                                     const std::string& version = "");

/// Whether the launcher's file sets pipeline parallelism (megatron, nemo, torchtitan,
/// torchtitan-main);
/// the others have no key for it and refuse PP > 1 (see emit_launcher_config).
bool launcher_writes_pipeline(LauncherFormat f);
/// Whether its file sets an expert-parallel degree: Megatron-LM's --expert-model-parallel-size and
/// TorchTitan 0.3.0's and main's parallelism.expert_parallel_degree (the files of the others name
/// none, and the implementations they run keep every expert on each rank).
bool launcher_writes_expert_parallel(LauncherFormat f);

/// A second file the run needs beside the main one, which refers to it by `path`: Accelerate's
/// DeepSpeed JSON (`deepspeed_config_file`), the Megatron-DeepSpeed flags of an FPDT run (a shell
/// file naming the ds_config JSON).
struct CompanionFile {
  std::string path;  ///< where to write it: beside the main file (see companion_path)
  std::string text;
  std::string what;  ///< one line: what it is and how the run uses it
};

struct EmittedConfig {
  std::string text;                ///< file contents (TOML, JSON, YAML) or a shell argument list
  std::string suggested_filename;  ///< e.g. "cpsim_torchtitan.toml"
  std::vector<std::string> notes;  ///< what the launcher cannot express, and simplifications
  std::vector<CompanionFile> companions;  ///< files the main one refers to; written with it
};

struct EmitOptions {
  /// Where the main file will be written, as the user gave it; empty or "-": not written (the
  /// companions are then named after the suggested file name).
  std::string main_path;
  /// The training data for launchers whose file must name it (ArcticTraining's data.sources): a
  /// Hugging Face dataset id or a local path; empty: such a launcher refuses, naming --dataset.
  std::string dataset;
};

/// The path of a companion of the main file: `main_path` (or `default_main` when it is empty or
/// "-") without its extension, then `suffix`. "out/run.yaml", ".ds_config.json" →
/// "out/run.ds_config.json".
std::string companion_path(const std::string& main_path,
                           const std::string& default_main,
                           const std::string& suffix);

/// The recipe a launcher runs from the file cpsim emits for it, as written: a knob the file cannot
/// set is what the launcher does without it (checkpoint offload, tiled MLP or a fused loss off; the
/// attention kernel the launcher selects; the communication dtype it fixes), each change named.
/// `plan --emit` searches these recipes, so the file it writes is what it simulated. Knobs set in
/// the user's training script and named in the file's notes (Hugging Face gradient checkpointing,
/// Liger through the trainer) are kept.
struct RecipeAsRun {
  models::TrainingRecipe recipe;
  std::vector<std::string> changes;  ///< "tiled MLP off (no TorchTitan TOML key)"
};
RecipeAsRun recipe_as_run(LauncherFormat format, const sim::ScheduleInputs& config);

/// The implementation (`ParallelConfig::implementation`) that runs the configuration's method under
/// this launcher: the one asked for when given; else the recipe's default where it runs on the
/// launcher, else the first implementation of the method that does; "none" (the method's scheme
/// alone) when no modelled implementation runs there.
std::string implementation_run_by(LauncherFormat format, const sim::ScheduleInputs& config);

/// A configuration as a launcher runs it from the file cpsim emits for it: the recipe as run
/// (recipe_as_run) and the implementation that runs the method there (implementation_run_by).
struct ConfigAsRun {
  sim::ScheduleInputs inputs;
  std::vector<std::string> changes;  ///< what the launcher changes in the recipe asked for
};
/// @throws InputError(field) when the launcher cannot run the method (or its kernel choice),
///         naming the launchers that can.
ConfigAsRun config_as_run(LauncherFormat format,
                          const sim::ScheduleInputs& config,
                          const std::string& field);

/// Renders the configuration for one launcher.
/// @throws InputError("--emit") when that launcher cannot run the method (or a knob of the
///         configuration), naming a launcher that can.
EmittedConfig emit_launcher_config(LauncherFormat format,
                                   const sim::ScheduleInputs& config,
                                   const EmitOptions& options = {});

}  // namespace cpsim::planner
