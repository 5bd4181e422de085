// FPDT / Ulysses-Offload (REFERENCES.md [FPDT], [DS-FPDT]). Ulysses over chunks:
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
//
// Edges (speed; the simulation is the same). An op that reads the blocks of chunks 0..i-1 lists
// only what changes its timing or a tensor's lifetime, so that a layer has O(nc) edges, not O(nc²):
//   - among the producers of its inputs on one stream only the last in program order can finish
//     last (streams run in order), and one on its own stream has finished before it starts;
//   - a tensor is freed when its last reader ends, and among readers on one stream that is the
//     last in program order: earlier readers on that stream need not list it.
// So the fetch of chunks 1..i-1 reads chunk i-1 (its offload ends after the others), the last
// fetch of a pass reads every chunk (it frees them), and in backward the fetch of query chunks
// j+1.. reads the last dOut (whose offload ends after every Q, output and dOut offload of the
// layer): each chunk's own fetch, later on the copy stream, frees it. Without offload the same
// holds for the compute ops that read the GPU copies (the last all-to-all producing one is the last
// dOut). Ops and tensors are emitted through one reused OpSpec with names interned once per step.
#include <algorithm>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cpsim/models/units.hpp"

#include "step_builder.hpp"

namespace cpsim::sim::detail {
namespace {

// Per-chunk names: stem + "[c<i>]" in the forward and for dOut, stem + "[k<j>]" in the backward
// loop over K/V chunks. Formatted names have an empty stem.
enum FwdName {
  kQ,
  kKv,
  kQRope,
  kKvRope,
  kQkvProj,
  kRope,
  kA2aQ,
  kA2aKv,
  kKvHost,
  kOffloadKv,
  kAcc,
  kKvBuffer0,
  kFetchKv0,
  kKvBuffer1,
  kFetchKvRest,
  kAttnPrev,
  kFetchJoin,
  kAttnDiag,
  kOutH,
  kLse,
  kOutCast,
  kA2aOut,
  kFillOut,
  kQHost,
  kOffloadQ,
  kOutHost,
  kOffloadOut,
  kFwdNames
};
constexpr const char* kFwdStems[kFwdNames] = {"q",          "kv",         "q_rope",
                                              "kv_rope",    "qkv_proj",   "rope",
                                              "a2a_q",      "a2a_kv",     "kv_host",
                                              "offload_kv", "fpdt_acc",   "kv_buffer0",
                                              "fetch_kv0",  "kv_buffer1", "",
                                              "",           "fetch_join", "attn_fwd[diag]",
                                              "attn_out_h", "lse",        "fpdt_out_cast",
                                              "a2a_out",    "fill_out",   "q_host",
                                              "offload_q",  "out_host",   "offload_out"};

enum BwdName {
  kDoutSlice,
  kSliceDout,
  kA2aDout,
  kDoutHost,
  kOffloadDout,
  kKvFetched,
  kFetchKvBwd,
  kDkvAcc,
  kDqBlock,
  kQBuffer0,
  kFetchQ0,
  kQBuffer1,
  kFetchQRest,
  kAttnBwd,
  kOffloadDq,
  kInnerJoin,
  kDkvH,
  kDkvCast,
  kA2aDkv,
  kDqFinal,
  kFetchDq,
  kDqSlice,
  kDqH,
  kDqCast,
  kA2aDq,
  kDqRope,
  kDkvRope,
  kRopeBwd,
  kQkvProjBwd,
  kBwdNames
};
constexpr const char* kBwdStems[kBwdNames] = {"dout_slice",    "slice_dout",
                                              "a2a_dout",      "dout_host",
                                              "offload_dout",  "kv_fetched(bwd)",
                                              "fetch_kv(bwd)", "dkv_acc",
                                              "dq_block",      "q_chunk_buffer0",
                                              "fetch_q0",      "q_chunk_buffer1",
                                              "fetch_q_rest",  "",
                                              "offload_dq",    "inner_join",
                                              "dkv_h",         "dkv_cast",
                                              "a2a_dkv",       "dq_final",
                                              "fetch_dq",      "dq_slice",
                                              "dq_h",          "dq_cast",
                                              "a2a_dq",        "dq_rope",
                                              "dkv_rope",      "rope_bwd",
                                              "qkv_proj_bwd"};

// Host issue (docs/MODEL.md, "Host issue"): the framework calls each op stands for in the
// offloading implementation, _FPDTGPUOffloadingAttentionImpl_ in fpdt_layer.py @ edaa722 (F),
// counted from its source (the gradient-less and non-offloading paths keep one call per kernel),
// and where it synchronises the host. Each forward block: _flash_attn_forward (1), the merge
// update_out_and_lse (F:59-77: the first block of a query chunk `.to(float32)` and a contiguous
// LSE F:70-72, 2; every later one _update_out_and_lse F:41-56, 12 calls), and the next K/V's
// load_to_gpu (F:720-721, an empty and a copy each: 4); then compute_stream.wait_stream and
// synchronize (F:731-732) after every block. Each backward block: three zeroed dq/dk/dv
// (F:849-851), _flash_attn_backward (1), the next query chunk's five load_to_gpu (F:925-930, 10),
// the three add_ (F:945-947) and dq's overwrite_to_cpu (F:951), with a synchronisation (F:940-941).
constexpr std::int64_t kFwdFirstBlockCalls = 1 + 2 + 4;
constexpr std::int64_t kFwdBlockCalls = 1 + 12 + 4;
constexpr std::int64_t kBwdBlockCalls = 3 + 1 + 10 + 3 + 1;
// Per chunk: the QKV matmul and bias add (F:620-621), the layernorm chunk's SequenceChunk
// (pinned empty and copy, F:506-508, F:623-624) and the q/k/v slices' two contiguous copies each
// (F:628-641); RoPE on q and k, five calls each (DeepSpeed layer.py:99-128, reference path);
// q/k/v SequenceChunks (F:655-658, 2 each); the output's casts and its output/LSE SequenceChunks
// (F:742-747).
constexpr std::int64_t kProjCalls = 2 + 2 + 6;
constexpr std::int64_t kRopeCalls = 2 * 5;
// Backward per K/V chunk: the casts (F:968-977, 3), RoPE's backward on dq and dk (F:27-38, 5
// each), and the projection's backward (F:996-1015: three matmuls with add_ for the weight,
// three sum-sum-add_ for the bias, three matmuls with add_ for the input gradient, two zeroed
// accumulators) with the next chunk's K/V and layernorm loads (F:1021-1026, 6).
constexpr std::int64_t kProjBwdCalls = 3 * 2 + 3 * 3 + 3 * 2 + 2 + 6;

/// Sets the host issue fields of the op just emitted on every simulated rank (ops appended last).
class HostMarks {
 public:
  HostMarks(Workload& w, int simulated_ranks, const models::HostIssueModel& host, bool on)
      : w_(w), n_(static_cast<std::size_t>(simulated_ranks)), host_(host), on_(on) {}
  /// The last op stands for `calls` framework calls; `sync`: the host waits for it.
  void mark(std::int64_t calls, bool sync = false) {
    if (!on_) {
      return;
    }
    const auto c = static_cast<std::uint16_t>(
        std::clamp<std::int64_t>(calls, 0, std::numeric_limits<std::uint16_t>::max()));
    for (std::size_t k = w_.ops.size() - n_; k < w_.ops.size(); ++k) {
      w_.ops[k].host_calls = c;
      w_.ops[k].host_sync = w_.ops[k].host_sync || sync;
    }
  }
  /// The host waits for the last op (a barrier or synchronisation right after it).
  void sync_last() {
    if (!on_) {
      return;
    }
    for (std::size_t k = w_.ops.size() - n_; k < w_.ops.size(); ++k) {
      w_.ops[k].host_sync = true;
    }
  }
  /// `blocks` blocks merged into one op, the host synchronising after each: it issues the first
  /// (the op's calls) and waits; each later block adds the synchronisation and its own issue of
  /// `calls` to the GPU's time, the GPU idle meanwhile: (blocks − 1)·(sync + calls·per call).
  double sync_gaps_s(std::int64_t blocks, std::int64_t calls) const {
    if (!on_ || blocks <= 1) {
      return 0.0;
    }
    return static_cast<double>(blocks - 1) *
           (host_.sync_s + static_cast<double>(calls) * host_.per_call_s());
  }

