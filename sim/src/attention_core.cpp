// Core attention on head-sharded tensors: one flash-attention call, a ring of K/V blocks, or an
// all-gather of K/V, over the ring group of `ring` ranks holding n_r = N / ring tokens each.
//
// Ring (REFERENCES.md [RingAttention], [ring-flash-attn]):
// K/V blocks rotate with send/recv on the comm stream, double
// buffered: step k computes on the block received at step k−1 while the next block is in flight,
// so communication is exposed exactly when a block's attention is shorter than its transfer
// (the overlap condition c ≥ F/B). The send of step k waits for the attention of step k−1:
// ring-flash-attention issues it after queuing that attention, and ProcessGroupNCCL makes its
// stream wait for the caller's stream at every call. Steps therefore run in lockstep (a step's
// send and attention start together when the previous step's both have ended) and two blocks are
// live at a time. In the backward the dK/dV hop of step k follows its attention, and the next
// send follows that hop on the comm stream.
// Merged steps (BuildOptions::merge_ring_steps, representative rank, r ≥ 4): steps 1..r−2 take
// the same time and hold the same buffers, and in the fluid model of engine.hpp a lockstep step
// whose send and attention start together lasts f(comm work, compute work) with f(λa, λb) =
// λ·f(a, b) (rates are constant while nothing else starts or ends). So r−2 steps last exactly
// as long as one op per stream with r−2 times the work: a send of r−2 calls (latencies add up)
// and an attention of r−2 blocks, holding the same two blocks. Only work on other streams beside
// the ring (FSDP gathers, offload copies) can overlap the merged steps differently.
// Layouts:
//   zigzag      2R chunks of c = n_r/2; rank i holds i and 2R−1−i. Step 0 is causal on the local
//               pair; at step k ≥ 1 the block comes from rank j = i − k (mod R): if j < i, both
//               local chunks see the first half of the block (q = n_r, kv = n_r/2), else only the
//               second local chunk sees the whole block (q = n_r/2, kv = n_r): equal work per rank.
//   contiguous  rank i holds chunk i; step 0 causal, step k full when j < i and skipped (masked)
//               otherwise: rank R−1 computes R blocks, rank 0 one.
// The forward keeps an fp32 output and LSE accumulator (online softmax); the backward keeps an fp32
// dQ accumulator and sends an fp32 dK/dV accumulator around the ring with the K/V blocks, as
// ring-flash-attention does (its "extra fp32 buffers").
//
// FlashAttention backward workspace, per call over nq queries and nkv keys, hq/hkv local heads:
//   every kernel   fp32 dQ accumulator nq·hq·d·4 and fp32 row sums dot(dO, O) nq·hq·4
//   fa2, GQA       dK and dV expanded to the query heads, 2·nkv·hq·d·2, summed over each group
//                  after the kernel (flash_api.cpp mha_bwd / mha_varlen_bwd: dk_expanded)
//   fa3, GQA       fp32 dK and dV accumulators at the K/V heads, 2·nkv·hkv·d·4
//   sdpa           PyTorch's SDPA gets K/V already repeated to the query heads (HF and TorchTitan
//                  call repeat_kv first), so the kernel itself sees hkv = hq; the repeated K/V
//                  are tensors of the forward (core_forward), not workspace.
//
// Packed documents (ScheduleInputs::documents, document_work.hpp): every kernel keeps its shape
// and is scaled by the visible area under the document mask over the area of one causal
// document: one call by the whole share, a ring step by its pair of positions (the representative
// rank waits for the slowest position of each step), an all-gather call by its position's share.
// Crude where documents are short: a varlen kernel's tiles at document edges and its launch are
// scaled with the rest.
//
// All-gather (Llama 3, Megatron `all_gather`, PyTorch native rotate "allgather"). K/V of the whole
// sequence are gathered before attention (exposed), each rank attends its local queries to the
// visible prefix, and the backward gathers again and reduce-scatters dK/dV. Only the local K/V are
// kept for backward.
#include <algorithm>
#include <functional>

#include <fmt/format.h>

#include "cpsim/models/units.hpp"

#include "step_builder.hpp"

