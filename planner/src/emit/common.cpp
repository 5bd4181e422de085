#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/json_io.hpp"
#include "cpsim/sim/pipeline.hpp"

#include "emit_common.hpp"

namespace cpsim::planner::emit_detail {
namespace {

const char* launcher_scope(LauncherFormat f) {
  switch (f) {
    case LauncherFormat::kTorchTitan:
      return "TorchTitan 0.3.0 runs CP only through FlexAttention, whose K/V are all-gathered "
             "(allgather); no ring rotation, Ulysses, UPipe or FPDT";
    case LauncherFormat::kTorchTitan022:
      return "TorchTitan 0.2.2's training ignores context_parallel_rotate_method (only its "
             "validation reads it), so CP runs PyTorch's default all-gather; no ring (0.2.1 runs "
             "it: --launcher-version 0.2.1), Ulysses, UPipe or FPDT";
    case LauncherFormat::kTorchTitan021:
      return "TorchTitan 0.2.1 has ring-style CP (ring, allgather); no Ulysses, UPipe or FPDT";
    case LauncherFormat::kTorchTitanMain:
      return "TorchTitan main runs CP only through FlexAttention, whose K/V are all-gathered "
             "(allgather); no ring rotation, Ulysses, UPipe or FPDT";
    case LauncherFormat::kUntiedUlysses:
      return "its --model.attn_impl offers upipe, usp (Ulysses x ring) and the torch ring only";
    case LauncherFormat::kDeepSpeed:
      return "DeepSpeed only has Ulysses sequence parallelism and FPDT (Megatron-DeepSpeed)";
    case LauncherFormat::kAccelerate:
      return "Accelerate has torch ring CP (cp_size) or DeepSpeed Ulysses (sp_size), mutually "
             "exclusive, and no UPipe or FPDT";
    case LauncherFormat::kMegatron:
      return "Megatron-LM CP (Transformer Engine) has p2p, all_gather, a2a and a2a+p2p only";
    case LauncherFormat::kArctic:
      return "ArcticTraining only has DeepSpeed Ulysses (sequence_parallel_size)";
    case LauncherFormat::kNeMo:
      return "NeMo runs Megatron-Core CP (Transformer Engine) with cp_comm_type p2p, all_gather "
             "or a2a; its strategy sets no hierarchical a2a+p2p sizes";
  }
  return "";
}

}  // namespace

void refuse_method(LauncherFormat f, CpMethod m) {
  const sim::LauncherSupport others = sim::cp_scheme(m).launchers();
  refuse(fmt::format("{} cannot run {} ({}); {}", launcher_target(f), models::to_string(m),
                     launcher_scope(f),
                     others.runs.empty() ? others.sentence() : "use " + launchers_for(m)));
}

// TorchTitan splits L blocks over S = P·V stages as if the embedding and the output were
// `first/last_stage_less_layers` blocks more (distributed/pipeline_parallel.py:236-330
// generate_llm_fqn_per_model_part @73a0e69): (L + w_f + w_l)/S per stage, the first stage giving
// up w_f blocks and the last w_l. With S = P and every middle stage holding the most blocks k,
// w_f = k − first and w_l = k − last give exactly cpsim's stages (L + w_f + w_l = P·k, no
// remainder); an even split interleaved sets both to 0 and the blocks per virtual stage L/(P·V)
// (pipeline_parallel.py:71-94: S = ceil(L / layers_per_stage)).
TorchTitanPipeline torchtitan_pipeline(const Plan& p) {
  const sim::PipelineShape s = sim::pipeline_shape(p.in);
  TorchTitanPipeline t;
  const bool interleaved = p.par.pp_schedule == models::PipelineSchedule::kInterleaved;
  const bool uneven = p.par.pp_first_stage_layers > 0 || p.par.pp_last_stage_layers > 0;
  t.schedule = interleaved ? "Interleaved1F1B" : "1F1B";
  if (interleaved) {
    if (uneven) {
      refuse(
          "TorchTitan takes the first/last stage's fewer blocks off one virtual stage, not evenly "
          "off each chunk as Megatron-Core does; use --emit megatron for uneven interleaved "
          "stages");
    }
    t.layers_per_stage = p.model.layers / (static_cast<std::int64_t>(s.stages) * s.virtual_stages);
    return t;
  }
  const std::int64_t k = s.stage_layers;
  if (s.stages > 2 && s.middle_stage_layers != k) {
    refuse(
        fmt::format("TorchTitan's split gives the first and last stage at most as many blocks "
                    "as the middle ones ({}/{}/{} here); use --emit megatron",
                    s.first_stage_layers, s.middle_stage_layers, s.last_stage_layers));
  }
  t.first_less = k - s.first_stage_layers;
  t.last_less = k - s.last_stage_layers;
  return t;
}

void refuse(const std::string& message) {
  throw InputError("--emit", message);
}

// ---- Small formatting helpers -------------------------------------------------------------------

std::string number(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15) {
    return fmt::format("{}", static_cast<std::int64_t>(v));
  }
  return fmt::format("{}", v);
}

