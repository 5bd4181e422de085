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

// Reads the members of one recipe document, each error naming `<origin>:<path>`.
class RecipeReader {
 public:
  RecipeReader(const Json& root, const std::string& origin) : root_(root), origin_(origin) {}

  std::string field(const std::string& path) const { return json_field(origin_, path); }
  const Json* member(std::string_view key) const { return find_member(root_, key); }

  // The object `key` with only the `known` keys, or nullptr when absent.
  const Json* section(std::string_view key, std::initializer_list<std::string_view> known) const {
    const Json* value = find_member(root_, key);
    if (value != nullptr) {
      json_object(*value, field(std::string(key)));
      reject_unknown_keys(*value, known, origin_, std::string(key));
    }
    return value;
  }

  template <typename Out>
  void read_int(const Json* object,
                std::string_view section_key,
                std::string_view key,
                Out& out) const {
    if (object == nullptr) {
      return;
    }
    if (const Json* v = find_member(*object, key)) {
      const std::string f = field(json_child_path(std::string(section_key), key));
      const std::int64_t value = json_integer(*v, f);
      if (value < std::numeric_limits<Out>::min() || value > std::numeric_limits<Out>::max()) {
        throw InputError(f, fmt::format("{} is out of range", value));
      }
      out = static_cast<Out>(value);
    }
  }

  void read_bool(const Json* object,
                 std::string_view section_key,
                 std::string_view key,
                 bool& out) const {
    if (object == nullptr) {
      return;
    }
    if (const Json* v = find_member(*object, key)) {
      out = json_bool(*v, field(json_child_path(std::string(section_key), key)));
    }
  }

 private:
  const Json& root_;
  const std::string& origin_;
};

void read_precision(const RecipeReader& r, TrainingRecipe& recipe) {
  const Json* precision =
      r.section("precision", {"param_bytes", "activation_bytes", "master_param_bytes", "grad_bytes",
                              "grad_reduce_bytes", "optimizer_state_bytes", "cp_comm_bytes",
                              "persistent_compute_params", "fp8"});
  r.read_int(precision, "precision", "param_bytes", recipe.param_bytes);
  r.read_int(precision, "precision", "activation_bytes", recipe.activation_bytes);
  r.read_int(precision, "precision", "master_param_bytes", recipe.master_param_bytes);
  r.read_int(precision, "precision", "grad_bytes", recipe.grad_bytes);
  r.read_int(precision, "precision", "grad_reduce_bytes", recipe.grad_reduce_bytes);
  r.read_int(precision, "precision", "optimizer_state_bytes", recipe.optimizer_state_bytes);
  r.read_int(precision, "precision", "cp_comm_bytes", recipe.cp_comm_bytes);
  r.read_bool(precision, "precision", "persistent_compute_params",
              recipe.persistent_compute_params);
  r.read_bool(precision, "precision", "fp8", recipe.fp8);
}

void read_sharding(const RecipeReader& r, TrainingRecipe& recipe) {
  const Json* sharding = r.section(
      "sharding", {"zero_stage", "fsdp_prefetch_layers", "optimizer_offload", "param_offload",
                   "reduce_bucket_elements", "host_grad_partition_buffer"});
  r.read_int(sharding, "sharding", "zero_stage", recipe.zero_stage);
  r.read_int(sharding, "sharding", "fsdp_prefetch_layers", recipe.fsdp_prefetch_layers);
  r.read_bool(sharding, "sharding", "optimizer_offload", recipe.optimizer_offload);
  r.read_bool(sharding, "sharding", "param_offload", recipe.param_offload);
  r.read_int(sharding, "sharding", "reduce_bucket_elements", recipe.reduce_bucket_elements);
  r.read_bool(sharding, "sharding", "host_grad_partition_buffer",
              recipe.host_grad_partition_buffer);
}

void read_checkpointing_and_tiling(const RecipeReader& r, TrainingRecipe& recipe) {
  const Json* ac = r.section("activation_checkpointing",
                             {"mode", "offload_to_host", "keep_first_last_on_gpu", "reentrant"});
  if (ac != nullptr) {
    if (const Json* mode = find_member(*ac, "mode")) {
      const std::string f = r.field("activation_checkpointing.mode");
      recipe.checkpointing = parse_checkpoint_mode(json_string(*mode, f), f);
    }
  }
  r.read_bool(ac, "activation_checkpointing", "offload_to_host", recipe.checkpoint_offload);
  r.read_bool(ac, "activation_checkpointing", "keep_first_last_on_gpu",
              recipe.offload_keep_first_last);
  r.read_bool(ac, "activation_checkpointing", "reentrant", recipe.checkpoint_reentrant);

  const Json* tiled_mlp = r.section("tiled_mlp", {"enabled", "shards"});
  r.read_bool(tiled_mlp, "tiled_mlp", "enabled", recipe.tiled_mlp);
  r.read_int(tiled_mlp, "tiled_mlp", "shards", recipe.tiled_mlp_shards);
  if (const Json* tiled_norm = r.member("tiled_norm")) {
    recipe.tiled_norm = json_bool(*tiled_norm, r.field("tiled_norm"));
  }
}

