#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/io.hpp"
#include "cpsim/models/json_io.hpp"

#include "io_checks.hpp"
#include "loader_common.hpp"

namespace cpsim::models {
namespace {

using detail::check_schema;
using detail::reject_unknown_keys;
using detail::resolve_file;
using detail::ResolvedFile;

constexpr std::string_view kHardwareSchema = "cpsim.hardware/1";

// ---------------------------------------------------------------------------------------------
// Hardware profile

enum class Bound { kNonNegative, kPositive, kFraction };

void check_bound(double v, Bound bound, const std::string& field) {
  switch (bound) {
    case Bound::kNonNegative:
      if (v < 0.0) {
        throw InputError(field, fmt::format("must not be negative, got {}", v));
      }
      return;
    case Bound::kPositive:
      if (v <= 0.0) {
        throw InputError(field, fmt::format("must be positive, got {}", v));
      }
      return;
    case Bound::kFraction:
      if (v <= 0.0 || v > 1.0) {
        throw InputError(field, fmt::format("must be a fraction in (0, 1], got {}", v));
      }
      return;
  }
}

/// Reads coefficients ({"value", "source"}) and curves ({"points", "source"}) of a profile and
/// records each source in `provenance` under the coefficient's JSON path.
class ProfileReader {
 public:
  ProfileReader(const std::string& origin, Provenance& provenance)
      : origin_(origin), provenance_(provenance) {}

  std::string field(const std::string& path) const { return json_field(origin_, path); }

  const Json& member(const Json& object, const std::string& path, std::string_view key) const {
    const auto it = object.find(key);
    const std::string child = json_child_path(path, key);
    if (it == object.end()) {
      throw InputError(field(child), "required key is missing");
    }
    return *it;
  }

  const Json& section(const Json& object,
                      const std::string& path,
                      std::string_view key,
                      std::initializer_list<std::string_view> known) const {
    const std::string child = json_child_path(path, key);
    const Json& value = json_object(member(object, path, key), field(child));
    reject_unknown_keys(value, known, origin_, child);
    return value;
  }

  double number(const Json& object, const std::string& path, std::string_view key, Bound bound) {
    const std::string child = json_child_path(path, key);
    const Json& coefficient = json_object(member(object, path, key), field(child));
    reject_unknown_keys(coefficient, {"value", "source"}, origin_, child);
    record_source(coefficient, child);
    const double v = json_number(member(coefficient, child, "value"), field(child));
    check_bound(v, bound, field(child));
    return v;
  }

  std::int64_t integer(const Json& object,
                       const std::string& path,
                       std::string_view key,
                       Bound bound) {
    const std::string child = json_child_path(path, key);
    const Json& coefficient = json_object(member(object, path, key), field(child));
    reject_unknown_keys(coefficient, {"value", "source"}, origin_, child);
    record_source(coefficient, child);
    const std::int64_t v = json_integer(member(coefficient, child, "value"), field(child));
    check_bound(static_cast<double>(v), bound, field(child));
    return v;
  }

  /// A curve with at least one point, x > 0 strictly increasing, y within `bound`.
  LogCurve curve(const Json& object, const std::string& path, std::string_view key, Bound bound) {
    const std::string child = json_child_path(path, key);
    const Json& node = json_object(member(object, path, key), field(child));
    reject_unknown_keys(node, {"points", "source"}, origin_, child);
    record_source(node, child);
    const std::string points_path = json_child_path(child, "points");
    const Json& points = member(node, child, "points");
    if (!points.is_array() || points.empty()) {
      throw InputError(field(points_path),
                       fmt::format("must be a non-empty array of [x, y] pairs, got {}",
                                   points.is_array() ? "an empty array" : describe_json(points)));
    }
    std::vector<std::pair<double, double>> xy;
    xy.reserve(points.size());
    for (std::size_t i = 0; i < points.size(); ++i) {
      const std::string point_field = field(fmt::format("{}[{}]", points_path, i));
      const Json& p = points[i];
      if (!p.is_array() || p.size() != 2) {
        throw InputError(point_field,
                         fmt::format("must be an [x, y] pair, got {}", describe_json(p)));
      }
      const double x = json_number(p[0], point_field);
      const double y = json_number(p[1], point_field);
      if (x <= 0.0) {
        throw InputError(point_field, fmt::format("x must be positive, got {}", x));
      }
      if (!xy.empty() && x <= xy.back().first) {
        throw InputError(point_field, fmt::format("x must be strictly increasing ({} after {})", x,
                                                  xy.back().first));
      }
      check_bound(y, bound, point_field);
      xy.emplace_back(x, y);
    }
    return LogCurve(std::move(xy));
  }