namespace cpsim::sim::detail {

std::int64_t StepBuilder::flash_bwd_workspace(std::int64_t nq,
                                              std::int64_t nkv,
                                              std::int64_t hq,
                                              std::int64_t hkv) const {
  const std::int64_t d = shape_.qk_head_dim, dv = shape_.v_head_dim;
  std::int64_t ws = nq * hq * d * kFp32Bytes + nq * hq * kFp32Bytes;
  if (hkv < hq) {
    if (r_.attention_kernel == "fa2") {
      ws += nkv * hq * (d + dv) * shape_.activation_bytes;
    } else if (r_.attention_kernel == "fa3") {
      ws += nkv * hkv * (d + dv) * kFp32Bytes;
    }
  }
  return ws;
}

KernelCost StepBuilder::masked(KernelCost k, double factor) {
  if (factor != 1.0) {
    k.time_s *= factor;
    k.flops *= factor;
  }
  return k;
}

CoreForward StepBuilder::core_forward(
    const std::string& tag, TensorSet q_h, TensorSet kv_h, std::int64_t hq, std::int64_t hkv) {
  if (shape_.ring > 1) {
    return method_.gathers_kv() ? allgather_forward(tag, q_h, kv_h, hq, hkv)
                                : ring_forward(tag, q_h, kv_h, hq, hkv);
  }
  const std::int64_t d = shape_.qk_head_dim, dv = shape_.v_head_dim;
  if (r_.attention_kernel == "sdpa" && hkv < hq) {
    // repeat_kv before SDPA: K/V expanded to the query heads, kept for backward in place of the
    // unexpanded ones (the expansion's backward sums the groups).
    TensorSet expanded =
        b_.tensor("kv_repeated" + tag, shape_.ring_tokens * hq * (d + dv) * shape_.activation_bytes,
                  MemCategory::kAttention);
    compute("repeat_kv" + tag, OpKind::kElementwise,
            mem(shape_.ring_tokens * (hq + hkv) * (d + dv) * shape_.activation_bytes), {kv_h},
            {expanded});
    kv_h = expanded;
    hkv = hq;
  }
  CoreForward out;
  if (hkv == hq) {
    out.kv_used = kv_h;
  }
  out.o_h = b_.tensor("attn_out_h" + tag, shape_.ring_tokens * hq * dv * shape_.activation_bytes,
                      MemCategory::kAttention);
  out.lse = b_.tensor("lse" + tag, hq * shape_.ring_tokens * kFp32Bytes, MemCategory::kAttention);
  // The implementation's merge around the kernel (an fp32 copy of the output, ...) is workspace,
  // and its kernels' traffic time on the same op.
  compute("attn_fwd" + tag, OpKind::kAttentionFwd,
          with_calls(with_traffic(masked(cost_.attention_fwd({shape_.ring_tokens,
                                                              shape_.ring_tokens, hq, d, true, dv}),
                                         whole_share()),
                                  LedgerSite::kCoreForward),
                     LedgerSite::kCoreForward),
          {q_h, kv_h}, {out.o_h, out.lse}, {}, ledger_bytes(LedgerSite::kCoreForward),
          MemCategory::kAttention);
  return out;
}

CoreBackward StepBuilder::core_backward(const std::string& tag,
                                        TensorSet q_h,
                                        TensorSet kv_h,
                                        TensorSet o_h,
                                        TensorSet lse,
                                        TensorSet do_h,
                                        std::int64_t hq,
                                        std::int64_t hkv) {
  if (shape_.ring > 1) {
    return method_.gathers_kv() ? allgather_backward(tag, q_h, kv_h, o_h, lse, do_h, hq, hkv)
                                : ring_backward(tag, q_h, kv_h, o_h, lse, do_h, hq, hkv);
  }
  const std::int64_t d = shape_.qk_head_dim, dv = shape_.v_head_dim;
  CoreBackward out;
  out.dq_h = b_.tensor("dq_h" + tag, shape_.ring_tokens * hq * d * shape_.activation_bytes,
                       MemCategory::kAttention);
  out.dkv_h =
      b_.tensor("dkv_h" + tag, shape_.ring_tokens * hkv * (d + dv) * shape_.activation_bytes,
                MemCategory::kAttention);
  std::int64_t ws = flash_bwd_workspace(shape_.ring_tokens, shape_.ring_tokens, hq, hkv);
  if (r_.attention_kernel == "sdpa" && hkv < hq) {
    ws += shape_.ring_tokens * hq * (d + dv) *
          shape_.activation_bytes;  // gradient of the repeated K/V before the group sum
  }
  ws += ledger_bytes(LedgerSite::kCoreBackward);
  compute("attn_bwd" + tag, OpKind::kAttentionBwd,
          with_calls(with_traffic(masked(cost_.attention_bwd({shape_.ring_tokens,
                                                              shape_.ring_tokens, hq, d, true, dv}),
                                         whole_share()),
                                  LedgerSite::kCoreBackward),
                     LedgerSite::kCoreBackward),
          {do_h, q_h, kv_h, o_h, lse}, {out.dq_h, out.dkv_h}, {}, ws, MemCategory::kAttention);
  if (const std::int64_t finish = ledger_bytes(LedgerSite::kGradFinish); finish > 0) {
    // The implementation's own gradient copies and casts after the kernel, while it still holds
    // what it saved (and the kernel's dQ/dK/dV, its inputs): new dQ and dK/dV come out. Time: the
    // traffic of its rows' kernels, then the casts back to the activation dtype that write the
    // outputs (fp32 read: twice the outputs' bytes, the outputs written: 3× their bytes).
    const std::int64_t dq_bytes = shape_.ring_tokens * hq * d * shape_.activation_bytes;
    const std::int64_t dkv_bytes = shape_.ring_tokens * hkv * (d + dv) * shape_.activation_bytes;
    CoreBackward cast;
    cast.dq_h = b_.tensor("dq_cast" + tag, dq_bytes, MemCategory::kAttention);
    cast.dkv_h = b_.tensor("dkv_cast" + tag, dkv_bytes, MemCategory::kAttention);
    compute("grad_finish" + tag, OpKind::kElementwise,
            with_calls(with_traffic(mem(3 * (dq_bytes + dkv_bytes)), LedgerSite::kGradFinish),
                       LedgerSite::kGradFinish),
            {out.dq_h, out.dkv_h, do_h, q_h, kv_h, o_h, lse}, {cast.dq_h, cast.dkv_h}, {}, finish,
            MemCategory::kAttention);
    return cast;
  }
  return out;
}

// Forward ring steps of positions whose attention differs (packed documents), on the
// representative rank. Position i's attention of step k starts when its attention of step k − 1
// has ended and the block of step k has arrived; the send of step k (the block of step k + 1)
// starts when every position's attention of step k − 1 has ended (the collective's rendezvous)
// and the send before it has ended. With a_ik the attention times and c a send:
//   F_i0 = a_i0,  F_ik = max(F_i(k−1), E_(k−1)) + a_ik,  T_k = max_i F_ik,
//   E_0 = c,      E_k = max(T_(k−1), E_(k−1)) + c.
// A position slow at one step and fast at the next catches up while the others wait for their
// block: the step is not the slowest position's, step by step. The representative rank, whose
// chain is F_k = max(F_(k−1), E_(k−1)) + d_k with the same sends, reaches T_k at every step with
//   d_0 = T_0,  d_k = T_k − max(T_(k−1), E_(k−1)).
// The send times are the nominal ones (nothing beside the ring shares the link); every position
// simulated gives the engine's own answer (tested within a few percent).
double StepBuilder::ring_forward_lockstep_s(int step,
                                            const std::function<double(int, int)>& attention_s,
                                            double send_s) const {
  const auto ring = static_cast<int>(shape_.ring);
  std::vector<double> finish(static_cast<std::size_t>(ring), 0.0);
  double t_prev = 0.0, e_prev = 0.0;
  for (int k = 0; k <= step; ++k) {
    double t = 0.0;
    for (int i = 0; i < ring; ++i) {
      double& f = finish[static_cast<std::size_t>(i)];
      f = (k == 0 ? 0.0 : std::max(f, e_prev)) + attention_s(i, k);
      t = std::max(t, f);
    }
    if (k == step) {
      return k == 0 ? t : t - std::max(t_prev, e_prev);
    }
    e_prev = (k == 0 ? 0.0 : std::max(t_prev, e_prev)) + send_s;
    t_prev = t;
  }
  return 0.0;
}

std::vector<double> StepBuilder::ring_step_times(
    const RingSegment& seg, std::int64_t hq, bool backward, double* flops, double send_s) const {
  const int step = seg.first;
  const auto steps = static_cast<double>(seg.steps);  // a merged segment's steps are alike
  const std::int64_t d = shape_.qk_head_dim, dv = shape_.v_head_dim;
  const bool zigzag = in_.parallel.ring_layout == models::RingLayout::kZigzag;
  // Online-softmax merge of the block into the fp32 accumulator (forward), or the addition of the
  // block's dQ/dK/dV into theirs (backward): read and write fp32 accumulators.
  const double merge_s =
      cost_.memory_bound(3 * shape_.ring_tokens * hq * (backward ? d : dv) * kFp32Bytes).time_s;
  auto cost = [&](const AttentionShape& shape) {
    return backward ? cost_.attention_bwd(shape) : cost_.attention_fwd(shape);
  };
  // The three shapes a step can have: causal (step 0), "source before me", "source after me".
  const KernelCost diagonal = cost({shape_.ring_tokens, shape_.ring_tokens, hq, d, true, dv});
  const KernelCost before =
      zigzag ? cost({shape_.ring_tokens, shape_.ring_tokens / 2, hq, d, false, dv})
             : cost({shape_.ring_tokens, shape_.ring_tokens, hq, d, false, dv});
  const KernelCost after =
      zigzag ? cost({shape_.ring_tokens / 2, shape_.ring_tokens, hq, d, false, dv}) : KernelCost{};
  const auto ring = static_cast<int>(shape_.ring);
  auto shape_at = [&](int i, int k) -> KernelCost {
    if (k == 0)
      return diagonal;
    const int j = ((i - k) % ring + ring) % ring;
    return j < i ? before : after;
  };
  auto of_position = [&](int i) { return shape_at(i, step); };
  auto seconds = [&](const KernelCost& k) { return k.flops > 0 ? k.time_s + merge_s : 0.0; };
  const DocumentWork& docs = in_.documents;
  if (!docs.empty()) {
    // Packed documents: position i's kernel at step k scaled by its pair's share (steps are not
    // merged).
    auto seconds_at = [&](int i, int k) {
      const KernelCost c = shape_at(i, k);
      return c.flops > 0 ? c.time_s * docs.step_factor(i, k) + merge_s : 0.0;
    };
    if (flops != nullptr) {
      const int i = b_.position(Group::kRing, 0);
      *flops = of_position(i).flops * docs.step_factor(i, step);
    }
    if (b_.simulated_ranks() < b_.ranks()) {
      if (backward) {
        // Step k's attention reads the dK/dV hop of step k − 1, a collective after every
        // position's attention of that step: each step lasts as long as its slowest position.
        double slowest = 0.0;
        for (int i = 0; i < ring; ++i) {
          slowest = std::max(slowest, seconds_at(i, step));
        }
        return {slowest};
      }
      return {ring_forward_lockstep_s(step, seconds_at, send_s)};
    }
    std::vector<double> t;
    for (int rank = 0; rank < b_.simulated_ranks(); ++rank) {
      t.push_back(seconds_at(b_.position(Group::kRing, rank), step));
    }
    return t;
  }
  if (flops != nullptr) {
    *flops = steps * of_position(b_.position(Group::kRing, 0)).flops;
  }
  if (b_.simulated_ranks() < b_.ranks()) {
    // Representative rank: each step takes as long as its slowest ring position (the rendezvous
    // of the next collective waits for it). Exact for the contiguous layout, whose slowest rank
    // computes every step; for zigzag the two shapes differ by a few percent.
    // At step k ≥ 1 positions i ≥ k receive from a lower position and i < k from a higher one.
    double slowest = seconds(diagonal);
    if (step > 0) {
      slowest = zigzag ? std::max(seconds(before), seconds(after)) : seconds(before);
    }
    return {steps * slowest};
  }
  std::vector<double> t;
  for (int rank = 0; rank < b_.simulated_ranks(); ++rank) {
    t.push_back(steps * seconds(of_position(b_.position(Group::kRing, rank))));
  }
  return t;
}

std::vector<RingSegment> StepBuilder::ring_segments() const {
  const auto steps = static_cast<int>(shape_.ring);
  std::vector<RingSegment> out;
  if (merge_ring_ && steps >= 4) {
    return {{0, 1}, {1, steps - 2}, {steps - 1, 1}};
  }
  for (int k = 0; k < steps; ++k) {
    out.push_back({k, 1});
  }
  return out;
}

namespace {

/// "7" for one step, "1..6" for a merged run of steps.
std::string step_label(const RingSegment& seg) {
  return seg.steps == 1 ? fmt::format("{}", seg.first)
                        : fmt::format("{}..{}", seg.first, seg.first + seg.steps - 1);
}

}  // namespace

CoreForward StepBuilder::ring_forward(
    const std::string& tag, TensorSet q_h, TensorSet kv_h, std::int64_t hq, std::int64_t hkv) {
  const std::int64_t d = shape_.qk_head_dim, dv = shape_.v_head_dim;
  const std::int64_t kv_bytes = shape_.ring_tokens * hkv * (d + dv) * shape_.activation_bytes;
  TensorSet acc =
      b_.tensor("ring_out_acc" + tag,
                shape_.ring_tokens * hq * dv * acc_bytes_ + hq * shape_.ring_tokens * kFp32Bytes,
                MemCategory::kAttention);
  TensorSet cur = kv_h;
  const auto steps = static_cast<int>(shape_.ring);
  // Per-segment names, interned once per build (every layer asks for the same ones).
  const std::int32_t series = b_.name_series("ring_forward" + tag);
  auto ring_name = [&](int step, int slot, const auto& make) {
    return b_.series_name(series, 3 * step + slot, make);
  };
  OpSet previous;  // the attention op of the previous segment
  for (const RingSegment& seg : ring_segments()) {
    const int k = seg.first;
    const int last = seg.first + seg.steps - 1;
    TensorSet next;
    if (last + 1 < steps) {
      // The sends of the segment's steps: the block of step last + 1 arrives when it ends. Issued
      // at the step's start, the send waits for the attention queued before it (NCCL's stream
      // waits for the caller's stream), so a step's send and attention start together.
      next = b_.tensor(ring_name(k, 0, [&] { return fmt::format("kv_block{}{}", last + 1, tag); }),
                       kv_bytes, MemCategory::kAttention);
      OpSpec& send = next_spec(
          Name::interned(ring_name(
              k, 1, [&] { return fmt::format("ring_send_kv{}{}", step_label(seg), tag); })),
          Stream::kComm, OpKind::kElementwise);
      send.inputs.push_back(cur);
      send.outputs.push_back(next);
      if (previous.valid()) {
        send.deps.push_back(previous);
      }
      b_.collective(send, Group::kRing, models::Collective::kSendRecv, cost_,
                    kv_bytes / shape_.activation_bytes * r_.cp_comm_bytes, seg.steps);
    }
    OpSpec& step = next_spec(
        Name::interned(ring_name(
            k, 2, [&] { return fmt::format("ring_attn_fwd{}{}", step_label(seg), tag); })),
        Stream::kCompute, OpKind::kAttentionFwd);
    step.time_s_per_rank =
        ring_step_times(seg, hq, false, &step.flops,
                        cost_
                            .collective(models::Collective::kSendRecv, b_.span_of(Group::kRing),
                                        b_.group_size(Group::kRing),
                                        kv_bytes / shape_.activation_bytes * r_.cp_comm_bytes)
                            .time_s());
    step.host_calls = seg.steps;  // one attention call per step (Op::host_calls)
    add_step_traffic(step.time_s_per_rank, LedgerSite::kRingForwardStep, seg.steps);
    step.inputs.push_back(q_h);
    step.inputs.push_back(cur);
    if (k == 0) {
      step.outputs.push_back(acc);
    } else {
      step.inputs.push_back(acc);
    }
    // The block's own output and LSE before they are merged, and what the implementation's merge
    // and send add.
    // Kept per earlier step: at step k the scheme itself holds blocks k and k + 1 and one merged
    // output, so code that keeps every step's block and output holds k − 1 more of each.
    step.workspace_bytes = shape_.ring_tokens * hq * dv * shape_.activation_bytes +
                           hq * shape_.ring_tokens * kFp32Bytes +
                           ledger_bytes(LedgerSite::kRingForwardStep) +
                           std::max(last - 1, 0) * ledger_bytes(LedgerSite::kRingForwardHeld);
    step.workspace_category = MemCategory::kAttention;
    previous = b_.op(step);
    cur = next;
  }
  CoreForward out;
  out.o_h = b_.tensor("attn_out_h" + tag, shape_.ring_tokens * hq * dv * shape_.activation_bytes,
                      MemCategory::kAttention);
  out.lse = b_.tensor("lse" + tag, hq * shape_.ring_tokens * kFp32Bytes, MemCategory::kAttention);
  compute("ring_out_cast" + tag, OpKind::kElementwise,
          mem(shape_.ring_tokens * hq * dv * (acc_bytes_ + shape_.activation_bytes)), {acc},
          {out.o_h, out.lse}, {}, (steps - 1) * ledger_bytes(LedgerSite::kRingForwardHeld),
          MemCategory::kAttention);
  return out;
}

CoreBackward StepBuilder::ring_backward(const std::string& tag,
                                        TensorSet q_h,
                                        TensorSet kv_h,
                                        TensorSet o_h,
                                        TensorSet lse,
                                        TensorSet do_h,
                                        std::int64_t hq,
                                        std::int64_t hkv) {
  const std::int64_t d = shape_.qk_head_dim, dv = shape_.v_head_dim;
  const std::int64_t kv_bytes = shape_.ring_tokens * hkv * (d + dv) * shape_.activation_bytes;
  const std::int64_t dkv_acc_bytes = shape_.ring_tokens * hkv * (d + dv) * acc_bytes_;
  TensorSet dq_acc = b_.tensor("ring_dq_acc" + tag, shape_.ring_tokens * hq * d * acc_bytes_,
                               MemCategory::kAttention);
  TensorSet dkv = b_.tensor("ring_dkv_acc0" + tag, dkv_acc_bytes, MemCategory::kAttention);
  TensorSet cur = kv_h;
  const auto steps = static_cast<int>(shape_.ring);
  // Per-segment names, interned once per build (every layer asks for the same ones).
  const std::int32_t series = b_.name_series("ring_backward" + tag);
  auto ring_name = [&](int step, int slot, const auto& make) {
    return b_.series_name(series, 5 * step + slot, make);
  };
  // A step: the send of the next K/V block and the attention backward start together (the send
  // follows the previous step's dK/dV hop on the comm stream, the attention reads its result);
  // the dK/dV hop follows both.
  for (const RingSegment& seg : ring_segments()) {
    const int k = seg.first;
    const int last = seg.first + seg.steps - 1;
    TensorSet next;
    if (last + 1 < steps) {
      next = b_.tensor(
          ring_name(k, 0, [&] { return fmt::format("kv_block{}(bwd){}", last + 1, tag); }),
          kv_bytes, MemCategory::kAttention);
      OpSpec& send = next_spec(
          Name::interned(ring_name(
              k, 1, [&] { return fmt::format("ring_send_kv{}(bwd){}", step_label(seg), tag); })),
          Stream::kComm, OpKind::kElementwise);
      send.inputs.push_back(cur);
      send.outputs.push_back(next);
      b_.collective(send, Group::kRing, models::Collective::kSendRecv, cost_,
                    kv_bytes / shape_.activation_bytes * r_.cp_comm_bytes, seg.steps);
    }
    OpSpec& step = next_spec(
        Name::interned(ring_name(
            k, 2, [&] { return fmt::format("ring_attn_bwd{}{}", step_label(seg), tag); })),
        Stream::kCompute, OpKind::kAttentionBwd);
    step.time_s_per_rank = ring_step_times(seg, hq, true, &step.flops);
    step.host_calls = seg.steps;
    add_step_traffic(step.time_s_per_rank, LedgerSite::kRingBackwardStep, seg.steps);
    step.inputs.assign({q_h, cur, o_h, lse, do_h});
    if (k == 0) {
      step.outputs.assign({dq_acc, dkv});
    } else {
      step.inputs.push_back(dq_acc);
      step.inputs.push_back(dkv);
    }
    // FlashAttention's fp32 dQ accumulator and row sums, and the block's dQ, dK, dV.
    step.workspace_bytes =
        flash_bwd_workspace(shape_.ring_tokens, shape_.ring_tokens, hq, hkv) +
        shape_.ring_tokens * (hq * d + hkv * (d + dv)) * shape_.activation_bytes +
        ledger_bytes(LedgerSite::kRingBackwardStep);
    step.workspace_category = MemCategory::kAttention;
    const OpSet computed = b_.op(step);
    // The dK/dV accumulator travels with its K/V block: one hop after every step brings it home.
    TensorSet dkv_next =
        b_.tensor(ring_name(k, 3, [&] { return fmt::format("ring_dkv_acc{}{}", last + 1, tag); }),
                  dkv_acc_bytes, MemCategory::kAttention);
    OpSpec& send = next_spec(
        Name::interned(ring_name(
            k, 4, [&] { return fmt::format("ring_send_dkv{}{}", step_label(seg), tag); })),
        Stream::kComm, OpKind::kElementwise);
    send.inputs.push_back(dkv);
    send.outputs.push_back(dkv_next);
    send.deps.push_back(computed);
    b_.collective(send, Group::kRing, models::Collective::kSendRecv, cost_, dkv_acc_bytes,
                  seg.steps);
    dkv = dkv_next;
    cur = next;
  }
  CoreBackward out;
  if (acc_bytes_ == shape_.activation_bytes) {
    // Accumulated in the activations' dtype: the accumulators are the gradients (no cast).
    out.dq_h = dq_acc;
    out.dkv_h = dkv;
    return out;
  }
  out.dq_h = b_.tensor("dq_h" + tag, shape_.ring_tokens * hq * d * shape_.activation_bytes,
                       MemCategory::kAttention);
  out.dkv_h = b_.tensor("dkv_h" + tag, kv_bytes, MemCategory::kAttention);
  compute(
      "ring_grad_cast" + tag, OpKind::kElementwise,
      mem(shape_.ring_tokens * (hq * d + hkv * (d + dv)) * (acc_bytes_ + shape_.activation_bytes)),
      {dq_acc, dkv}, {out.dq_h, out.dkv_h});
  return out;
}

namespace {

// Causal calls of one rank's queries against the gathered prefix (bottom-right aligned).
std::vector<AttentionShape> allgather_calls(const models::ParallelConfig& p,
                                            int i,
                                            std::int64_t n,
                                            std::int64_t ring,
                                            std::int64_t hq,
                                            std::int64_t d,
                                            std::int64_t dv) {
  if (p.ring_layout == models::RingLayout::kZigzag) {
    const std::int64_t c = n / (2 * ring);
    return {AttentionShape{c, (i + 1) * c, hq, d, true, dv},
            AttentionShape{c, (2 * ring - i) * c, hq, d, true, dv}};
  }
  const std::int64_t s = n / ring;
  return {AttentionShape{s, (i + 1) * s, hq, d, true, dv}};
}

}  // namespace

std::vector<double> StepBuilder::allgather_times(std::int64_t hq,
                                                 bool backward,
                                                 double* flops) const {
  const std::int64_t d = shape_.qk_head_dim, dv = shape_.v_head_dim;
  auto seconds = [&](int position, double* f) {
    double t = 0.0;
    const double share = in_.documents.empty() ? 1.0 : in_.documents.position_factor(position);
    for (const AttentionShape& s :
         allgather_calls(in_.parallel, position, shape_.seq_tokens, shape_.ring, hq, d, dv)) {
      // A windowed block: each call's queries see only the window's keys of the gathered prefix
      // (TransformerEngine's all_gather and FlexAttention's CP compute only those; the gather
      // itself is whole).
      const double window = layer_window_tokens_ > 0
                                ? models::window_share(s.q_len, s.kv_len, layer_window_tokens_)
                                : 1.0;
      const KernelCost k =
          masked(backward ? cost_.attention_bwd(s) : cost_.attention_fwd(s), share * window);
      t += k.time_s;
      if (f != nullptr)
        *f += k.flops;
    }
    return t;
  };
  *flops = 0.0;
  (void)seconds(b_.position(Group::kRing, 0), flops);
  if (b_.simulated_ranks() < b_.ranks()) {
    double slowest = 0.0;  // representative rank: the slowest position (see ring_step_times)
    for (int i = 0; i < static_cast<int>(shape_.ring); ++i)
      slowest = std::max(slowest, seconds(i, nullptr));
    return {slowest};
  }
  std::vector<double> t;
  for (int rank = 0; rank < b_.simulated_ranks(); ++rank) {
    t.push_back(seconds(b_.position(Group::kRing, rank), nullptr));
  }
  return t;
}

CoreForward StepBuilder::allgather_forward(
    const std::string& tag, TensorSet q_h, TensorSet kv_h, std::int64_t hq, std::int64_t hkv) {
  const std::int64_t d = shape_.qk_head_dim, dv = shape_.v_head_dim;
  const std::int64_t full_bytes = shape_.seq_tokens * hkv * (d + dv) * shape_.activation_bytes;
  TensorSet kv_full = b_.tensor("kv_gathered" + tag, full_bytes, MemCategory::kAttention);
  OpSpec& ag = next_spec("allgather_kv" + tag, Stream::kComm, OpKind::kElementwise);
  ag.inputs.push_back(kv_h);
  ag.outputs.push_back(kv_full);
  b_.collective(ag, Group::kRing, models::Collective::kAllGather, cost_,
                full_bytes / shape_.activation_bytes * r_.cp_comm_bytes);
  CoreForward out;
  out.o_h = b_.tensor("attn_out_h" + tag, shape_.ring_tokens * hq * dv * shape_.activation_bytes,
                      MemCategory::kAttention);
  out.lse = b_.tensor("lse" + tag, hq * shape_.ring_tokens * kFp32Bytes, MemCategory::kAttention);
  OpSpec& fa = next_spec("attn_fwd" + tag, Stream::kCompute, OpKind::kAttentionFwd);
  fa.time_s_per_rank = allgather_times(hq, false, &fa.flops);
  fa.inputs.assign({q_h, kv_full});
  fa.outputs.assign({out.o_h, out.lse});
  b_.op(fa);
  return out;
}

CoreBackward StepBuilder::allgather_backward(const std::string& tag,
                                             TensorSet q_h,
                                             TensorSet kv_h,
                                             TensorSet o_h,
                                             TensorSet lse,
                                             TensorSet do_h,
                                             std::int64_t hq,
                                             std::int64_t hkv) {
  const std::int64_t d = shape_.qk_head_dim, dv = shape_.v_head_dim;
  const std::int64_t full_bytes = shape_.seq_tokens * hkv * (d + dv) * shape_.activation_bytes;
  TensorSet kv_full = b_.tensor("kv_gathered(bwd)" + tag, full_bytes, MemCategory::kAttention);
  OpSpec& ag = next_spec("allgather_kv(bwd)" + tag, Stream::kComm, OpKind::kElementwise);
  ag.inputs.push_back(kv_h);
  ag.outputs.push_back(kv_full);
  b_.collective(ag, Group::kRing, models::Collective::kAllGather, cost_,
                full_bytes / shape_.activation_bytes * r_.cp_comm_bytes);
  CoreBackward out;
  out.dq_h = b_.tensor("dq_h" + tag, shape_.ring_tokens * hq * d * shape_.activation_bytes,
                       MemCategory::kAttention);
  TensorSet dkv_full = b_.tensor("dkv_full" + tag, full_bytes, MemCategory::kAttention);
  OpSpec& fa = next_spec("attn_bwd" + tag, Stream::kCompute, OpKind::kAttentionBwd);
  fa.time_s_per_rank = allgather_times(hq, true, &fa.flops);
  fa.inputs.assign({do_h, q_h, kv_full, o_h, lse});
  fa.outputs.assign({out.dq_h, dkv_full});
  fa.workspace_bytes = flash_bwd_workspace(shape_.ring_tokens, shape_.seq_tokens, hq, hkv);
  fa.workspace_category = MemCategory::kAttention;
  b_.op(fa);
  out.dkv_h =
      b_.tensor("dkv_h" + tag, shape_.ring_tokens * hkv * (d + dv) * shape_.activation_bytes,
                MemCategory::kAttention);
  OpSpec& rs = next_spec("reducescatter_dkv" + tag, Stream::kComm, OpKind::kElementwise);
  rs.inputs.push_back(dkv_full);
  rs.outputs.push_back(out.dkv_h);
  b_.collective(rs, Group::kRing, models::Collective::kReduceScatter, cost_,
                full_bytes / shape_.activation_bytes * r_.cp_comm_bytes);
  return out;
}

}  // namespace cpsim::sim::detail
