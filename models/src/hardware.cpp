#include "cpsim/models/hardware.hpp"

#include <string>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"

namespace cpsim::models {

const char* to_string(Collective c) {
  switch (c) {
    case Collective::kAllToAll:
      return "all_to_all";
    case Collective::kAllGather:
      return "all_gather";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kAllReduce:
      return "all_reduce";
    case Collective::kSendRecv:
      return "send_recv";
  }
  return "unknown";
}

const char* to_string(Span s) {
  switch (s) {
    case Span::kIntraNode:
      return "intra_node";
    case Span::kInterNode:
      return "inter_node";
  }
  return "unknown";
}

const CollectiveModel& HardwareProfile::collective(Span span, Collective c) const {
  const auto span_it = collectives.find(span);
  if (span_it != collectives.end()) {
    const auto it = span_it->second.find(c);
    if (it != span_it->second.end()) {
      return it->second;
    }
  }
  throw InputError(fmt::format("collectives.{}.{}", to_string(span), to_string(c)),
                   fmt::format("hardware profile '{}' has no model for {} on {}", name,
                               to_string(c), to_string(span)));
}

const AttentionKernelModel& HardwareProfile::attention_kernel(const std::string& kernel) const {
  const auto it = attention_kernels.find(kernel);
  if (it != attention_kernels.end()) {
    return it->second;
  }
  std::string known;
  for (const auto& [known_name, model] : attention_kernels) {
    known += known.empty() ? known_name : ", " + known_name;
  }
  throw InputError("--attention-kernel",
                   fmt::format("unknown attention kernel '{}' in hardware profile '{}'; known: {}",
                               kernel, name, known.empty() ? "(none)" : known));
}

}  // namespace cpsim::models