const char* boolean(bool b) {
  return b ? "true" : "false";
}

std::string quoted(const std::string& s) {
  std::string out;
  models::append_json_string(out, s);
  return out;
}

std::string shell_word(const std::string& s) {
  bool plain = !s.empty();
  for (const char ch : s) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.' || ch == '/' ||
                    ch == ':' || ch == '=' || ch == ',' || ch == '+';
    plain = plain && ok;
  }
  if (plain) {
    return s;
  }
  std::string out = "'";
  for (const char ch : s) {
    out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  }
  return out + "'";
}

std::string comment_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) {
    out += l.empty() ? "#\n" : fmt::format("# {}\n", l);
  }
  return out;
}
// ---- Refusals -----------------------------------------------------------------------------------

void require_seq_multiple_of_2cp(const Plan& p, const char* launcher, const char* why) {
  const std::int64_t multiple = std::int64_t{2} * p.cp;
  if (p.seq % multiple != 0) {
    refuse(fmt::format("{} needs --seq divisible by 2 x CP = {} ({}); {} is not", launcher,
                       multiple, why, p.seq));
  }
}

void require_zero_for_optimizer_offload(const Plan& p, const char* launcher) {
  if (p.recipe.optimizer_offload && p.recipe.zero_stage < 1) {
    refuse(
        fmt::format("{} offloads the optimizer to the CPU only under ZeRO (stage 1 to 3); "
                    "use --zero 1, 2 or 3 with optimizer offload",
                    launcher));
  }
}
// ---- Model names --------------------------------------------------------------------------------

Flavor llama3_flavor(const models::TransformerSpec& m) {
  struct Shape {
    std::int64_t layers, hidden, heads, kv, ffn;
    const char* flavor;
  };
  static constexpr std::array kShapes = {Shape{32, 4096, 32, 8, 14336, "8B"},
                                         Shape{80, 8192, 64, 8, 28672, "70B"},
                                         Shape{126, 16384, 128, 8, 53248, "405B"}};
  for (const Shape& s : kShapes) {
    if (m.layers == s.layers && m.hidden == s.hidden && m.heads == s.heads && m.kv_heads == s.kv &&
        m.ffn_hidden == s.ffn && m.head_dim == 128 && m.vocab == 128256 && !m.qk_norm &&
        !m.is_moe()) {
      return {"llama3", s.flavor};
    }
  }
  return {};
}

// The dense flavors of torchtitan/models/qwen3/__init__.py (the same in v0.2.0, v0.2.1 and
// v0.2.2): head_dim 128, vocab 151936, q/k RMSNorm; 0.6B to 4B tie the embeddings
// (enable_weight_tying), 8B and larger do not.
Flavor qwen3_flavor(const models::TransformerSpec& m) {
  struct Shape {
    std::int64_t layers, hidden, heads, kv, ffn;
    bool tied;
    const char* flavor;
  };
  static constexpr std::array kShapes = {
      Shape{28, 1024, 16, 8, 3072, true, "0.6B"},  Shape{28, 2048, 16, 8, 6144, true, "1.7B"},
      Shape{36, 2560, 32, 8, 9728, true, "4B"},    Shape{36, 4096, 32, 8, 12288, false, "8B"},
      Shape{40, 5120, 40, 8, 17408, false, "14B"}, Shape{64, 5120, 64, 8, 25600, false, "32B"}};
  for (const Shape& s : kShapes) {
    if (m.layers == s.layers && m.hidden == s.hidden && m.heads == s.heads && m.kv_heads == s.kv &&
        m.ffn_hidden == s.ffn && m.tied_embeddings == s.tied && m.head_dim == 128 &&
        m.vocab == 151936 && m.qk_norm && !m.is_moe()) {
      return {"qwen3", s.flavor};
    }
  }
  // The mixture-of-experts flavors (torchtitan/models/qwen3/__init__.py in 0.3.0 and at b5bcd76,
  // _30b_a3b and _235b_a22b: 128 experts, top 8, route_norm, softmax scores; untied).
  struct MoeShape {
    std::int64_t layers, hidden, heads, kv, expert_ffn;
    const char* flavor;
  };
  static constexpr std::array kMoeShapes = {MoeShape{48, 2048, 32, 4, 768, "30B-A3B"},
                                            MoeShape{94, 4096, 64, 4, 1536, "235B-A22B"}};
  for (const MoeShape& s : kMoeShapes) {
    if (m.is_moe() && m.layers == s.layers && m.hidden == s.hidden && m.heads == s.heads &&
        m.kv_heads == s.kv && m.moe.experts == 128 && m.moe.experts_per_token == 8 &&
        m.moe.expert_ffn_hidden == s.expert_ffn && m.moe.renormalize && !m.tied_embeddings &&
        m.head_dim == 128 && m.vocab == 151936 && m.qk_norm) {
      return {"qwen3", s.flavor};
    }
  }
  return {};
}

Flavor torchtitan_flavor(const models::TransformerSpec& m) {
  const Flavor llama = llama3_flavor(m);
  return llama.name != nullptr ? llama : qwen3_flavor(m);
}

