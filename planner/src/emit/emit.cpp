#include "cpsim/planner/emit.hpp"

#include <array>
#include <cassert>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"
#include "cpsim/sim/cp_method.hpp"
#include "cpsim/sim/implementation.hpp"

#include "emit_common.hpp"

// The dispatcher: which launcher runs which method, then one emitter per launcher (one file each
// in this folder) and the shared finishing step (emit_common.hpp).

namespace cpsim::planner {
namespace {

constexpr std::array kFormats = {LauncherFormat::kTorchTitan,    LauncherFormat::kTorchTitan022,
                                 LauncherFormat::kTorchTitan021, LauncherFormat::kTorchTitanMain,
                                 LauncherFormat::kUntiedUlysses, LauncherFormat::kDeepSpeed,
                                 LauncherFormat::kAccelerate,    LauncherFormat::kMegatron,
                                 LauncherFormat::kArctic,        LauncherFormat::kNeMo};

}  // namespace

std::span<const LauncherFormat> launcher_formats() {
  return kFormats;
}

namespace {

using emit_detail::CpMethod;
using emit_detail::Plan;
using emit_detail::refuse;

}  // namespace

const char* to_string(LauncherFormat f) {
  switch (f) {
    case LauncherFormat::kTorchTitan:
      return "torchtitan";
    case LauncherFormat::kTorchTitan022:
      return "torchtitan-0.2.2";
    case LauncherFormat::kTorchTitan021:
      return "torchtitan-0.2.1";
    case LauncherFormat::kTorchTitanMain:
      return "torchtitan-main";
    case LauncherFormat::kUntiedUlysses:
      return "untied-ulysses";
    case LauncherFormat::kDeepSpeed:
      return "deepspeed";
    case LauncherFormat::kAccelerate:
      return "accelerate";
    case LauncherFormat::kMegatron:
      return "megatron";
    case LauncherFormat::kArctic:
      return "arctic";
    case LauncherFormat::kNeMo:
      return "nemo";
  }
  return "unknown";
}

const char* launcher_target(LauncherFormat f) {
  // The releases CI loads the files with (requirements.txt), else the commits the emitters were
  // written from (docs/REFERENCES.md, "Launchers").
  switch (f) {
    case LauncherFormat::kTorchTitan:
      return "TorchTitan 0.3.0";
    case LauncherFormat::kTorchTitan022:
      return "TorchTitan 0.2.2";
    case LauncherFormat::kTorchTitan021:
      return "TorchTitan 0.2.1";
    case LauncherFormat::kTorchTitanMain:
      return "TorchTitan main @ b5bcd76";
    case LauncherFormat::kUntiedUlysses:
      return "Untied-Ulysses @ e465aa8 (the UPipe fork of TorchTitan)";
    case LauncherFormat::kDeepSpeed:
      return "DeepSpeed 0.19.8";
    case LauncherFormat::kAccelerate:
      return "Accelerate 1.15.0";
    case LauncherFormat::kMegatron:
      return "Megatron-LM core_r0.15 (checked with Megatron-Core 0.16.1)";
    case LauncherFormat::kArctic:
      return "ArcticTraining @ b28638e";
    case LauncherFormat::kNeMo:
      return "NeMo 2.4.0";
  }
  return "unknown";
}

LauncherFormat parse_launcher_format(const std::string& text,
                                     const std::string& field,
                                     const std::string& version) {
  std::string known;
  for (const LauncherFormat f : kFormats) {
    known += known.empty() ? to_string(f) : fmt::format(", {}", to_string(f));
  }
  if (text == "torchtitan" && !version.empty() && version != "0.3.0") {
    // Older TorchTitan releases by their TOML formats.
    for (const LauncherFormat f :
         {LauncherFormat::kTorchTitan022, LauncherFormat::kTorchTitan021}) {
      if (text + "-" + version == to_string(f)) {
        return f;
      }
    }
    throw InputError("--launcher-version",
                     fmt::format("torchtitan files are written for 0.3.0 (the default), 0.2.2 or "
                                 "0.2.1, not '{}'",
                                 version));
  }
  for (const LauncherFormat f : kFormats) {
    if (text == to_string(f)) {
      if (!version.empty() && text != "torchtitan") {
        throw InputError("--launcher-version",
                         fmt::format("{} files are written for one release, {}; only torchtitan "
                                     "takes a version",
                                     text, launcher_target(f)));
      }
      return f;
    }
  }
  throw InputError(field, fmt::format("unknown launcher format '{}'; known: {}", text, known));
}

namespace {

// Each launcher's two functions, both in its emitter file, in LauncherFormat order.
struct LauncherFunctions {
  LauncherFormat format;
  EmittedConfig (*emit)(emit_detail::Plan&);
  RecipeAsRun (*recipe_as_run)(const sim::ScheduleInputs&);
};
constexpr std::array<LauncherFunctions, 10> kLaunchers = {{
    {LauncherFormat::kTorchTitan, emit_detail::emit_torchtitan_030,
     emit_detail::torchtitan_030_recipe_as_run},
    {LauncherFormat::kTorchTitan022, emit_detail::emit_torchtitan_toml,
     emit_detail::torchtitan_toml_recipe_as_run},
    {LauncherFormat::kTorchTitan021, emit_detail::emit_torchtitan_toml,
     emit_detail::torchtitan_toml_recipe_as_run},
    {LauncherFormat::kTorchTitanMain, emit_detail::emit_torchtitan_main,
     emit_detail::torchtitan_main_recipe_as_run},
    {LauncherFormat::kUntiedUlysses, emit_detail::emit_untied_ulysses,
     emit_detail::untied_ulysses_recipe_as_run},
    {LauncherFormat::kDeepSpeed, emit_detail::emit_deepspeed, emit_detail::deepspeed_recipe_as_run},
    {LauncherFormat::kAccelerate, emit_detail::emit_accelerate,
     emit_detail::accelerate_recipe_as_run},
    {LauncherFormat::kMegatron, emit_detail::emit_megatron, emit_detail::megatron_recipe_as_run},
    {LauncherFormat::kArctic, emit_detail::emit_arctic, emit_detail::arctic_recipe_as_run},
    {LauncherFormat::kNeMo, emit_detail::emit_nemo, emit_detail::nemo_recipe_as_run},
}};

const LauncherFunctions& functions_of(LauncherFormat format) {
  const auto i = static_cast<std::size_t>(format);
  assert(i < kLaunchers.size() && kLaunchers[i].format == format);
  return kLaunchers[i];
}

}  // namespace

RecipeAsRun recipe_as_run(LauncherFormat format, const sim::ScheduleInputs& config) {
  return functions_of(format).recipe_as_run(config);
}

std::string implementation_run_by(LauncherFormat format, const sim::ScheduleInputs& config) {
  const models::ParallelConfig& p = config.parallel;
  if (!p.implementation.empty()) {
    return p.implementation;
  }
  const std::string launcher = to_string(format);
  if (const sim::Implementation* d = sim::default_implementation(config.recipe.name, p.method);
      d != nullptr && d->runs_on(launcher)) {
    return std::string(d->name());
  }
  for (const sim::Implementation* impl : sim::implementations()) {
    if (impl->runs(p.method) && impl->runs_on(launcher)) {
      return std::string(impl->name());
    }
  }
  return "none";
}

namespace {

// An implementation asked for (--impl) that the launcher does not run is bad input: its file
// would run other code than the one simulated. "none" (the method's scheme alone) runs anywhere
// the method does.
void require_implementation_runs_on(LauncherFormat format, const sim::ScheduleInputs& config) {
  const sim::Implementation* impl = sim::find_implementation(config.parallel.implementation);
  if (impl != nullptr && !impl->runs_on(to_string(format))) {
    std::string launchers;
    for (const std::string_view l : impl->launchers()) {
      launchers += fmt::format("{}{}", launchers.empty() ? "" : ", ", l);
    }
    throw InputError("--impl", fmt::format("{} does not run {}; {} runs on: {}", to_string(format),
                                           impl->name(), impl->name(), launchers));
  }
}

}  // namespace

ConfigAsRun config_as_run(LauncherFormat format,
                          const sim::ScheduleInputs& config,
                          const std::string& field) {
  require_implementation_runs_on(format, config);
  const sim::CpScheme& method = sim::cp_scheme(config.parallel.method);
  if (!method.launcher_selection(to_string(format), config.parallel,
                                 config.recipe.attention_kernel)) {
    throw InputError(field, fmt::format("{} cannot run {} (launchers: {})", to_string(format),
                                        models::to_string(config.parallel.method),
                                        method.launchers().sentence()));
  }
  if (const std::optional<std::string> why =
          method.launcher_refuses(to_string(format), config.model)) {
    throw InputError(field, *why);
  }
  ConfigAsRun run{config, {}};
  RecipeAsRun recipe = recipe_as_run(format, config);
  run.inputs.recipe = std::move(recipe.recipe);
  run.changes = std::move(recipe.changes);
  run.inputs.parallel.implementation = implementation_run_by(format, config);
  return run;
}

std::string companion_path(const std::string& main_path,
                           const std::string& default_main,
                           const std::string& suffix) {
  const std::string& main = main_path.empty() || main_path == "-" ? default_main : main_path;
  const std::size_t slash = main.find_last_of('/');
  const std::size_t dot = main.find_last_of('.');
  const bool has_extension =
      dot != std::string::npos && dot > 0 && (slash == std::string::npos || dot > slash + 1);
  return (has_extension ? main.substr(0, dot) : main) + suffix;
}

namespace {

bool is_torchtitan(LauncherFormat f) {
  return f == LauncherFormat::kTorchTitan || f == LauncherFormat::kTorchTitan022 ||
         f == LauncherFormat::kTorchTitan021 || f == LauncherFormat::kTorchTitanMain;
}

}  // namespace

bool launcher_writes_pipeline(LauncherFormat f) {
  return f == LauncherFormat::kMegatron || f == LauncherFormat::kNeMo || is_torchtitan(f);
}

bool launcher_writes_expert_parallel(LauncherFormat f) {
  return f == LauncherFormat::kMegatron || f == LauncherFormat::kTorchTitan ||
         f == LauncherFormat::kTorchTitanMain;
}

EmittedConfig emit_launcher_config(LauncherFormat format,
                                   const sim::ScheduleInputs& config,
                                   const EmitOptions& options) {
  const CpMethod m = config.parallel.method;
  // The method's launcher table (sim/src/methods) says which launchers run it, and how.
  std::optional<sim::LauncherSelection> selection = sim::cp_scheme(m).launcher_selection(
      to_string(format), config.parallel, config.recipe.attention_kernel);
  if (!selection) {
    emit_detail::refuse_method(format, m);
  }
  require_implementation_runs_on(format, config);
  // What each file can say about tensor parallelism and gradient accumulation.
  const bool writes_tp = format == LauncherFormat::kMegatron || format == LauncherFormat::kNeMo ||
                         is_torchtitan(format) || format == LauncherFormat::kAccelerate;
  if (config.parallel.tp_degree > 1 && !writes_tp) {
    emit_detail::refuse(
        fmt::format("{} files set no tensor parallelism (--tp {}); launchers that "
                    "do: torchtitan, torchtitan-main, megatron, nemo, accelerate (torch CP)",
                    to_string(format), config.parallel.tp_degree));
  }
  // Pipeline parallelism: Megatron-LM's and TorchTitan's keys; the files cpsim writes for the
  // other launchers have none (Accelerate's ParallelismConfig, parallelism_config.py @16cb6eb, and
  // ArcticTraining's config @b28638e name no pipeline degree; the implementations the DeepSpeed
  // and UPipe launchers run refuse PP themselves).
  if (config.parallel.pp_degree > 1 && !launcher_writes_pipeline(format)) {
    emit_detail::refuse(
        fmt::format("{} files set no pipeline parallelism (--pp {}); launchers that do: megatron, "
                    "nemo, torchtitan, torchtitan-main",
                    to_string(format), config.parallel.pp_degree));
  }
  if (config.parallel.ep_degree > 1 && !launcher_writes_expert_parallel(format)) {
    throw InputError("--ep", fmt::format("{} files set no expert parallelism (--ep {}); launchers "
                                         "that do: megatron, torchtitan, torchtitan-main",
                                         to_string(format), config.parallel.ep_degree));
  }
  if (config.parallel.micro_batches > 1 && format == LauncherFormat::kUntiedUlysses) {
    emit_detail::refuse(fmt::format(
        "the UPipe reference code's arguments set no gradient accumulation (--micro-batches {})",
        config.parallel.micro_batches));
  }
  // The configuration is checked against the implementation this launcher runs (the method's
  // scheme alone where none is modelled).
  sim::ScheduleInputs inputs = config;
  inputs.parallel.implementation = implementation_run_by(format, config);
  // Validates the configuration (throws InputError naming the flag). A constraint of an
  // implementation this launcher brings in (neither asked for nor the recipe's default) where the
  // method's scheme alone is valid is the launcher's refusal, naming the launchers that can.
  std::optional<Plan> checked;
  try {
    checked.emplace(inputs, std::move(*selection));
  } catch (const sim::ConfigError& e) {
    const sim::Implementation* d = sim::default_implementation(config.recipe.name, m);
    sim::ScheduleInputs scheme = inputs;
    scheme.parallel.implementation = "none";
    if (!config.parallel.implementation.empty() ||
        (d != nullptr && d->name() == inputs.parallel.implementation) ||
        sim::check_head_layout(scheme).issue) {
      throw;
    }
    emit_detail::refuse(
        fmt::format("{} runs {} here, which cannot run this configuration: {}; "
                    "launchers that run {}: {}",
                    to_string(format), inputs.parallel.implementation, e.what(), to_string(m),
                    emit_detail::launchers_for(m)));
  }
  Plan& plan = *checked;
  plan.format = format;
  plan.main_path = options.main_path;
  plan.dataset = options.dataset;
  return functions_of(format).emit(plan);
}

}  // namespace cpsim::planner