// One kernel, or {"default": kernel, "<model_type>": kernel, ...}.
void read_rope_kernel(const RecipeReader& r, TrainingRecipe& recipe) {
  const Json* rope = r.member("rope_kernel");
  if (rope == nullptr) {
    return;
  }
  const std::string f = r.field("rope_kernel");
  if (!rope->is_object()) {
    recipe.rope_kernel = parse_rope_kernel(json_string(*rope, f), f);
    return;
  }
  const Json* fallback = find_member(*rope, "default");
  if (fallback == nullptr) {
    throw InputError(r.field("rope_kernel.default"),
                     "missing: the kernel for model types not listed");
  }
  recipe.rope_kernel = parse_rope_kernel(json_string(*fallback, f + ".default"), f + ".default");
  for (const auto& [type, value] : rope->items()) {
    if (type != "default") {
      const std::string ft = f + "." + type;
      recipe.rope_kernel_by_model_type.emplace_back(type,
                                                    parse_rope_kernel(json_string(value, ft), ft));
    }
  }
}

void read_kernels_and_loss(const RecipeReader& r, TrainingRecipe& recipe) {
  if (const Json* norm = r.member("norm_kernel")) {
    const std::string f = r.field("norm_kernel");
    recipe.norm_kernel = parse_norm_kernel(json_string(*norm, f), f);
  }
  read_rope_kernel(r, recipe);
  if (const Json* mlp = r.member("mlp_kernel")) {
    const std::string f = r.field("mlp_kernel");
    recipe.mlp_kernel = parse_mlp_kernel(json_string(*mlp, f), f);
  }
  if (const Json* int32 = r.member("int32_kernel_indexing")) {
    recipe.int32_kernel_indexing = json_bool(*int32, r.field("int32_kernel_indexing"));
  }
  if (const Json* fused_loss = r.member("fused_loss")) {
    recipe.fused_loss = json_bool(*fused_loss, r.field("fused_loss"));
  }
  const Json* rope_cache = r.section("rope_cache", {"bytes_per_head_dim", "per_layer"});
  r.read_int(rope_cache, "rope_cache", "bytes_per_head_dim", recipe.rope_cache_bytes_per_head_dim);
  r.read_bool(rope_cache, "rope_cache", "per_layer", recipe.rope_cache_per_layer);
  if (recipe.rope_cache_bytes_per_head_dim < 0) {
    throw InputError(r.field("rope_cache.bytes_per_head_dim"), "must be 0 or more");
  }
  const Json* allocator = r.section("allocator", {"expandable_segments"});
  r.read_bool(allocator, "allocator", "expandable_segments", recipe.expandable_segments);
  if (const Json* kernel = r.member("attention_kernel")) {
    recipe.attention_kernel = json_string(*kernel, r.field("attention_kernel"));
  }
}

}  // namespace

TrainingRecipe parse_recipe(const std::string& json_text, const std::string& origin) {
  const Json root = parse_json(json_text, origin);
  if (!root.is_object()) {
    throw InputError(origin,
                     fmt::format("a recipe must be a JSON object, got {}", describe_json(root)));
  }
  check_schema(root, kRecipeSchema, origin);
  reject_unknown_keys(root,
                      {"schema", "name", "description", "precision", "optimizer", "sharding",
                       "activation_checkpointing", "tiled_mlp", "tiled_norm", "norm_kernel",
                       "rope_kernel", "mlp_kernel", "fused_loss", "rope_cache", "allocator",
                       "attention_kernel", "int32_kernel_indexing"},
                      origin, "");

  // Every key but `schema` is optional; absent keys keep the defaults of TrainingRecipe (alst).
  TrainingRecipe recipe;
  const RecipeReader r(root, origin);
  if (const Json* name = r.member("name")) {
    recipe.name = json_string(*name, r.field("name"));
  }
  if (recipe.name.empty()) {
    recipe.name = name_from_origin(origin);
  }
  if (const Json* description = r.member("description")) {
    recipe.description = json_string(*description, r.field("description"));
  }
  read_precision(r, recipe);
  if (const Json* optimizer = r.member("optimizer")) {
    recipe.optimizer = json_string(*optimizer, r.field("optimizer"));
  }
  read_sharding(r, recipe);
  read_checkpointing_and_tiling(r, recipe);
  read_kernels_and_loss(r, recipe);

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
