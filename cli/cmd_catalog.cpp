// `cpsim models`, `cpsim hardware` and `cpsim implementations`: what is built in.
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cpsim/models/error.hpp"
#include "cpsim/models/units.hpp"
#include "cpsim/sim/implementation.hpp"

#include "commands.hpp"
#include "common.hpp"

namespace cpsim::cli {

CLI::App* register_models(CLI::App& app, CatalogArgs& a) {
  CLI::App* c =
      app.add_subcommand("models", "List the built-in models with their shapes and sizes");
  c->add_flag("--json", a.json, "print JSON instead of the table");
  return c;
}

int run_models(const CatalogArgs& a) {
  const models::DataDir data = data_dir();
  nlohmann::json list = nlohmann::json::array();
  std::vector<std::vector<std::string>> rows;
  for (const std::string& name : models::list_builtin(data, "models")) {
    const models::TransformerSpec m = models::load_model(name, data);
    const models::ParameterCount p = models::count_parameters(m);
    list.push_back({{"name", name},
                    {"layers", m.layers},
                    {"hidden", m.hidden},
                    {"heads", m.heads},
                    {"kv_heads", m.kv_heads},
                    {"head_dim", m.head_dim},
                    {"ffn_hidden", m.ffn_hidden},
                    {"vocab", m.vocab},
                    {"tied_embeddings", m.tied_embeddings},
                    {"parameters", p.total},
                    {"source", m.source}});
    rows.push_back({name, std::to_string(m.layers), std::to_string(m.hidden),
                    fmt::format("{}/{}", m.heads, m.kv_heads), std::to_string(m.head_dim),
                    std::to_string(m.ffn_hidden), std::to_string(m.vocab),
                    m.tied_embeddings ? "yes" : "no",
                    fmt::format("{:.3f} B", static_cast<double>(p.total) / 1e9)});
  }
  if (a.json) {
    std::cout << nlohmann::json{{"schema_version", 1}, {"models", list}}.dump(2) << "\n";
  } else {
    std::cout << format_table(
        {"model", "layers", "hidden", "heads/kv", "head_dim", "ffn", "vocab", "tied", "params"},
        rows, {false, true, true, true, true, true, true, false, true});
    std::cout << "\nAny Hugging Face config.json path works as --model too.\n";
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

nlohmann::json ledger_json(const sim::Implementation& impl) {
  nlohmann::json rows = nlohmann::json::array();
  for (const sim::LedgerRow& r : impl.ledger()) {
    rows.push_back({{"id", r.id},
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

int show_implementation(const sim::Implementation& impl, const CatalogArgs& a) {
  const models::DataDir data = data_dir();
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
                                {"ledger", ledger_json(impl)},
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
                    sim::row_formula(r), sim::traffic_formula(r), std::string(r.tensor)});
  }
  std::cout << format_table({"row", "site", "when", "bytes", "traffic", "tensor"}, rows,
                            {false, false, false, false, false, false});
  std::cout << "\nBytes per layer and rank beyond the method's scheme; s = tokens per rank before "
               "the all-to-all, H and Hkv the query and (replicated) KV heads, d the head "
               "dimension. Traffic: HBM bytes its kernels read and write (copies, casts, merges, "
               "zero fills), timed on the op's compute stream at the memory-bound rate.\n"
               "  not modelled:\n";
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
    list.push_back({{"name", impl->name()},
                    {"title", impl->title()},
                    {"methods", method_names(*impl)},
                    {"launchers", launchers},
                    {"default_for", defaults_of(*impl, data)},
                    {"pinned_source", impl->pinned_source()},
                    {"ledger_document", impl->ledger_document()}});
    rows.push_back({std::string(impl->name()), joined(method_names(*impl)), joined(launchers),
                    joined(defaults_of(*impl, data)), std::string(impl->pinned_source())});
  }
  if (a.json) {
    std::cout << nlohmann::json{{"schema_version", 1}, {"implementations", list}}.dump(2) << "\n";
  } else {
    std::cout << format_table({"implementation", "methods", "launchers", "default for", "source"},
                              rows, {false, false, false, false, false});
    std::cout << "\n--impl NAME selects one (--impl none: the method's scheme alone, no wrapper "
                 "allocations); `cpsim implementations NAME` shows its ledger.\n";
  }
  return 0;
}

}  // namespace cpsim::cli
