#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/units.hpp"
#include "cpsim/sim/implementation.hpp"
#include "cpsim/sim/pipeline.hpp"

#include "evaluate_pipeline.hpp"
#include "search_parts.hpp"

namespace cpsim::planner {

using namespace search_parts;

namespace {

using models::CheckpointMode;

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i) {
    if (n % i == 0)
      d.push_back(i);
  }
  return d;
}

std::string structure_label(const models::ParallelConfig& p) {
  std::string s = sim::cp_scheme(p.method).label(sim::LabelStyle::kSearch, p, nullptr);
  if (p.tp_degree > 1) {
    s += fmt::format(" tp{}", p.tp_degree);
  }
  if (p.ep_degree > 1) {
    s += fmt::format(" ep{}", p.ep_degree);
  }
  if (p.pp_degree > 1) {
    s += fmt::format(" pp{}", p.pp_degree);
    if (p.pp_first_stage_layers > 0 || p.pp_last_stage_layers > 0) {
      s += fmt::format("[{}..{}]", p.pp_first_stage_layers, p.pp_last_stage_layers);
    }
    if (p.pp_schedule == models::PipelineSchedule::kInterleaved) {
      s += fmt::format(" v{}", p.virtual_stages);
    }
  }
  if (p.micro_batches > 1) {
    s += fmt::format(" mb{}", p.micro_batches);
  }
  if (p.data_parallel() > 1) {
    s += fmt::format(" dp{}", p.data_parallel());
  }
  return s;
}

// The recipes of the --seq search: ZeRO 3/2 × AC (full+offload, full, selective, none) × tiled
// MLP × fused loss, each knob the user fixed kept at the base recipe's value.
std::vector<models::TrainingRecipe> recipe_space(const models::TrainingRecipe& base,
                                                 const PlanConstraints& fixed) {
  const std::vector<int> zeros =
      fixed.zero_stage ? std::vector<int>{base.zero_stage} : std::vector<int>{3, 2};
  std::vector<std::pair<CheckpointMode, bool>> acs;
  for (const auto& ac :
       {std::pair{CheckpointMode::kFull, true}, std::pair{CheckpointMode::kFull, false},
        std::pair{CheckpointMode::kSelective, false}, std::pair{CheckpointMode::kNone, false}}) {
    if ((!fixed.checkpointing || ac.first == base.checkpointing) &&
        (!fixed.checkpoint_offload || ac.second == base.checkpoint_offload)) {
      acs.push_back(ac);
    }
  }
  if (acs.empty()) {  // a fixed pair outside the list: searched as given (validation refuses it)
    acs.emplace_back(base.checkpointing, base.checkpoint_offload);
  }
  const std::vector<bool> tileds =
      fixed.tiled_mlp ? std::vector<bool>{base.tiled_mlp} : std::vector<bool>{true, false};
  const std::vector<bool> fuseds =
      fixed.fused_loss ? std::vector<bool>{base.fused_loss} : std::vector<bool>{true, false};
  std::vector<models::TrainingRecipe> recipes;
  for (const int zero : zeros) {
    for (const auto& [ac, offload] : acs) {
      for (const bool tiled : tileds) {
        for (const bool fused : fuseds) {
          if (base.fp8 && (tiled || zero == 3)) {
            continue;  // FP8 runs TransformerEngine's Linear layers with unsharded weights
          }
          models::TrainingRecipe r = base;
          r.zero_stage = zero;
          r.checkpointing = ac;
          r.checkpoint_offload = offload;
          r.tiled_mlp = tiled;
          r.tiled_norm = tiled ? base.tiled_norm || tiled : base.tiled_norm;
          r.fused_loss = fused;
          recipes.push_back(r);
        }
      }
    }
  }
  return recipes;
}

