#include "cpsim/planner/search.hpp"

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

namespace cpsim::planner {
namespace {

using models::CheckpointMode;

// Every registered implementation, or the ones asked for, in registry order.
std::vector<const sim::CpImplementation*> methods_of(const PlanOptions& options) {
  std::vector<const sim::CpImplementation*> out;
  for (const sim::CpImplementation* m : sim::cp_implementations()) {
    if (options.methods.empty() || std::find(options.methods.begin(), options.methods.end(),
                                             m->id()) != options.methods.end()) {
      out.push_back(m);
    }
  }
  return out;
}

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i) {
    if (n % i == 0)
      d.push_back(i);
  }
  return d;
}

std::string recipe_label(const models::TrainingRecipe& r) {
  std::string ac = models::to_string(r.checkpointing);
  if (r.checkpointing == CheckpointMode::kFull && r.checkpoint_offload)
    ac += "+offload";
  return fmt::format("ac {}, {}, {}, zero{}{}", ac, r.tiled_mlp ? "tiled mlp" : "untiled mlp",
                     r.fused_loss ? "fused loss" : "logits", r.zero_stage,
                     r.optimizer_offload ? "+opt offload" : "");
}

std::string structure_label(const models::ParallelConfig& p) {
  std::string s = sim::cp_implementation(p.method).label(sim::LabelStyle::kSearch, p, nullptr);
  if (p.tp_degree > 1) {
    s += fmt::format(" tp{}", p.tp_degree);
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

/// A rough count of the ops one evaluation simulates per block (order of magnitude only: it sorts
/// the work of the threads, longest first, so that none is left with a long one at the end).
std::int64_t cost_estimate(const sim::ScheduleInputs& in) {
  const std::int64_t per_block =
      sim::cp_implementation(in.parallel.method).ops_per_block_estimate(in);
  const bool full_ac = in.recipe.checkpointing == CheckpointMode::kFull;
  const std::int64_t blocks =
      in.parallel.pp_degree > 1 ? 2 * sim::pipeline_shape(in).stage_layers : in.model.layers;
  return per_block * (full_ac ? 3 : 2) * blocks;
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
// --decoder-first/last-pipeline-num-layers express it: L = (P − 2)·k + 2·(k − 1).
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
bool keeps_fixed(const sim::CpImplementation& method,
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
void append_structures(const sim::CpImplementation& method,
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
    if (!sim::cp_implementation(c.parallel.method)
             .launcher_selection(to_string(launcher), c.parallel, c.recipe.attention_kernel)) {
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

// Two instants, each with only tensors the step builder certainly holds then (allocation rounding
// and everything else only add to them); both see the model states, the fixed overheads and the
// tensors every block saved in the forward (`saved`):
//   - the unfused loss at its backward peak (sim::logits_loss_peak_bytes_per_logit): Hugging
//     Face's at log_softmax_bwd holds the saved fp32 log-softmax output, its fp32 gradient and the
//     fp32 gradient of the logits (12 bytes per logit, whatever the activation dtype); Megatron's
//     the fp32 softmax and the gradient cast to the activation dtype; and x_final;
//   - the MLP backward of the last block: the incoming gradient dy and the output dh1n (2·act);
//     untiled, gate/up and the product (3·s·f·ab, the product s·f with FP8; recomputed under full
//     AC, else among `saved`)
//     and at least the product's gradient as workspace (s·f·ab); under full AC the recomputed norm
//     output h1n (act).
namespace {

// `scratch` (a copy of `in` but for the model, recipe, parallel configuration and margin) becomes
// the stage `in` simulates with one micro-batch, without copying the hardware profile.
void stage_into(const sim::ScheduleInputs& in,
                sim::ScheduleInputs& scratch,
                sim::PipelineStage stage) {
  scratch.model = in.model;
  scratch.recipe = in.recipe;
  scratch.parallel = in.parallel;
  scratch.margin = in.margin;
  scratch.tp_rank_model = in.tp_rank_model;
  sim::make_pipeline_stage(scratch, 1, stage);
}

// The tensors every block saves in the forward and holds to its backward (see above).
std::int64_t saved_bytes(const sim::ScheduleInputs& in) {
  const auto& m = in.model;
  const auto& r = in.recipe;
  const std::int64_t s = in.parallel.seq_len / in.parallel.cp_degree;
  const std::int64_t t = std::max(1, in.parallel.tp_degree);
  const std::int64_t act = s / t * m.hidden * r.activation_bytes;
  const std::int64_t mlp_tensor = s * (m.ffn_hidden / t) * r.activation_bytes;
  const std::int64_t product = r.fp8 ? s * (m.ffn_hidden / t) : mlp_tensor;
  if (r.checkpointing == CheckpointMode::kFull) {
    // Block inputs stay on the GPU unless offloaded (then the first and last stay).
    return r.checkpoint_offload
               ? (r.offload_keep_first_last ? std::min<std::int64_t>(2, m.layers) : 0) * act
               : m.layers * act;
  }
  // Block input, norm1 output, attention residual, norm2 output of every block; untiled, the
  // MLP's gate/up and activation.
  return m.layers * 4 * act + (r.tiled_mlp ? 0 : m.layers * (2 * mlp_tensor + product));
}

std::int64_t bound_with_in_flight(const sim::ScheduleInputs& in, double in_flight) {
  const auto& m = in.model;
  const auto& r = in.recipe;
  const std::int64_t s = in.parallel.seq_len / in.parallel.cp_degree;
  const std::int64_t ab = r.activation_bytes;
  // Tensor parallelism with sequence parallelism: norms, residuals and block inputs hold s/T
  // tokens, the MLP's tensors f/T columns, the logits ⌈V/T⌉ (docs/MODEL.md).
  const std::int64_t t = std::max(1, in.parallel.tp_degree);
  const std::int64_t act = s / t * m.hidden * ab;
  const std::int64_t mlp_tensor = s * (m.ffn_hidden / t) * ab;  // one [s, f/T] tensor
  const std::int64_t vocab = (m.vocab + t - 1) / t;
  // The product as the backward keeps it: with FP8 the down projection's FP8 copy (1 byte).
  const std::int64_t product = r.fp8 ? s * (m.ffn_hidden / t) : mlp_tensor;
  const bool full_ac = r.checkpointing == CheckpointMode::kFull;
  const std::int64_t saved = saved_bytes(in);
  const std::int64_t loss = r.fused_loss || !m.has_output_layer
                                ? 0
                                : s * vocab * sim::logits_loss_peak_bytes_per_logit(in) + act;
  std::int64_t last_mlp_backward = 2 * act;
  if (!r.tiled_mlp) {
    last_mlp_backward += full_ac ? 3 * mlp_tensor + product : mlp_tensor;
  }
  if (full_ac) {
    last_mlp_backward += act;
  }
  const auto held = static_cast<std::int64_t>(in_flight * static_cast<double>(saved));
  return sim::model_states(in).gpu_bytes + in.hardware.fixed_overhead_bytes() + held +
         std::max(loss, last_mlp_backward);
}

}  // namespace

std::int64_t memory_lower_bound(const sim::ScheduleInputs& in) {
  if (in.parallel.pp_degree > 1) {
    sim::ScheduleInputs scratch = in;
    return memory_lower_bound(in, scratch);
  }
  return bound_with_in_flight(in, 1.0);
}

std::int64_t memory_lower_bound(const sim::ScheduleInputs& in, sim::ScheduleInputs& scratch) {
  if (in.parallel.pp_degree <= 1) {
    return bound_with_in_flight(in, 1.0);
  }
  // The composed peak is the larger of the two stages' simulated peaks, each plus (factor − 1)
  // times what a micro-batch holds between its forward and backward, at least `saved`
  // (evaluate_pipeline.cpp).
  const sim::PipelineShape shape = sim::pipeline_shape(in);
  stage_into(in, scratch, sim::PipelineStage::kWithoutOutputLayer);
  const std::int64_t inner = bound_with_in_flight(scratch, std::max(1.0, shape.activation_factor));
  scratch.model.has_output_layer = true;  // the same stage with the LM head: the last
  return std::max(inner,
                  bound_with_in_flight(scratch, std::max(1.0, shape.last_stage_activation_factor)));
}

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
      for (const sim::CpImplementation* method : methods_of(options)) {
        append_structures(*method, at_tp, options, cps, structures);
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

namespace {

// One pass over the candidates at(0..n−1) (sorted best first by the plan's order), giving the
// positions of the front: with the primary key p (max context: the length; else throughput) and
// the secondary q (throughput; else −peak), both higher is better, a candidate is dominated
// exactly when one with a higher p has q at least as high, or one with the same p has a higher q.
// Candidates of equal p are adjacent and the first of them has the highest q, so it suffices to
// keep the best q among higher p and the first q of the group.
template <class At>
std::vector<std::size_t> pareto_positions(std::size_t n, const At& at, bool max_context) {
  auto primary = [max_context](const Candidate& c) {
    return max_context ? static_cast<double>(c.max_seq_len) : c.report.tokens_per_s_per_gpu;
  };
  auto secondary = [max_context](const Candidate& c) {
    return max_context ? c.report.tokens_per_s_per_gpu
                       : -static_cast<double>(c.report.peak_memory_bytes);
  };
  std::vector<std::size_t> front;
  double best_above = -std::numeric_limits<double>::infinity();  // best q among higher p
  std::size_t group = 0;                                         // first of the current p
  for (std::size_t i = 0; i < n; ++i) {
    if (primary(at(i)) != primary(at(group))) {
      for (std::size_t j = group; j < i; ++j) {
        best_above = std::max(best_above, secondary(at(j)));
      }
      group = i;
    }
    const double q = secondary(at(i));
    if (q > best_above && q >= secondary(at(group))) {
      front.push_back(i);
    }
  }
  return front;
}

}  // namespace

std::vector<Candidate> pareto_front(const std::vector<Candidate>& ranked, bool max_context) {
  std::vector<Candidate> front;
  const auto at = [&ranked](std::size_t i) -> const Candidate& { return ranked[i]; };
  for (const std::size_t i : pareto_positions(ranked.size(), at, max_context)) {
    front.push_back(ranked[i]);
  }
  return front;
}

namespace {

std::string explain(const Candidate& best, const Candidate& second, bool max_context) {
  const sim::StepReport& a = best.report;
  const sim::StepReport& b = second.report;
  const auto compute = static_cast<std::size_t>(sim::Stream::kCompute);
  if (max_context && best.max_seq_len != second.max_seq_len) {
    return fmt::format(
        "{} reaches {} vs {} for {}: one step longer the runner-up is stopped by {}; at its own "
        "limit the best has {} of headroom beyond the margin",
        best.label, format_length(best.max_seq_len), format_length(second.max_seq_len),
        second.label, second.binding.text, format_bytes(static_cast<double>(a.gpu_headroom_bytes)));
  }
  const double gain = b.tokens_per_s_per_gpu > 0
                          ? 100.0 * (a.tokens_per_s_per_gpu / b.tokens_per_s_per_gpu - 1.0)
                          : 0.0;
  return fmt::format(
      "{} is {:.1f} % faster than {}: compute {} vs {} per step (kernel efficiency and "
      "recomputation), time not covered by compute {} vs {} (exposed communication and copies); "
      "peak memory {} vs {}",
      best.label, gain, second.label, format_seconds(a.stream_busy_s[compute]),
      format_seconds(b.stream_busy_s[compute]), format_seconds(a.exposed_comm_s),
      format_seconds(b.exposed_comm_s), format_bytes(static_cast<double>(a.peak_memory_bytes)),
      format_bytes(static_cast<double>(b.peak_memory_bytes)));
}

/// The candidate nearest to fitting among those that do not: the smallest ratio of memory needed
/// to memory usable (GPU or host, whichever misses), for the message when nothing fits.
class ClosestMiss {
 public:
  /// `at_least`: `need` is a lower bound (pruned, or a simulation stopped above capacity).
  void offer(const Candidate& c,
             std::int64_t seq_len,
             const char* memory,
             std::int64_t need,
             std::int64_t usable,
             bool at_least) {
    const double ratio = usable > 0 ? static_cast<double>(need) / static_cast<double>(usable)
                                    : std::numeric_limits<double>::infinity();
    if (!text_.empty() && !(ratio < ratio_)) {
      return;
    }
    ratio_ = ratio;
    text_ =
        fmt::format("the closest, {}, needs {}{} of {} memory at {} against {} usable ({} over)",
                    c.label, at_least ? "at least " : "", format_bytes(static_cast<double>(need)),
                    memory, format_length(seq_len), format_bytes(static_cast<double>(usable)),
                    format_bytes(static_cast<double>(need - usable)));
  }
  /// A candidate that misses for another reason (kernel limits) or was refused.
  void offer_other(const Candidate& c, const std::string& why) {
    if (other_.empty()) {
      other_ = fmt::format("{}: {}", c.label, why);
    }
  }
  std::string text() const { return text_.empty() ? other_ : text_; }

 private:
  double ratio_ = std::numeric_limits<double>::infinity();
  std::string text_, other_;
};

/// Offers one evaluated candidate that does not fit to `miss`.
void offer_miss(const Candidate& c, bool max_context, std::int64_t capacity, ClosestMiss& miss) {
  if (max_context) {
    const BindingConstraint& b = c.binding;
    if (b.kind == BindingConstraint::Kind::kGpuMemory) {
      miss.offer(c, b.seq_len, "GPU", b.used_bytes, b.limit_bytes, false);
    } else if (b.kind == BindingConstraint::Kind::kHostMemory) {
      miss.offer(c, b.seq_len, "host (per node)", b.used_bytes, b.limit_bytes, false);
    } else {
      miss.offer_other(c, b.text);
    }
    return;
  }
  const sim::StepReport& r = c.report;
  if (r.peak_memory_bytes > capacity) {
    miss.offer(c, c.parallel.seq_len, "GPU", r.peak_memory_bytes, capacity, r.stopped_early);
  } else if (!r.fits_host) {
    miss.offer(c, c.parallel.seq_len, "host (per node)", r.host_memory_bytes, r.host_capacity_bytes,
               false);
  } else {
    miss.offer_other(c, r.kernel_limit);
  }
}

}  // namespace

namespace {

bool ranks_before(const Candidate& a, const Candidate& b, bool max_context) {
  if (max_context && a.max_seq_len != b.max_seq_len)
    return a.max_seq_len > b.max_seq_len;
  if (a.report.tokens_per_s_per_gpu != b.report.tokens_per_s_per_gpu)
    return a.report.tokens_per_s_per_gpu > b.report.tokens_per_s_per_gpu;
  if (a.report.peak_memory_bytes != b.report.peak_memory_bytes)
    return a.report.peak_memory_bytes < b.report.peak_memory_bytes;
  return a.label < b.label;
}

// Checks one candidate's reserved memory (once); true when that moved it (a shorter longest
// context, or no longer fitting).
bool check_reserved(const sim::ScheduleInputs& base,
                    const PlanOptions& options,
                    Candidate& c,
                    bool max_context,
                    std::int64_t& simulations,
                    EvaluationScratch& scratch) {
  if (c.reserved_checked) {
    return false;
  }
  c.reserved_checked = true;
  const sim::ScheduleInputs in = c.inputs(base);
  if (!max_context) {
    EvaluateOptions logged;
    logged.model_allocator = true;
    simulations += 1;
    c.report = evaluate(in, logged, scratch).report;
    c.fits = c.report.fits();
    return !c.fits;
  }
  MaxLenResult m;
  m.step = std::lcm(options.granularity, required_multiple(in));
  m.max_seq_len = c.max_seq_len;
  m.at_max = c.report;
  m.binding = c.binding;
  check_reserved_memory(in, m, &scratch);
  simulations += m.evaluations;
  const bool changed = m.max_seq_len != c.max_seq_len;
  c.max_seq_len = m.max_seq_len;
  c.binding = m.binding;
  c.report = m.at_max;
  c.fits = m.max_seq_len > 0;
  if (c.fits) {
    c.parallel.seq_len = m.max_seq_len;
  }
  return changed;
}

// Runs `worker` on min(threads, items) threads, this one among them, and waits for all of them.
void run_workers(int threads, std::size_t items, const std::function<void()>& worker) {
  const int n = std::max(1, std::min<int>(threads, static_cast<int>(items)));
  std::vector<std::thread> pool;
  for (int t = 1; t < n; ++t) {
    pool.emplace_back(worker);
  }
  worker();
  for (auto& t : pool) {
    t.join();
  }
}

// Runs item(state, i) for i in [0, n) on the plan's threads, each thread with its own state
// (make_state()); every item runs, and the error of the first failing item, in index order, is
// rethrown afterwards (as one thread in order would have met it).
template <class MakeState, class Item>
void for_each_index(int threads, std::size_t n, const MakeState& make_state, const Item& item) {
  std::vector<std::exception_ptr> errors(n);
  std::atomic<std::size_t> next{0};
  auto worker = [&]() {
    auto state = make_state();
    for (std::size_t i = next++; i < n; i = next++) {
      try {
        item(state, i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  run_workers(threads, n, worker);
  for (const std::exception_ptr& e : errors) {
    if (e) {
      std::rethrow_exception(e);
    }
  }
}

// Checks the reserved memory of `cands` on the plan's threads (each check is independent of the
// others: the outcome is the same in any order); true when one moved. Rethrows the first
// candidate's error, in the order given.
bool check_reserved_all(const sim::ScheduleInputs& base,
                        const PlanOptions& options,
                        const std::vector<Candidate*>& cands,
                        bool max_context,
                        std::int64_t& simulations) {
  std::vector<char> moved(cands.size(), 0);
  std::vector<std::int64_t> sims(cands.size(), 0);
  for_each_index(
      options.threads, cands.size(), [] { return EvaluationScratch{}; },
      [&](EvaluationScratch& scratch, std::size_t i) {
        moved[i] = check_reserved(base, options, *cands[i], max_context, sims[i], scratch) ? 1 : 0;
      });
  simulations += std::accumulate(sims.begin(), sims.end(), std::int64_t{0});
  return std::find(moved.begin(), moved.end(), 1) != moved.end();
}

// The Pareto front of the candidates `order` (indices into `cands`, in the plan's order), as
// indices into `cands`.
std::vector<std::size_t> front_of(const std::vector<Candidate>& cands,
                                  const std::vector<std::size_t>& order,
                                  bool max_context) {
  auto at = [&cands, &order](std::size_t i) -> const Candidate& { return cands[order[i]]; };
  std::vector<std::size_t> front;
  for (const std::size_t i : pareto_positions(order.size(), at, max_context)) {
    front.push_back(order[i]);
  }
  return front;
}

// Each method's first candidate of `order`, in the methods' order (methods without one left
// out), as indices into `cands`.
std::vector<std::size_t> best_per_method_of(
    const std::vector<Candidate>& cands,
    const std::vector<std::size_t>& order,
    const std::vector<const sim::CpImplementation*>& methods) {
  std::vector<std::size_t> first(methods.size(), cands.size());
  std::size_t found = 0;
  for (std::size_t k = 0; k < order.size() && found < methods.size(); ++k) {
    for (std::size_t m = 0; m < methods.size(); ++m) {
      if (first[m] == cands.size() && cands[order[k]].parallel.method == methods[m]->id()) {
        first[m] = order[k];
        ++found;
      }
    }
  }
  std::vector<std::size_t> out;
  std::copy_if(first.begin(), first.end(), std::back_inserter(out),
               [&cands](std::size_t i) { return i < cands.size(); });
  return out;
}

// Ranks the fitting candidates `order` (indices into `cands`, sorted by the plan's order) and
// checks the reserved memory of every candidate the plan shows (the top, each method's best, the
// Pareto front, the runner-up), best first; a check that moves a candidate re-ranks and goes on
// until every shown one is checked. The allocated peak bounds the reserved memory from below, so
// unchecked candidates can only move down: none of them belongs above a checked one. The ranking
// works on indices (a check moves a few of tens of thousands); the candidates are moved into
// `res` once, at the end.
void rank_checking_reserved(const sim::ScheduleInputs& base,
                            const PlanOptions& options,
                            std::vector<Candidate>& cands,
                            std::vector<std::size_t> order,
                            PlanResult& res,
                            ClosestMiss& miss) {
  const bool mc = res.max_context;
  auto better = [&cands, mc](std::size_t a, std::size_t b) {
    return ranks_before(cands[a], cands[b], mc);
  };
  const std::vector<const sim::CpImplementation*> methods = methods_of(options);
  std::vector<char> shown(cands.size(), 0);
  std::vector<std::size_t> front, per_method;  // indices into cands
  for (;;) {
    if (!std::is_sorted(order.begin(), order.end(), better)) {
      std::stable_sort(order.begin(), order.end(), better);
    }
    front = front_of(cands, order, mc);
    per_method = best_per_method_of(cands, order, methods);
    const std::size_t top =
        std::min(order.size(), static_cast<std::size_t>(std::max(2, options.top)));
    for (std::size_t k = 0; k < top; ++k) {
      shown[order[k]] = 1;
    }
    for (const std::size_t i : front) {
      shown[i] = 1;
    }
    for (const std::size_t i : per_method) {
      shown[i] = 1;
    }
    std::vector<Candidate*> to_check;
    for (const std::size_t i : order) {
      if (shown[i] != 0) {
        shown[i] = 0;
        if (!cands[i].reserved_checked) {
          to_check.push_back(&cands[i]);
        }
      }
    }
    bool moved = check_reserved_all(base, options, to_check, mc, res.simulations);
    // Those that no longer fit leave the ranking, in order.
    for (const std::size_t i : order) {
      if (!cands[i].fits) {
        offer_miss(cands[i], mc, base.hardware.hbm_capacity_bytes - base.margin.gpu_bytes, miss);
        moved = true;
      }
    }
    std::erase_if(order, [&cands](std::size_t i) { return !cands[i].fits; });
    if (!moved) {
      break;
    }
  }
  for (const std::size_t i : front) {
    res.pareto.push_back(cands[i]);
  }
  for (const std::size_t i : per_method) {
    res.best_per_method.push_back(cands[i]);
  }
  if (options.keep_all) {
    res.all = cands;
  }
  res.ranked.reserve(order.size());
  for (const std::size_t i : order) {
    res.ranked.push_back(std::move(cands[i]));
  }
}

}  // namespace

namespace {

// The saved tensors of `in`'s pipeline stage (saved_bytes), without copying the hardware profile.
std::int64_t saved_of_stage(const sim::ScheduleInputs& in, sim::PipelineStage kind) {
  sim::ScheduleInputs stage;
  stage_into(in, stage, kind);
  return saved_bytes(stage);
}

// At --seq, the candidate whose simulation each pending candidate's is (itself for most): one
// under selective checkpointing of a method whose blocks keep under it what they keep without
// checkpointing (CpImplementation::recomputes_selectively) runs, op for op, the step of the same
// candidate without checkpointing, and takes that one's evaluation when it is pending too.
std::vector<std::size_t> simulation_twins(const std::vector<Candidate>& cands,
                                          const std::vector<std::size_t>& pending) {
  std::vector<std::size_t> twin(cands.size());
  std::iota(twin.begin(), twin.end(), std::size_t{0});
  std::unordered_map<std::string_view, std::size_t> without_checkpointing;
  for (const std::size_t i : pending) {
    if (cands[i].recipe.checkpointing == CheckpointMode::kNone) {
      without_checkpointing.emplace(cands[i].label, i);
    }
  }
  for (const std::size_t i : pending) {
    const Candidate& c = cands[i];
    if (c.recipe.checkpointing != CheckpointMode::kSelective ||
        sim::cp_implementation(c.parallel.method).recomputes_selectively(c.parallel)) {
      continue;
    }
    models::TrainingRecipe none = c.recipe;
    none.checkpointing = CheckpointMode::kNone;
    const std::string suffix = " | " + recipe_label(c.recipe);
    if (!c.label.ends_with(suffix)) {
      continue;
    }
    const std::string label =
        c.label.substr(0, c.label.size() - suffix.size()) + " | " + recipe_label(none);
    const auto it = without_checkpointing.find(label);
    if (it != without_checkpointing.end() && cands[it->second].parallel == c.parallel &&
        cands[it->second].recipe == none) {
      twin[i] = it->second;
    }
  }
  return twin;
}

// The work of the threads at --seq: the pending candidates of one stage group together (in
// pending order), and each candidate with the ones whose simulation is its own (`twin`, after it);
// every other candidate alone. A stage group takes the twins of its members.
std::vector<std::vector<std::size_t>> work_items(const std::vector<Candidate>& cands,
                                                 const std::vector<std::size_t>& pending,
                                                 const std::vector<std::size_t>& twin) {
  std::vector<std::vector<std::size_t>> work;
  std::map<std::int64_t, std::size_t> item_of_group;
  std::unordered_map<std::size_t, std::size_t> item_of_candidate;
  for (const std::size_t i : pending) {
    if (twin[i] != i) {
      continue;
    }
    const std::int64_t g = cands[i].stage_group;
    if (g >= 0) {
      const auto [it, added] = item_of_group.emplace(g, work.size());
      if (!added) {
        work[it->second].push_back(i);
        continue;
      }
    }
    item_of_candidate.emplace(i, work.size());
    work.push_back({i});
  }
  for (const std::size_t i : pending) {
    if (twin[i] == i) {
      continue;
    }
    const std::int64_t g = cands[twin[i]].stage_group;
    work[g >= 0 ? item_of_group.at(g) : item_of_candidate.at(twin[i])].push_back(i);
  }
  return work;
}

// What a candidate's evaluation found, for a candidate whose simulation is the same (twin).
void share_evaluation(const Candidate& from, Candidate& to) {
  to.report = from.report;
  to.fits = from.fits;
  to.evaluated = from.evaluated;
  to.error = from.error;
}

// One micro-batch of a stage group's stage (`kind`), stopping where no member can fit any more:
// above the capacity less the smallest lower bound of what a member adds to the stage's peak
// ((factor − 1)·saved, the in-flight micro-batches).
Evaluation run_stage_stopping(std::vector<Candidate>& cands,
                              const std::vector<std::size_t>& item,
                              const EvaluateOptions& options,
                              EvaluationScratch& scratch,
                              sim::ScheduleInputs& in,
                              sim::PipelineStage kind) {
  EvaluateOptions first = options;
  double factor = std::numeric_limits<double>::infinity();
  for (const std::size_t i : item) {
    cands[i].apply_to(in);
    const sim::PipelineShape shape = sim::pipeline_shape(in);
    factor = std::min(factor, kind == sim::PipelineStage::kWithOutputLayer
                                  ? shape.last_stage_activation_factor
                                  : shape.activation_factor);
  }
  cands[item.front()].apply_to(in);
  const auto added = static_cast<std::int64_t>(std::max(0.0, factor - 1.0) *
                                               static_cast<double>(saved_of_stage(in, kind)));
  if (first.stop_above_device_bytes > 0) {
    first.stop_above_device_bytes =
        std::max<std::int64_t>(1, first.stop_above_device_bytes - added);
  }
  return simulate_pipeline_stage_one(in, first, &scratch, kind);
}

// Evaluates the candidates of one stage group at --seq: their stage is simulated once per kind
// (evaluate_pipeline.hpp) and each step composed from the runs; a simulation stopped above the
// capacity rules out every member (the composed peak is at least the stage's). Returns the
// simulations run.
std::int64_t evaluate_stage_group(std::vector<Candidate>& cands,
                                  const std::vector<std::size_t>& item,
                                  const EvaluateOptions& options,
                                  EvaluationScratch& scratch,
                                  sim::ScheduleInputs& in,
                                  const RefusalText& refusal_text) {
  cands[item.front()].apply_to(in);
  StageRuns runs;
  std::int64_t simulations = 0;
  try {
    runs.inner = run_stage_stopping(cands, item, options, scratch, in,
                                    sim::PipelineStage::kWithoutOutputLayer);
    simulations += 1;
    if (runs.inner.report.stopped_early) {
      runs.one = runs.inner;  // over the capacity on the stages before the last: none fits
    } else {
      runs.one = run_stage_stopping(cands, item, options, scratch, in,
                                    sim::PipelineStage::kWithOutputLayer);
      simulations += 1;
    }
    // The second run only times the step: needed only when a member fits.
    bool any_fits = false;
    const bool stopped = runs.one.report.stopped_early || runs.inner.report.stopped_early;
    for (const std::size_t i : item) {
      cands[i].apply_to(in);
      any_fits = any_fits || (!stopped && pipeline_fits(in, runs.one.report, runs.inner.report));
    }
    cands[item.front()].apply_to(in);
    if (any_fits) {
      runs.two = simulate_pipeline_stage_two(in, options, &scratch);
      simulations += 1;
    } else {
      runs.two = runs.one.report;
    }
  } catch (const sim::ConfigError& e) {
    for (const std::size_t i : item) {
      cands[i].error = refusal_text(e);
    }
    return 0;
  } catch (const InputError& e) {
    for (const std::size_t i : item) {
      cands[i].error = e.what();
    }
    return 0;
  }
  for (const std::size_t i : item) {
    Candidate& c = cands[i];
    c.apply_to(in);
    c.report = compose_pipeline(in, runs).report;
    c.fits = c.report.fits();
    c.evaluated = true;
  }
  return simulations;
}

// What screen() found: per candidate, its cost estimate (evaluated ones) and the memory lower
// bound that pruned it.
struct Screened {
  std::vector<std::int64_t> cost;
  std::vector<std::int64_t> bound;
};

// The cheap checks of every candidate, on the plan's threads (each candidate on its own, in
// blocks of consecutive candidates; one reused copy of the base inputs per thread, a candidate
// holds only what it changes): its length (the plan's, or the first step of the longest-context
// search), the head layout and the recipe (refusals set `error`), and at --seq the memory lower
// bound (over the capacity: `pruned`).
Screened screen(const sim::ScheduleInputs& base,
                const PlanOptions& options,
                const RefusalText& refusal_text,
                std::vector<Candidate>& cands) {
  const std::int64_t capacity = base.hardware.hbm_capacity_bytes - base.margin.gpu_bytes;
  Screened out;
  out.cost.assign(cands.size(), 0);
  out.bound.assign(cands.size(), 0);
  constexpr std::size_t kBlock = 1024;
  struct Probes {
    sim::ScheduleInputs probe;
    sim::ScheduleInputs stage_probe;  // a pipeline's stage, for its bound
  };
  const std::size_t blocks = (cands.size() + kBlock - 1) / kBlock;
  for_each_index(
      options.threads, blocks,
      [&base] {
        return Probes{base, base};
      },
      [&](Probes& probes, std::size_t b) {
        sim::ScheduleInputs& probe = probes.probe;
        for (std::size_t i = b * kBlock; i < std::min(cands.size(), (b + 1) * kBlock); ++i) {
          Candidate& c = cands[i];
          c.apply_to(probe);
          c.parallel.seq_len = options.seq_len
                                   ? *options.seq_len
                                   : std::lcm(options.granularity, required_multiple(probe));
          probe.parallel.seq_len = c.parallel.seq_len;
          if (sim::LayoutCheck checked = sim::check_head_layout(probe); checked.issue) {
            c.error = refusal_text(sim::ConfigError(std::move(*checked.issue), probe.parallel));
            continue;
          }
          try {
            probe.recipe.validate();
          } catch (const InputError& e) {
            c.error = e.what();
            continue;
          }
          if (options.seq_len) {
            const std::int64_t bound = memory_lower_bound(probe, probes.stage_probe);
            if (bound > capacity) {
              c.pruned = true;
              c.prune_reason = "memory lower bound exceeds the GPU";
              out.bound[i] = bound;
              continue;
            }
          }
          out.cost[i] = cost_estimate(probe);
        }
      });
  return out;
}

}  // namespace

bool check_reserved_memory(const sim::ScheduleInputs& base,
                           const PlanOptions& options,
                           Candidate& candidate,
                           bool max_context) {
  std::int64_t simulations = 0;
  EvaluationScratch scratch;
  return check_reserved(base, options, candidate, max_context, simulations, scratch);
}

namespace {

// The work items (one candidate, or at --seq the candidates of one pipeline stage group and
// those whose simulation is another's, with it), longest first by the screen's cost estimate
// (each result goes to its own candidate: the order changes only the wall time).
struct WorkPlan {
  std::vector<std::vector<std::size_t>> items;
  std::vector<std::size_t> order;
};

WorkPlan plan_work(const std::vector<Candidate>& cands,
                   const std::vector<std::size_t>& pending,
                   const std::vector<std::int64_t>& cost,
                   bool at_seq) {
  WorkPlan w;
  if (at_seq) {
    w.items = work_items(cands, pending, simulation_twins(cands, pending));
  } else {
    for (const std::size_t i : pending) {
      w.items.push_back({i});
    }
  }
  w.order.resize(w.items.size());
  std::iota(w.order.begin(), w.order.end(), std::size_t{0});
  std::stable_sort(w.order.begin(), w.order.end(), [&](std::size_t a, std::size_t b) {
    return cost[w.items[a].front()] > cost[w.items[b].front()];
  });
  return w;
}

// Evaluates one candidate without a pipeline: its step at --seq, else its longest context.
// Returns the simulations run.
std::int64_t evaluate_candidate(Candidate& c,
                                const sim::ScheduleInputs& in,
                                const PlanOptions& options,
                                const EvaluateOptions& seq_options,
                                EvaluationScratch& scratch,
                                const RefusalText& refusal_text) {
  std::int64_t simulations = 0;
  try {
    if (options.seq_len) {
      c.report = evaluate(in, seq_options, scratch).report;
      c.fits = c.report.fits();
      simulations = 1;
    } else {
      MaxLenOptions mo;
      mo.granularity = options.granularity;
      mo.max_step_time_s = options.max_step_time_s;
      mo.check_reserved = false;  // the candidates shown are checked below
      mo.threads = 1;             // the candidates already share the threads
      mo.scratch = &scratch;
      mo.refusal_text = refusal_text;
      const MaxLenResult m = max_seq_len(in, mo);
      simulations = m.evaluations;
      c.max_seq_len = m.max_seq_len;
      c.binding = m.binding;
      c.fits = m.max_seq_len > 0;
      if (c.fits) {
        c.report = m.at_max;
        c.parallel.seq_len = m.max_seq_len;
      }
    }
    c.evaluated = true;
  } catch (const sim::ConfigError& e) {
    c.error = refusal_text(e);
  } catch (const InputError& e) {
    c.error = e.what();
  }
  return simulations;
}

// Evaluates the work items on the plan's threads; returns the simulations run.
std::int64_t evaluate_work(const sim::ScheduleInputs& base,
                           const PlanOptions& options,
                           const RefusalText& refusal_text,
                           std::int64_t capacity,
                           const WorkPlan& work,
                           std::size_t pending,
                           std::vector<Candidate>& cands) {
  std::atomic<std::size_t> next{0};
  std::atomic<std::int64_t> simulations{0};
  // A configuration over the GPU's memory is dropped whatever its speed: its simulation stops as
  // soon as the memory passes the capacity (the ranking is unchanged; only time is saved).
  EvaluateOptions seq_options;
  seq_options.stop_above_device_bytes = std::max<std::int64_t>(1, capacity);
  std::mutex progress_mutex;
  std::int64_t progressed = 0;
  auto progress = [&](std::size_t candidates) {
    if (options.on_progress) {
      const std::lock_guard<std::mutex> lock(progress_mutex);
      progressed += static_cast<std::int64_t>(candidates);
      options.on_progress(progressed, static_cast<std::int64_t>(pending));
    }
  };
  auto worker = [&]() {
    EvaluationScratch scratch;
    sim::ScheduleInputs in = base;  // this thread's inputs, one candidate at a time
    for (std::size_t k = next++; k < work.order.size(); k = next++) {
      const std::vector<std::size_t>& item = work.items[work.order[k]];
      if (options.seq_len && cands[item.front()].parallel.pp_degree > 1) {
        simulations += evaluate_stage_group(cands, item, seq_options, scratch, in, refusal_text);
        progress(item.size());
        continue;
      }
      Candidate& c = cands[item.front()];
      c.apply_to(in);
      simulations += evaluate_candidate(c, in, options, seq_options, scratch, refusal_text);
      for (std::size_t t = 1; t < item.size(); ++t) {
        share_evaluation(c, cands[item[t]]);
      }
      progress(item.size());
    }
  };
  run_workers(options.threads, work.order.size(), worker);
  return simulations;
}

// The counts of the result, and the misses offered in the candidates' order.
void count_and_offer_misses(std::vector<Candidate>& cands,
                            std::int64_t capacity,
                            PlanResult& res,
                            ClosestMiss& miss) {
  for (Candidate& c : cands) {
    res.pruned += c.pruned ? 1 : 0;
    res.refused += c.error.empty() ? 0 : 1;
    res.evaluated += c.evaluated ? 1 : 0;
    if (c.evaluated && !c.fits) {
      offer_miss(c, res.max_context, capacity, miss);
    } else if (!c.error.empty()) {
      miss.offer_other(c, c.error);
    }
  }
}

// The methods searched without a row in best_per_method, and why.
std::vector<PlanResult::MethodWithoutFit> methods_without_fit(
    const std::vector<models::CpMethod>& methods,
    const std::vector<Candidate>& cands,
    const std::vector<Candidate>& best_per_method) {
  std::vector<PlanResult::MethodWithoutFit> out;
  for (const models::CpMethod m : methods) {
    const bool shown = std::any_of(best_per_method.begin(), best_per_method.end(),
                                   [m](const Candidate& c) { return c.parallel.method == m; });
    if (shown) {
      continue;
    }
    std::string first_refusal;
    std::int64_t tried = 0;
    for (const Candidate& c : cands) {
      if (c.parallel.method != m) {
        continue;
      }
      if (c.error.empty()) {
        ++tried;
      } else if (first_refusal.empty()) {
        first_refusal = c.error;
      }
    }
    out.push_back({m, tried > 0 ? fmt::format("none of its {} configurations fits", tried)
                      : first_refusal.empty() ? "no configuration to search"
                                              : first_refusal});
  }
  return out;
}

// Why the best beats the runner-up: the best configuration of another method when there is one
// ("why this method" is the question; variants of the winner differ by little).
std::string why_best(const PlanResult& res) {
  if (res.ranked.size() < 2) {
    return "";
  }
  const Candidate* runner = &res.ranked[1];
  for (const Candidate& c : res.ranked) {
    if (c.parallel.method != res.ranked[0].parallel.method) {
      runner = &c;
      break;
    }
  }
  return explain(res.ranked[0], *runner, res.max_context);
}

}  // namespace

PlanResult plan(const sim::ScheduleInputs& base, const PlanOptions& options) {
  const RefusalText refusal_text =
      options.refusal_text ? options.refusal_text : RefusalText(default_refusal_text);
  PlanResult res;
  res.max_context = !options.seq_len.has_value();
  std::vector<Candidate> cands = enumerate_candidates(base, options);
  res.generated = static_cast<std::int64_t>(cands.size());
  const std::int64_t capacity = base.hardware.hbm_capacity_bytes - base.margin.gpu_bytes;

  // Cheap checks first: invalid combinations and memory lower bounds (screen), then the closest
  // miss offered in the candidates' order.
  ClosestMiss miss;
  const Screened screened = screen(base, options, refusal_text, cands);
  std::vector<std::size_t> pending;
  for (std::size_t i = 0; i < cands.size(); ++i) {
    const Candidate& c = cands[i];
    if (c.pruned) {
      miss.offer(c, c.parallel.seq_len, "GPU", screened.bound[i], capacity, true);
    } else if (c.error.empty()) {
      pending.push_back(i);
    }
  }
  const WorkPlan work = plan_work(cands, pending, screened.cost, options.seq_len.has_value());
  res.simulations =
      evaluate_work(base, options, refusal_text, capacity, work, pending.size(), cands);
  count_and_offer_misses(cands, capacity, res, miss);

  // The fitting candidates in the plan's order, moved once (a sort of the candidates themselves
  // would move each of them many times).
  std::vector<std::size_t> fitting;
  for (std::size_t i = 0; i < cands.size(); ++i) {
    if (cands[i].evaluated && cands[i].fits) {
      fitting.push_back(i);
    }
  }
  std::stable_sort(fitting.begin(), fitting.end(), [&](std::size_t a, std::size_t b) {
    return ranks_before(cands[a], cands[b], res.max_context);
  });
  rank_checking_reserved(base, options, cands, std::move(fitting), res, miss);
  if (res.ranked.empty()) {
    res.closest_miss = miss.text();
    if (res.generated > 0 && res.refused == res.generated) {
      res.every_candidate_refused = cands.front().error;
    }
  }
  res.why_best = why_best(res);
  res.methods_without_fit = methods_without_fit(options.methods, cands, res.best_per_method);
  return res;
}

}  // namespace cpsim::planner
