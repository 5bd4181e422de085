#include "op_emitter.hpp"

#include <algorithm>
#include <string>
#include <vector>

namespace cpsim::sim::detail {

OpEmitter::OpEmitter(const ScheduleInputs& in,
                     const HeadLayout& layout,
                     const Implementation* implementation,
                     Workload& w,
                     int simulated_ranks)
    : in_(in),
      m_(in.model),
      r_(in.recipe),
      shape_(StepShape::of(in)),
      cost_(in.hardware,
            implementation != nullptr ? implementation->attention_kernel(in)
                                      : in.recipe.attention_kernel),
      b_(w,
         in.parallel.gpus,
         simulated_ranks,
         in.parallel.cp_degree,
         in.parallel.ring_degree,
         in.parallel.gpus_per_node,
         in.parallel.tp_degree,
         in.parallel.ep_degree),
      w_(w) {
  if (implementation == nullptr) {
    return;
  }
  const LedgerUnits units = ledger_units(in, layout);
  for (int site = 0; site < kLedgerSiteCount; ++site) {
    const auto s = static_cast<LedgerSite>(site);
    ledger_bytes_[static_cast<std::size_t>(site)] = implementation->site_bytes(s, units);
    ledger_traffic_[static_cast<std::size_t>(site)] = implementation->site_traffic_bytes(s, units);
    traced_calls_[static_cast<std::size_t>(site)] = implementation->site_calls(s, units);
  }
}

OpSpec& OpEmitter::next_spec(Name name, Stream stream, OpKind kind) {
  OpSpec& s = spec_;
  s.name_id = name.id(w_);
  s.stream = stream;
  s.kind = kind;
  s.time_s = 0.0;
  s.time_s_per_rank.clear();
  s.flops = 0.0;
  s.transfer_bytes = 0;
  s.workspace_bytes = 0;
  s.workspace_category = MemCategory::kOther;
  s.memory_pool = MemoryPool::kByStream;
  s.host_calls = 1;
  s.host_sync = false;
  s.inputs.clear();
  s.outputs.clear();
  s.deps.clear();
  return s;
}

OpSet OpEmitter::compute(Name name,
                         OpKind kind,
                         const KernelCost& k,
                         ListRef<TensorSet> inputs,
                         ListRef<TensorSet> outputs,
                         ListRef<OpSet> deps,
                         std::int64_t workspace,
                         MemCategory ws_cat) {
  OpSpec& s = next_spec(name, Stream::kCompute, kind);
  s.time_s = k.time_s;
  s.flops = k.flops;
  s.host_calls = k.host_calls;
  s.inputs.assign(inputs.begin(), inputs.end());
  s.outputs.assign(outputs.begin(), outputs.end());
  s.deps.assign(deps.begin(), deps.end());
  s.workspace_bytes = workspace;
  s.workspace_category = ws_cat;
  return b_.op(s);
}

TensorSet OpEmitter::exchange(
    Name name, TensorSet in, std::int64_t bytes, MemCategory cat, ListRef<OpSet> deps) {
  if (shape_.ulysses == 1) {
    return in;
  }
  const std::int32_t id = name.id(w_);
  TensorSet out = b_.tensor(id, bytes, cat, false);
  OpSpec& s = next_spec(Name::interned(id), Stream::kComm, OpKind::kElementwise);
  s.inputs.push_back(in);
  s.outputs.push_back(out);
  s.deps.assign(deps.begin(), deps.end());
  // Communication in a wider dtype than the activations (DeepSpeed's fp32 default) sends a cast
  // copy and receives into one: both live while the collective runs.
  const std::int64_t wire_bytes = bytes / shape_.activation_bytes * r_.cp_comm_bytes;
  if (r_.cp_comm_bytes != shape_.activation_bytes) {
    s.workspace_bytes = 2 * wire_bytes;
    s.workspace_category = cat;
  }
  b_.collective(s, Group::kUlysses, models::Collective::kAllToAll, cost_, wire_bytes);
  return out;
}

TensorSet OpEmitter::exchange(Name name,
                              TensorSet in,
                              std::int64_t bytes,
                              LedgerSite site,
                              ListRef<TensorSet> held,
                              ListRef<OpSet> deps) {
  const std::int64_t extra = ledger_bytes(site);
  const std::int64_t traffic = ledger_traffic(site);
  if (shape_.ulysses == 1 && extra == 0 && held.size() == 0) {
    return in;
  }
  const std::int32_t id = name.id(w_);
  TensorSet out = b_.tensor(id, bytes, MemCategory::kAttention, false);
  if (shape_.ulysses == 1) {
    // The wrapper copies even without peers: a local copy with its transients and the traffic of
    // the wrapper's copies (or, with nothing to copy, an empty op that keeps `held` alive).
    std::vector<TensorSet> inputs(held.begin(), held.end());
    inputs.push_back(in);
    compute(Name::interned(id), OpKind::kElementwise,
            with_traffic(cost_.memory_bound(extra > 0 ? 2 * bytes : 0), site), inputs, {out}, deps,
            extra, MemCategory::kAttention);
    return out;
  }
  // The wrapper's copies around the all-to-all (send-buffer copies, casts, reorders) are kernels
  // on the compute stream: one op "copy.<name>" with their traffic, which the all-to-all waits
  // for (copies after the receive are put before it too: the chain's length is the same). Their
  // memory stays the all-to-all's workspace. Host calls: where the implementation's calls at the
  // site are traced, the all-to-all is one of them (its NCCL call) and the copy op issues the rest
  // (the wrapper's copies and reshapes, before and after the receive alike; without a copy op the
  // all-to-all issues them all); else one each.
  const std::optional<std::int64_t> traced = traced_calls(site);
  OpSet copied;
  if (traffic > 0) {
    const std::string copy_name = "copy." + w_.names[static_cast<std::size_t>(id)];
    KernelCost copy = with_traffic(cost_.memory_bound(0), site);
    if (traced) {
      copy.host_calls = std::max<std::int64_t>(*traced - 1, 0);
    }
    copied = compute(copy_name, OpKind::kElementwise, copy, {in}, {}, deps);
  }
  OpSpec& s = next_spec(Name::interned(id), Stream::kComm, OpKind::kElementwise);
  if (traced) {
    s.host_calls = copied.valid() ? std::min<std::int64_t>(*traced, 1) : *traced;
  }
  s.inputs.assign(held.begin(), held.end());
  s.inputs.push_back(in);
  s.outputs.push_back(out);
  s.deps.assign(deps.begin(), deps.end());
  if (copied.valid()) {
    s.deps.push_back(copied);
  }
  const std::int64_t wire_bytes = bytes / shape_.activation_bytes * r_.cp_comm_bytes;
  s.workspace_bytes = extra;
  if (r_.cp_comm_bytes != shape_.activation_bytes) {
    s.workspace_bytes += 2 * wire_bytes;  // the cast copy and the wider receive buffer (above)
  }
  s.workspace_category = MemCategory::kAttention;
  b_.collective(s, Group::kUlysses, models::Collective::kAllToAll, cost_, wire_bytes);
  return out;
}

// Megatron-style sequence parallelism (Korthikanti et al. 2022, §4.2.2: g = all-gather forward /
// reduce-scatter backward, ḡ the reverse): each column-parallel block (Q/K/V, gate/up, LM head)
// starts with an all-gather of its [s/T, h] input, each row-parallel block (output projection,
// down, vocabulary-parallel embedding) ends with a reduce-scatter of its partial [s, h] output.
// NCCL's convention (docs/MODEL.md): S = the whole [s, h] tensor for both, wire S·(T−1)/T. They
// run synchronously (exposed), as Megatron without --tp-comm-overlap (off by default) and
// TorchTitan without async TP (off by default) run them.
TensorSet OpEmitter::tp_exchange(
    const char* name, TensorSet in, bool gather, MemCategory cat, ListRef<OpSet> deps) {
  if (shape_.tp == 1) {
    return in;
  }
  const std::int64_t full_bytes = shape_.local_tokens * m_.hidden * shape_.activation_bytes;
  TensorSet out = b_.tensor(
      name, gather ? full_bytes : shape_.sp_tokens * m_.hidden * shape_.activation_bytes, cat);
  OpSpec& s = next_spec(name, Stream::kComm, OpKind::kElementwise);
  s.inputs.push_back(in);
  s.outputs.push_back(out);
  s.deps.assign(deps.begin(), deps.end());
  b_.collective(s, Group::kTp,
                gather ? models::Collective::kAllGather : models::Collective::kReduceScatter, cost_,
                full_bytes);
  return out;
}

OpSet OpEmitter::host_copy(Name name,
                           bool to_device,
                           std::int64_t bytes,
                           TensorSet in,
                           TensorSet out,
                           ListRef<OpSet> deps,
                           MemoryPool pool) {
  return host_copy(name, to_device, bytes, ListRef<TensorSet>{in}, ListRef<TensorSet>{out}, deps,
                   pool);
}

OpSet OpEmitter::host_copy(Name name,
                           bool to_device,
                           std::int64_t bytes,
                           ListRef<TensorSet> inputs,
                           ListRef<TensorSet> outputs,
                           ListRef<OpSet> deps,
                           MemoryPool pool) {
  OpSpec& s = next_spec(name, to_device ? Stream::kH2D : Stream::kD2H,
                        to_device ? OpKind::kCopyH2D : OpKind::kCopyD2H);
  s.transfer_bytes = bytes;
  s.memory_pool = pool;
  s.time_s = cost_.host_copy_s(bytes, to_device);
  s.inputs.assign(inputs.begin(), inputs.end());
  s.outputs.assign(outputs.begin(), outputs.end());
  s.deps.assign(deps.begin(), deps.end());
  return b_.op(s);
}

}  // namespace cpsim::sim::detail
