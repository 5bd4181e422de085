#pragma once
/// @file Loading built-in and user files: models (cpsim JSON or Hugging Face config.json), hardware
/// profiles, recipes. All loaders throw InputError naming the offending field or flag.

#include <filesystem>
#include <string>
#include <vector>

#include "cpsim/models/hardware.hpp"
#include "cpsim/models/recipe.hpp"
#include "cpsim/models/transformer.hpp"

namespace cpsim::models {

/// Where built-in data lives: data/{models,hardware,recipes}.
struct DataDir {
  std::filesystem::path root;
};

/// Parses a Hugging Face `config.json` text. Accepts `rope_theta`/`rope_scaling` and the newer
/// `rope_parameters`; `num_key_value_heads` defaults to heads; `head_dim` to hidden/heads.
/// Reads the mixtures of experts of `mixtral` and `qwen3_moe` (MoeSpec); refuses other MoE types
/// and MLA configs (fields named) rather than ignoring them.
/// @throws InputError with field `<origin>:<key>`.
TransformerSpec parse_hf_config(const std::string& json_text, const std::string& origin);

/// A built-in name (`llama3-8b`) or a path to a config.json (HF format or cpsim model JSON, which
/// is the HF format plus `name` and `source`). @throws InputError with field `field`.
TransformerSpec load_model(const std::string& name_or_path,
                           const DataDir& data,
                           const std::string& field = "--model");

HardwareProfile parse_hardware_profile(const std::string& json_text, const std::string& origin);
HardwareProfile load_hardware(const std::string& name_or_path,
                              const DataDir& data,
                              const std::string& field = "--hardware");

TrainingRecipe parse_recipe(const std::string& json_text, const std::string& origin);
TrainingRecipe load_recipe(const std::string& name_or_path,
                           const DataDir& data,
                           const std::string& field = "--recipe");

/// Names of the built-in files of one kind ("models", "hardware", "recipes"), sorted.
std::vector<std::string> list_builtin(const DataDir& data, const std::string& kind);

}  // namespace cpsim::models
