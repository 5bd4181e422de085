#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/io.hpp"
#include "cpsim/models/json_io.hpp"

#include "io_checks.hpp"
#include "loader_common.hpp"

namespace cpsim::models {
namespace {

using detail::check_schema;
using detail::name_from_origin;
using detail::reject_unknown_keys;
using detail::resolve_file;
using detail::ResolvedFile;
using detail::rethrow_with_origin;

constexpr std::string_view kRecipeSchema = "cpsim.recipe/1";

}  // namespace

TrainingRecipe parse_recipe(const std::string& json_text, const std::string& origin) {
  const Json root = parse_json(json_text, origin);
  if (!root.is_object()) {
    throw InputError(origin,
                     fmt::format("a recipe must be a JSON object, got {}", describe_json(root)));
  }
  check_schema(root, kRecipeSchema, origin);
  reject_unknown_keys(
      root,
      {"schema", "name", "description", "precision", "optimizer", "sharding",
       "activation_checkpointing", "tiled_mlp", "tiled_norm", "norm_kernel", "rope_kernel",
       "mlp_kernel", "fused_loss", "allocator", "attention_kernel", "int32_kernel_indexing"},
      origin, "");

  // Every key but `schema` is optional; absent keys keep the defaults of TrainingRecipe (alst).
  TrainingRecipe recipe;
  const auto field = [&](const std::string& path) { return json_field(origin, path); };
  const auto section = [&](std::string_view key,
                           std::initializer_list<std::string_view> known) -> const Json* {
    const Json* value = find_member(root, key);
    if (value != nullptr) {
      json_object(*value, field(std::string(key)));
      reject_unknown_keys(*value, known, origin, std::string(key));
    }
    return value;
  };
  const auto read_int = [&](const Json* object, std::string_view section_key, std::string_view key,
                            auto& out) {
    if (object == nullptr) {
      return;
    }
    if (const Json* v = find_member(*object, key)) {
      const std::string f = field(json_child_path(std::string(section_key), key));
      const std::int64_t value = json_integer(*v, f);
      using Out = std::remove_reference_t<decltype(out)>;
      if (value < std::numeric_limits<Out>::min() || value > std::numeric_limits<Out>::max()) {
        throw InputError(f, fmt::format("{} is out of range", value));
      }
      out = static_cast<Out>(value);
    }
  };
  const auto read_bool = [&](const Json* object, std::string_view section_key, std::string_view key,
                             bool& out) {
    if (object == nullptr) {
      return;
    }
    if (const Json* v = find_member(*object, key)) {
      out = json_bool(*v, field(json_child_path(std::string(section_key), key)));
    }
  };

  if (const Json* name = find_member(root, "name")) {
    recipe.name = json_string(*name, field("name"));
  }
  if (recipe.name.empty()) {
    recipe.name = name_from_origin(origin);
  }
  if (const Json* description = find_member(root, "description")) {
    recipe.description = json_string(*description, field("description"));
  }

  const Json* precision =
      section("precision", {"param_bytes", "activation_bytes", "master_param_bytes", "grad_bytes",
                            "grad_reduce_bytes", "optimizer_state_bytes", "cp_comm_bytes",
                            "persistent_compute_params", "fp8"});
  read_int(precision, "precision", "param_bytes", recipe.param_bytes);
  read_int(precision, "precision", "activation_bytes", recipe.activation_bytes);
  read_int(precision, "precision", "master_param_bytes", recipe.master_param_bytes);
  read_int(precision, "precision", "grad_bytes", recipe.grad_bytes);
  read_int(precision, "precision", "grad_reduce_bytes", recipe.grad_reduce_bytes);
  read_int(precision, "precision", "optimizer_state_bytes", recipe.optimizer_state_bytes);
  read_int(precision, "precision", "cp_comm_bytes", recipe.cp_comm_bytes);
  read_bool(precision, "precision", "persistent_compute_params", recipe.persistent_compute_params);
  read_bool(precision, "precision", "fp8", recipe.fp8);

  if (const Json* optimizer = find_member(root, "optimizer")) {
    recipe.optimizer = json_string(*optimizer, field("optimizer"));
  }

  const Json* sharding = section(
      "sharding", {"zero_stage", "fsdp_prefetch_layers", "optimizer_offload", "param_offload",
                   "reduce_bucket_elements", "host_grad_partition_buffer"});
  read_int(sharding, "sharding", "zero_stage", recipe.zero_stage);
  read_int(sharding, "sharding", "fsdp_prefetch_layers", recipe.fsdp_prefetch_layers);
  read_bool(sharding, "sharding", "optimizer_offload", recipe.optimizer_offload);
  read_bool(sharding, "sharding", "param_offload", recipe.param_offload);
  read_int(sharding, "sharding", "reduce_bucket_elements", recipe.reduce_bucket_elements);
  read_bool(sharding, "sharding", "host_grad_partition_buffer", recipe.host_grad_partition_buffer);

  const Json* ac = section("activation_checkpointing",
                           {"mode", "offload_to_host", "keep_first_last_on_gpu", "reentrant"});
  if (ac != nullptr) {
    if (const Json* mode = find_member(*ac, "mode")) {
      const std::string f = field("activation_checkpointing.mode");
      recipe.checkpointing = parse_checkpoint_mode(json_string(*mode, f), f);
    }
  }
  read_bool(ac, "activation_checkpointing", "offload_to_host", recipe.checkpoint_offload);
  read_bool(ac, "activation_checkpointing", "keep_first_last_on_gpu",
            recipe.offload_keep_first_last);
  read_bool(ac, "activation_checkpointing", "reentrant", recipe.checkpoint_reentrant);

  const Json* tiled_mlp = section("tiled_mlp", {"enabled", "shards"});
  read_bool(tiled_mlp, "tiled_mlp", "enabled", recipe.tiled_mlp);
  read_int(tiled_mlp, "tiled_mlp", "shards", recipe.tiled_mlp_shards);

  if (const Json* tiled_norm = find_member(root, "tiled_norm")) {
    recipe.tiled_norm = json_bool(*tiled_norm, field("tiled_norm"));
  }
  if (const Json* norm = find_member(root, "norm_kernel")) {
    const std::string f = field("norm_kernel");
    recipe.norm_kernel = parse_norm_kernel(json_string(*norm, f), f);
  }
  // One kernel, or {"default": kernel, "<model_type>": kernel, ...}.
  if (const Json* rope = find_member(root, "rope_kernel")) {
    const std::string f = field("rope_kernel");
    if (rope->is_object()) {
      const Json* fallback = find_member(*rope, "default");
      if (fallback == nullptr) {
        throw InputError(field("rope_kernel.default"),
                         "missing: the kernel for model types not listed");
      }
      recipe.rope_kernel =
          parse_rope_kernel(json_string(*fallback, f + ".default"), f + ".default");
      for (const auto& [type, value] : rope->items()) {
        if (type != "default") {
          const std::string ft = f + "." + type;
          recipe.rope_kernel_by_model_type.emplace_back(
              type, parse_rope_kernel(json_string(value, ft), ft));
        }
      }
    } else {
      recipe.rope_kernel = parse_rope_kernel(json_string(*rope, f), f);
    }
  }
  if (const Json* mlp = find_member(root, "mlp_kernel")) {
    const std::string f = field("mlp_kernel");
    recipe.mlp_kernel = parse_mlp_kernel(json_string(*mlp, f), f);
  }
  if (const Json* int32 = find_member(root, "int32_kernel_indexing")) {
    recipe.int32_kernel_indexing = json_bool(*int32, field("int32_kernel_indexing"));
  }
  if (const Json* fused_loss = find_member(root, "fused_loss")) {
    recipe.fused_loss = json_bool(*fused_loss, field("fused_loss"));
  }
  const Json* allocator = section("allocator", {"expandable_segments"});
  read_bool(allocator, "allocator", "expandable_segments", recipe.expandable_segments);
  if (const Json* kernel = find_member(root, "attention_kernel")) {
    recipe.attention_kernel = json_string(*kernel, field("attention_kernel"));
  }

  try {
    recipe.validate();
  } catch (const InputError& e) {
    rethrow_with_origin(e, "recipe.", origin);
  }
  detail::check_optimizer_offload_stage(recipe, origin);
  return recipe;
}

TrainingRecipe load_recipe(const std::string& name_or_path,
                           const DataDir& data,
                           const std::string& field) {
  const ResolvedFile file = resolve_file(name_or_path, data, "recipes", "recipe",
                                         "or give a path to a recipe JSON", field);
  return parse_recipe(read_text_file(file.path, field), file.origin);
}

}  // namespace cpsim::models