 private:
  Workload& w_;
  std::size_t n_;
  const models::HostIssueModel& host_;
  bool on_;
};

}  // namespace

// What both FPDT passes of one layer share: the builder, the chunking (K global tokens per chunk,
// nc chunks of lc local tokens, hq and hkv heads per rank after the all-to-all), whether chunks
// are offloaded, the op emitter and the offloading implementation's host calls and
// synchronisations (see above).
class StepBuilder::FpdtPass {
 protected:
  explicit FpdtPass(StepBuilder& sb)
      : sb_(sb),
        hq_(sb.m_.heads / sb.shape_.ulysses),
        hkv_(sb.layout_.kv_heads_eff / sb.shape_.ulysses),
        d_(sb.m_.head_dim),
        chunk_(sb.in_.parallel.fpdt_chunk),
        nc_(sb.shape_.seq_tokens / chunk_),
        lc_(sb.shape_.local_tokens / nc_),
        offload_(sb.in_.parallel.fpdt_offload),
        host_(sb.w_,
              sb.b_.simulated_ranks(),
              sb.cost_.profile().host_issue,
              offload_ && sb.implementation_ != nullptr &&
                  sb.implementation_->synchronised_fpdt_loop()) {
    const std::int64_t ab = sb.shape_.activation_bytes;
    q_local_bytes_ = lc_ * sb.m_.heads * d_ * ab;
    kv_local_bytes_ = lc_ * 2 * sb.layout_.kv_heads_eff * d_ * ab;
    q_h_bytes_ = chunk_ * hq_ * d_ * ab;
    kv_h_bytes_ = chunk_ * 2 * hkv_ * d_ * ab;
    lse_bytes_ = hq_ * chunk_ * kFp32Bytes;
    if (const DocumentWork& docs = sb.in_.documents; !docs.empty()) {
      chunk_work_ = document_work(docs.sequence, docs.sequence_tokens, static_cast<int>(nc_),
                                  models::RingLayout::kContiguous, DocumentSplit::kSequence);
    }
  }

