// `cpsim models`, `cpsim hardware` and `cpsim implementations`: what is built in.
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cpsim/models/error.hpp"
#include "cpsim/models/json_io.hpp"
#include "cpsim/models/units.hpp"
#include "cpsim/sim/implementation.hpp"

#include "commands.hpp"
#include "common.hpp"

namespace cpsim::cli {

CLI::App* register_models(CLI::App& app, CatalogArgs& a) {
  CLI::App* c = app.add_subcommand(
      "models",
      "List the built-in models with their shapes and sizes, or show one model (built-in or a "
      "config.json) as cpsim reads it");
  c->add_option("name", a.name, "model to show in full (built-in name or config.json path)");
  c->add_flag("--json", a.json, "print JSON instead of the table");
  return c;
}

namespace {

const char* activation_name(models::ActivationKind k) {
  switch (k) {
    case models::ActivationKind::kSwiGlu:
      return "swiglu";
    case models::ActivationKind::kGeGlu:
      return "geglu";
    case models::ActivationKind::kClampedQuickGeGlu:
      return "clamped-quick-geglu";
  }
  return "?";
}

// A shared expert, as a clause of the experts line.
std::string shared_expert_clause(const models::TransformerSpec& m) {
  if (m.moe.shared_ffn_hidden == 0) {
    return "";
  }
  return fmt::format(", a shared expert of width {}{}", m.moe.shared_ffn_hidden,
                     m.moe.shared_gate ? " behind a sigmoid gate" : "");
}

// The biases and sinks of the attention, as a clause of the summary line.
std::string attention_extras(const models::TransformerSpec& m) {
  std::string out;
  if (m.qkv_bias) {
    out += m.output_proj_bias ? ", q/k/v/o biases" : ", q/k/v biases";
  }
  if (m.attention_sinks) {
    out += ", attention sinks";
  }
  if (m.is_mla()) {
    out +=
        fmt::format(", multi-head latent attention (q rank {}, kv rank {}, RoPE {}, v heads {})",
                    m.mla.q_lora_rank, m.mla.kv_lora_rank, m.mla.rope_head_dim, m.value_head_dim());
  }
  if (m.moe.groups > 0) {
    out += fmt::format(", a grouped sigmoid router (top {} of {} groups, scaled by {:g})",
                       m.moe.group_topk, m.moe.groups, m.moe.routed_scaling);
  }
  return out;
}

const char* norm_name(models::NormKind k) {
  return k == models::NormKind::kRmsNorm ? "rmsnorm" : "layernorm";
}

// The shape fields every listing shows (JSON objects print their keys sorted).
nlohmann::json shape_json(const models::TransformerSpec& m) {
  return {{"layers", m.layers},     {"hidden", m.hidden},
          {"heads", m.heads},       {"kv_heads", m.kv_heads},
          {"head_dim", m.head_dim}, {"ffn_hidden", m.ffn_hidden},
          {"vocab", m.vocab},       {"tied_embeddings", m.tied_embeddings}};
}

// A layer's attention as transformers' layer_types spells it, and as one letter.
struct LayerKindName {
  const char* type;
  char letter;
};

LayerKindName layer_kind_name(models::LayerAttention a) {
  switch (a) {
    case models::LayerAttention::kSliding:
      return {"sliding_attention", 'S'};
    case models::LayerAttention::kChunked:
      return {"chunked_attention", 'C'};
    case models::LayerAttention::kFull:
      break;
  }
  return {"full_attention", 'F'};
}

// The config's YaRN RoPE scaling; null without one.
nlohmann::json yarn_json(const models::TransformerSpec& m) {
  if (!m.yarn) {
    return nullptr;
  }
  const auto optional = [](const std::optional<double>& v) {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  };
  return {{"factor", m.yarn->factor},
          {"original_max_position_embeddings", m.yarn->original_max_position_embeddings},
          {"beta_fast", m.yarn->beta_fast},
          {"beta_slow", m.yarn->beta_slow},
          {"mscale", optional(m.yarn->mscale)},
          {"mscale_all_dim", optional(m.yarn->mscale_all_dim)}};
}

// Each layer's attention as transformers' layer_types spells it.
std::vector<std::string> layer_types(const models::TransformerSpec& m) {
  std::vector<std::string> out;
  for (std::int64_t l = 0; l < m.layers; ++l) {
    out.emplace_back(layer_kind_name(m.attention_of(l)).type);
  }
  return out;
}

// Parameters one token's forward reads: all but the experts it is not routed to.
std::int64_t active_parameters(const models::TransformerSpec& m, const models::ParameterCount& p) {
  if (!m.is_moe()) {
    return p.total;
  }
  const std::int64_t idle = m.moe.experts - m.moe.experts_per_token;
  return p.total - m.sparse_layers() * idle * (p.experts_per_layer / m.moe.experts);
}

// One model in full: every field cpsim read from its config and what it derives.
int show_model(const CatalogArgs& a, const models::DataDir& data) {
  const models::TransformerSpec m = models::load_model(a.name, data, "name");
  const models::ParameterCount p = models::count_parameters(m);
  const nlohmann::json window =
      m.windowed_layers() > 0 ? nlohmann::json(m.sliding_window) : nlohmann::json(nullptr);
  if (a.json) {
    nlohmann::json model = shape_json(m);
    model.update(
        {{"name", m.name},
         {"source", m.source},
         {"model_type", m.model_type},
         {"qk_norm", m.qk_norm},
         {"qkv_bias", m.qkv_bias},
         {"output_proj_bias", m.output_proj_bias},
         {"attention_sinks", m.attention_sinks},
         {"v_head_dim", m.value_head_dim()},
         {"latent_attention", m.is_mla() ? nlohmann::json{{"q_lora_rank", m.mla.q_lora_rank},
                                                          {"kv_lora_rank", m.mla.kv_lora_rank},
                                                          {"qk_rope_head_dim", m.mla.rope_head_dim}}
                                         : nlohmann::json(nullptr)},
         {"activation", activation_name(m.activation)},
         {"norm", norm_name(m.norm)},
         {"rope_theta", m.rope_theta},
         {"yarn", yarn_json(m)},
         {"max_position_embeddings", m.max_position_embeddings},
         {"sliding_window", window},
         {"attention_chunk_size",
          m.chunked_layers() > 0 ? nlohmann::json(m.attention_chunk) : nlohmann::json(nullptr)},
         {"layer_types", layer_types(m)},
         {"parameters", p.total},
         {"active_parameters_per_token", active_parameters(m, p)},
         {"experts", m.is_moe() ? nlohmann::json{{"experts", m.moe.experts},
                                                 {"experts_per_token", m.moe.experts_per_token},
                                                 {"expert_ffn_hidden", m.moe.expert_ffn_hidden},
                                                 {"renormalize", m.moe.renormalize},
                                                 {"biases", m.moe.biases},
                                                 {"shared_ffn_hidden", m.moe.shared_ffn_hidden},
                                                 {"shared_gate", m.moe.shared_gate},
                                                 {"sparse_layers", m.sparse_layers()},
                                                 {"router_groups", m.moe.groups},
                                                 {"router_group_topk", m.moe.group_topk},
                                                 {"routed_scaling", m.moe.routed_scaling},
                                                 {"dense_ffn_hidden", m.ffn_hidden}}
                                : nlohmann::json(nullptr)},
         {"notes", m.notes}});
    std::cout << nlohmann::json{{"schema_version", 1}, {"model", model}}.dump(2) << "\n";
    return 0;
  }
  std::cout << fmt::format("{}{}\n  source: {}\n\n", m.name,
                           m.model_type.empty() ? "" : fmt::format(" ({})", m.model_type),
                           m.source);
  std::cout << fmt::format(
      "  {} layers, hidden {}, {} query / {} key-value heads of {}, MLP {} ({}), vocabulary {}\n",
      m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim, m.mlp_width(),
      activation_name(m.activation), m.vocab);
  std::cout << fmt::format("  {} parameters ({:.3f} B){}{}{}\n", p.total,
                           static_cast<double>(p.total) / 1e9,
                           m.tied_embeddings ? ", tied embeddings" : "",
                           m.qk_norm ? ", q/k norms" : "", attention_extras(m));
  if (m.is_moe()) {
    std::cout << fmt::format(
        "  mixture of experts in {}: {} experts of width {}, {} per token{}; {} "
        "parameters active per token ({:.3f} B)\n",
        m.mixed_mlp() ? fmt::format("{} of {} layers (the others a dense MLP of {})",
                                    m.sparse_layers(), m.layers, m.ffn_hidden)
                      : std::string("every layer"),
        m.moe.experts, m.moe.expert_ffn_hidden, m.moe.experts_per_token,
        m.moe.biases ? ", router and expert biases" : shared_expert_clause(m),
        active_parameters(m, p), static_cast<double>(active_parameters(m, p)) / 1e9);
  }
  std::string pattern;
  for (std::int64_t l = 0; l < m.layers; ++l) {
    pattern += layer_kind_name(m.attention_of(l)).letter;
  }
  if (m.windowed_layers() > 0) {
    std::cout << fmt::format(
        "  attention: {} of {} layers within a {}-token sliding window (S), the others causal "
        "(F): {}\n",
        m.windowed_layers(), m.layers, m.sliding_window, pattern);
  } else if (m.chunked_layers() > 0) {
    std::cout << fmt::format(
        "  attention: {} of {} layers within {}-token chunks (C), the others causal (F): {}\n",
        m.chunked_layers(), m.layers, m.attention_chunk, pattern);
  } else {
    std::cout << "  attention: causal over the whole sequence in every layer\n";
  }
  for (const std::string& note : m.notes) {
    std::cout << fmt::format("  note: {}\n", note);
  }
  return 0;
}

}  // namespace

int run_models(const CatalogArgs& a) {
  const models::DataDir data = data_dir();
  if (!a.name.empty()) {
    return show_model(a, data);
  }
  nlohmann::json list = nlohmann::json::array();
  std::vector<std::vector<std::string>> rows;
  for (const std::string& name : models::list_builtin(data, "models")) {
    const models::TransformerSpec m = models::load_model(name, data);
    const models::ParameterCount p = models::count_parameters(m);
    nlohmann::json entry = shape_json(m);
    entry.update({{"name", name}, {"parameters", p.total}, {"source", m.source}});
    list.push_back(std::move(entry));
    rows.push_back({name, std::to_string(m.layers), std::to_string(m.hidden),
                    fmt::format("{}/{}", m.heads, m.kv_heads), std::to_string(m.head_dim),
                    m.is_moe() ? fmt::format("{}x{}/{}", m.moe.experts, m.moe.expert_ffn_hidden,
                                             m.moe.experts_per_token)
                               : std::to_string(m.ffn_hidden),
                    std::to_string(m.vocab), m.tied_embeddings ? "yes" : "no",
                    fmt::format("{:.3f} B", static_cast<double>(p.total) / 1e9)});
  }
  if (a.json) {
    std::cout << nlohmann::json{{"schema_version", 1}, {"models", list}}.dump(2) << "\n";
  } else {
    std::cout << format_table(
        {"model", "layers", "hidden", "heads/kv", "head_dim", "ffn", "vocab", "tied", "params"},
        rows, {false, true, true, true, true, true, true, false, true});
    std::cout << "\nAny Hugging Face config.json path works as --model too; `cpsim models NAME` "
                 "(or a path) shows one as cpsim reads it.\n";
  }
  return 0;
}

CLI::App* register_hardware(CLI::App& app, CatalogArgs& a) {
  CLI::App* c = app.add_subcommand(
      "hardware",
      "List the built-in hardware profiles, or show one with every coefficient's source");
  c->add_option("name", a.name, "profile to show in full (built-in name or file)");
  c->add_flag("--json", a.json, "print JSON instead of text");
  return c;
}

int run_hardware(const CatalogArgs& a) {
  const models::DataDir data = data_dir();
  if (!a.name.empty()) {
    const models::HardwareProfile p = models::load_hardware(a.name, data, "name");
    if (a.json) {
      nlohmann::json prov = nlohmann::json::object();
      for (const auto& [k, v] : p.provenance) {
        prov[k] = v;
      }
      std::cout << nlohmann::json{{"schema_version", 1},
                                  {"name", p.name},
                                  {"description", p.description},
                                  {"provenance", prov}}
                       .dump(2)
                << "\n";
      return 0;
    }
    std::cout << fmt::format("{}: {}\n\n", p.name, p.description);
    std::cout << fmt::format("  GPU {}: {} HBM, {:.0f} TFLOP/s bf16 dense, {:.2f} TB/s, {} SMs\n",
                             p.gpu_name, format_bytes(static_cast<double>(p.hbm_capacity_bytes)),
                             p.peak_bf16_flops_per_s / 1e12, p.hbm_bandwidth_bytes_per_s / 1e12,
                             p.sm_count);
    std::cout << fmt::format(
        "  node: {} GPUs, {} host memory; PCIe {:.1f}/{:.1f} GB/s H2D/D2H, {:.1f} duplex\n",
        p.gpus_per_node, format_bytes(static_cast<double>(p.host_memory_bytes_per_node)),
        p.host_link.h2d_bytes_per_s / 1e9, p.host_link.d2h_bytes_per_s / 1e9,
        p.host_link.duplex_total_bytes_per_s / 1e9);
    if (p.host_issue.enabled()) {
      std::cout << fmt::format(
          "  host issue: {:.2f} us dispatch + {:.2f} us launch per framework op, {:.2f} us per "
          "host synchronisation\n\n",
          p.host_issue.dispatch_s * 1e6, p.host_issue.launch_s * 1e6, p.host_issue.sync_s * 1e6);
    } else {
      std::cout << "  host issue: off (no node.host_issue in the profile)\n\n";
    }
    std::cout << "  coefficient sources:\n";
    for (const auto& [k, v] : p.provenance) {
      std::cout << fmt::format("    {}\n        {}\n", k, v);
    }
    return 0;
  }
  nlohmann::json list = nlohmann::json::array();
  std::vector<std::vector<std::string>> rows;
  for (const std::string& name : models::list_builtin(data, "hardware")) {
    const models::HardwareProfile p = models::load_hardware(name, data);
    list.push_back({{"name", name},
                    {"gpu", p.gpu_name},
                    {"hbm_capacity_bytes", p.hbm_capacity_bytes},
                    {"gpus_per_node", p.gpus_per_node},
                    {"description", p.description}});
    rows.push_back({name, p.gpu_name, format_bytes(static_cast<double>(p.hbm_capacity_bytes)),
                    std::to_string(p.gpus_per_node)});
  }
  if (a.json) {
    std::cout << nlohmann::json{{"schema_version", 1}, {"hardware", list}}.dump(2) << "\n";
  } else {
    std::cout << format_table({"profile", "gpu", "hbm", "gpus/node"}, rows,
                              {false, false, true, true});
    std::cout << "\n`cpsim hardware NAME` shows every coefficient and where it comes from.\n";
  }
  return 0;
}

// ---- cpsim implementations ------------------------------------------------------------------

namespace {

std::string joined(const std::vector<std::string>& items) {
  std::string s;
  for (const std::string& i : items) {
    s += s.empty() ? i : ", " + i;
  }
  return s;
}

std::vector<std::string> method_names(const sim::Implementation& impl) {
  std::vector<std::string> out;
  for (const models::CpMethod m : impl.methods()) {
    out.emplace_back(models::to_string(m));
  }
  return out;
}

/// "recipe/method" pairs of the built-in recipes it is the default of.
std::vector<std::string> defaults_of(const sim::Implementation& impl, const models::DataDir& data) {
  std::vector<std::string> out;
  for (const std::string& recipe : models::list_builtin(data, "recipes")) {
    for (const models::CpMethod m : impl.methods()) {
      if (impl.default_for(recipe, m)) {
        out.push_back(fmt::format("{}/{}", recipe, models::to_string(m)));
      }
    }
  }
  return out;
}

/// What the traces of an implementation's own code say of its ledger rows
/// (data/traces/<impl>/ledger_check.json, written by calibrate/tracer/check_ledgers.py): each
/// row's status — traced (its allocations in the traces equal the row at every traced shape),
/// differs (they do not), source_read (no trace allocates it) — and the traced shapes.
struct LedgerCheck {
  std::map<std::string, std::string, std::less<>> row_status;
  std::vector<std::string> shapes;
  std::string path;
};

/// The implementation's ledger check, or nothing when it has no traces.
/// @throws InputError naming the file when it exists but cannot be read as one.
std::optional<LedgerCheck> load_ledger_check(const sim::Implementation& impl,
                                             const models::DataDir& data) {
  const std::filesystem::path path =
      data.root / "traces" / std::string(impl.name()) / "ledger_check.json";
  if (!std::filesystem::exists(path)) {
    return std::nullopt;
  }
  const std::string origin = path.string();
  const models::Json doc = models::parse_json(models::read_text_file(path, origin), origin);
  const auto array = [&](const models::Json& object, std::string_view key) -> const models::Json& {
    const models::Json* member = models::find_member(object, key);
    if (member == nullptr || !member->is_array()) {
      throw InputError(models::json_field(origin, std::string(key)), "an array is required");
    }
    return *member;
  };
  const auto text = [&](const models::Json& object, std::string_view key) {
    const std::string field = models::json_field(origin, "rows." + std::string(key));
    const models::Json* member = models::find_member(object, key);
    if (member == nullptr) {
      throw InputError(field, "is required");
    }
    return models::json_string(*member, field);
  };
  LedgerCheck check;
  check.path = origin;
  for (const models::Json& shape : array(models::json_object(doc, origin), "shapes")) {
    check.shapes.push_back(models::json_string(shape, models::json_field(origin, "shapes")));
  }
  for (const models::Json& row : array(doc, "rows")) {
    const std::string status = text(models::json_object(row, origin + ":rows"), "status");
    if (status != "traced" && status != "differs" && status != "source_read") {
      throw InputError(models::json_field(origin, "rows.status"),
                       "'" + status + "' is not traced, differs or source_read");
    }
    check.row_status[text(row, "id")] = status;
  }
  return check;
}

/// The status of a ledger row: from the check, "source_read" for a row it does not list.
std::string row_status(const std::optional<LedgerCheck>& check, std::string_view id) {
  if (!check) {
    return "source_read";
  }
  const auto it = check->row_status.find(id);
  return it == check->row_status.end() ? "source_read" : it->second;
}

/// Rows traced, differing from their traces and only read from source.
nlohmann::json row_counts(const sim::Implementation& impl,
                          const std::optional<LedgerCheck>& check) {
  std::map<std::string, int> counts{{"traced", 0}, {"differs", 0}, {"source_read", 0}};
  for (const sim::LedgerRow& r : impl.ledger()) {
    ++counts[row_status(check, r.id)];
  }
  return counts;
}

std::string counts_cell(const nlohmann::json& counts) {
  return fmt::format("{}/{}/{}", counts.at("traced").get<int>(), counts.at("differs").get<int>(),
                     counts.at("source_read").get<int>());
}

nlohmann::json ledger_json(const sim::Implementation& impl,
                           const std::optional<LedgerCheck>& check) {
  nlohmann::json rows = nlohmann::json::array();
  for (const sim::LedgerRow& r : impl.ledger()) {
    rows.push_back({{"id", r.id},
                    {"check", row_status(check, r.id)},
                    {"site", sim::to_string(r.site)},
                    {"when", sim::to_string(r.when)},
                    {"bytes_per_shd", r.shd},
                    {"bytes_per_shkvd", r.shkd},
                    {"bytes_per_sh", r.sh},
                    {"traffic_per_shd", r.traffic.shd},
                    {"traffic_per_shkvd", r.traffic.shkd},
                    {"traffic_per_sh", r.traffic.sh},
                    {"tensor", r.tensor}});
  }
  return rows;
}

/// Its framework calls per site traced from its code (sim::SiteCalls; empty: none traced).
nlohmann::json traced_calls_json(const sim::Implementation& impl) {
  nlohmann::json rows = nlohmann::json::array();
  for (const sim::SiteCalls& c : impl.traced_calls()) {
    rows.push_back(
        {{"site", sim::to_string(c.site)}, {"when", sim::to_string(c.when)}, {"calls", c.calls}});
  }
  return rows;
}

// How it runs a mixture of experts, per method it runs (sim::ExpertSupport).
nlohmann::json experts_json(const sim::Implementation& impl) {
  nlohmann::json out = nlohmann::json::object();
  const auto calls = [](const sim::ExpertSupport::HostCalls& c) {
    return nlohmann::json{
        {"block", c.block}, {"per_expert", c.per_expert}, {"renormalize", c.renormalize}};
  };
  for (const models::CpMethod m : impl.methods()) {
    const sim::ExpertSupport e = impl.experts(m);
    out[models::to_string(m)] = {
        {"runs", e.runs},
        {"expert_parallel", e.expert_parallel},
        {"source", e.source},
        {"routing_bytes_per_token_expert", e.routing_bytes_per_token_expert},
        {"routing_bytes_per_copy", e.routing_bytes_per_copy},
        {"routing_bytes_per_token", e.routing_bytes_per_token},
        {"keeps_renormalisation", e.keeps_renormalisation},
        {"router_input_bytes", e.router_input_bytes},
        {"weights_inside_experts", e.weights_inside_experts},
        {"combined_bytes", e.combined_bytes},
        {"keeps_weighted_outputs", e.keeps_weighted_outputs},
        {"eager_expert_activation", e.eager_expert_activation},
        {"clamped_glu_copies", e.clamped_glu_copies},
        {"runs_shared_experts", e.runs_shared_experts},
        {"forward_calls", calls(e.forward_calls)},
        {"backward_calls", calls(e.backward_calls)},
        {"synchronises_per_expert", e.synchronises_per_expert}};
  }
  return out;
}

// How it runs a model's sliding windows and attention sinks, per method it runs.
nlohmann::json attention_features_json(const sim::Implementation& impl) {
  nlohmann::json out = nlohmann::json::object();
  for (const models::CpMethod m : impl.methods()) {
    const sim::WindowSupport w = impl.sliding_window(m);
    const sim::FeatureSupport s = impl.attention_sinks(m);
    out[models::to_string(m)] = {
        {"sliding_window", {{"runs", w.passes_window}, {"source", w.source}}},
        {"attention_sinks", {{"runs", s.runs}, {"source", s.source}}},
        {"chunked_attention",
         {{"runs", impl.chunked_attention(m).runs}, {"source", impl.chunked_attention(m).source}}},
        {"latent_attention",
         {{"runs", impl.latent_attention(m).runs}, {"source", impl.latent_attention(m).source}}}};
  }
  return out;
}

int show_implementation(const sim::Implementation& impl, const CatalogArgs& a) {
  const models::DataDir data = data_dir();
  const std::optional<LedgerCheck> check = load_ledger_check(impl, data);
  const std::vector<std::string> shapes = check ? check->shapes : std::vector<std::string>{};
  if (a.json) {
    std::vector<std::string> limits(impl.limits().begin(), impl.limits().end());
    std::cout << nlohmann::json{{"schema_version", 1},
                                {"name", impl.name()},
                                {"title", impl.title()},
                                {"methods", method_names(impl)},
                                {"launchers", std::vector<std::string>(impl.launchers().begin(),
                                                                       impl.launchers().end())},
                                {"default_for", defaults_of(impl, data)},
                                {"pinned_source", impl.pinned_source()},
                                {"ledger_document", impl.ledger_document()},
                                {"ledger", ledger_json(impl, check)},
                                {"ledger_rows", row_counts(impl, check)},
                                {"traced_calls", traced_calls_json(impl)},
                                {"experts", experts_json(impl)},
                                {"attention", attention_features_json(impl)},
                                {"traced_shapes", shapes},
                                {"limits", limits}}
                     .dump(2)
              << "\n";
    return 0;
  }
  std::cout << fmt::format("{}: {}\n  source  {}\n  ledger  {}\n  methods {}\n\n", impl.name(),
                           impl.title(), impl.pinned_source(), impl.ledger_document(),
                           joined(method_names(impl)));
  std::vector<std::vector<std::string>> rows;
  for (const sim::LedgerRow& r : impl.ledger()) {
    rows.push_back({std::string(r.id), sim::to_string(r.site), sim::to_string(r.when),
                    sim::row_formula(r), sim::traffic_formula(r), row_status(check, r.id),
                    std::string(r.tensor)});
  }
  std::cout << format_table({"row", "site", "when", "bytes", "traffic", "check", "tensor"}, rows,
                            {false, false, false, false, false, false, false});
  std::cout << "\nBytes per layer and rank beyond the method's scheme; s = tokens per rank before "
               "the all-to-all, H and Hkv the query and (replicated) KV heads, d the head "
               "dimension. Traffic: HBM bytes its kernels read and write (copies, casts, merges, "
               "zero fills), timed on the op's compute stream at the memory-bound rate.\n"
               "Check: traced = the allocations of its own code, run on the CPU, equal the row at "
               "every traced shape; differs = they do not; source_read = read from source only "
               "(docs/TRACING.md).\n";
  if (check) {
    std::cout << fmt::format("  traced shapes: {} ({})\n", joined(shapes), check->path);
  }
  std::cout << "  not modelled:\n";
  for (const std::string_view l : impl.limits()) {
    std::cout << "    - " << l << "\n";
  }
  return 0;
}

}  // namespace

CLI::App* register_implementations(CLI::App& app, CatalogArgs& a) {
  CLI::App* c = app.add_subcommand(
      "implementations",
      "List the CP implementations cpsim models (the code users run: its ledger of allocations "
      "beyond the method's scheme), or show one's ledger");
  c->add_option("name", a.name, "implementation to show with its ledger rows");
  c->add_flag("--json", a.json, "print JSON instead of the table");
  return c;
}

int run_implementations(const CatalogArgs& a) {
  if (!a.name.empty()) {
    const sim::Implementation* impl = sim::find_implementation(a.name);
    if (impl == nullptr) {
      throw InputError("name", fmt::format("unknown implementation '{}'; known: {}", a.name,
                                           sim::implementation_names()));
    }
    return show_implementation(*impl, a);
  }
  const models::DataDir data = data_dir();
  nlohmann::json list = nlohmann::json::array();
  std::vector<std::vector<std::string>> rows;
  for (const sim::Implementation* impl : sim::implementations()) {
    const std::vector<std::string> launchers(impl->launchers().begin(), impl->launchers().end());
    const nlohmann::json counts = row_counts(*impl, load_ledger_check(*impl, data));
    list.push_back({{"name", impl->name()},
                    {"ledger_rows", counts},
                    {"title", impl->title()},
                    {"methods", method_names(*impl)},
                    {"launchers", launchers},
                    {"default_for", defaults_of(*impl, data)},
                    {"pinned_source", impl->pinned_source()},
                    {"ledger_document", impl->ledger_document()}});
    rows.push_back({std::string(impl->name()), joined(method_names(*impl)), joined(launchers),
                    joined(defaults_of(*impl, data)), counts_cell(counts),
                    std::string(impl->pinned_source())});
  }
  if (a.json) {
    std::cout << nlohmann::json{{"schema_version", 1}, {"implementations", list}}.dump(2) << "\n";
  } else {
    std::cout << format_table(
        {"implementation", "methods", "launchers", "default for", "rows t/d/r", "source"}, rows,
        {false, false, false, false, true, false});
    std::cout << "\n--impl NAME selects one (--impl none: the method's scheme alone, no wrapper "
                 "allocations); `cpsim implementations NAME` shows its ledger. Rows t/d/r: ledger "
                 "rows traced (its own code, run on the CPU, allocates them), differing from the "
                 "traces, and read from source only.\n";
  }
  return 0;
}

}  // namespace cpsim::cli
