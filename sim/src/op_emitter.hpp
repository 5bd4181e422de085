#pragma once
// Internal: the op emitter of the step builder. Every op of a step goes out through it: compute
// kernels, all-to-alls over the Ulysses group (with the implementation's ledger rows at their
// sites), sequence-parallel exchanges over the TP group, and host copies, each with its kernel cost
// from the cost model.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>

#include "cpsim/models/transformer.hpp"
#include "cpsim/sim/cost_model.hpp"
#include "cpsim/sim/implementation.hpp"
#include "cpsim/sim/schedule.hpp"

#include "builder.hpp"

namespace cpsim::sim::detail {

/// The sizes of a step that every part of the builder reads, computed once from the inputs: the
/// sequence, the degrees, and the tokens a rank holds at each point of a block.
struct StepShape {
  std::int64_t seq_tokens = 0;        ///< N, the global sequence
  std::int64_t cp = 1;                ///< C = ulysses · ring
  std::int64_t ulysses = 1;           ///< u, the all-to-all part of C
  std::int64_t ring = 1;              ///< r, the ring part of C
  std::int64_t tp = 1;                ///< T, tensor parallel (with sequence parallelism)
  std::int64_t local_tokens = 0;      ///< s = N / C: a rank's tokens outside attention
  std::int64_t sp_tokens = 0;         ///< s / T: norms, residuals and block I/O under TP
  std::int64_t ring_tokens = 0;       ///< N / r: a rank's tokens after the Ulysses all-to-all
  std::int64_t activation_bytes = 2;  ///< bytes of one activation element
  std::int64_t qk_head_dim = 0;       ///< d, a query's and a key's head width
  std::int64_t v_head_dim = 0;        ///< d_v, a value's and an output's (d but under MLA)
  /// A key and a value head together, d + d_v: the K/V tensors' width per KV head.
  std::int64_t kv_pair_dim() const { return qk_head_dim + v_head_dim; }
  std::int64_t ep = 1;  ///< E_p, expert parallel
  /// Mixture of experts: the token copies (rows) the rank's experts compute, s·k without EP and
  /// ⌈s·k·imbalance⌉ with it (ParallelConfig::expert_imbalance); 0 for a dense MLP.
  std::int64_t expert_rows = 0;
  std::int64_t local_experts = 0;  ///< E / E_p experts on the rank; 0 for a dense MLP

  static StepShape of(const ScheduleInputs& in) {
    const models::ParallelConfig& p = in.parallel;
    StepShape s;
    s.seq_tokens = p.seq_len;
    s.cp = p.cp_degree;
    s.ring = p.ring_degree;
    s.ulysses = s.cp / s.ring;
    s.tp = p.tp_degree;
    s.local_tokens = s.seq_tokens / s.cp;
    s.sp_tokens = s.local_tokens / s.tp;
    s.ring_tokens = s.seq_tokens / s.ring;
    s.activation_bytes = in.recipe.activation_bytes;
    s.qk_head_dim = in.model.head_dim;
    s.v_head_dim = in.model.value_head_dim();
    s.ep = std::max(1, p.ep_degree);  // check_experts refuses a degree below 1
    if (in.model.is_moe()) {
      const std::int64_t copies = s.local_tokens * in.model.moe.experts_per_token;
      s.expert_rows = s.ep == 1 ? copies
                                : static_cast<std::int64_t>(
                                      std::ceil(static_cast<double>(copies) * p.expert_imbalance));
      s.local_experts = in.model.moe.experts / s.ep;
    }
    return s;
  }
};

/// Emits ops through one reused OpSpec (spec_), whose vectors keep their capacity from op to op.
/// The step builder emits through it, and its attention schemes (attention_*.cpp) do too.
class OpEmitter {
 public:
  /// `implementation` (nullptr: none): its ledger rows at `layout` and its attention kernel.
  OpEmitter(const ScheduleInputs& in,
            const HeadLayout& layout,
            const Implementation* implementation,
            Workload& w,
            int simulated_ranks);