// The TP degrees searched: the one fixed, else every T that divides the GPUs of a node, the GPUs,
// the query and KV heads and the FFN width (Megatron-Core's and TorchTitan's requirements; what
// else a T needs, the simulator checks per candidate).
std::vector<int> tp_degrees(const sim::ScheduleInputs& base, const PlanConstraints& fixed) {
  if (fixed.tp_degree > 0) {
    return {fixed.tp_degree};
  }
  const models::TransformerSpec& m = base.model;
  const int per_node = std::max(1, base.parallel.gpus_per_node);
  std::vector<int> out;
  for (const int t : divisors(per_node)) {
    if (base.parallel.gpus % t == 0 && m.heads % t == 0 && m.kv_heads % t == 0 &&
        m.ffn_hidden % t == 0) {
      out.push_back(t);
    }
  }
  return out;
}

// The EP degrees searched: the one fixed, else for a mixture of experts every E_p that divides
// the experts and the GPUs of a pipeline stage, across nodes too (Megatron-Core and TorchTitan
// place EP groups over nodes when E_p exceeds a node; the all-to-all then crosses the network;
// what else an E_p needs, the simulator checks per candidate), else 1.
std::vector<int> ep_degrees(const sim::ScheduleInputs& base,
                            const PlanConstraints& fixed,
                            int stage_gpus) {
  if (fixed.ep_degree > 0) {
    return {fixed.ep_degree};
  }
  const models::TransformerSpec& m = base.model;
  if (!m.is_moe()) {
    return {1};
  }
  std::vector<int> out;
  for (const int e : divisors(std::max(1, stage_gpus))) {
    if (m.moe.experts % e == 0) {
      out.push_back(e);
    }
  }
  return out;
}

// Whether a search may make a step hold more sequences than the base's for pipeline parallelism
// (P micro-batches at least fill a pipeline of P stages): --seq with data parallelism allowed (a
// larger global batch), or a PP degree or micro-batch count the user fixed.
bool pipeline_may_grow_batch(const PlanOptions& options) {
  const PlanConstraints& f = options.fixed;
  return f.pp_degree > 1 || f.micro_batches > 0 ||
         (options.seq_len.has_value() && options.allow_data_parallel);
}

// The uneven split of L blocks over P stages the search tries when P does not divide L: one block
// fewer on the first and the last stage than on the others, the layout Llama 3 used to balance
// the embedding and the LM head + loss (REFERENCES.md [Llama3] §3.3.2), as Megatron's
// --decoder-first/last-pipeline-num-layers express it: L = (P − 2)·k + 2·(k − 1); else the
// remainder on the first stage alone, k = ⌈L/P⌉ blocks on each other stage and L − (P − 1)·k ≥ 1
// on the first (--decoder-first-pipeline-num-layers; DeepSeek-V3's 61 over 8 stages: 5 and 8).
std::optional<std::pair<int, int>> stage_split(std::int64_t layers,
                                               int pp,
                                               const PlanConstraints& f) {
  if (f.pp_first_stage_layers > 0 || f.pp_last_stage_layers > 0) {
    return std::pair{f.pp_first_stage_layers, f.pp_last_stage_layers};
  }
  if (layers % pp == 0) {
    return std::pair{0, 0};
  }
  if (pp >= 3 && (layers + 2) % pp == 0 && (layers + 2) / pp >= 2) {
    const int k = static_cast<int>((layers + 2) / pp);
    return std::pair{k - 1, k - 1};
  }
  const std::int64_t k = (layers + pp - 1) / pp;
  if (pp >= 2 && layers - (pp - 1) * k >= 1) {
    return std::pair{static_cast<int>(layers - (pp - 1) * k), 0};
  }
  return std::nullopt;
}

// The PP degrees searched at TP degree `tp`: the one fixed, else 1 and, when the step may grow,
// every P ≥ 2 dividing the GPUs / T whose stages split the blocks (stage_split), P ≤ the fixed
// micro-batch count.
std::vector<int> pp_degrees(const sim::ScheduleInputs& base, const PlanOptions& options, int tp) {
  const PlanConstraints& f = options.fixed;
  if (f.pp_degree > 0) {
    return {f.pp_degree};
  }
  std::vector<int> out{1};
  if (!pipeline_may_grow_batch(options)) {
    return out;
  }
  for (const int p : divisors(base.parallel.gpus / tp)) {
    if (p >= 2 && (f.micro_batches == 0 || p <= f.micro_batches) &&
        stage_split(base.model.layers, p, f)) {
      out.push_back(p);
    }
  }
  return out;
}

