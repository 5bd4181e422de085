#include "cpsim/calibrate/profile_io.hpp"

#include <array>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cpsim/models/error.hpp"

namespace cpsim::calibrate {
namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr std::array<models::Span, 2> kSpans = {models::Span::kIntraNode, models::Span::kInterNode};
constexpr std::array<models::Collective, 5> kCollectives = {
    models::Collective::kAllToAll, models::Collective::kAllGather,
    models::Collective::kReduceScatter, models::Collective::kAllReduce,
    models::Collective::kSendRecv};

class ProfileWriter {
 public:
  explicit ProfileWriter(const models::HardwareProfile& p) : profile_(p) {}

  const std::string& source(const std::string& path) const {
    const auto it = profile_.provenance.find(path);
    if (it == profile_.provenance.end() ||
        it->second.find_first_not_of(" \t\r\n") == std::string::npos) {
      throw InputError("provenance." + path, "the coefficient has no source");
    }
    return it->second;
  }

  template <typename T>
  OrderedJson value(const std::string& path, T v) const {
    return OrderedJson{{"value", v}, {"source", source(path)}};
  }

  OrderedJson curve(const std::string& path, const models::LogCurve& c) const {
    OrderedJson points = OrderedJson::array();
    for (const auto& [x, y] : c.points()) {
      points.push_back(OrderedJson::array({x, y}));
    }
    return OrderedJson{{"points", std::move(points)}, {"source", source(path)}};
  }

 private:
  const models::HardwareProfile& profile_;
};

}  // namespace

