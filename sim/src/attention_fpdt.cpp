// FPDT / Ulysses-Offload (reference/papers.md §2; DeepSpeed fpdt_layer.py). Ulysses over chunks:
// the global sequence is cut into nc = N / K chunks of K tokens (the chunk size is global); each
// rank holds K/C tokens of every chunk, so after the all-to-all chunk i is a contiguous block of
// K tokens with H/C heads on every rank.
// Forward, chunk by chunk: project and all-to-all chunk i, attend its queries to the K/V of chunks
// j ≤ i (online softmax: causal at j = i, full before), all-to-all the output back. With
// offloading, every chunk's K/V goes to pinned host memory as soon as it is made and comes back
// for the later chunks, double buffered on the copy streams (the fetch of block j+2 waits for the
// attention of block j); the chunks saved for backward (Q, output, LSE) are offloaded too.
// Backward: K/V chunks outer, query chunks inner (i ≥ j). For every pair the query chunk's Q,
// output, dOut, LSE and fp32 dQ are fetched from host, attention backward adds into the GPU's fp32
// dK/dV of chunk j, and dQ goes back to its pinned fp32 buffer. dK/dV of chunk j are complete after
// its inner loop, dQ of chunk j after outer iteration j: both are then sent back (all-to-all) into
// the projection backward. Without offloading (or with one chunk) everything stays on the GPU.
#include <fmt/format.h>

#include "cpsim/models/units.hpp"

#include "step_builder.hpp"