  // The step builder's op emitter, with the ids ChunkNames gives as names.
  TensorSet exchange(std::int32_t n, TensorSet in, std::int64_t bytes, LedgerSite site) {
    return sb_.exchange(Name::interned(n), in, bytes, site);
  }
  OpSet compute(std::int32_t n,
                OpKind kind,
                const KernelCost& k,
                ListRef<TensorSet> inputs,
                ListRef<TensorSet> outputs,
                ListRef<OpSet> deps = {},
                std::int64_t workspace = 0,
                MemCategory ws_cat = MemCategory::kOther) {
    return sb_.compute(Name::interned(n), kind, k, inputs, outputs, deps, workspace, ws_cat);
  }
  OpSet copy(std::int32_t n,
             bool to_device,
             std::int64_t bytes,
             ListRef<TensorSet> inputs,
             ListRef<TensorSet> outputs,
             ListRef<OpSet> deps = {}) {
    return sb_.host_copy(Name::interned(n), to_device, bytes, inputs, outputs, deps);
  }
  /// The spec of the next op (StepBuilder::next_spec) with its cost; emit() emits it.
  OpSpec& next(std::int32_t n, Stream stream, OpKind kind, double time_s, double flops) {
    OpSpec& s = sb_.next_spec(Name::interned(n), stream, kind);
    s.time_s = time_s;
    s.flops = flops;
    return s;
  }
  OpSet emit() { return sb_.emit(); }

  // A block's attention kernel over a full and a diagonal (causal) pair of chunks, and what each
  // block adds beside it (the merge into the accumulators).
  void set_blocks(const KernelCost& full_kernel,
                  const KernelCost& diag_kernel,
                  const KernelCost& per_block) {
    full_kernel_ = full_kernel;
    diag_kernel_ = diag_kernel;
    per_block_ = per_block;
    full_block_ = sb_.plus(full_kernel, per_block);
    diag_block_ = sb_.plus(diag_kernel, per_block);
  }
  // Query chunk i against key chunk i.
  KernelCost diagonal(std::int64_t i) const {
    if (chunk_work_.empty()) {
      return diag_block_;
    }
    return sb_.plus(masked(diag_kernel_, share(i, i + 1, i)), per_block_);
  }
  // Query chunk i against key chunks 0..i−1 (forward).
  KernelCost earlier(std::int64_t i) const {
    if (chunk_work_.empty()) {
      return sb_.times(full_block_, static_cast<double>(i));
    }
    double sum = 0.0;
    for (std::int64_t j = 0; j < i; ++j) {
      sum += share(i, i + 1, j);
    }
    return sb_.plus(masked(full_kernel_, sum), sb_.times(per_block_, static_cast<double>(i)));
  }
  // Query chunks j..nc−1 against key chunk j (backward).
  KernelCost later(std::int64_t j) const {
    const std::int64_t pairs = nc_ - j;
    if (chunk_work_.empty()) {
      return sb_.plus(diag_block_, sb_.times(full_block_, static_cast<double>(pairs - 1)));
    }
    return sb_.plus(sb_.plus(masked(diag_kernel_, share(j, j + 1, j)),
                             masked(full_kernel_, share(j + 1, nc_, j))),
                    sb_.times(per_block_, static_cast<double>(pairs)));
  }

  StepBuilder& sb_;
  std::int64_t hq_, hkv_, d_, chunk_, nc_, lc_;
  bool offload_;
  HostMarks host_;
  // Packed documents: the visible share of every (query chunk, key chunk) block against one
  // document (contiguous chunks of the sequence, document_work.hpp); empty without documents.
  DocumentWork chunk_work_;
  KernelCost full_kernel_, diag_kernel_, per_block_, full_block_, diag_block_;

 private:
  // Σ over query chunks [i0, i1) of the share of their block against key chunk j.
  double share(std::int64_t i0, std::int64_t i1, std::int64_t j) const {
    double sum = 0.0;
    for (std::int64_t i = i0; i < i1; ++i) {
      sum += chunk_work_.pair_factor(static_cast<int>(i), static_cast<int>(j));
    }
    return sum;
  }

 protected:
  // One chunk's local Q and K/V (before the all-to-all), head-sharded Q and K/V, and LSE.
  std::int64_t q_local_bytes_ = 0, kv_local_bytes_ = 0, q_h_bytes_ = 0, kv_h_bytes_ = 0,
               lse_bytes_ = 0;
};

// One layer's FPDT forward: the chunk loop of fpdt_forward with its sizes, costs and the state the
// chunks hand on (the K/V store, the next chunk's prefetched first block, the output's fills).
class StepBuilder::FpdtForward : private StepBuilder::FpdtPass {
 public:
  FpdtForward(StepBuilder& sb, SavedLayer& sv, TensorSet params, bool grad);
  void run();

 private:
  struct ChunkQkv {
    TensorSet q_h, kv_h;
  };
  ChunkQkv project(std::int64_t i);
  OpSet offload(std::int64_t i, TensorSet q_h, TensorSet kv_h);
  void fetch_first_of(std::int64_t chunk_index);
  OpSet attend_earlier(std::int64_t i, TensorSet q_h, TensorSet acc, OpSet offloaded);
  void finish_chunk(std::int64_t i, TensorSet q_h, TensorSet acc, OpSet offloaded);

