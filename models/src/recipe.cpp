#include "cpsim/models/recipe.hpp"

#include <cstdint>
#include <initializer_list>
#include <string>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"

namespace cpsim::models {
namespace {

/// Field names follow the recipe JSON paths, prefixed with "recipe.".
void check_one_of(std::int64_t value,
                  std::initializer_list<std::int64_t> allowed,
                  const char* path) {
  for (const std::int64_t a : allowed) {
    if (value == a) {
      return;
    }
  }
  std::string list;
  for (const std::int64_t a : allowed) {
    list += list.empty() ? fmt::format("{}", a) : fmt::format(", {}", a);
  }
  throw InputError(fmt::format("recipe.{}", path),
                   fmt::format("must be one of {} bytes, got {}", list, value));
}

void check_range(std::int64_t value, std::int64_t lo, std::int64_t hi, const char* path) {
  if (value < lo || value > hi) {
    throw InputError(fmt::format("recipe.{}", path),
                     fmt::format("must be between {} and {}, got {}", lo, hi, value));
  }
}

/// The value of `values` whose name is `text`. @throws InputError naming `field`, listing the
/// names.
template <typename Enum>
Enum parse_named(const std::string& text,
                 std::initializer_list<Enum> values,
                 const char* what,
                 const std::string& field) {
  std::string known;
  for (const Enum v : values) {
    if (text == to_string(v)) {
      return v;
    }
    known += known.empty() ? to_string(v) : fmt::format(", {}", to_string(v));
  }
  throw InputError(field, fmt::format("unknown {} '{}'; known: {}", what, text, known));
}

}  // namespace

const char* to_string(CheckpointMode m) {
  switch (m) {
    case CheckpointMode::kNone:
      return "none";
    case CheckpointMode::kSelective:
      return "selective";
    case CheckpointMode::kFull:
      return "full";
  }
  return "unknown";
}

CheckpointMode parse_checkpoint_mode(const std::string& text, const std::string& field) {
  return parse_named(text,
                     {CheckpointMode::kNone, CheckpointMode::kSelective, CheckpointMode::kFull},
                     "checkpointing mode", field);
}

const char* to_string(NormKernel k) {
  switch (k) {
    case NormKernel::kUpcast:
      return "upcast";
    case NormKernel::kFused:
      return "fused";
    case NormKernel::kEager:
      return "eager";
  }
  return "unknown";
}

NormKernel parse_norm_kernel(const std::string& text, const std::string& field) {
  return parse_named(text, {NormKernel::kUpcast, NormKernel::kFused, NormKernel::kEager},
                     "norm kernel", field);
}

const char* to_string(RopeKernel k) {
  switch (k) {
    case RopeKernel::kFused:
      return "fused";
    case RopeKernel::kEager:
      return "eager";
    case RopeKernel::kComplex:
      return "complex";
  }
  return "unknown";
}

RopeKernel TrainingRecipe::rope_kernel_for(std::string_view model_type) const {
  for (const auto& [type, kernel] : rope_kernel_by_model_type) {
    if (type == model_type) {
      return kernel;
    }
  }
  return rope_kernel;
}

RopeKernel parse_rope_kernel(const std::string& text, const std::string& field) {
  return parse_named(text, {RopeKernel::kFused, RopeKernel::kEager, RopeKernel::kComplex},
                     "RoPE kernel", field);
}

const char* to_string(MlpKernel k) {
  switch (k) {
    case MlpKernel::kUnfused:
      return "unfused";
    case MlpKernel::kFused:
      return "fused";
    case MlpKernel::kEager:
      return "eager";
  }
  return "unknown";
}

MlpKernel parse_mlp_kernel(const std::string& text, const std::string& field) {
  return parse_named(text, {MlpKernel::kUnfused, MlpKernel::kFused, MlpKernel::kEager},
                     "MLP kernel", field);
}

void TrainingRecipe::validate() const {
  check_one_of(param_bytes, {1, 2, 4}, "precision.param_bytes");
  check_one_of(activation_bytes, {1, 2, 4}, "precision.activation_bytes");
  check_one_of(master_param_bytes, {0, 2, 4}, "precision.master_param_bytes");
  check_one_of(grad_bytes, {1, 2, 4}, "precision.grad_bytes");
  check_one_of(grad_reduce_bytes, {1, 2, 4}, "precision.grad_reduce_bytes");
  check_range(optimizer_state_bytes, 0, 32, "precision.optimizer_state_bytes");
  check_one_of(cp_comm_bytes, {1, 2, 4}, "precision.cp_comm_bytes");
  if (optimizer.empty()) {
    throw InputError("recipe.optimizer", "must not be empty");
  }
  check_range(zero_stage, 0, 3, "sharding.zero_stage");
  check_range(fsdp_prefetch_layers, 0, 64, "sharding.fsdp_prefetch_layers");
  if (param_offload && zero_stage != 3) {
    throw InputError("recipe.sharding.param_offload",
                     fmt::format("parameter offload needs ZeRO stage 3, got stage {}", zero_stage));
  }
  check_range(reduce_bucket_elements, 0, std::int64_t{1} << 40, "sharding.reduce_bucket_elements");
  check_range(tiled_mlp_shards, 0, std::int64_t{1} << 20, "tiled_mlp.shards");
  if (fp8 && tiled_mlp) {
    throw InputError("recipe.precision.fp8",
                     "FP8 runs TransformerEngine's Linear layers: needs the untiled MLP");
  }
  if (fp8 && zero_stage == 3) {
    throw InputError("recipe.precision.fp8",
                     "FP8 weight caching is modelled for unsharded compute weights (ZeRO stage <= "
                     "2), got stage 3");
  }
  if (attention_kernel.empty()) {
    throw InputError("recipe.attention_kernel", "must not be empty");
  }
}

}  // namespace cpsim::models