// The pipeline variants of one structure (its PP degree and stage split set): schedule × virtual
// stages × micro-batches. Interleaving needs V dividing every stage's blocks and m a multiple of
// P (Megatron-Core, sim/pipeline.cpp); a value the user fixed is kept as given.
std::vector<models::ParallelConfig> pipeline_variants(const models::ParallelConfig& st,
                                                      const sim::ScheduleInputs& base,
                                                      const PlanOptions& options) {
  const PlanConstraints& f = options.fixed;
  std::vector<models::ParallelConfig> out;
  if (st.pp_degree <= 1) {
    models::ParallelConfig q = st;
    q.micro_batches = f.micro_batches > 0 ? f.micro_batches : base.parallel.micro_batches;
    out.push_back(q);
    return out;
  }
  const int pp = st.pp_degree;
  std::vector<int> ms;
  if (f.micro_batches > 0) {
    ms = {f.micro_batches};
  } else if (options.seq_len) {
    ms = {pp, 2 * pp, 4 * pp};
  } else {
    ms = {pp};
  }
  const std::int64_t layers = base.model.layers;
  const int split_stages = (st.pp_first_stage_layers > 0) + (st.pp_last_stage_layers > 0);
  const std::int64_t middle =
      pp > split_stages
          ? (layers - st.pp_first_stage_layers - st.pp_last_stage_layers) / (pp - split_stages)
          : 0;
  auto divides_stages = [&](int v) {
    const std::int64_t first = st.pp_first_stage_layers > 0 ? st.pp_first_stage_layers : middle;
    const std::int64_t last = st.pp_last_stage_layers > 0 ? st.pp_last_stage_layers : middle;
    return first % v == 0 && last % v == 0 && middle % v == 0;
  };
  std::vector<std::pair<models::PipelineSchedule, int>> schedules;
  const bool fixed_schedule = f.pp_schedule.has_value();
  if (!fixed_schedule || *f.pp_schedule == models::PipelineSchedule::k1F1B) {
    schedules.emplace_back(models::PipelineSchedule::k1F1B, 1);
  }
  if (!fixed_schedule || *f.pp_schedule == models::PipelineSchedule::kInterleaved) {
    if (f.virtual_stages > 0) {
      schedules.emplace_back(models::PipelineSchedule::kInterleaved, f.virtual_stages);
    } else {
      for (const int v : {2, 4, 8}) {
        if (divides_stages(v)) {
          schedules.emplace_back(models::PipelineSchedule::kInterleaved, v);
        }
      }
    }
  }
  for (const auto& [schedule, v] : schedules) {
    for (const int m : ms) {
      const bool interleaved = schedule == models::PipelineSchedule::kInterleaved;
      if (f.pp_degree == 0 && (m < pp || (interleaved && m % pp != 0))) {
        continue;  // a searched P: only pipelines its micro-batches fill
      }
      models::ParallelConfig q = st;
      q.pp_schedule = schedule;
      q.virtual_stages = v;
      q.micro_batches = m;
      out.push_back(q);
    }
  }
  return out;
}

// Whether the configuration's implementation (as the candidate asks for it, or the recipe's
// default) runs pipeline parallelism.
bool runs_pipeline(const sim::ScheduleInputs& in) {
  const sim::Implementation* impl = sim::requested_implementation(in);
  return impl == nullptr || impl->pp_refusal().empty();
}

