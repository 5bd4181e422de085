#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "cpsim/models/units.hpp"
#include "cpsim/sim/implementation.hpp"
#include "cpsim/sim/schedule.hpp"

namespace cpsim::sim {

const char* to_string(LedgerSite s) {
  switch (s) {
    case LedgerSite::kHeldThroughBlock:
      return "held_through_block";
    case LedgerSite::kHeldThroughBackward:
      return "held_through_backward";
    case LedgerSite::kQExchange:
      return "q_exchange";
    case LedgerSite::kKvExchange:
      return "kv_exchange";
    case LedgerSite::kCoreForward:
      return "core_forward";
    case LedgerSite::kOutExchange:
      return "out_exchange";
    case LedgerSite::kDoutExchange:
      return "dout_exchange";
    case LedgerSite::kCoreBackward:
      return "core_backward";
    case LedgerSite::kGradFinish:
      return "grad_finish";
    case LedgerSite::kDqExchange:
      return "dq_exchange";
    case LedgerSite::kDkvExchange:
      return "dkv_exchange";
    case LedgerSite::kRingForwardStep:
      return "ring_forward_step";
    case LedgerSite::kRingBackwardStep:
      return "ring_backward_step";
    case LedgerSite::kRingForwardHeld:
      return "ring_forward_held";
  }
  return "?";
}

const char* to_string(LedgerWhen w) {
  switch (w) {
    case LedgerWhen::kAlways:
      return "always";
    case LedgerWhen::kUlyssesAbove1:
      return "u > 1";
    case LedgerWhen::kKvHeadsPerRankAbove1:
      return "hkv/u > 1";
    case LedgerWhen::kKvHeadsPerRankAbove1AnyDegree:
      return "hkv/u > 1, any u";
    case LedgerWhen::kHeadsPerRankAbove1:
      return "h/u > 1";
  }
  return "?";
}

LedgerUnits ledger_units(const ScheduleInputs& in, const HeadLayout& layout) {
  // One stage's heads: all of them outside UPipe (heads_per_stage = H, kv_heads_per_fetch =
  // the KV heads after replication); one chunk's tokens in FPDT.
  const std::int64_t s = in.parallel.local_seq() / std::max<std::int64_t>(layout.fpdt_chunks, 1);
  const std::int64_t d = in.model.head_dim, dv = in.model.value_head_dim();
  LedgerUnits u;
  u.shd = s * layout.heads_per_stage * d;
  u.shvd = s * layout.heads_per_stage * dv;
  u.shkd = s * layout.kv_heads_per_fetch * (d + dv) / 2;  // (d + d_v) even: TransformerSpec
  u.sh = s * layout.heads_per_stage;
  u.ulysses = layout.ulysses;
  u.kv_heads_per_rank = layout.kv_heads_per_fetch / layout.ulysses;
  u.heads_per_rank = layout.heads_per_stage / layout.ulysses;
  u.kv_replication = layout.kv_replication;
  u.shkd_model = u.shkd / std::max<std::int64_t>(layout.kv_replication, 1);
  return u;
}

std::int64_t row_bytes(const LedgerRow& row, const LedgerUnits& units) {
  return row.shd * (row.output_heads ? units.shvd : units.shd) +
         row.shkd * (row.model_kv_heads ? units.shkd_model : units.shkd) + row.sh * units.sh;
}

namespace {
std::string formula(std::int64_t shd,
                    std::int64_t shkd,
                    std::int64_t sh,
                    bool model_kv = false,
                    bool output_heads = false) {
  std::string s;
  auto term = [&s](std::int64_t k, const char* unit) {
    if (k != 0) {
      s += fmt::format("{}{}·{}", s.empty() ? "" : " + ", k, unit);
    }
  };
  term(shd, output_heads ? "sHd_v" : "sHd");
  term(shkd, model_kv ? "sHkv_m·d" : "sHkv·d");
  term(sh, "sH");
  return s.empty() ? "0" : s;
}

bool applies(const LedgerRow& row, const LedgerUnits& units) {
  return row.when == LedgerWhen::kAlways ||
         (row.when == LedgerWhen::kUlyssesAbove1 && units.ulysses > 1) ||
         (row.when == LedgerWhen::kKvHeadsPerRankAbove1 && units.ulysses > 1 &&
          units.kv_heads_per_rank > 1) ||
         (row.when == LedgerWhen::kKvHeadsPerRankAbove1AnyDegree && units.kv_heads_per_rank > 1) ||
         (row.when == LedgerWhen::kHeadsPerRankAbove1 && units.ulysses > 1 &&
          units.heads_per_rank > 1);
}
}  // namespace

std::string row_formula(const LedgerRow& row) {
  return formula(row.shd, row.shkd, row.sh, row.model_kv_heads, row.output_heads);
}

std::int64_t row_traffic_bytes(const LedgerRow& row, const LedgerUnits& units) {
  return row.traffic.shd * (row.output_heads ? units.shvd : units.shd) +
         row.traffic.shkd * units.shkd + row.traffic.sh * units.sh;
}

std::string traffic_formula(const LedgerRow& row) {
  return formula(row.traffic.shd, row.traffic.shkd, row.traffic.sh, false, row.output_heads);
}

bool Implementation::runs(models::CpMethod m) const {
  for (const models::CpMethod x : methods()) {
    if (x == m) {
      return true;
    }
  }
  return false;
}

std::int64_t Implementation::site_bytes(LedgerSite site, const LedgerUnits& units) const {
  return site_sum(site, units, row_bytes);
}

std::int64_t Implementation::site_traffic_bytes(LedgerSite site, const LedgerUnits& units) const {
  return site_sum(site, units, row_traffic_bytes);
}

std::int64_t Implementation::site_sum(LedgerSite site,
                                      const LedgerUnits& units,
                                      std::int64_t (*per_row)(const LedgerRow&,
                                                              const LedgerUnits&)) const {
  std::int64_t sum = 0;
  for (const LedgerRow& row : ledger()) {
    if (row.site == site && applies(row, units)) {
      sum += per_row(row, units);
    }
  }
  return sum;
}

const char* to_string(CallsWhen w) {
  switch (w) {
    case CallsWhen::kAlways:
      return "always";
    case CallsWhen::kHeadsPerRankAbove1:
      return "h/u > 1";
    case CallsWhen::kKvHeadsPerRankAbove1:
      return "hkv/u > 1";
    case CallsWhen::kKvReplicated:
      return "kv replicated";
  }
  return "?";
}

std::optional<std::int64_t> Implementation::site_calls(LedgerSite site,
                                                       const LedgerUnits& units) const {
  std::optional<std::int64_t> sum;
  for (const SiteCalls& row : traced_calls()) {
    if (row.site != site) {
      continue;
    }
    const bool applies =
        row.when == CallsWhen::kAlways ||
        (row.when == CallsWhen::kHeadsPerRankAbove1 && units.heads_per_rank > 1) ||
        (row.when == CallsWhen::kKvHeadsPerRankAbove1 && units.kv_heads_per_rank > 1) ||
        (row.when == CallsWhen::kKvReplicated && units.kv_replication > 1);
    sum = sum.value_or(0) + (applies ? row.calls : 0);
  }
  return sum;
}

// The implementations, each defined in its own file of this folder by its factory: one
// declaration here and one line in the list below (sim/CMakeLists.txt compiles every file of the
// folder).
namespace impls {
const Implementation& yunchang_usp();
const Implementation& deepspeed_ulysses();
const Implementation& untied_ulysses_upipe();
const Implementation& torch_native_cp();
const Implementation& megatron_core_cp();
const Implementation& deepspeed_fpdt();
}  // namespace impls

std::span<const Implementation* const> implementations() {
  // One line per implementation; the count follows the list.
  static const auto kAll = std::to_array<const Implementation*>({
      &impls::yunchang_usp(),
      &impls::deepspeed_ulysses(),
      &impls::untied_ulysses_upipe(),
      &impls::torch_native_cp(),
      &impls::megatron_core_cp(),
      &impls::deepspeed_fpdt(),
  });
  return kAll;
}

bool Implementation::default_for(std::string_view recipe, models::CpMethod m) const {
  return !table_.default_recipe.empty() && recipe == table_.default_recipe && runs(m);
}

bool Implementation::runs_on(std::string_view launcher) const {
  for (const std::string_view l : launchers()) {
    if (l == launcher) {
      return true;
    }
  }
  return false;
}

const Implementation* default_implementation(std::string_view recipe, models::CpMethod m) {
  for (const Implementation* i : implementations()) {
    if (i->default_for(recipe, m)) {
      return i;
    }
  }
  return nullptr;
}

ResolvedImplementation resolve_implementation(const ScheduleInputs& in) {
  const std::string& asked = in.parallel.implementation;
  const models::CpMethod m = in.parallel.method;
  ResolvedImplementation out;
  if (asked.empty()) {
    out.implementation = default_implementation(in.recipe.name, m);
    return out;
  }
  if (asked == "none") {
    return out;
  }
  const Implementation* found = find_implementation(asked);
  if (found == nullptr) {
    out.issue = ConfigIssue{
        Quantity::kImplementation,
        fmt::format("unknown implementation '{}'; known: {}, or none (the method's scheme alone)",
                    asked, implementation_names())};
  } else if (!found->runs(m)) {
    std::string runs;
    for (const models::CpMethod x : found->methods()) {
      runs += fmt::format("{}{}", runs.empty() ? "" : ", ", models::to_string(x));
    }
    out.issue = ConfigIssue{
        Quantity::kImplementation,
        fmt::format("{} does not run --method {} (it runs {})", asked, models::to_string(m), runs)};
  } else {
    out.implementation = found;
  }
  return out;
}

const Implementation* requested_implementation(const ScheduleInputs& in) {
  return resolve_implementation(in).implementation;
}

std::int64_t logits_loss_peak_bytes_per_logit(const ScheduleInputs& in) {
  const Implementation* impl = requested_implementation(in);
  const LogitsLoss loss = impl != nullptr ? impl->logits_loss() : LogitsLoss::kHuggingFace;
  switch (loss) {
    case LogitsLoss::kMegatronVocabParallel:
      return kFp32Bytes + in.recipe.activation_bytes;
    case LogitsLoss::kHuggingFace:
      break;
  }
  return 3 * kFp32Bytes;
}

const Implementation* find_implementation(std::string_view name) {
  for (const Implementation* i : implementations()) {
    if (i->name() == name) {
      return i;
    }
  }
  return nullptr;
}

std::string implementation_names() {
  std::string s;
  for (const Implementation* i : implementations()) {
    s += s.empty() ? "" : ", ";
    s += i->name();
  }
  return s;
}

}  // namespace cpsim::sim