  /// spec_ reset for the next op: `name` on `stream`, nothing attached; emit() emits it.
  OpSpec& next_spec(Name name, Stream stream, OpKind kind);
  OpSet emit() { return b_.op(spec_); }
  OpSet compute(Name name,
                OpKind kind,
                const KernelCost& k,
                ListRef<TensorSet> inputs,
                ListRef<TensorSet> outputs,
                ListRef<OpSet> deps = {},
                std::int64_t workspace = 0,
                MemCategory ws_cat = MemCategory::kOther);
  /// All-to-all of `in` (per-rank send buffer `bytes` in activation dtype) over the Ulysses group;
  /// returns `in` itself when the group has one rank. The output tensor has the op's name.
  TensorSet exchange(
      Name name, TensorSet in, std::int64_t bytes, MemCategory cat, ListRef<OpSet> deps = {});
  /// The same at one of the implementation's ledger sites: its bytes there are the op's
  /// workspace (the wrapper's copies); at Ulysses degree 1 a wrapper that still copies makes it a
  /// local copy op. `held` are read by the op too (kept alive until it ends).
  TensorSet exchange(Name name,
                     TensorSet in,
                     std::int64_t bytes,
                     LedgerSite site,
                     ListRef<TensorSet> held = {},
                     ListRef<OpSet> deps = {});
  /// Bytes of the implementation's ledger rows at `site` (0 without an implementation).
  std::int64_t ledger_bytes(LedgerSite site) const {
    return ledger_bytes_[static_cast<std::size_t>(site)];
  }
  /// HBM bytes the implementation's ledger rows at `site` read and write (0 without one).
  std::int64_t ledger_traffic(LedgerSite site) const {
    return ledger_traffic_[static_cast<std::size_t>(site)];
  }
  /// `k` with the time of `blocks` × the traffic at `site` added (same launch).
  KernelCost with_traffic(KernelCost k, LedgerSite site, double blocks = 1.0) const {
    k.time_s += blocks * cost_.memory_traffic_s(ledger_traffic(site));
    return k;
  }
  /// Framework calls traced from the implementation's code at `site` (Implementation::site_calls);
  /// nullopt: none traced, the builders' own count per op stands.
  std::optional<std::int64_t> traced_calls(LedgerSite site) const {
    return traced_calls_[static_cast<std::size_t>(site)];
  }
  /// `k` issued as the calls traced at `site`, when there are (else as it is).
  KernelCost with_calls(KernelCost k, LedgerSite site) const {
    k.host_calls = traced_calls(site).value_or(k.host_calls);
    return k;
  }
  /// Adds `steps` × the traffic time at `site` to every rank's time of a ring segment (the
  /// implementation's per-step merge, casts and send-buffer copies; skipped steps included).
  void add_step_traffic(std::vector<double>& times, LedgerSite site, int steps) const {
    const double s = steps * cost_.memory_traffic_s(ledger_traffic(site));
    for (double& t : times) {
      t += s;
    }
  }
  /// Sequence parallelism (T > 1): all-gather of a sequence-sharded [s/T, h] activation to
  /// [s, h] (`gather`), or reduce-scatter of a partial [s, h] sum to [s/T, h], over the TP group on
  /// the communication stream; a new tensor of category `cat`. Returns `in` when T = 1.
  TensorSet tp_exchange(const char* name,
                        TensorSet in,
                        bool gather,
                        MemCategory cat = MemCategory::kOther,
                        ListRef<OpSet> deps = {});
  /// A copy of `bytes` between host and device (H2D when `to_device`) on the copy stream of its
  /// direction, timed by CostModel::host_copy_s; `out` is allocated when it starts.
  OpSet host_copy(Name name,
                  bool to_device,
                  std::int64_t bytes,
                  TensorSet in,
                  TensorSet out,
                  ListRef<OpSet> deps = {},
                  MemoryPool pool = MemoryPool::kByStream);
  /// The same, reading and writing several tensors.
  OpSet host_copy(Name name,
                  bool to_device,
                  std::int64_t bytes,
                  ListRef<TensorSet> inputs,
                  ListRef<TensorSet> outputs,
                  ListRef<OpSet> deps = {},
                  MemoryPool pool = MemoryPool::kByStream);

 protected:
  const ScheduleInputs& in_;
  const models::TransformerSpec& m_;
  const models::TrainingRecipe& r_;
  const StepShape shape_;
  CostModel cost_;
  Builder b_;
  Workload& w_;
  OpSpec spec_;
  std::array<std::int64_t, kLedgerSiteCount> ledger_bytes_{};                 ///< by LedgerSite
  std::array<std::int64_t, kLedgerSiteCount> ledger_traffic_{};               ///< by LedgerSite
  std::array<std::optional<std::int64_t>, kLedgerSiteCount> traced_calls_{};  ///< by LedgerSite
};

}  // namespace cpsim::sim::detail