// Whether `p` (a structure the method proposed) has every value the user fixed that the method
// reads.
bool keeps_fixed(const sim::CpScheme& method,
                 const models::ParallelConfig& p,
                 const PlanConstraints& fixed) {
  return (fixed.ulysses_degree == 0 || !method.has_ulysses_part() ||
          p.ulysses_degree() == fixed.ulysses_degree) &&
         (fixed.ring_degree == 0 || !method.has_ring_part() ||
          p.ring_degree == fixed.ring_degree) &&
         (fixed.heads_per_stage == 0 || !method.uses_heads_per_stage() ||
          p.heads_per_stage == fixed.heads_per_stage) &&
         (fixed.fpdt_chunk == 0 || !method.uses_fpdt_chunk() || p.fpdt_chunk == fixed.fpdt_chunk);
}

// The method's structures at each CP degree, keeping the values the user fixed. When none of
// the method's proposals has them, the configuration as given is searched alone (at the largest
// CP degree), so that its refusal or result names the value rather than the method vanishing.
void append_structures(const sim::CpScheme& method,
                       const sim::ScheduleInputs& base,
                       const PlanOptions& options,
                       const std::vector<int>& cps,
                       std::vector<models::ParallelConfig>& out) {
  const PlanConstraints& fixed = options.fixed;
  sim::SearchSpace space;
  space.heads = base.model.heads;
  space.seq_len = options.seq_len;
  const std::size_t before = out.size();
  std::vector<models::ParallelConfig> proposed;
  for (const int c : cps) {
    models::ParallelConfig p = base.parallel;
    p.method = method.id();
    p.cp_degree = c;
    p.heads_per_stage = 0;
    if (!fixed.ring_layout) {
      p.ring_layout = models::RingLayout::kZigzag;
    }
    space.cp_degree = c;
    proposed.clear();
    method.search_candidates(p, space, proposed);
    for (const models::ParallelConfig& q : proposed) {
      if (keeps_fixed(method, q, fixed)) {
        out.push_back(q);
      }
    }
  }
  if (out.size() > before || proposed.empty()) {
    return;
  }
  models::ParallelConfig given = proposed.back();  // at the largest CP degree searched
  if (method.has_ring_part() && method.has_ulysses_part()) {
    given.ring_degree = fixed.ring_degree > 0 ? fixed.ring_degree
                        : fixed.ulysses_degree > 0
                            ? std::max(1, given.cp_degree / fixed.ulysses_degree)
                            : given.ring_degree;
  } else if (method.has_ring_part() && fixed.ring_degree > 0) {
    given.cp_degree = given.ring_degree = fixed.ring_degree;  // the ring is the whole group
  } else if (method.has_ulysses_part() && fixed.ulysses_degree > 0) {
    given.cp_degree = fixed.ulysses_degree;
  }
  if (method.uses_heads_per_stage() && fixed.heads_per_stage > 0) {
    given.heads_per_stage = fixed.heads_per_stage;
  }
  if (method.uses_fpdt_chunk() && fixed.fpdt_chunk > 0) {
    given.fpdt_chunk = fixed.fpdt_chunk;
  }
  out.push_back(given);
}

