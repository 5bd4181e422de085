#include "io_checks.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <string_view>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/units.hpp"

namespace cpsim::models::detail {
namespace {

using Json = nlohmann::json;

std::string field_of(const std::string& origin, std::string_view path) {
  return fmt::format("{}:{}", origin, path);
}

// ---------------------------------------------------------------------------------------------
// Architectures

struct RefusedModelType {
  std::string_view model_type;
  std::string_view what;
};
constexpr std::string_view kStateSpace = "state-space / recurrent";
constexpr std::string_view kHybrid = "hybrid attention / state-space";
constexpr std::string_view kMoe = "mixture-of-experts";
constexpr std::array<RefusedModelType, 19> kRefusedModelTypes = {{
    {"mamba", kStateSpace},
    {"mamba2", kStateSpace},
    {"falcon_mamba", kStateSpace},
    {"rwkv", kStateSpace},
    {"rwkv5", kStateSpace},
    {"rwkv6", kStateSpace},
    {"rwkv7", kStateSpace},
    {"xlstm", kStateSpace},
    {"recurrent_gemma", kHybrid},
    {"jamba", kHybrid},
    {"zamba", kHybrid},
    {"zamba2", kHybrid},
    {"bamba", kHybrid},
    {"falcon_h1", kHybrid},
    {"nemotron_h", kHybrid},
    {"granitemoehybrid", kHybrid},
    {"deepseek_v2", kMoe},
    {"dbrx", kMoe},
    {"olmoe", kMoe},
}};

bool is_off(const Json& value) {
  return value.is_null() || (value.is_boolean() && !value.get<bool>()) ||
         (value.is_number() && value.get<double>() == 0.0);
}

}  // namespace

void check_modelled_architecture(const Json& config, const std::string& origin) {
  if (const auto it = config.find("model_type"); it != config.end() && it->is_string()) {
    const auto& type = it->get_ref<const std::string&>();
    for (const RefusedModelType& refused : kRefusedModelTypes) {
      if (type == refused.model_type) {
        throw InputError(field_of(origin, "model_type"),
                         fmt::format("'{}' is a {} model that cpsim does not model (decoder-"
                                     "only transformers, mixture-of-experts as mixtral, "
                                     "qwen3_moe, qwen2_moe, gpt_oss, llama4 and "
                                     "deepseek_v3)",
                                     type, refused.what));
      }
    }
  }
  // Gemma 2's final soft-capping: logits / c, tanh, × c over the [s, V] logits before the loss
  // (transformers 4.57.6 modeling_gemma2.py, modeling_gemma3.py:675-678), whose tensors the loss
  // model does not hold.
  if (const auto it = config.find("final_logit_softcapping"); it != config.end() && !is_off(*it)) {
    throw InputError(field_of(origin, "final_logit_softcapping"),
                     "soft-capping of the logits (tanh over the [s, V] logits before the loss) is "
                     "not modelled");
  }
  // Biases in the MLP and LayerNorm (mean and bias) are not in the block cpsim builds.
  if (const auto it = config.find("mlp_bias"); it != config.end() && !is_off(*it)) {
    throw InputError(field_of(origin, "mlp_bias"),
                     "biases in the MLP are not modelled: cpsim builds bias-free MLP linears");
  }
  if (config.find("rms_norm_eps") == config.end()) {
    for (const char* key : {"layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"}) {
      if (config.find(key) != config.end()) {
        throw InputError(field_of(origin, key),
                         "LayerNorm (mean subtraction and bias) is not modelled: cpsim builds "
                         "RMSNorm blocks (configs with rms_norm_eps)");
      }
    }
  }
}

void note_head_dim(TransformerSpec& spec) {
  if (spec.is_mla() || spec.heads * spec.head_dim == spec.hidden) {  // MLA: read_mla's note
    return;
  }
  spec.notes.push_back(fmt::format(
      "attention uses head_dim {}: query width {} × {} = {}, not hidden_size {} (projections "
      "{} → {} → {})",
      spec.head_dim, spec.heads, spec.head_dim, spec.q_width(), spec.hidden, spec.hidden,
      spec.q_width(), spec.hidden));
}

// ---------------------------------------------------------------------------------------------
// Hardware profiles

namespace {

/// Throws unless lo ≤ v ≤ hi; `unit` is appended to the numbers of the message.
void check_within(double v, double lo, double hi, std::string_view unit, const std::string& field) {
  if (v < lo || v > hi) {
    throw InputError(field, fmt::format("{:g}{} is implausible: expected {:g} to {:g}{}", v, unit,
                                        lo, hi, unit));
  }
}

void check_curve_within(
    const LogCurve& curve, double lo, double hi, std::string_view unit, const std::string& field) {
  const auto& points = curve.points();
  for (std::size_t i = 0; i < points.size(); ++i) {
    check_within(points[i].second, lo, hi, unit, fmt::format("{}.points[{}]", field, i));
  }
}

constexpr std::string_view kCollectiveKeys[] = {"all_to_all", "all_gather", "reduce_scatter",
                                                "all_reduce", "send_recv"};

}  // namespace

void check_profile_plausible(const HardwareProfile& hw, const std::string& origin) {
  const auto f = [&](std::string_view path) { return field_of(origin, path); };
  const double gib = static_cast<double>(kGiB);
  const double capacity = static_cast<double>(hw.hbm_capacity_bytes);
  check_within(capacity / gib, 1.0, 16384.0, " GiB", f("gpu.hbm_capacity_bytes"));
  check_within(static_cast<double>(hw.sm_count), 1.0, 1e5, " SMs", f("gpu.sm_count"));
  check_within(hw.peak_bf16_flops_per_s, 1e12, 1e18, " FLOP/s", f("gpu.peak_bf16_flops_per_s"));
  check_within(hw.hbm_bandwidth_bytes_per_s, 1e10, 1e15, " B/s",
               f("gpu.hbm_bandwidth_bytes_per_s"));
  check_within(hw.kernel_launch_s, 0.0, 1e-3, " s", f("compute.kernel_launch_s"));
  check_within(hw.collective_launch_s, 0.0, 1e-2, " s", f("compute.collective_launch_s"));
  check_within(hw.compute_slowdown_under_comm, 0.0, 10.0, "",
               f("compute.compute_slowdown_under_comm"));
  check_within(hw.host_issue.dispatch_s, 0.0, 1e-3, " s", f("node.host_issue.dispatch_s"));
  check_within(hw.host_issue.launch_s, 0.0, 1e-3, " s", f("node.host_issue.launch_s"));
  check_within(hw.host_issue.sync_s, 0.0, 1e-2, " s", f("node.host_issue.sync_s"));
  // Attention runs on the tensor cores: no curve above the GPU's dense peak (with slack for a
  // profile whose peak is the boost-clock figure while kernels were timed above it).
  const double attention_max = 1.5 * hw.peak_bf16_flops_per_s;
  for (const auto& [name, k] : hw.attention_kernels) {
    const std::string path = "compute.attention_kernels." + name;
    check_curve_within(k.fwd_causal_flops_per_s, 1e9, attention_max, " FLOP/s",
                       f(path + ".fwd_causal_flops_per_s"));
    check_curve_within(k.fwd_full_flops_per_s, 1e9, attention_max, " FLOP/s",
                       f(path + ".fwd_full_flops_per_s"));
    check_curve_within(k.bwd_causal_flops_per_s, 1e9, attention_max, " FLOP/s",
                       f(path + ".bwd_causal_flops_per_s"));
    check_curve_within(k.bwd_full_flops_per_s, 1e9, attention_max, " FLOP/s",
                       f(path + ".bwd_full_flops_per_s"));
    check_within(static_cast<double>(k.fwd_block_m), 1.0, 4096.0, "", f(path + ".fwd_block_m"));
    check_within(static_cast<double>(k.bwd_block_n), 1.0, 4096.0, "", f(path + ".bwd_block_n"));
    check_within(static_cast<double>(k.head_dim), 1.0, 4096.0, "", f(path + ".head_dim"));
  }
  if (hw.fixed_overhead_bytes() >= hw.hbm_capacity_bytes) {
    throw InputError(f("memory_overheads"),
                     fmt::format("CUDA context, NCCL buffers and cuBLAS workspace ({}) leave "
                                 "nothing of the GPU's {}",
                                 format_bytes(static_cast<double>(hw.fixed_overhead_bytes())),
                                 format_bytes(capacity)));
  }
  check_within(static_cast<double>(hw.gpus_per_node), 1.0, 1024.0, " GPUs",
               f("node.gpus_per_node"));
  check_within(static_cast<double>(hw.host_memory_bytes_per_node) / gib, 1.0, 1048576.0, " GiB",
               f("node.host_memory_bytes"));
  check_within(hw.cpu_adam_params_per_s, 1e6, 1e13, " params/s", f("node.cpu_adam_params_per_s"));
  check_within(hw.host_link.alpha_s, 0.0, 1e-2, " s", f("node.host_link.alpha_s"));
  check_within(hw.host_link.h2d_bytes_per_s, 1e8, 1e13, " B/s",
               f("node.host_link.h2d_bytes_per_s"));
  check_within(hw.host_link.d2h_bytes_per_s, 1e8, 1e13, " B/s",
               f("node.host_link.d2h_bytes_per_s"));
  check_within(hw.host_link.duplex_total_bytes_per_s, 1e8, 2e13, " B/s",
               f("node.host_link.duplex_total_bytes_per_s"));
  for (const auto& [span, by_collective] : hw.collectives) {
    for (const auto& [collective, model] : by_collective) {
      const std::string path =
          fmt::format("collectives.{}.{}", span == Span::kIntraNode ? "intra_node" : "inter_node",
                      kCollectiveKeys[static_cast<std::size_t>(collective)]);
      check_within(model.alpha_s, 0.0, 1.0, " s", f(path + ".alpha_s"));
      check_within(model.peak_busbw_bytes_per_s, 1e8, 1e14, " B/s",
                   f(path + ".peak_busbw_bytes_per_s"));
      for (const auto& [ranks, curve] : model.by_ranks) {
        const std::string entry = fmt::format("{}.by_ranks.{}", path, ranks);
        check_within(curve.alpha_s, 0.0, 1.0, " s", f(entry + ".alpha_s"));
        check_within(curve.peak_busbw_bytes_per_s, 1e8, 1e14, " B/s",
                     f(entry + ".peak_busbw_bytes_per_s"));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Recipes

void check_optimizer_offload_stage(const TrainingRecipe& recipe, const std::string& origin) {
  if (recipe.optimizer_offload && recipe.zero_stage < 1) {
    throw InputError(field_of(origin, "sharding.optimizer_offload"),
                     "optimizer offload needs ZeRO stage 1, 2 or 3 (it offloads the optimizer "
                     "partition, as DeepSpeed ZeRO-Offload does), got sharding.zero_stage 0");
  }
}

}  // namespace cpsim::models::detail
