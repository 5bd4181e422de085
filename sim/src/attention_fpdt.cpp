// FPDT / Ulysses-Offload (reference/papers.md §2; DeepSpeed fpdt_layer.py). Ulysses over chunks:
// the global sequence is cut into nc = N / K chunks of K tokens (the chunk size is global); each
// rank holds K/C tokens of every chunk, so after the all-to-all chunk i is a contiguous block of
// K tokens with H/C heads on every rank.
// Forward, chunk by chunk: project and all-to-all chunk i, attend its queries to the K/V of chunks
// j ≤ i (online softmax: causal at j = i, full before), all-to-all the output back. With
// offloading, every chunk's K/V goes to pinned host memory as soon as it is made and comes back
// for the later chunks through two GPU buffers (double buffering); the chunks saved for backward
// (Q, output + LSE, dOut) are offloaded too and dQ accumulates in pinned fp32 host buffers.
// Backward: K/V chunks outer, query chunks inner (i ≥ j): the query chunk's Q, output, dOut, LSE
// and fp32 dQ come from host, attention backward adds into the GPU's fp32 dK/dV of chunk j, dQ goes
// back to host. dK/dV of chunk j are complete after its inner loop, dQ of chunk j after outer
// iteration j: both are then sent back (all-to-all) into the projection backward.
//
// Granularity: the blocks of one inner loop share one shape, so each inner loop is simulated as
// one fetch of its first block, one fetch of the rest (on the copy stream, sharing PCIe with the
// offloads), one compute op for all its blocks and a join that waits for both: the loop lasts
// max(compute, transfers) as double buffering makes it, and two block buffers are live, with O(nc)
// ops per layer instead of O(nc²).
#include <fmt/format.h>

#include "cpsim/models/units.hpp"

#include "step_builder.hpp"