// The candidates a launcher runs, each recipe as the launcher's file makes it run; candidates that
// become the same configuration are kept once (the first), methods it cannot run are dropped.
std::vector<Candidate> as_run_by(LauncherFormat launcher,
                                 const sim::ScheduleInputs& base,
                                 std::vector<Candidate> candidates) {
  sim::ScheduleInputs probe = base;
  std::set<std::string> seen;
  std::vector<Candidate> out;
  for (Candidate& c : candidates) {
    c.apply_to(probe);
    const sim::CpScheme& method = sim::cp_scheme(c.parallel.method);
    if (!method.launcher_selection(to_string(launcher), c.parallel, c.recipe.attention_kernel) ||
        method.launcher_refuses(to_string(launcher), probe.model)) {
      continue;
    }
    c.recipe = recipe_as_run(launcher, probe).recipe;
    c.parallel.implementation = implementation_run_by(launcher, probe);
    c.label = structure_label(c.parallel) + " | " + recipe_label(c.recipe);
    if (seen.insert(c.label).second) {
      out.push_back(std::move(c));
    }
  }
  return out;
}

}  // namespace
namespace {

// The structures searched: TP × PP (with its stage split) × CP group sizes × each method's own
// degrees. Tensor parallelism inside a node: T GPUs of a node per TP group, the CP group over the
// GPUs / T TP positions (the whole of them for the longest context). Pipeline parallelism
// outermost: P stages of GPUs / P, each laid out as without PP. The longest context uses every GPU
// in one CP group: activations shrink with C while model states are sharded over all GPUs anyway,
// so data parallelism never lengthens the context. Throughput at --seq: smaller groups (data
// parallel) only when the user allows a larger global batch. A fixed Ulysses or ring degree may
// need a smaller group: every degree is searched then.
std::vector<models::ParallelConfig> searched_structures(const sim::ScheduleInputs& base,
                                                        const PlanOptions& options) {
  const int gpus = base.parallel.gpus;
  const bool max_context = !options.seq_len.has_value();
  const PlanConstraints& fixed = options.fixed;
  const bool fixed_part = fixed.ulysses_degree > 0 || fixed.ring_degree > 0;
  const bool smaller_groups = fixed_part || (!max_context && options.allow_data_parallel);
  std::vector<models::ParallelConfig> structures;
  sim::ScheduleInputs at_tp = base;
  for (const int tp : tp_degrees(base, fixed)) {
    at_tp.parallel.tp_degree = tp;
    for (const int pp : pp_degrees(base, options, tp)) {
      const std::optional<std::pair<int, int>> split = stage_split(base.model.layers, pp, fixed);
      at_tp.parallel.pp_degree = pp;
      at_tp.parallel.pp_first_stage_layers = split ? split->first : 0;
      at_tp.parallel.pp_last_stage_layers = split ? split->second : 0;
      const int positions = gpus / (tp * pp);
      if (gpus % (tp * pp) != 0 || (fixed.cp_degree > 0 && positions % fixed.cp_degree != 0)) {
        continue;  // the CP group given does not fit the TP positions of a stage
      }
      const std::vector<int> cps = fixed.cp_degree > 0 ? std::vector<int>{fixed.cp_degree}
                                   : smaller_groups    ? divisors(positions)
                                                       : std::vector<int>{positions};
      for (const int ep : ep_degrees(base, fixed, gpus / pp)) {
        at_tp.parallel.ep_degree = ep;
        for (const sim::CpScheme* method : methods_of(options)) {
          append_structures(*method, at_tp, options, cps, structures);
        }
      }
    }
  }
  return structures;
}

// Every structure × its pipeline variants × every recipe, labelled; the variants of one
// structure and recipe share a pipeline stage group.
std::vector<Candidate> expand(const std::vector<models::ParallelConfig>& structures,
                              const std::vector<std::vector<models::ParallelConfig>>& variants_of,
                              const std::vector<models::TrainingRecipe>& recipes,
                              std::size_t count) {
  std::vector<Candidate> out;
  out.reserve(count);
  std::int64_t group = 0;
  // Labels: each recipe's and each variant's made once (not once per candidate).
  std::vector<std::string> recipe_labels;
  for (const models::TrainingRecipe& r : recipes) {
    recipe_labels.push_back(" | " + recipe_label(r));
  }
  std::vector<std::string> variant_labels;
  for (std::size_t s = 0; s < structures.size(); ++s) {
    const std::vector<models::ParallelConfig>& variants = variants_of[s];
    variant_labels.clear();
    for (const models::ParallelConfig& q : variants) {
      variant_labels.push_back(structure_label(q));
    }
    for (std::size_t ri = 0; ri < recipes.size(); ++ri) {
      for (std::size_t v = 0; v < variants.size(); ++v) {
        Candidate& c = out.emplace_back();
        c.parallel = variants[v];
        c.recipe = recipes[ri];
        c.label = variant_labels[v] + recipe_labels[ri];
        c.stage_group = variants[v].pp_degree > 1 ? group : -1;
      }
      group += 1;
    }
  }
  return out;
}

}  // namespace