std::string shape_summary(const models::TransformerSpec& m) {
  return fmt::format("{} layers, hidden {}, {} heads, {} KV heads, head_dim {}, ffn {}, vocab {}",
                     m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim, m.ffn_hidden, m.vocab);
}

// ---- Finishing step -----------------------------------------------------------------------------

void add_environment_line(const Plan& p, std::vector<std::string>& usage) {
  if (p.recipe.expandable_segments) {
    usage.emplace_back("environment: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True");
  }
}

std::string launcher_word(LauncherFormat f, const sim::ScheduleInputs& in) {
  const std::optional<sim::LauncherSelection> s =
      sim::cp_scheme(in.parallel.method)
          .launcher_selection(to_string(f), in.parallel, in.recipe.attention_kernel);
  return s ? s->selects : std::string();
}

void no_transformer_engine_fp8(RecipeAsRun& r, const char* launcher) {
  run_as(r, r.recipe.fp8, false,
         fmt::format("bf16 GEMMs (FP8 is TransformerEngine's; {} sets none)", launcher));
}

void torchtitan_rope(RecipeAsRun& r, const models::TransformerSpec& m, const char* launcher) {
  if (qwen3_flavor(m).name != nullptr) {
    run_as(r, r.recipe.rope_kernel, models::RopeKernel::kEager,
           fmt::format("eager RoPE ({}'s Qwen3 rotate_half)", launcher));
  } else {
    run_as(r, r.recipe.rope_kernel, models::RopeKernel::kComplex,
           fmt::format("complex RoPE in fp32 ({}'s Llama apply_rotary_emb)", launcher));
  }
}

void torchtitan_rope_cache(RecipeAsRun& r,
                           const models::TransformerSpec& m,
                           bool per_layer,
                           const char* launcher) {
  // Qwen3: cos‖sin of [S, d] in fp32, [S, 2d] (CosSinRoPE; v0.2.2 precompute_rope_cache); Llama:
  // complex64 [S, d/2] (ComplexRoPE; v0.2.2 precompute_freqs_cis).
  const std::int64_t bytes = qwen3_flavor(m).name != nullptr ? 8 : 4;
  run_as(r, r.recipe.rope_cache_bytes_per_head_dim, bytes,
         fmt::format("RoPE table of every position on the GPU ({}: {} bytes per position and "
                     "head dim, {})",
                     launcher, bytes, per_layer ? "one per block" : "one per model"));
  r.recipe.rope_cache_per_layer = per_layer;  // named in the change above
}

void no_offload_or_tiling(RecipeAsRun& r,
                          const std::string& offload_why,
                          const std::string& tiling_why) {
  models::TrainingRecipe& x = r.recipe;
  if (x.checkpointing == CheckpointMode::kFull) {
    run_as(r, x.checkpoint_offload, false, fmt::format("checkpoint offload off ({})", offload_why));
  }
  run_as(r, x.tiled_mlp, false, fmt::format("tiled MLP off ({})", tiling_why));
  run_as(r, x.tiled_norm, false, fmt::format("tiled RMSNorm off ({})", tiling_why));
}

void comm_dtype_fixed(RecipeAsRun& r, const char* launcher) {
  run_as(r, r.recipe.cp_comm_bytes, r.recipe.activation_bytes,
         fmt::format("CP communication in the compute dtype ({} fixes it)", launcher));
}

std::vector<std::string> ds_config_common_lines(Plan& p) {
  std::vector<std::string> lines;
  lines.push_back(
      fmt::format("  \"bf16\": {{\"enabled\": {}}}", boolean(p.recipe.param_bytes == 2)));
  std::string zero =
      fmt::format("  \"zero_optimization\": {{\n    \"stage\": {}", p.recipe.zero_stage);
  if (p.recipe.optimizer_offload) {
    zero += ",\n    \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}";
  }
  lines.push_back(zero + "\n  }");
  lines.push_back(
      fmt::format("  \"seq_parallel_communication_data_type\": {}", quoted(p.ds_comm_dtype())));
  if (p.recipe.param_bytes != 2) {
    p.note("bf16 is off: the recipe computes in a non-bf16 dtype");
  }
  return lines;
}

EmittedConfig finish(Plan& p, LauncherText text) {
  EmittedConfig out;
  out.suggested_filename = text.filename;
  out.companions = std::move(p.companions);
  std::vector<std::string> header = {p.provenance(),
                                     fmt::format("written for {}", launcher_target(p.format))};
  header.insert(header.end(), std::make_move_iterator(text.usage.begin()),
                std::make_move_iterator(text.usage.end()));
  if (text.comment_header) {
    for (const auto& n : p.notes) {
      header.push_back(fmt::format("note: {}", n));
    }
    out.text = comment_lines(header) + text.body;
    out.notes = std::move(p.notes);
  } else {
    out.text = std::move(text.body);
    header.insert(header.end(), std::make_move_iterator(p.notes.begin()),
                  std::make_move_iterator(p.notes.end()));
    out.notes = std::move(header);
  }
  return out;
}

}  // namespace cpsim::planner::emit_detail
