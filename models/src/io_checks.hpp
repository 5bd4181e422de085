#pragma once
// Checks of loaded files beyond their JSON types: values a file may hold but no real setup has.
// Each throws InputError naming `<origin>:<json path>`. Private to the models module.

#include <string>

#include <nlohmann/json.hpp>

#include "cpsim/models/hardware.hpp"
#include "cpsim/models/recipe.hpp"
#include "cpsim/models/transformer.hpp"

namespace cpsim::models::detail {

/// Refuses Hugging Face configs of architectures cpsim does not model: state-space and recurrent
/// models (`model_type` mamba, rwkv, jamba, ...), hybrids, mixture-of-experts model types other
/// than mixtral and qwen3_moe (hf_config_io.cpp reads those), biased MLPs, LayerNorm blocks and
/// logit soft-capping.
void check_modelled_architecture(const nlohmann::json& config, const std::string& origin);

/// When heads × head_dim differs from hidden_size (Qwen3: 32 × 128 = 4096 against 2560), adds a
/// note to `spec` saying that the attention projections use head_dim.
void note_head_dim(TransformerSpec& spec);

/// Every profile number within a range no real GPU, node or link is outside of (a typo such as
/// `1e308` FLOP/s or bandwidth in bits is refused, naming the field and the range).
void check_profile_plausible(const HardwareProfile& hw, const std::string& origin);

/// ZeRO-Offload offloads the optimizer partition: it needs ZeRO stage 1, 2 or 3.
void check_optimizer_offload_stage(const TrainingRecipe& recipe, const std::string& origin);

}  // namespace cpsim::models::detail