 private:
  void record_source(const Json& node, const std::string& path) {
    const std::string source_path = json_child_path(path, "source");
    const auto it = node.find("source");
    if (it == node.end()) {
      throw InputError(field(source_path), "every coefficient needs a non-empty source");
    }
    const std::string source = json_string(*it, field(source_path));
    if (source.find_first_not_of(" \t\r\n") == std::string::npos) {
      throw InputError(field(source_path), "every coefficient needs a non-empty source");
    }
    provenance_[path] = source;
  }

  const std::string& origin_;
  Provenance& provenance_;
};

/// Checks that a name can be used as one component of a dotted JSON path.
void check_name_component(const std::string& name, const std::string& field) {
  const bool ok = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
  if (!ok) {
    throw InputError(field, fmt::format("name '{}' must be non-empty and use only letters, digits, "
                                        "'_' and '-'",
                                        name));
  }
}

int to_int(std::int64_t v, const std::string& field) {
  if (v > std::numeric_limits<int>::max()) {
    throw InputError(field, fmt::format("{} is out of range", v));
  }
  return static_cast<int>(v);
}

constexpr std::array<std::pair<Span, std::string_view>, 2> kSpans = {{
    {Span::kIntraNode, "intra_node"},
    {Span::kInterNode, "inter_node"},
}};
constexpr std::array<std::pair<Collective, std::string_view>, 5> kCollectives = {{
    {Collective::kAllToAll, "all_to_all"},
    {Collective::kAllGather, "all_gather"},
    {Collective::kReduceScatter, "reduce_scatter"},
    {Collective::kAllReduce, "all_reduce"},
    {Collective::kSendRecv, "send_recv"},
}};

}  // namespace

namespace {

CollectiveCurve read_collective_curve(ProfileReader& r, const Json& c, const std::string& path) {
  CollectiveCurve curve;
  curve.alpha_s = r.number(c, path, "alpha_s", Bound::kNonNegative);
  curve.peak_busbw_bytes_per_s = r.number(c, path, "peak_busbw_bytes_per_s", Bound::kPositive);
  curve.efficiency_by_size = r.curve(c, path, "efficiency_by_size", Bound::kFraction);
  return curve;
}

/// `by_ranks`: {"<ranks>": {alpha_s, peak_busbw_bytes_per_s, efficiency_by_size}, ...}, ranks
/// an integer >= 2 written in decimal.
std::map<int, CollectiveCurve> read_by_ranks(ProfileReader& r,
                                             const Json& c,
                                             const std::string& path) {
  const std::string by_path = json_child_path(path, "by_ranks");
  const Json& by = json_object(c.at("by_ranks"), r.field(by_path));
  std::map<int, CollectiveCurve> out;
  for (const auto& [key, value] : by.items()) {
    const std::string entry_path = json_child_path(by_path, key);
    const bool digits = !key.empty() && key.size() <= 6 &&
                        key.find_first_not_of("0123456789") == std::string::npos && key[0] != '0';
    const int ranks = digits ? std::stoi(key) : 0;
    if (ranks < 2) {
      throw InputError(r.field(entry_path),
                       fmt::format("key must be a rank count of at least 2, got \"{}\"", key));
    }
    const Json& entry =
        r.section(by, by_path, key, {"alpha_s", "peak_busbw_bytes_per_s", "efficiency_by_size"});
    out[ranks] = read_collective_curve(r, entry, entry_path);
  }
  return out;
}

}  // namespace

namespace {

void read_gpu(ProfileReader& r, const Json& root, HardwareProfile& hw) {
  const Json& gpu = r.section(root, "", "gpu",
                              {"name", "hbm_capacity_bytes", "sm_count", "peak_bf16_flops_per_s",
                               "peak_fp8_flops_per_s", "hbm_bandwidth_bytes_per_s"});
  hw.gpu_name = json_string(r.member(gpu, "gpu", "name"), r.field("gpu.name"));
  hw.hbm_capacity_bytes = r.integer(gpu, "gpu", "hbm_capacity_bytes", Bound::kPositive);
  hw.sm_count = r.integer(gpu, "gpu", "sm_count", Bound::kPositive);
  hw.peak_bf16_flops_per_s = r.number(gpu, "gpu", "peak_bf16_flops_per_s", Bound::kPositive);
  if (gpu.contains("peak_fp8_flops_per_s")) {
    hw.peak_fp8_flops_per_s = r.number(gpu, "gpu", "peak_fp8_flops_per_s", Bound::kPositive);
  }
  hw.hbm_bandwidth_bytes_per_s =
      r.number(gpu, "gpu", "hbm_bandwidth_bytes_per_s", Bound::kPositive);
}

// The compute section's efficiencies and launch costs (its attention kernels apart).
const Json& read_compute(ProfileReader& r, const Json& root, HardwareProfile& hw) {
  const Json& compute =
      r.section(root, "", "compute",
                {"gemm_max_efficiency", "gemm_efficiency_by_flops", "memory_bound_efficiency",
                 "kernel_launch_s", "collective_launch_s", "compute_slowdown_under_comm",
                 "attention_kernels"});
  hw.gemm_max_efficiency = r.number(compute, "compute", "gemm_max_efficiency", Bound::kFraction);
  if (compute.contains("gemm_efficiency_by_flops")) {
    hw.gemm_efficiency_by_flops =
        r.curve(compute, "compute", "gemm_efficiency_by_flops", Bound::kFraction);
  }
  hw.memory_bound_efficiency =
      r.number(compute, "compute", "memory_bound_efficiency", Bound::kFraction);
  hw.kernel_launch_s = r.number(compute, "compute", "kernel_launch_s", Bound::kNonNegative);
  hw.collective_launch_s = r.number(compute, "compute", "collective_launch_s", Bound::kNonNegative);
  hw.compute_slowdown_under_comm =
      r.number(compute, "compute", "compute_slowdown_under_comm", Bound::kNonNegative);

  return compute;
}

void read_attention_kernels(ProfileReader& r, const Json& compute, HardwareProfile& hw) {
  const std::string kernels_path = "compute.attention_kernels";
  const Json& kernels =
      json_object(r.member(compute, "compute", "attention_kernels"), r.field(kernels_path));
  if (kernels.empty()) {
    throw InputError(r.field(kernels_path), "must name at least one attention kernel");
  }
  for (const auto& [kernel_name, kernel_json] : kernels.items()) {
    const std::string path = json_child_path(kernels_path, kernel_name);
    check_name_component(kernel_name, r.field(path));
    const Json& k =
        r.section(kernels, kernels_path, kernel_name,
                  {"fwd_causal_flops_per_s", "fwd_full_flops_per_s", "bwd_causal_flops_per_s",
                   "bwd_full_flops_per_s", "fwd_block_m", "bwd_block_n", "head_dim"});
    AttentionKernelModel model;
    model.fwd_causal_flops_per_s = r.curve(k, path, "fwd_causal_flops_per_s", Bound::kPositive);
    model.fwd_full_flops_per_s = r.curve(k, path, "fwd_full_flops_per_s", Bound::kPositive);
    model.bwd_causal_flops_per_s = r.curve(k, path, "bwd_causal_flops_per_s", Bound::kPositive);
    model.bwd_full_flops_per_s = r.curve(k, path, "bwd_full_flops_per_s", Bound::kPositive);
    model.fwd_block_m = r.integer(k, path, "fwd_block_m", Bound::kPositive);
    model.bwd_block_n = r.integer(k, path, "bwd_block_n", Bound::kPositive);
    model.head_dim = r.integer(k, path, "head_dim", Bound::kPositive);
    hw.attention_kernels.emplace(kernel_name, std::move(model));
  }
}

void read_memory_overheads(ProfileReader& r, const Json& root, HardwareProfile& hw) {
  if (const auto it = root.find("memory_overheads");
      it != root.end() && it->is_object() && it->contains("nccl_buffers_bytes")) {
    throw InputError(r.field("memory_overheads.nccl_buffers_bytes"),
                     "replaced by memory_overheads.nccl (NCCL's memory per communicator, "
                     "docs/MODEL.md \"NCCL memory\"); copy that block from a built-in profile");
  }
  const Json& overheads = r.section(root, "", "memory_overheads",
                                    {"cuda_context_bytes", "cublas_workspace_bytes", "nccl"});
  hw.cuda_context_bytes =
      r.integer(overheads, "memory_overheads", "cuda_context_bytes", Bound::kNonNegative);
  hw.cublas_workspace_bytes =
      r.integer(overheads, "memory_overheads", "cublas_workspace_bytes", Bound::kNonNegative);
  const std::string path = "memory_overheads.nccl";
  const Json& nccl =
      r.section(overheads, "memory_overheads", "nccl",
                {"collective_channels_intra_node", "collective_channels_inter_node",
                 "p2p_channels_per_nvlink_peer", "p2p_channels_per_net_peer", "nvls_channels",
                 "nvlink_p2p_read", "allocation_granularity_bytes"});
  const auto count = [&](std::string_view key, Bound bound) {
    return to_int(r.integer(nccl, path, key, bound), r.field(json_child_path(path, key)));
  };
  NcclTopology& t = hw.nccl;
  t.collective_channels_intra_node = count("collective_channels_intra_node", Bound::kPositive);
  t.collective_channels_inter_node = count("collective_channels_inter_node", Bound::kPositive);
  t.p2p_channels_per_nvlink_peer = count("p2p_channels_per_nvlink_peer", Bound::kPositive);
  t.p2p_channels_per_net_peer = count("p2p_channels_per_net_peer", Bound::kPositive);
  t.nvls_channels = count("nvls_channels", Bound::kNonNegative);
  const int read = count("nvlink_p2p_read", Bound::kNonNegative);
  if (read > 1) {
    throw InputError(r.field(path + ".nvlink_p2p_read"),
                     fmt::format("must be 0 (write mode) or 1 (read mode), got {}", read));
  }
  t.nvlink_p2p_read = read == 1;
  t.allocation_granularity_bytes =
      r.integer(nccl, path, "allocation_granularity_bytes", Bound::kPositive);
}

void read_node(ProfileReader& r, const Json& root, HardwareProfile& hw) {
  const Json& node = r.section(
      root, "", "node",
      {"gpus_per_node", "host_memory_bytes", "host_link", "cpu_adam_params_per_s", "host_issue"});
  hw.gpus_per_node = to_int(r.integer(node, "node", "gpus_per_node", Bound::kPositive),
                            r.field("node.gpus_per_node"));
  hw.host_memory_bytes_per_node = r.integer(node, "node", "host_memory_bytes", Bound::kPositive);
  hw.cpu_adam_params_per_s = r.number(node, "node", "cpu_adam_params_per_s", Bound::kPositive);
  const Json& host_link =
      r.section(node, "node", "host_link",
                {"alpha_s", "h2d_bytes_per_s", "d2h_bytes_per_s", "duplex_total_bytes_per_s"});
  hw.host_link.alpha_s = r.number(host_link, "node.host_link", "alpha_s", Bound::kNonNegative);
  hw.host_link.h2d_bytes_per_s =
      r.number(host_link, "node.host_link", "h2d_bytes_per_s", Bound::kPositive);
  hw.host_link.d2h_bytes_per_s =
      r.number(host_link, "node.host_link", "d2h_bytes_per_s", Bound::kPositive);
  hw.host_link.duplex_total_bytes_per_s =
      r.number(host_link, "node.host_link", "duplex_total_bytes_per_s", Bound::kPositive);
  // Optional: without it the host issue model is off (docs/MODEL.md, "Host issue").
  if (node.contains("host_issue")) {
    const Json& host = r.section(node, "node", "host_issue", {"dispatch_s", "launch_s", "sync_s"});
    hw.host_issue.dispatch_s = r.number(host, "node.host_issue", "dispatch_s", Bound::kNonNegative);
    hw.host_issue.launch_s = r.number(host, "node.host_issue", "launch_s", Bound::kNonNegative);
    hw.host_issue.sync_s = r.number(host, "node.host_issue", "sync_s", Bound::kNonNegative);
  }
}

void read_collectives(ProfileReader& r, const Json& root, HardwareProfile& hw) {
  const Json& collectives = r.section(root, "", "collectives", {"intra_node", "inter_node"});
  for (const auto& [span, span_key] : kSpans) {
    const std::string span_path = json_child_path("collectives", span_key);
    const Json& span_json =
        r.section(collectives, "collectives", span_key,
                  {"all_to_all", "all_gather", "reduce_scatter", "all_reduce", "send_recv"});
    for (const auto& [collective, collective_key] : kCollectives) {
      const std::string path = json_child_path(span_path, collective_key);
      const Json& c =
          r.section(span_json, span_path, collective_key,
                    {"alpha_s", "peak_busbw_bytes_per_s", "efficiency_by_size", "by_ranks"});
      CollectiveModel model;
      static_cast<CollectiveCurve&>(model) = read_collective_curve(r, c, path);
      if (c.contains("by_ranks")) {
        model.by_ranks = read_by_ranks(r, c, path);
      }
      hw.collectives[span][collective] = std::move(model);
    }
  }
}

}  // namespace

HardwareProfile parse_hardware_profile(const std::string& json_text, const std::string& origin) {
  const Json root = parse_json(json_text, origin);
  if (!root.is_object()) {
    throw InputError(origin, fmt::format("a hardware profile must be a JSON object, got {}",
                                         describe_json(root)));
  }
  check_schema(root, kHardwareSchema, origin);
  reject_unknown_keys(root,
                      {"schema", "name", "description", "gpu", "compute", "memory_overheads",
                       "node", "collectives"},
                      origin, "");

  HardwareProfile hw;
  ProfileReader r(origin, hw.provenance);
  hw.schema_version = kProfileSchemaVersion;
  hw.name = json_string(r.member(root, "", "name"), r.field("name"));
  if (hw.name.empty()) {
    throw InputError(r.field("name"), "must not be empty");
  }
  if (const Json* description = find_member(root, "description")) {
    hw.description = json_string(*description, r.field("description"));
  }

  read_gpu(r, root, hw);
  const Json& compute = read_compute(r, root, hw);
  read_attention_kernels(r, compute, hw);
  read_memory_overheads(r, root, hw);
  read_node(r, root, hw);
  read_collectives(r, root, hw);
  detail::check_profile_plausible(hw, origin);
  return hw;
}

HardwareProfile load_hardware(const std::string& name_or_path,
                              const DataDir& data,
                              const std::string& field) {
  const ResolvedFile file = resolve_file(name_or_path, data, "hardware", "hardware profile",
                                         "or give a path to a profile JSON", field);
  return parse_hardware_profile(read_text_file(file.path, field), file.origin);
}

}  // namespace cpsim::models