namespace cpsim::sim::detail {

void StepBuilder::fpdt_forward(SavedLayer& sv, TensorSet params, bool grad) {
  const std::int64_t h = m_.hidden, d = m_.head_dim;
  const std::int64_t kv = layout_.kv_heads_eff;
  const std::int64_t hq = m_.heads / u_, hkv = kv / u_;
  const std::int64_t chunk = in_.parallel.fpdt_chunk;  // K, global tokens
  const std::int64_t nc = n_ / chunk;
  const std::int64_t lc = s_ / nc;  // local tokens of one chunk
  const bool offload = in_.parallel.fpdt_offload;
  const std::int64_t q_local_bytes = lc * m_.heads * d * ab_;
  const std::int64_t kv_local_bytes = lc * 2 * kv * d * ab_;
  const std::int64_t q_h_bytes = chunk * hq * d * ab_;
  const std::int64_t kv_h_bytes = chunk * 2 * hkv * d * ab_;
  const std::int64_t lse_bytes = hq * chunk * kFp32Bytes;
  const KernelCost merge = mem(3 * chunk * hq * d * kFp32Bytes);
  const KernelCost full_block = plus(cost_.attention_fwd({chunk, chunk, hq, d, false}), merge);
  const KernelCost diag_block = plus(cost_.attention_fwd({chunk, chunk, hq, d, true}), merge);

  sv.o = b_.tensor("fpdt_out", s_ * m_.heads * d * ab_, MemCategory::kAttention);
  const OpSet alloc = compute("fpdt_alloc_out", OpKind::kElementwise, {0.0, 0.0}, {}, {sv.o});
  std::vector<OpSet> fills;
  std::vector<TensorSet> kv_store;  // per chunk: on host when offloading, else on the GPU
  for (std::int64_t i = 0; i < nc; ++i) {
    const std::string tag = fmt::format("[c{}]", i);
    TensorSet q = b_.tensor("q" + tag, q_local_bytes, MemCategory::kAttention);
    TensorSet kvp = b_.tensor("kv" + tag, kv_local_bytes, MemCategory::kAttention);
    compute("qkv_proj" + tag, OpKind::kGemm, gemm(lc, (m_.heads + 2 * m_.kv_heads) * d, h),
            {sv.xn, params}, {q, kvp});
    TensorSet q_r = b_.tensor("q_rope" + tag, q_local_bytes, MemCategory::kAttention);
    TensorSet kv_r = b_.tensor("kv_rope" + tag, kv_local_bytes, MemCategory::kAttention);
    compute("rope" + tag, OpKind::kElementwise, mem(2 * (q_local_bytes + kv_local_bytes)), {q, kvp},
            {q_r, kv_r});
    TensorSet q_h = exchange("a2a_q" + tag, q_r, q_local_bytes, MemCategory::kAttention);
    TensorSet kv_h = exchange("a2a_kv" + tag, kv_r, kv_local_bytes, MemCategory::kAttention);
    if (offload) {
      TensorSet host = b_.tensor("kv_host" + tag, kv_h_bytes, MemCategory::kAttention, true);
      host_copy("offload_kv" + tag, false, kv_h_bytes, kv_h, host);
      kv_store.push_back(host);
    } else {
      kv_store.push_back(kv_h);
    }
    // Online softmax over the visible K/V chunks into an fp32 output + LSE accumulator.
    TensorSet acc = b_.tensor("fpdt_acc" + tag, chunk * hq * d * kFp32Bytes + lse_bytes,
                              MemCategory::kAttention);
    OpSet join;
    if (i > 0) {
      std::vector<TensorSet> ins{q_h};
      TensorSet rest;
      OpSet fetch_rest;
      if (offload) {
        TensorSet first = b_.tensor("kv_buffer0" + tag, kv_h_bytes, MemCategory::kAttention);
        const OpSet fetch_first =
            host_copy("fetch_kv0" + tag, true, kv_h_bytes, kv_store[0], first);
        ins.push_back(first);
        if (i > 1) {
          rest = b_.tensor("kv_buffer1" + tag, kv_h_bytes, MemCategory::kAttention);
          OpSpec s;
          s.name = fmt::format("fetch_kv1..{}{}", i - 1, tag);
          s.stream = Stream::kH2D;
          s.kind = OpKind::kCopyH2D;
          s.transfer_bytes = (i - 1) * kv_h_bytes;
          s.time_s = cost_.host_copy_s(s.transfer_bytes, true);
          s.inputs.assign(kv_store.begin() + 1, kv_store.begin() + i);
          s.outputs = {rest};
          s.deps = {fetch_first};
          fetch_rest = b_.op(s);
        }
      } else {
        ins.insert(ins.end(), kv_store.begin(), kv_store.begin() + i);
      }
      const OpSet prev =
          compute(fmt::format("attn_fwd[k0..{}]{}", i - 1, tag), OpKind::kAttentionFwd,
                  times(full_block, static_cast<double>(i)), ins, {acc}, {},
                  chunk * hq * d * ab_ + lse_bytes, MemCategory::kAttention);
      join = compute("fetch_join" + tag, OpKind::kElementwise, {0.0, 0.0}, {rest}, {},
                     {prev, fetch_rest});
    }
    compute("attn_fwd[diag]" + tag, OpKind::kAttentionFwd, diag_block,
            i > 0 ? std::vector<TensorSet>{q_h, kv_h, acc} : std::vector<TensorSet>{q_h, kv_h},
            i > 0 ? std::vector<TensorSet>{} : std::vector<TensorSet>{acc}, {join},
            chunk * hq * d * ab_ + lse_bytes, MemCategory::kAttention);
    TensorSet o_h = b_.tensor("attn_out_h" + tag, q_h_bytes, MemCategory::kAttention);
    TensorSet lse = b_.tensor("lse" + tag, lse_bytes, MemCategory::kAttention);
    compute("fpdt_out_cast" + tag, OpKind::kElementwise, mem(chunk * hq * d * (kFp32Bytes + ab_)),
            {acc}, {o_h, lse});
    TensorSet o_local = exchange("a2a_out" + tag, o_h, q_local_bytes, MemCategory::kAttention);
    fills.push_back(compute("fill_out" + tag, OpKind::kElementwise, mem(2 * q_local_bytes),
                            {o_local}, {}, {alloc}));
    if (grad) {
      // Saved for backward: Q, output and LSE of the chunk (K/V are already stored).
      if (offload) {
        TensorSet q_host = b_.tensor("q_host" + tag, q_h_bytes, MemCategory::kAttention, true);
        host_copy("offload_q" + tag, false, q_h_bytes, q_h, q_host);
        TensorSet o_host =
            b_.tensor("out_host" + tag, q_h_bytes + lse_bytes, MemCategory::kAttention, true);
        OpSpec copy;
        copy.name = "offload_out" + tag;
        copy.stream = Stream::kD2H;
        copy.kind = OpKind::kCopyD2H;
        copy.transfer_bytes = q_h_bytes + lse_bytes;
        copy.time_s = cost_.host_copy_s(q_h_bytes + lse_bytes, false);
        copy.inputs = {o_h, lse};
        copy.outputs = {o_host};
        b_.op(copy);
        sv.chunk_q.push_back(q_host);
        sv.chunk_o.push_back(o_host);
        sv.chunk_lse.push_back(o_host);
      } else {
        sv.chunk_q.push_back(q_h);
        sv.chunk_o.push_back(o_h);
        sv.chunk_lse.push_back(lse);
      }
    }
  }
  if (grad) {
    sv.chunk_kv = kv_store;
  }
  // The output projection waits for every chunk's output to be written.
  sv.attn_ready = compute("fpdt_out_ready", OpKind::kElementwise, {0.0, 0.0}, {}, {}, fills);
}

InputGrad StepBuilder::fpdt_backward(const SavedLayer& sv,
                                     TensorSet d_o,
                                     TensorSet params,
                                     TensorSet grads) {
  const std::int64_t h = m_.hidden, d = m_.head_dim;
  const std::int64_t kv = layout_.kv_heads_eff;
  const std::int64_t hq = m_.heads / u_, hkv = kv / u_;
  const std::int64_t chunk = in_.parallel.fpdt_chunk;
  const std::int64_t nc = n_ / chunk;
  const std::int64_t lc = s_ / nc;
  const bool offload = in_.parallel.fpdt_offload;
  const std::int64_t q_local_bytes = lc * m_.heads * d * ab_;
  const std::int64_t kv_local_bytes = lc * 2 * kv * d * ab_;
  const std::int64_t q_h_bytes = chunk * hq * d * ab_;
  const std::int64_t kv_h_bytes = chunk * 2 * hkv * d * ab_;
  const std::int64_t lse_bytes = hq * chunk * kFp32Bytes;
  const std::int64_t dq_bytes = chunk * hq * d * kFp32Bytes;
  const std::int64_t dkv_acc_bytes = chunk * 2 * hkv * d * kFp32Bytes;
  const KernelCost add = mem(3 * (dq_bytes + dkv_acc_bytes));
  const KernelCost full_block = plus(cost_.attention_bwd({chunk, chunk, hq, d, false}), add);
  const KernelCost diag_block = plus(cost_.attention_bwd({chunk, chunk, hq, d, true}), add);
  // FlashAttention workspace (fp32 dQ accumulator, row sums) and the block's dK/dV.
  const std::int64_t ws = dq_bytes + hq * chunk * kFp32Bytes + kv_h_bytes;
  const auto at = [](const std::vector<TensorSet>& v, std::int64_t i) {
    return v[static_cast<std::size_t>(i)];
  };

  TensorSet dxn = b_.tensor("dxn", s_ * h * ab_, MemCategory::kOther);
  std::vector<OpSet> dx_writes{
      compute("fpdt_alloc_dx", OpKind::kElementwise, mem(s_ * h * ab_), {}, {dxn})};
  // dQ of every chunk accumulates in fp32: pinned host buffers when offloading, else on the GPU.
  TensorSet dq_all = b_.tensor("dq_fp32_all", nc * dq_bytes, MemCategory::kAttention, offload);
  compute("fpdt_alloc_dq", OpKind::kElementwise, {0.0, 0.0}, {}, {dq_all});
  // dOut of every chunk to head-sharded layout (kept on host when offloading).
  std::vector<TensorSet> dout(static_cast<std::size_t>(nc));
  for (std::int64_t i = 0; i < nc; ++i) {
    const std::string tag = fmt::format("[c{}]", i);
    TensorSet slice = b_.tensor("dout_slice" + tag, q_local_bytes, MemCategory::kAttention);
    compute("slice_dout" + tag, OpKind::kElementwise, mem(2 * q_local_bytes), {d_o}, {slice});
    TensorSet do_h = exchange("a2a_dout" + tag, slice, q_local_bytes, MemCategory::kAttention);
    if (offload) {
      TensorSet host = b_.tensor("dout_host" + tag, q_h_bytes, MemCategory::kAttention, true);
      host_copy("offload_dout" + tag, false, q_h_bytes, do_h, host);
      dout[static_cast<std::size_t>(i)] = host;
    } else {
      dout[static_cast<std::size_t>(i)] = do_h;
    }
  }
  for (std::int64_t j = 0; j < nc; ++j) {
    const std::string ktag = fmt::format("[k{}]", j);
    const std::int64_t pairs = nc - j;  // query chunks i = j .. nc-1
    TensorSet kv_j = at(sv.chunk_kv, j);
    if (offload) {
      TensorSet fetched = b_.tensor("kv_fetched(bwd)" + ktag, kv_h_bytes, MemCategory::kAttention);
      host_copy("fetch_kv(bwd)" + ktag, true, kv_h_bytes, kv_j, fetched);
      kv_j = fetched;
    }
    TensorSet dkv_acc = b_.tensor("dkv_acc" + ktag, dkv_acc_bytes, MemCategory::kAttention);
    TensorSet dq_block = b_.tensor("dq_block" + ktag, dq_bytes, MemCategory::kAttention);
    std::vector<TensorSet> ins{kv_j, dq_all};
    OpSet load_first, load_rest, dq_back;
    TensorSet rest;
    if (offload) {
      // Q, output + LSE, dOut and fp32 dQ of one query chunk per inner step.
      const std::int64_t bundle = 2 * q_h_bytes + lse_bytes + q_h_bytes + dq_bytes;
      TensorSet first = b_.tensor("q_chunk_buffer0" + ktag, bundle, MemCategory::kAttention);
      OpSpec s;
      s.name = "fetch_q0" + ktag;
      s.stream = Stream::kH2D;
      s.kind = OpKind::kCopyH2D;
      s.transfer_bytes = bundle;
      s.time_s = cost_.host_copy_s(bundle, true);
      s.inputs = {at(sv.chunk_q, j), at(sv.chunk_o, j), dout[static_cast<std::size_t>(j)], dq_all};
      s.outputs = {first};
      load_first = b_.op(s);
      ins.push_back(first);
      if (pairs > 1) {
        rest = b_.tensor("q_chunk_buffer1" + ktag, bundle, MemCategory::kAttention);
        OpSpec r = s;
        r.name = "fetch_q_rest" + ktag;
        r.transfer_bytes = (pairs - 1) * bundle;
        r.time_s = cost_.host_copy_s(r.transfer_bytes, true);
        r.inputs.clear();
        for (std::int64_t i = j + 1; i < nc; ++i) {
          r.inputs.insert(r.inputs.end(), {at(sv.chunk_q, i), at(sv.chunk_o, i),
                                           dout[static_cast<std::size_t>(i)]});
        }
        r.outputs = {rest};
        r.deps = {load_first};
        load_rest = b_.op(r);
      }
    } else {
      for (std::int64_t i = j; i < nc; ++i) {
        ins.insert(ins.end(), {at(sv.chunk_q, i), at(sv.chunk_o, i), at(sv.chunk_lse, i),
                               dout[static_cast<std::size_t>(i)]});
      }
    }
    const KernelCost k = plus(diag_block, times(full_block, static_cast<double>(pairs - 1)));
    const OpSet bwd =
        compute(fmt::format("attn_bwd[q{}..{}]{}", j, nc - 1, ktag), OpKind::kAttentionBwd, k, ins,
                {dkv_acc, dq_block}, {}, ws, MemCategory::kAttention);
    if (offload) {
      // dQ of each inner step goes back to its pinned buffer while the next step computes.
      OpSpec back;
      back.name = "offload_dq" + ktag;
      back.stream = Stream::kD2H;
      back.kind = OpKind::kCopyD2H;
      back.transfer_bytes = pairs * dq_bytes;
      back.time_s = cost_.host_copy_s(back.transfer_bytes, false);
      back.deps = {load_first};
      dq_back = b_.op(back);
    }
    const OpSet join = compute("inner_join" + ktag, OpKind::kElementwise, {0.0, 0.0},
                               {rest, dq_block}, {}, {bwd, load_rest, dq_back});
    // dK/dV of chunk j are complete: back to sequence sharding and into the K/V projection.
    TensorSet dkv_h = b_.tensor("dkv_h" + ktag, kv_h_bytes, MemCategory::kAttention);
    compute("dkv_cast" + ktag, OpKind::kElementwise, mem(chunk * 2 * hkv * d * (kFp32Bytes + ab_)),
            {dkv_acc}, {dkv_h}, {join});
    TensorSet dkv = exchange("a2a_dkv" + ktag, dkv_h, kv_local_bytes, MemCategory::kAttention);
    // dQ of chunk j received its last contribution in this outer iteration.
    TensorSet dq_j = b_.tensor("dq_final" + ktag, dq_bytes, MemCategory::kAttention);
    if (offload) {
      host_copy("fetch_dq" + ktag, true, dq_bytes, dq_all, dq_j, {join});
    } else {
      compute("dq_slice" + ktag, OpKind::kElementwise, mem(2 * dq_bytes), {dq_all}, {dq_j}, {join});
    }
    TensorSet dq_h = b_.tensor("dq_h" + ktag, q_h_bytes, MemCategory::kAttention);
    compute("dq_cast" + ktag, OpKind::kElementwise, mem(chunk * hq * d * (kFp32Bytes + ab_)),
            {dq_j}, {dq_h});
    TensorSet dqs = exchange("a2a_dq" + ktag, dq_h, q_local_bytes, MemCategory::kAttention);
    TensorSet dq_r = b_.tensor("dq_rope" + ktag, q_local_bytes, MemCategory::kAttention);
    TensorSet dkv_r = b_.tensor("dkv_rope" + ktag, kv_local_bytes, MemCategory::kAttention);
    compute("rope_bwd" + ktag, OpKind::kElementwise, mem(2 * (q_local_bytes + kv_local_bytes)),
            {dqs, dkv}, {dq_r, dkv_r});
    dx_writes.push_back(compute("qkv_proj_bwd" + ktag, OpKind::kGemm,
                                times(gemm(lc, (m_.heads + 2 * m_.kv_heads) * d, h), 2.0),
                                {dq_r, dkv_r, sv.xn, params, grads}, {}, {dx_writes.back()}));
  }
  return {dxn, dx_writes.back()};
}

}  // namespace cpsim::sim::detail