namespace cpsim::sim::detail {
namespace {

// Double buffering: a copy may start once the compute two steps back has finished.
std::vector<OpSet> two_back(const std::vector<OpSet>& compute_ops) {
  if (compute_ops.size() < 2) {
    return {};
  }
  return {compute_ops[compute_ops.size() - 2]};
}

}  // namespace

void StepBuilder::fpdt_forward(SavedLayer& sv, TensorSet params, bool grad) {
  const std::int64_t h = m_.hidden, d = m_.head_dim;
  const std::int64_t kv = layout_.kv_heads_eff;
  const std::int64_t hq = m_.heads / u_, hkv = kv / u_;
  const std::int64_t chunk = in_.parallel.fpdt_chunk;  // K, global tokens
  const std::int64_t nc = n_ / chunk;
  const std::int64_t lc = s_ / nc;  // local tokens of one chunk
  const bool offload = in_.parallel.fpdt_offload && nc > 1;
  const std::int64_t q_local_bytes = lc * m_.heads * d * ab_;
  const std::int64_t kv_local_bytes = lc * 2 * kv * d * ab_;
  const std::int64_t q_h_bytes = chunk * hq * d * ab_;
  const std::int64_t kv_h_bytes = chunk * 2 * hkv * d * ab_;
  const std::int64_t lse_bytes = hq * chunk * kFp32Bytes;

  sv.o = b_.tensor("fpdt_out", s_ * m_.heads * d * ab_, MemCategory::kAttention);
  const OpSet alloc = compute("fpdt_alloc_out", OpKind::kElementwise, {0.0, 0.0}, {}, {sv.o});
  std::vector<OpSet> fills;
  std::vector<TensorSet> kv_store;  // per chunk: on host when offloading, else on the GPU
  std::vector<OpSet> attn_ops;
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
    for (std::int64_t j = 0; j <= i; ++j) {
      const std::string pair = fmt::format("[c{},k{}]", i, j);
      TensorSet kv_src = kv_h;
      if (j < i) {
        kv_src = kv_store[static_cast<std::size_t>(j)];
        if (offload) {
          TensorSet fetched = b_.tensor("kv_fetched" + pair, kv_h_bytes, MemCategory::kAttention);
          host_copy("fetch_kv" + pair, true, kv_h_bytes, kv_src, fetched, two_back(attn_ops));
          kv_src = fetched;
        }
      }
      std::vector<TensorSet> ins{q_h, kv_src};
      std::vector<TensorSet> outs;
      if (j == 0) {
        outs.push_back(acc);
      } else {
        ins.push_back(acc);
      }
      const KernelCost k = plus(cost_.attention_fwd({chunk, chunk, hq, d, j == i}),
                                mem(3 * chunk * hq * d * kFp32Bytes));
      attn_ops.push_back(compute("attn_fwd" + pair, OpKind::kAttentionFwd, k, ins, outs, {},
                                 chunk * hq * d * ab_ + lse_bytes, MemCategory::kAttention));
    }
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
  const bool offload = in_.parallel.fpdt_offload && nc > 1;
  const std::int64_t q_local_bytes = lc * m_.heads * d * ab_;
  const std::int64_t kv_local_bytes = lc * 2 * kv * d * ab_;
  const std::int64_t q_h_bytes = chunk * hq * d * ab_;
  const std::int64_t kv_h_bytes = chunk * 2 * hkv * d * ab_;
  const std::int64_t lse_bytes = hq * chunk * kFp32Bytes;
  const std::int64_t dq_bytes = chunk * hq * d * kFp32Bytes;
  const auto at = [](const std::vector<TensorSet>& v, std::int64_t i) {
    return v[static_cast<std::size_t>(i)];
  };

  TensorSet dxn = b_.tensor("dxn", s_ * h * ab_, MemCategory::kOther);
  std::vector<OpSet> dx_writes{
      compute("fpdt_alloc_dx", OpKind::kElementwise, mem(s_ * h * ab_), {}, {dxn})};
  // dOut of every chunk to head-sharded layout (kept on host when offloading).
  std::vector<TensorSet> dout(static_cast<std::size_t>(nc));
  std::vector<TensorSet> dq(static_cast<std::size_t>(nc));  // latest fp32 dQ of each chunk
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
  std::vector<OpSet> bwd_ops;
  for (std::int64_t j = 0; j < nc; ++j) {
    const std::string ktag = fmt::format("[k{}]", j);
    TensorSet kv_j = at(sv.chunk_kv, j);
    if (offload) {
      TensorSet fetched = b_.tensor("kv_fetched(bwd)" + ktag, kv_h_bytes, MemCategory::kAttention);
      host_copy("fetch_kv(bwd)" + ktag, true, kv_h_bytes, kv_j, fetched, two_back(bwd_ops));
      kv_j = fetched;
    }
    TensorSet dkv_acc =
        b_.tensor("dkv_acc" + ktag, chunk * 2 * hkv * d * kFp32Bytes, MemCategory::kAttention);
    for (std::int64_t i = j; i < nc; ++i) {
      const std::string pair = fmt::format("[c{},k{}]", i, j);
      std::vector<TensorSet> ins{kv_j};
      if (offload) {
        // Q, output + LSE, dOut, and (after the first touch) the fp32 dQ of chunk i.
        const std::int64_t bytes = 2 * q_h_bytes + lse_bytes + q_h_bytes + (j > 0 ? dq_bytes : 0);
        TensorSet loaded = b_.tensor("q_chunk_in" + pair, bytes, MemCategory::kAttention);
        OpSpec s;
        s.name = "fetch_q" + pair;
        s.stream = Stream::kH2D;
        s.kind = OpKind::kCopyH2D;
        s.transfer_bytes = bytes;
        s.time_s = cost_.host_copy_s(bytes, true);
        s.inputs = {at(sv.chunk_q, i), at(sv.chunk_o, i), dout[static_cast<std::size_t>(i)]};
        if (j > 0) {
          s.inputs.push_back(dq[static_cast<std::size_t>(i)]);
        }
        s.outputs = {loaded};
        s.deps = two_back(bwd_ops);
        b_.op(s);
        ins.push_back(loaded);
      } else {
        ins.insert(ins.end(), {at(sv.chunk_q, i), at(sv.chunk_o, i), at(sv.chunk_lse, i),
                               dout[static_cast<std::size_t>(i)]});
        if (j > 0) {
          ins.push_back(dq[static_cast<std::size_t>(i)]);
        }
      }
      std::vector<TensorSet> outs;
      if (i == j) {
        outs.push_back(dkv_acc);
      } else {
        ins.push_back(dkv_acc);
      }
      TensorSet dq_new = b_.tensor("dq_acc" + pair, dq_bytes, MemCategory::kAttention);
      outs.push_back(dq_new);
      // FlashAttention workspace (fp32 dQ accumulator, row sums) and the block's dK/dV.
      const std::int64_t ws = dq_bytes + hq * chunk * kFp32Bytes + kv_h_bytes;
      const KernelCost k = plus(cost_.attention_bwd({chunk, chunk, hq, d, i == j}),
                                mem(3 * (dq_bytes + chunk * 2 * hkv * d * kFp32Bytes)));
      bwd_ops.push_back(compute("attn_bwd" + pair, OpKind::kAttentionBwd, k, ins, outs, {}, ws,
                                MemCategory::kAttention));
      if (offload) {
        TensorSet host = b_.tensor("dq_host" + pair, dq_bytes, MemCategory::kAttention, true);
        host_copy("offload_dq" + pair, false, dq_bytes, dq_new, host);
        dq[static_cast<std::size_t>(i)] = host;
      } else {
        dq[static_cast<std::size_t>(i)] = dq_new;
      }
    }
    // dK/dV of chunk j are complete: back to sequence sharding and into the K/V projection.
    TensorSet dkv_h = b_.tensor("dkv_h" + ktag, kv_h_bytes, MemCategory::kAttention);
    compute("dkv_cast" + ktag, OpKind::kElementwise, mem(chunk * 2 * hkv * d * (kFp32Bytes + ab_)),
            {dkv_acc}, {dkv_h}, {bwd_ops.back()});
    TensorSet dkv = exchange("a2a_dkv" + ktag, dkv_h, kv_local_bytes, MemCategory::kAttention);
    // dQ of chunk j received its last contribution in this outer iteration.
    TensorSet dq_j = dq[static_cast<std::size_t>(j)];
    if (offload) {
      TensorSet back = b_.tensor("dq_final" + ktag, dq_bytes, MemCategory::kAttention);
      host_copy("fetch_dq" + ktag, true, dq_bytes, dq_j, back);
      dq_j = back;
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
