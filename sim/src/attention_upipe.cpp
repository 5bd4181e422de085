// UPipe (Untied Ulysses, headwise chunking; REFERENCES.md [UPipe], [UPipe-code]).
// The attention of a block
// runs in H/U stages of U query heads (U/u per rank after the all-to-all); a GQA-aware order
// projects and sends K/V once per fetch and reuses them for the stages of the fetch; stage buffers
// are freed before the next stage. The custom op saves its input xn, the full output final_out [s,
// H·d] and one LSE per stage. Its backward, per stage, recomputes the Q projection + RoPE +
// all-to-all (K/V at the start of each fetch), all-to-alls the stage's slice of final_out and of
// dOut to head- sharded layout, runs core attention backward (a zigzag ring when ring > 1), and
// all-to-alls dQ (and dK/dV at the end of a fetch) back into the projection backward.
#include <iterator>

#include <fmt/format.h>

#include "cpsim/models/units.hpp"

#include "step_builder.hpp"

namespace cpsim::sim::detail {
namespace {

// Names of the per-stage ops and tensors (stem + "[s<stage>]"), interned once per step.
constexpr const char* kUpipeFwdStems[] = {"kv",     "kv_proj", "kv_rope", "rope_k",
                                          "a2a_kv", "q",       "q_proj",  "q_rope",
                                          "rope_q", "a2a_q",   "a2a_out", "fill_out"};
constexpr const char* kUpipeBwdStems[] = {
    "kv(re)",     "kv_proj(re)",    "kv_rope(re)",  "rope_k(re)", "a2a_kv(re)",
    "q(re)",      "q_proj(re)",     "q_rope(re)",   "rope_q(re)", "a2a_q(re)",
    "out_slice",  "slice_out",      "a2a_out(bwd)", "dout_slice", "slice_dout",
    "a2a_dout",   "dkv_accumulate", "a2a_dq",       "dq_rope",    "rope_q_bwd",
    "q_proj_bwd", "a2a_dkv",        "dkv_rope",     "rope_k_bwd", "kv_proj_bwd"};

}  // namespace

void StepBuilder::upipe_forward(SavedLayer& sv, TensorSet params) {
  const std::int64_t h = m_.hidden, d = m_.head_dim;
  const std::int64_t u = layout_.heads_per_stage;
  const std::int64_t f = layout_.kv_heads_per_fetch;
  const std::int64_t q_local = u / shape_.ulysses;
  const std::int64_t kv_local = f / shape_.ulysses;
  const std::int64_t kv_bytes = shape_.local_tokens * 2 * f * d * shape_.activation_bytes;
  const std::int64_t q_bytes = shape_.local_tokens * u * d * shape_.activation_bytes;
  // The full output is preallocated by the custom op and filled stage by stage.
  sv.final_out =
      b_.tensor("final_out", shape_.local_tokens * m_.heads * d * shape_.activation_bytes,
                MemCategory::kActivations);
  OpSet alloc = compute("upipe_alloc_out", OpKind::kElementwise, {0.0, 0.0}, {}, {sv.final_out});
  TensorSet kv_h;
  std::vector<OpSet> fills;
  ChunkNames names(b_, "upipe_forward", static_cast<int>(std::size(kUpipeFwdStems)),
                   kUpipeFwdStems);
  for (std::int64_t st = 0; st < layout_.stages; ++st) {
    const std::string tag = fmt::format("[s{}]", st);
    auto stage_name = [&](int slot) { return Name::interned(names(slot, 's', st)); };
    if (st % layout_.stages_per_kv_fetch == 0) {
      TensorSet kvp = b_.tensor(names(0, 's', st), kv_bytes, MemCategory::kAttention);
      compute(stage_name(1), OpKind::kGemm,
              linear_fwd(shape_.local_tokens, 2 * f / layout_.kv_replication * d, h),
              {sv.xn, params}, {kvp});
      TensorSet kvr = b_.tensor(names(2, 's', st), kv_bytes, MemCategory::kAttention);
      compute(stage_name(3), OpKind::kElementwise,
              rope_cost(0, shape_.local_tokens * f * d, 0, RopeBackward::kNone), {kvp}, {kvr});
      kv_h = exchange(stage_name(4), kvr, kv_bytes, LedgerSite::kKvExchange);
    }
    TensorSet q = b_.tensor(names(5, 's', st), q_bytes, MemCategory::kAttention);
    compute(stage_name(6), OpKind::kGemm, linear_fwd(shape_.local_tokens, u * d, h),
            {sv.xn, params}, {q});
    TensorSet qr = b_.tensor(names(7, 's', st), q_bytes, MemCategory::kAttention);
    compute(stage_name(8), OpKind::kElementwise,
            rope_cost(shape_.local_tokens * u * d, 0, 0, RopeBackward::kNone), {q}, {qr});
    TensorSet q_h = exchange(stage_name(9), qr, q_bytes, LedgerSite::kQExchange);
    const CoreForward core = core_forward(tag, q_h, kv_h, q_local, kv_local);
    TensorSet o_s = exchange(stage_name(10), core.o_h, q_bytes, LedgerSite::kOutExchange);
    fills.push_back(
        compute(stage_name(11), OpKind::kElementwise, mem(2 * q_bytes), {o_s}, {}, {alloc}));
    sv.lses.push_back(core.lse);
  }
  // Heads back to their natural order before the output projection (an indexed copy).
  sv.o = b_.tensor("out_permuted", shape_.local_tokens * m_.heads * d * shape_.activation_bytes,
                   MemCategory::kActivations);
  compute("permute_out", OpKind::kElementwise,
          mem(2 * shape_.local_tokens * m_.heads * d * shape_.activation_bytes), {sv.final_out},
          {sv.o}, fills);
}

InputGrad StepBuilder::upipe_backward(const SavedLayer& sv,
                                      TensorSet d_o,
                                      TensorSet params,
                                      TensorSet grads) {
  const std::int64_t h = m_.hidden, d = m_.head_dim;
  const std::int64_t u = layout_.heads_per_stage;
  const std::int64_t f = layout_.kv_heads_per_fetch;
  const std::int64_t q_local = u / shape_.ulysses;
  const std::int64_t kv_local = f / shape_.ulysses;
  const std::int64_t kv_bytes = shape_.local_tokens * 2 * f * d * shape_.activation_bytes;
  const std::int64_t q_bytes = shape_.local_tokens * u * d * shape_.activation_bytes;
  // dX accumulates the contributions of every stage's Q (and each fetch's K/V) projection.
  TensorSet dxn =
      b_.tensor("dxn", shape_.local_tokens * h * shape_.activation_bytes, MemCategory::kOther);
  OpSet alloc = compute("upipe_alloc_dx", OpKind::kElementwise,
                        mem(shape_.local_tokens * h * shape_.activation_bytes), {}, {dxn});
  std::vector<OpSet> dx_writes{alloc};
  TensorSet kv_h, dkv_acc;
  OpSet dkv_ready;
  ChunkNames names(b_, "upipe_backward", static_cast<int>(std::size(kUpipeBwdStems)),
                   kUpipeBwdStems);
  for (std::int64_t st = 0; st < layout_.stages; ++st) {
    const std::string tag = fmt::format("[s{}]", st);
    auto stage_name = [&](int slot) { return Name::interned(names(slot, 's', st)); };
    const bool fetch_start = st % layout_.stages_per_kv_fetch == 0;
    const bool fetch_end = (st + 1) % layout_.stages_per_kv_fetch == 0;
    if (fetch_start) {
      TensorSet kvp = b_.tensor(names(0, 's', st), kv_bytes, MemCategory::kAttention);
      compute(stage_name(1), OpKind::kGemm,
              linear_fwd(shape_.local_tokens, 2 * f / layout_.kv_replication * d, h),
              {sv.xn, params}, {kvp});
      TensorSet kvr = b_.tensor(names(2, 's', st), kv_bytes, MemCategory::kAttention);
      compute(stage_name(3), OpKind::kElementwise,
              rope_cost(0, shape_.local_tokens * f * d, 0, RopeBackward::kNone), {kvp}, {kvr});
      kv_h = exchange(stage_name(4), kvr, kv_bytes, LedgerSite::kKvExchange);
    }
    TensorSet q = b_.tensor(names(5, 's', st), q_bytes, MemCategory::kAttention);
    compute(stage_name(6), OpKind::kGemm, linear_fwd(shape_.local_tokens, u * d, h),
            {sv.xn, params}, {q});
    TensorSet qr = b_.tensor(names(7, 's', st), q_bytes, MemCategory::kAttention);
    compute(stage_name(8), OpKind::kElementwise,
            rope_cost(shape_.local_tokens * u * d, 0, 0, RopeBackward::kNone), {q}, {qr});
    TensorSet q_h = exchange(stage_name(9), qr, q_bytes, LedgerSite::kQExchange);
    // The stage's slice of final_out and of dOut, to head-sharded layout.
    TensorSet o_slice = b_.tensor(names(10, 's', st), q_bytes, MemCategory::kAttention);
    compute(stage_name(11), OpKind::kElementwise, mem(2 * q_bytes), {sv.final_out}, {o_slice});
    TensorSet o_h = exchange(stage_name(12), o_slice, q_bytes, MemCategory::kAttention);
    TensorSet do_slice = b_.tensor(names(13, 's', st), q_bytes, MemCategory::kAttention);
    compute(stage_name(14), OpKind::kElementwise, mem(2 * q_bytes), {d_o}, {do_slice});
    TensorSet do_h = exchange(stage_name(15), do_slice, q_bytes, MemCategory::kAttention);
    // Core attention backward from the saved LSE and the re-sent output. The first stage of a K/V
    // fetch produces the fetch's dK/dV; later stages add theirs into it.
    const CoreBackward g = core_backward(tag, q_h, kv_h, o_h, sv.lses[static_cast<std::size_t>(st)],
                                         do_h, q_local, kv_local);
    const TensorSet dq_h = g.dq_h;
    if (fetch_start) {
      dkv_acc = g.dkv_h;
      dkv_ready = {};
    } else {
      dkv_ready = compute(stage_name(16), OpKind::kElementwise,
                          mem(3 * shape_.ring_tokens * 2 * kv_local * d * shape_.activation_bytes),
                          {g.dkv_h, dkv_acc}, {}, {dkv_ready});
    }
    TensorSet dq = exchange(stage_name(17), dq_h, q_bytes, LedgerSite::kDqExchange);
    TensorSet dqr = b_.tensor(names(18, 's', st), q_bytes, MemCategory::kAttention);
    compute(stage_name(19), OpKind::kElementwise,
            rope_cost(shape_.local_tokens * u * d, 0, 0, RopeBackward::kAutograd), {dq}, {dqr});
    dx_writes.push_back(compute(stage_name(20), OpKind::kGemm,
                                linear_bwd(shape_.local_tokens, u * d, h),
                                {dqr, sv.xn, params, grads}, {}, {dx_writes.back()}));
    if (fetch_end) {
      TensorSet dkv =
          exchange(stage_name(21), dkv_acc, kv_bytes, LedgerSite::kDkvExchange, {}, {dkv_ready});
      TensorSet dkvr = b_.tensor(names(22, 's', st), kv_bytes, MemCategory::kAttention);
      compute(stage_name(23), OpKind::kElementwise,
              rope_cost(0, shape_.local_tokens * f * d, 0, RopeBackward::kAutograd), {dkv}, {dkvr});
      dx_writes.push_back(
          compute(stage_name(24), OpKind::kGemm,
                  linear_bwd(shape_.local_tokens, 2 * f / layout_.kv_replication * d, h),
                  {dkvr, sv.xn, params, grads}, {}, {dx_writes.back()}));
    }
  }
  // dxn is complete when the last projection backward has written it.
  return {dxn, dx_writes.back()};
}

}  // namespace cpsim::sim::detail