  SavedLayer& sv_;
  TensorSet params_;
  bool grad_;
  std::int64_t attn_ws_;
  KernelCost proj_, rope_, out_cast_, fill_;
  ChunkNames name_;
  OpSet alloc_;
  std::vector<OpSet> fills_;
  std::vector<TensorSet> kv_store_;  // per chunk: on host when offloading, else on the GPU
  OpSet out_offloaded_;              // the last chunk's output and LSE offload
  TensorSet next_first_;
  OpSet next_fetch_first_;
};

StepBuilder::FpdtForward::FpdtForward(StepBuilder& sb, SavedLayer& sv, TensorSet params, bool grad)
    : FpdtPass(sb),
      sv_(sv),
      params_(params),
      grad_(grad),
      name_(sb.b_, "fpdt_forward", kFwdNames, kFwdStems) {
  const auto& m = sb.m_;
  const std::int64_t h = m.hidden, d = d_, ab = sb.shape_.activation_bytes;
  set_blocks(sb.cost_.attention_fwd({chunk_, chunk_, hq_, d, false}),
             sb.cost_.attention_fwd({chunk_, chunk_, hq_, d, true}),
             sb.mem(3 * chunk_ * hq_ * d * kFp32Bytes));
  // Every chunk has the same shapes.
  proj_ = sb.linear_fwd(lc_, (m.heads + 2 * m.kv_heads) * d, h);
  // RoPE on the chunk's Q and its model K heads (DeepSpeed's apply_rotary_pos_emb); V and any
  // K/V replication are a copy beside it.
  const std::int64_t rope_k = lc_ * m.kv_heads * d;
  rope_ = sb.rope_cost(q_local_bytes_ / ab, rope_k, 2 * kv_local_bytes_ - 2 * ab * rope_k,
                       RopeBackward::kNone);
  out_cast_ = sb.mem(chunk_ * hq_ * d * (kFp32Bytes + ab));
  fill_ = sb.mem(2 * q_local_bytes_);
  // The block's output and LSE before the merge, the implementation's merge temporaries, and,
  // where its merge rebinds the accumulator, the new fp32 output and LSE it writes while the old
  // ones are live.
  attn_ws_ = chunk_ * hq_ * d * ab + lse_bytes_ + sb.ledger_bytes(LedgerSite::kCoreForward);
  if (sb.implementation_ != nullptr && sb.implementation_->rebinds_merge_accumulator()) {
    attn_ws_ += chunk_ * hq_ * d * kFp32Bytes + lse_bytes_;
  }
}

void StepBuilder::FpdtForward::run() {
  sv_.o = sb_.b_.tensor("fpdt_out",
                        sb_.shape_.local_tokens * sb_.m_.heads * d_ * sb_.shape_.activation_bytes,
                        MemCategory::kAttention);
  alloc_ = sb_.compute("fpdt_alloc_out", OpKind::kElementwise, {0.0, 0.0}, {}, {sv_.o});
  fills_.reserve(static_cast<std::size_t>(nc_));
  kv_store_.reserve(static_cast<std::size_t>(nc_));
  for (std::int64_t i = 0; i < nc_; ++i) {
    const ChunkQkv c = project(i);
    const OpSet offloaded = offload(i, c.q_h, c.kv_h);
    // Online softmax over the visible K/V chunks into an fp32 output + LSE accumulator.
    TensorSet acc = sb_.b_.tensor(name_(kAcc, 'c', i), chunk_ * hq_ * d_ * kFp32Bytes + lse_bytes_,
                                  MemCategory::kAttention, false);
    if (i > 0) {
      const OpSet join = attend_earlier(i, c.q_h, acc, offloaded);
      if (offload_ && i + 1 < nc_) {
        fetch_first_of(i + 1);
      }
      compute(name_(kAttnDiag, 'c', i), OpKind::kAttentionFwd,
              sb_.with_traffic(diagonal(i), LedgerSite::kCoreForward), {c.q_h, c.kv_h, acc}, {},
              {join}, attn_ws_, MemCategory::kAttention);
      host_.mark(kFwdBlockCalls, true);
    } else {
      if (offload_ && i + 1 < nc_) {
        fetch_first_of(i + 1);
      }
      compute(name_(kAttnDiag, 'c', i), OpKind::kAttentionFwd, diagonal(i), {c.q_h, c.kv_h}, {acc},
              {}, attn_ws_, MemCategory::kAttention);
      host_.mark(kFwdFirstBlockCalls, true);
    }
    finish_chunk(i, c.q_h, acc, offloaded);
  }
  if (grad_) {
    sv_.chunk_kv = kv_store_;
  }
  // The output projection waits for every chunk's output to be written, and for the output and
  // LSE offloads (the compute stream waits for general_offload_stream before the cat, F:749-750;
  // the copies run in order, so the last one is enough).
  if (out_offloaded_.valid()) {
    fills_.push_back(out_offloaded_);
  }
  sv_.attn_ready = sb_.compute("fpdt_out_ready", OpKind::kElementwise, {0.0, 0.0}, {}, {}, fills_);
  host_.mark(1, true);  // the synchronize before the output's torch.cat (F:749-752)
}

// Chunk i's Q, K, V: projection, RoPE, the all-to-alls into its head-sharded Q and K/V.
StepBuilder::FpdtForward::ChunkQkv StepBuilder::FpdtForward::project(std::int64_t i) {
  const auto attention = MemCategory::kAttention;
  TensorSet q = sb_.b_.tensor(name_(kQ, 'c', i), q_local_bytes_, attention, false);
  TensorSet kvp = sb_.b_.tensor(name_(kKv, 'c', i), kv_local_bytes_, attention, false);
  compute(name_(kQkvProj, 'c', i), OpKind::kGemm, proj_, {sv_.xn, params_}, {q, kvp});
  host_.mark(kProjCalls);
  TensorSet q_r = sb_.b_.tensor(name_(kQRope, 'c', i), q_local_bytes_, attention, false);
  TensorSet kv_r = sb_.b_.tensor(name_(kKvRope, 'c', i), kv_local_bytes_, attention, false);
  compute(name_(kRope, 'c', i), OpKind::kElementwise, rope_, {q, kvp}, {q_r, kv_r});
  host_.mark(kRopeCalls);
  ChunkQkv c;
  c.q_h = exchange(name_(kA2aQ, 'c', i), q_r, q_local_bytes_, LedgerSite::kQExchange);
  c.kv_h = exchange(name_(kA2aKv, 'c', i), kv_r, kv_local_bytes_, LedgerSite::kKvExchange);
  host_.sync_last();  // dist.barrier() and the compute stream's synchronize (F:644, F:653-654)
  return c;
}

// DeepSpeed's fpdt_layer.py @ edaa722 (F): the chunk's Q, K and V go to pinned host memory on
// offload_stream as soon as they are made (F:655-658), and after every block of the chunk the
// compute stream waits for offload_stream and the host synchronises (F:731-732): the work after
// the chunk's first block waits for these offloads (the op returned; none without offloading).
OpSet StepBuilder::FpdtForward::offload(std::int64_t i, TensorSet q_h, TensorSet kv_h) {
  if (!offload_) {
    kv_store_.push_back(kv_h);
    return {};
  }
  const auto attention = MemCategory::kAttention;
  TensorSet kv_host = sb_.b_.tensor(name_(kKvHost, 'c', i), kv_h_bytes_, attention, true);
  OpSet offloaded = copy(name_(kOffloadKv, 'c', i), false, kv_h_bytes_, {kv_h}, {kv_host});
  host_.mark(4);
  kv_store_.push_back(kv_host);
  if (grad_) {  // Q is kept for the backward (the copies run in order: the last one is enough)
    TensorSet q_host = sb_.b_.tensor(name_(kQHost, 'c', i), q_h_bytes_, attention, true);
    offloaded = copy(name_(kOffloadQ, 'c', i), false, q_h_bytes_, {q_h}, {q_host});
    host_.mark(2);
    sv_.chunk_q.push_back(q_host);
  }
  return offloaded;
}

// With offloading, the next query chunk's first K/V block is fetched before this chunk's last
// block: fpdt_layer.py loads it after that block and before the synchronisation that ends it
// (F:709-732), so it overlaps the block (the copy stream's order is the same either way).
void StepBuilder::FpdtForward::fetch_first_of(std::int64_t chunk_index) {
  next_first_ = sb_.b_.tensor(name_(kKvBuffer0, 'c', chunk_index), kv_h_bytes_,
                              MemCategory::kAttention, false);
  next_fetch_first_ =
      copy(name_(kFetchKv0, 'c', chunk_index), true, kv_h_bytes_, {kv_store_[0]}, {next_first_});
  host_.mark(0);  // load_to_gpu: counted with the blocks
}

// The blocks of chunks 0..i-1 for query chunk i (all but the last step of the pass list only
// chunk i-1, see the file comment); returns the join the diagonal block waits for.
OpSet StepBuilder::FpdtForward::attend_earlier(std::int64_t i,
                                               TensorSet q_h,
                                               TensorSet acc,
                                               OpSet offloaded) {
  const auto attention = MemCategory::kAttention;
  const auto visible_begin = kv_store_.begin() + (i + 1 == nc_ ? 0 : i - 1);
  const auto visible_end = kv_store_.begin() + i;
  // The implementation's merge (_update_out_and_lse) runs for every block but each query
  // chunk's first: i − 1 times here, once in the diagonal block below.
  KernelCost prev_cost =
      sb_.with_traffic(earlier(i), LedgerSite::kCoreForward, static_cast<double>(i - 1));
  prev_cost.time_s += host_.sync_gaps_s(i, kFwdBlockCalls);
  const std::int32_t prev_name =
      name_(kAttnPrev, i, [&] { return fmt::format("attn_fwd[k0..{}][c{}]", i - 1, i); });
  TensorSet rest;
  OpSet fetch_rest;
  OpSet prev;
  if (offload_) {
    if (!next_fetch_first_.valid()) {
      fetch_first_of(i);
    }
    const TensorSet first = next_first_;
    const OpSet fetch_first = next_fetch_first_;
    next_fetch_first_ = OpSet{};
    if (i > 1) {
      rest = sb_.b_.tensor(name_(kKvBuffer1, 'c', i), kv_h_bytes_, attention, false);
      const std::int64_t bytes = (i - 1) * kv_h_bytes_;
      OpSpec& s =
          next(name_(kFetchKvRest, i, [&] { return fmt::format("fetch_kv1..{}[c{}]", i - 1, i); }),
               Stream::kH2D, OpKind::kCopyH2D, sb_.cost_.host_copy_s(bytes, true), 0.0);
      s.transfer_bytes = bytes;
      s.inputs.assign(std::max(visible_begin, kv_store_.begin() + 1), visible_end);
      s.outputs = {rest};
      s.deps = {fetch_first};
      fetch_rest = emit();
      host_.mark(0);
    }
    prev = compute(prev_name, OpKind::kAttentionFwd, prev_cost, {q_h, first}, {acc}, {}, attn_ws_,
                   attention);
    host_.mark(kFwdFirstBlockCalls, true);  // F:731-732 after every block
  } else {
    OpSpec& s =
        next(prev_name, Stream::kCompute, OpKind::kAttentionFwd, prev_cost.time_s, prev_cost.flops);
    s.inputs = {q_h};
    s.inputs.insert(s.inputs.end(), visible_begin, visible_end);
    s.outputs = {acc};
    s.workspace_bytes = attn_ws_;
    s.workspace_category = attention;
    prev = emit();
  }
  const OpSet join = compute(name_(kFetchJoin, 'c', i), OpKind::kElementwise, {0.0, 0.0}, {rest},
                             {}, {prev, fetch_rest, offloaded});
  host_.mark(0);
  return join;
}

// Chunk i's output: the cast out of the accumulator, the all-to-all back, the fill of the
// layer's output, and what the backward keeps (on host when offloading).
void StepBuilder::FpdtForward::finish_chunk(std::int64_t i,
                                            TensorSet q_h,
                                            TensorSet acc,
                                            OpSet offloaded) {
  const auto attention = MemCategory::kAttention;
  TensorSet o_h = sb_.b_.tensor(name_(kOutH, 'c', i), q_h_bytes_, attention, false);
  TensorSet lse = sb_.b_.tensor(name_(kLse, 'c', i), lse_bytes_, attention, false);
  compute(name_(kOutCast, 'c', i), OpKind::kElementwise, out_cast_, {acc}, {o_h, lse}, {offloaded});
  host_.mark(3);
  TensorSet o_local =
      exchange(name_(kA2aOut, 'c', i), o_h, q_local_bytes_, LedgerSite::kOutExchange);
  fills_.push_back(
      compute(name_(kFillOut, 'c', i), OpKind::kElementwise, fill_, {o_local}, {}, {alloc_}));
  if (!grad_) {
    return;
  }
  // Saved for backward: Q, output and LSE of the chunk (K/V are already stored).
  if (offload_) {
    TensorSet o_host =
        sb_.b_.tensor(name_(kOutHost, 'c', i), q_h_bytes_ + lse_bytes_, attention, true);
    out_offloaded_ =
        copy(name_(kOffloadOut, 'c', i), false, q_h_bytes_ + lse_bytes_, {o_h, lse}, {o_host});
    host_.mark(4);
    sv_.chunk_o.push_back(o_host);
    sv_.chunk_lse.push_back(o_host);
  } else {
    sv_.chunk_q.push_back(q_h);
    sv_.chunk_o.push_back(o_h);
    sv_.chunk_lse.push_back(lse);
  }
}

void StepBuilder::fpdt_forward(SavedLayer& sv, TensorSet params, bool grad) {
  FpdtForward pass(*this, sv, params, grad);
  pass.run();
}

// One layer's FPDT backward: the loop over K/V chunks (outer) and query chunks (inner) of
// fpdt_backward with its sizes, costs and the state the chunks hand on.
class StepBuilder::FpdtBackward : private StepBuilder::FpdtPass {
 public:
  FpdtBackward(
      StepBuilder& sb, const SavedLayer& sv, TensorSet d_o, TensorSet params, TensorSet grads);
  InputGrad run();

