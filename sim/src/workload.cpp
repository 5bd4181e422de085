#include "cpsim/sim/workload.hpp"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace cpsim::sim {

const char* to_string(Stream s) {
  switch (s) {
    case Stream::kCompute:
      return "compute";
    case Stream::kComm:
      return "comm";
    case Stream::kFsdp:
      return "fsdp";
    case Stream::kD2H:
      return "d2h";
    case Stream::kH2D:
      return "h2d";
  }
  return "?";
}

const char* to_string(OpKind k) {
  switch (k) {
    case OpKind::kGemm:
      return "gemm";
    case OpKind::kAttentionFwd:
      return "attention_fwd";
    case OpKind::kAttentionBwd:
      return "attention_bwd";
    case OpKind::kElementwise:
      return "elementwise";
    case OpKind::kLoss:
      return "loss";
    case OpKind::kOptimizer:
      return "optimizer";
    case OpKind::kCollective:
      return "collective";
    case OpKind::kCopyD2H:
      return "copy_d2h";
    case OpKind::kCopyH2D:
      return "copy_h2d";
  }
  return "?";
}

const char* to_string(Phase p) {
  switch (p) {
    case Phase::kForward:
      return "forward";
    case Phase::kRecompute:
      return "recompute";
    case Phase::kBackward:
      return "backward";
    case Phase::kOptimizer:
      return "optimizer";
  }
  return "?";
}

const char* to_string(MemCategory c) {
  switch (c) {
    case MemCategory::kModelStates:
      return "model_states";
    case MemCategory::kParamGather:
      return "param_gather";
    case MemCategory::kGradBuffers:
      return "grad_buffers";
    case MemCategory::kActivations:
      return "activations";
    case MemCategory::kAttention:
      return "attention";
    case MemCategory::kOther:
      return "other";
  }
  return "?";
}

void Workload::clear() {
  ranks = 0;
  represented_ranks = 0;
  gpus_per_node = 8;
  ops.clear();
  tensors.clear();
  collectives.clear();
  edges.clear();
  groups.clear();
  static_memory.clear();
  notes.clear();
  repeated_blocks = 0;
  instances.clear();
  for (TemplateShape& t : template_shapes) {
    t.ops = 0;
    t.tensors = 0;
    t.ported_ops.clear();
  }
  layout = {};
  loss_begin = kNone;
  last_name_ = -1;
}

std::int32_t Workload::intern(std::string_view name) {
  std::int32_t id = -1;
  if (last_name_ >= 0) {
    const std::int32_t guess = next_name_[static_cast<std::size_t>(last_name_)];
    if (guess >= 0 && static_cast<std::size_t>(guess) < names.size() &&
        names[static_cast<std::size_t>(guess)] == name) {
      id = guess;
    }
  }
  if (id < 0) {
    auto it = name_index_.find(name);
    if (it == name_index_.end()) {
      it = name_index_.emplace(std::string(name), static_cast<std::int32_t>(names.size())).first;
      names.emplace_back(name);
      next_name_.push_back(-1);
    }
    id = it->second;
    if (last_name_ >= 0) {
      next_name_[static_cast<std::size_t>(last_name_)] = id;
    }
  }
  last_name_ = id;
  return id;
}

std::int32_t Workload::intern_indexed(std::string_view prefix,
                                      std::int32_t index,
                                      std::string_view suffix) {
  if (index < 0) {
    throw std::logic_error("intern_indexed: negative index");
  }
  auto series =
      std::find_if(indexed_names_.begin(), indexed_names_.end(),
                   [&](const IndexedNames& n) { return n.prefix == prefix && n.suffix == suffix; });
  if (series == indexed_names_.end()) {
    indexed_names_.push_back({std::string(prefix), std::string(suffix), {}});
    series = indexed_names_.end() - 1;
  }
  std::vector<std::int32_t>& ids = series->ids;
  const auto i = static_cast<std::size_t>(index);
  if (i >= ids.size()) {
    ids.resize(i + 1, kNone);
  }
  if (ids[i] == kNone) {
    ids[i] = intern(fmt::format("{}{}{}", prefix, index, suffix));
  }
  last_name_ = ids[i];
  return ids[i];
}

}  // namespace cpsim::sim