namespace {

OrderedJson gpu_json(const ProfileWriter& w, const models::HardwareProfile& p) {
  OrderedJson gpu;
  gpu["name"] = p.gpu_name;
  gpu["hbm_capacity_bytes"] = w.value("gpu.hbm_capacity_bytes", p.hbm_capacity_bytes);
  gpu["sm_count"] = w.value("gpu.sm_count", p.sm_count);
  gpu["peak_bf16_flops_per_s"] = w.value("gpu.peak_bf16_flops_per_s", p.peak_bf16_flops_per_s);
  if (p.peak_fp8_flops_per_s > 0.0) {
    gpu["peak_fp8_flops_per_s"] = w.value("gpu.peak_fp8_flops_per_s", p.peak_fp8_flops_per_s);
  }
  gpu["hbm_bandwidth_bytes_per_s"] =
      w.value("gpu.hbm_bandwidth_bytes_per_s", p.hbm_bandwidth_bytes_per_s);
  return gpu;
}

OrderedJson attention_kernels_json(const ProfileWriter& w, const models::HardwareProfile& p) {
  OrderedJson kernels = OrderedJson::object();
  for (const auto& [name, k] : p.attention_kernels) {
    const std::string path = "compute.attention_kernels." + name;
    OrderedJson kj;
    kj["fwd_causal_flops_per_s"] =
        w.curve(path + ".fwd_causal_flops_per_s", k.fwd_causal_flops_per_s);
    kj["fwd_full_flops_per_s"] = w.curve(path + ".fwd_full_flops_per_s", k.fwd_full_flops_per_s);
    kj["bwd_causal_flops_per_s"] =
        w.curve(path + ".bwd_causal_flops_per_s", k.bwd_causal_flops_per_s);
    kj["bwd_full_flops_per_s"] = w.curve(path + ".bwd_full_flops_per_s", k.bwd_full_flops_per_s);
    kj["fwd_block_m"] = w.value(path + ".fwd_block_m", k.fwd_block_m);
    kj["bwd_block_n"] = w.value(path + ".bwd_block_n", k.bwd_block_n);
    kj["head_dim"] = w.value(path + ".head_dim", k.head_dim);
    kernels[name] = std::move(kj);
  }
  return kernels;
}

OrderedJson compute_json(const ProfileWriter& w, const models::HardwareProfile& p) {
  OrderedJson compute;
  compute["gemm_max_efficiency"] = w.value("compute.gemm_max_efficiency", p.gemm_max_efficiency);
  if (!p.gemm_efficiency_by_flops.empty()) {
    compute["gemm_efficiency_by_flops"] =
        w.curve("compute.gemm_efficiency_by_flops", p.gemm_efficiency_by_flops);
  }
  compute["memory_bound_efficiency"] =
      w.value("compute.memory_bound_efficiency", p.memory_bound_efficiency);
  compute["kernel_launch_s"] = w.value("compute.kernel_launch_s", p.kernel_launch_s);
  compute["collective_launch_s"] = w.value("compute.collective_launch_s", p.collective_launch_s);
  compute["compute_slowdown_under_comm"] =
      w.value("compute.compute_slowdown_under_comm", p.compute_slowdown_under_comm);
  compute["attention_kernels"] = attention_kernels_json(w, p);
  return compute;
}

OrderedJson overheads_json(const ProfileWriter& w, const models::HardwareProfile& p) {
  OrderedJson overheads;
  overheads["cuda_context_bytes"] =
      w.value("memory_overheads.cuda_context_bytes", p.cuda_context_bytes);
  overheads["cublas_workspace_bytes"] =
      w.value("memory_overheads.cublas_workspace_bytes", p.cublas_workspace_bytes);
  const models::NcclTopology& t = p.nccl;
  OrderedJson nccl;
  const auto put = [&](const char* key, std::int64_t v) {
    nccl[key] = w.value(fmt::format("memory_overheads.nccl.{}", key), v);
  };
  put("collective_channels_intra_node", t.collective_channels_intra_node);
  put("collective_channels_inter_node", t.collective_channels_inter_node);
  put("p2p_channels_per_nvlink_peer", t.p2p_channels_per_nvlink_peer);
  put("p2p_channels_per_net_peer", t.p2p_channels_per_net_peer);
  put("nvls_channels", t.nvls_channels);
  put("nvlink_p2p_read", t.nvlink_p2p_read ? 1 : 0);
  put("allocation_granularity_bytes", t.allocation_granularity_bytes);
  overheads["nccl"] = std::move(nccl);
  return overheads;
}

OrderedJson node_json(const ProfileWriter& w, const models::HardwareProfile& p) {
  OrderedJson node;
  node["gpus_per_node"] = w.value("node.gpus_per_node", p.gpus_per_node);
  node["host_memory_bytes"] = w.value("node.host_memory_bytes", p.host_memory_bytes_per_node);
  OrderedJson host_link;
  host_link["alpha_s"] = w.value("node.host_link.alpha_s", p.host_link.alpha_s);
  host_link["h2d_bytes_per_s"] =
      w.value("node.host_link.h2d_bytes_per_s", p.host_link.h2d_bytes_per_s);
  host_link["d2h_bytes_per_s"] =
      w.value("node.host_link.d2h_bytes_per_s", p.host_link.d2h_bytes_per_s);
  host_link["duplex_total_bytes_per_s"] =
      w.value("node.host_link.duplex_total_bytes_per_s", p.host_link.duplex_total_bytes_per_s);
  node["host_link"] = std::move(host_link);
  node["cpu_adam_params_per_s"] = w.value("node.cpu_adam_params_per_s", p.cpu_adam_params_per_s);
  if (p.host_issue.enabled()) {
    OrderedJson host_issue;
    host_issue["dispatch_s"] = w.value("node.host_issue.dispatch_s", p.host_issue.dispatch_s);
    host_issue["launch_s"] = w.value("node.host_issue.launch_s", p.host_issue.launch_s);
    host_issue["sync_s"] = w.value("node.host_issue.sync_s", p.host_issue.sync_s);
    node["host_issue"] = std::move(host_issue);
  }
  return node;
}

OrderedJson collectives_json(const ProfileWriter& w, const models::HardwareProfile& p) {
  OrderedJson collectives;
  for (const models::Span span : kSpans) {
    const std::string span_key = models::to_string(span);
    OrderedJson span_json;
    for (const models::Collective c : kCollectives) {
      const std::string key = models::to_string(c);
      const std::string path = fmt::format("collectives.{}.{}", span_key, key);
      const models::CollectiveModel& m = p.collective(span, c);
      OrderedJson cj;
      cj["alpha_s"] = w.value(path + ".alpha_s", m.alpha_s);
      cj["peak_busbw_bytes_per_s"] =
          w.value(path + ".peak_busbw_bytes_per_s", m.peak_busbw_bytes_per_s);
      cj["efficiency_by_size"] = w.curve(path + ".efficiency_by_size", m.efficiency_by_size);
      if (!m.by_ranks.empty()) {
        OrderedJson by = OrderedJson::object();
        for (const auto& [ranks, curve] : m.by_ranks) {
          const std::string entry = fmt::format("{}.by_ranks.{}", path, ranks);
          by[std::to_string(ranks)] = OrderedJson{
              {"alpha_s", w.value(entry + ".alpha_s", curve.alpha_s)},
              {"peak_busbw_bytes_per_s",
               w.value(entry + ".peak_busbw_bytes_per_s", curve.peak_busbw_bytes_per_s)},
              {"efficiency_by_size",
               w.curve(entry + ".efficiency_by_size", curve.efficiency_by_size)}};
        }
        cj["by_ranks"] = std::move(by);
      }
      span_json[key] = std::move(cj);
    }
    collectives[span_key] = std::move(span_json);
  }
  return collectives;
}

}  // namespace

std::string write_hardware_profile(const models::HardwareProfile& p) {
  const ProfileWriter w(p);
  OrderedJson root;
  root["schema"] = fmt::format("cpsim.hardware/{}", models::kProfileSchemaVersion);
  root["name"] = p.name;
  root["description"] = p.description;
  root["gpu"] = gpu_json(w, p);
  root["compute"] = compute_json(w, p);
  root["memory_overheads"] = overheads_json(w, p);
  root["node"] = node_json(w, p);
  root["collectives"] = collectives_json(w, p);
  return root.dump(2) + "\n";
}

}  // namespace cpsim::calibrate