 private:
  struct InnerLoop {
    TensorSet dkv_acc, dq_block;
    OpSet join;
  };
  void send_douts();
  void fetch_kv(std::int64_t chunk_index);
  InnerLoop inner_loop(std::int64_t j);
  void gradients_of(std::int64_t j, const InnerLoop& loop);
  static TensorSet at(const std::vector<TensorSet>& v, std::int64_t i) {
    return v[static_cast<std::size_t>(i)];
  }

  const SavedLayer& sv_;
  TensorSet d_o_, params_, grads_;
  std::int64_t dq_bytes_, dkv_acc_bytes_, ws_, bundle_;
  KernelCost slice_dout_, dkv_cast_, dq_slice_, dq_cast_, rope_bwd_, proj_bwd_;
  ChunkNames name_;
  TensorSet dxn_, dq_all_;
  std::vector<OpSet> dx_writes_;
  std::vector<TensorSet> dout_;
  TensorSet last_dout_;
  std::vector<TensorSet> ins_;
  TensorSet next_kv_;
};

StepBuilder::FpdtBackward::FpdtBackward(
    StepBuilder& sb, const SavedLayer& sv, TensorSet d_o, TensorSet params, TensorSet grads)
    : FpdtPass(sb),
      sv_(sv),
      d_o_(d_o),
      params_(params),
      grads_(grads),
      name_(sb.b_, "fpdt_backward", kBwdNames, kBwdStems) {
  const auto& m = sb.m_;
  const std::int64_t h = m.hidden, d = d_, ab = sb.shape_.activation_bytes;
  dq_bytes_ = chunk_ * hq_ * d * kFp32Bytes;
  dkv_acc_bytes_ = chunk_ * 2 * hkv_ * d * kFp32Bytes;
  set_blocks(sb.cost_.attention_bwd({chunk_, chunk_, hq_, d, false}),
             sb.cost_.attention_bwd({chunk_, chunk_, hq_, d, true}),
             sb.mem(3 * (dq_bytes_ + dkv_acc_bytes_)));
  // FlashAttention workspace (fp32 dQ accumulator, row sums; GQA: dK/dV expanded or fp32
  // accumulators), the block's dK/dV and the implementation's per-block buffers.
  ws_ = sb.flash_bwd_workspace(chunk_, chunk_, hq_, hkv_) + kv_h_bytes_ +
        sb.ledger_bytes(LedgerSite::kCoreBackward);
  // Q, output + LSE, dOut and fp32 dQ of one query chunk per inner step (offloading).
  bundle_ = 2 * q_h_bytes_ + lse_bytes_ + q_h_bytes_ + dq_bytes_;
  // Every chunk has the same shapes.
  slice_dout_ = sb.mem(2 * q_local_bytes_);
  dkv_cast_ = sb.mem(chunk_ * 2 * hkv_ * d * (kFp32Bytes + ab));
  dq_slice_ = sb.mem(2 * dq_bytes_);
  dq_cast_ = sb.mem(chunk_ * hq_ * d * (kFp32Bytes + ab));
  // DeepSpeed's own RoPE backward (apply_rotary_pos_emb_backward), not autograd's.
  const std::int64_t rope_k = lc_ * m.kv_heads * d;
  rope_bwd_ = sb.rope_cost(q_local_bytes_ / ab, rope_k, 2 * kv_local_bytes_ - 2 * ab * rope_k,
                           RopeBackward::kOwn);
  proj_bwd_ = sb.linear_bwd(lc_, (m.heads + 2 * m.kv_heads) * d, h);
}

InputGrad StepBuilder::FpdtBackward::run() {
  const std::int64_t h = sb_.m_.hidden;
  dxn_ = sb_.b_.tensor("dxn", sb_.shape_.local_tokens * h * sb_.shape_.activation_bytes,
                       MemCategory::kOther);
  dx_writes_ = {sb_.compute("fpdt_alloc_dx", OpKind::kElementwise,
                            sb_.mem(sb_.shape_.local_tokens * h * sb_.shape_.activation_bytes), {},
                            {dxn_})};
  dx_writes_.reserve(static_cast<std::size_t>(nc_) + 1);
  // dQ of every chunk accumulates in fp32: pinned host buffers when offloading, else on the GPU.
  dq_all_ = sb_.b_.tensor("dq_fp32_all", nc_ * dq_bytes_, MemCategory::kAttention, offload_);
  sb_.compute("fpdt_alloc_dq", OpKind::kElementwise, {0.0, 0.0}, {}, {dq_all_});
  send_douts();
  for (std::int64_t j = 0; j < nc_; ++j) {
    gradients_of(j, inner_loop(j));
  }
  return {dxn_, dx_writes_.back()};
}

// dOut of every chunk to head-sharded layout (kept on host when offloading).
void StepBuilder::FpdtBackward::send_douts() {
  const auto attention = MemCategory::kAttention;
  dout_.assign(static_cast<std::size_t>(nc_), TensorSet{});
  for (std::int64_t i = 0; i < nc_; ++i) {
    TensorSet slice = sb_.b_.tensor(name_(kDoutSlice, 'c', i), q_local_bytes_, attention, false);
    compute(name_(kSliceDout, 'c', i), OpKind::kElementwise, slice_dout_, {d_o_}, {slice});
    TensorSet do_h =
        exchange(name_(kA2aDout, 'c', i), slice, q_local_bytes_, LedgerSite::kDoutExchange);
    host_
        .sync_last();  // synchronize after the first (F:826), dist.barrier after the others (F:935)
    if (offload_) {
      TensorSet dout_host = sb_.b_.tensor(name_(kDoutHost, 'c', i), q_h_bytes_, attention, true);
      copy(name_(kOffloadDout, 'c', i), false, q_h_bytes_, {do_h}, {dout_host});
      host_.mark(2);
      dout_[static_cast<std::size_t>(i)] = dout_host;
    } else {
      dout_[static_cast<std::size_t>(i)] = do_h;
    }
  }
  // The last dOut: its offload (or all-to-all) is the last producer of what the later query
  // chunks hold (see the file comment).
  last_dout_ = dout_.back();
}

// With offloading, K/V chunk j + 1 is fetched before chunk j's projection backward: fpdt_layer.py
// loads it there, before the synchronisation that ends the outer iteration (F:1021-1029).
void StepBuilder::FpdtBackward::fetch_kv(std::int64_t chunk_index) {
  next_kv_ = sb_.b_.tensor(name_(kKvFetched, 'k', chunk_index), kv_h_bytes_,
                           MemCategory::kAttention, false);
  copy(name_(kFetchKvBwd, 'k', chunk_index), true, kv_h_bytes_, {at(sv_.chunk_kv, chunk_index)},
       {next_kv_});
  host_.mark(0);  // load_to_gpu: counted with the projection backward
}

// K/V chunk j against query chunks j..nc-1: the query chunks' fetches (offloading), one op for
// the blocks, dQ's copies back, and the join that ends the inner loop.
StepBuilder::FpdtBackward::InnerLoop StepBuilder::FpdtBackward::inner_loop(std::int64_t j) {
  const auto attention = MemCategory::kAttention;
  const std::int64_t pairs = nc_ - j;  // query chunks i = j .. nc-1
  TensorSet kv_j = at(sv_.chunk_kv, j);
  if (offload_) {
    if (j == 0) {
      fetch_kv(0);
    }
    kv_j = next_kv_;
  }
  InnerLoop loop;
  loop.dkv_acc = sb_.b_.tensor(name_(kDkvAcc, 'k', j), dkv_acc_bytes_, attention, false);
  loop.dq_block = sb_.b_.tensor(name_(kDqBlock, 'k', j), dq_bytes_, attention, false);
  ins_.assign({kv_j, dq_all_});
  OpSet load_first, load_rest, dq_back;
  TensorSet rest;
  if (offload_) {
    TensorSet first = sb_.b_.tensor(name_(kQBuffer0, 'k', j), bundle_, attention, false);
    load_first = copy(name_(kFetchQ0, 'k', j), true, bundle_,
                      {at(sv_.chunk_q, j), at(sv_.chunk_o, j), at(dout_, j), dq_all_}, {first});
    host_.mark(0);
    ins_.push_back(first);
    if (pairs > 1) {
      rest = sb_.b_.tensor(name_(kQBuffer1, 'k', j), bundle_, attention, false);
      const std::int64_t bytes = (pairs - 1) * bundle_;
      OpSpec& r = next(name_(kFetchQRest, 'k', j), Stream::kH2D, OpKind::kCopyH2D,
                       sb_.cost_.host_copy_s(bytes, true), 0.0);
      r.transfer_bytes = bytes;
      r.inputs = {last_dout_};  // query chunks j+1..: each one's own fetch frees it
      r.outputs = {rest};
      r.deps = {load_first};
      load_rest = emit();
      host_.mark(0);
    }
  } else {
    ins_.insert(ins_.end(),
                {at(sv_.chunk_q, j), at(sv_.chunk_o, j), at(sv_.chunk_lse, j), at(dout_, j)});
    if (pairs > 1) {
      ins_.push_back(last_dout_);  // query chunks j+1..: read again (and freed) at their own j
    }
  }
  // The implementation's per-block buffers (new zeroed dq, dk, dv) for each of the pairs blocks.
  KernelCost k = sb_.with_traffic(later(j), LedgerSite::kCoreBackward, static_cast<double>(pairs));
  k.time_s += host_.sync_gaps_s(pairs, kBwdBlockCalls);
  OpSpec& b =
      next(name_(kAttnBwd, j, [&] { return fmt::format("attn_bwd[q{}..{}][k{}]", j, nc_ - 1, j); }),
           Stream::kCompute, OpKind::kAttentionBwd, k.time_s, k.flops);
  b.inputs.assign(ins_.begin(), ins_.end());
  b.outputs = {loop.dkv_acc, loop.dq_block};
  b.workspace_bytes = ws_;
  b.workspace_category = attention;
  const OpSet bwd = emit();
  // F:940-941 after every block: the gaps between the blocks are in its time; the last block's
  // synchronisation is the inner loop's below (F:962-963), after dQ's copies to the host are
  // issued (overwrite_to_cpu after each block, F:951).
  host_.mark(kBwdBlockCalls);
  if (offload_) {
    // dQ of each inner step goes back to its pinned buffer while the next step computes.
    const std::int64_t bytes = pairs * dq_bytes_;
    OpSpec& back = next(name_(kOffloadDq, 'k', j), Stream::kD2H, OpKind::kCopyD2H,
                        sb_.cost_.host_copy_s(bytes, false), 0.0);
    back.transfer_bytes = bytes;
    back.deps = {load_first};
    dq_back = emit();
    host_.mark(0);
  }
  loop.join = compute(name_(kInnerJoin, 'k', j), OpKind::kElementwise, {0.0, 0.0},
                      {rest, loop.dq_block}, {}, {bwd, load_rest, dq_back});
  host_.mark(0, true);  // F:962-963
  return loop;
}

// After K/V chunk j's inner loop: its dK/dV and the (now complete) dQ of chunk j back to sequence
// sharding, RoPE's backward and the projection's.
void StepBuilder::FpdtBackward::gradients_of(std::int64_t j, const InnerLoop& loop) {
  const auto attention = MemCategory::kAttention;
  // dK/dV of chunk j are complete: back to sequence sharding and into the K/V projection.
  TensorSet dkv_h = sb_.b_.tensor(name_(kDkvH, 'k', j), kv_h_bytes_, attention, false);
  compute(name_(kDkvCast, 'k', j), OpKind::kElementwise, dkv_cast_, {loop.dkv_acc}, {dkv_h},
          {loop.join});
  host_.mark(2);
  TensorSet dkv =
      exchange(name_(kA2aDkv, 'k', j), dkv_h, kv_local_bytes_, LedgerSite::kDkvExchange);
  // dQ of chunk j received its last contribution in this outer iteration.
  TensorSet dq_j = sb_.b_.tensor(name_(kDqFinal, 'k', j), dq_bytes_, attention, false);
  if (offload_) {
    copy(name_(kFetchDq, 'k', j), true, dq_bytes_, {dq_all_}, {dq_j}, {loop.join});
    host_.mark(0);
  } else {
    compute(name_(kDqSlice, 'k', j), OpKind::kElementwise, dq_slice_, {dq_all_}, {dq_j},
            {loop.join});
  }
  TensorSet dq_h = sb_.b_.tensor(name_(kDqH, 'k', j), q_h_bytes_, attention, false);
  compute(name_(kDqCast, 'k', j), OpKind::kElementwise, dq_cast_, {dq_j}, {dq_h});
  TensorSet dqs = exchange(name_(kA2aDq, 'k', j), dq_h, q_local_bytes_, LedgerSite::kDqExchange);
  host_.sync_last();  // general_offload_stream.synchronize() and dist.barrier() (F:983-985)
  TensorSet dq_r = sb_.b_.tensor(name_(kDqRope, 'k', j), q_local_bytes_, attention, false);
  TensorSet dkv_r = sb_.b_.tensor(name_(kDkvRope, 'k', j), kv_local_bytes_, attention, false);
  compute(name_(kRopeBwd, 'k', j), OpKind::kElementwise, rope_bwd_, {dqs, dkv}, {dq_r, dkv_r});
  host_.mark(kRopeCalls);
  if (offload_ && j + 1 < nc_) {
    fetch_kv(j + 1);
  }
  const OpSet previous = dx_writes_.back();
  dx_writes_.push_back(compute(name_(kQkvProjBwd, 'k', j), OpKind::kGemm, proj_bwd_,
                               {dq_r, dkv_r, sv_.xn, params_, grads_}, {}, {previous}));
  host_.mark(kProjBwdCalls, true);  // F:1028-1029
}

InputGrad StepBuilder::fpdt_backward(const SavedLayer& sv,
                                     TensorSet d_o,
                                     TensorSet params,
                                     TensorSet grads) {
  FpdtBackward pass(*this, sv, d_o, params, grads);
  return pass.run();
}

}  // namespace cpsim::sim::detail