std::vector<Candidate> enumerate_candidates(const sim::ScheduleInputs& base,
                                            const PlanOptions& options) {
  const bool max_context = !options.seq_len.has_value();
  const PlanConstraints& fixed = options.fixed;
  const std::vector<models::TrainingRecipe> recipes =
      !max_context && options.vary_recipe ? recipe_space(base.recipe, options.fixed)
                                          : std::vector<models::TrainingRecipe>{base.recipe};
  const std::vector<models::ParallelConfig> structures = searched_structures(base, options);
  // A searched PP degree only where the implementation runs it (the recipes searched share the
  // base's name, hence its default implementations); a fixed one stays, for its refusal to name
  // the reason. With a launcher the implementation is the launcher's: checked after as_run_by.
  std::vector<std::vector<models::ParallelConfig>> variants_of;
  std::size_t count = 0;
  sim::ScheduleInputs probe = base;
  for (const models::ParallelConfig& st : structures) {
    probe.parallel = st;
    const bool dropped =
        fixed.pp_degree == 0 && st.pp_degree > 1 && !options.launcher && !runs_pipeline(probe);
    variants_of.push_back(dropped ? std::vector<models::ParallelConfig>{}
                                  : pipeline_variants(st, base, options));
    count += variants_of.back().size() * recipes.size();
  }
  std::vector<Candidate> out = expand(structures, variants_of, recipes, count);
  if (options.launcher) {
    out = as_run_by(*options.launcher, base, std::move(out));
    if (!launcher_writes_expert_parallel(*options.launcher)) {
      std::erase_if(out, [](const Candidate& c) { return c.parallel.ep_degree > 1; });
    }
  }
  if (fixed.pp_degree == 0 && options.launcher) {
    // The launcher's implementation (as_run_by) and the launcher itself must run PP.
    const bool launcher_pp = launcher_writes_pipeline(*options.launcher);
    std::erase_if(out, [&](const Candidate& c) {
      if (c.parallel.pp_degree <= 1) {
        return false;
      }
      c.apply_to(probe);
      return !launcher_pp || !runs_pipeline(probe);
    });
  }
  return out;
}

sim::ScheduleInputs Candidate::inputs(const sim::ScheduleInputs& base) const {
  sim::ScheduleInputs in = base;
  apply_to(in);
  return in;
}

void Candidate::apply_to(sim::ScheduleInputs& into) const {
  into.parallel = parallel;
  into.recipe = recipe;
}

namespace search_parts {

// Every registered implementation, or the ones asked for, in registry order.
std::vector<const sim::CpScheme*> methods_of(const PlanOptions& options) {
  std::vector<const sim::CpScheme*> out;
  for (const sim::CpScheme* m : sim::cp_schemes()) {
    if (options.methods.empty() || std::find(options.methods.begin(), options.methods.end(),
                                             m->id()) != options.methods.end()) {
      out.push_back(m);
    }
  }
  return out;
}

/// A rough count of the ops one evaluation simulates per block (order of magnitude only: it sorts
/// the work of the threads, longest first, so that none is left with a long one at the end).
std::int64_t cost_estimate(const sim::ScheduleInputs& in) {
  const std::int64_t per_block = sim::cp_scheme(in.parallel.method).ops_per_block_estimate(in);
  const bool full_ac = in.recipe.checkpointing == CheckpointMode::kFull;
  const std::int64_t blocks =
      in.parallel.pp_degree > 1 ? 2 * sim::pipeline_shape(in).stage_layers : in.model.layers;
  return per_block * (full_ac ? 3 : 2) * blocks;
}

std::string recipe_label(const models::TrainingRecipe& r) {
  std::string ac = models::to_string(r.checkpointing);
  if (r.checkpointing == CheckpointMode::kFull && r.checkpoint_offload)
    ac += "+offload";
  return fmt::format("ac {}, {}, {}, zero{}{}", ac, r.tiled_mlp ? "tiled mlp" : "untiled mlp",
                     r.fused_loss ? "fused loss" : "logits", r.zero_stage,
                     r.optimizer_offload ? "+opt offload" : "");
}

}  // namespace search_parts

}  // namespace cpsim::planner
