// cpsim: simulator and memory/throughput planner for context-parallel long-context training.
// Exit status: 0 success, 2 bad input (one line on stderr naming the flag or field), 1 internal
// error.
#include <algorithm>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cpsim/models/error.hpp"

#include "commands.hpp"
#include "config_flags.hpp"

namespace {

/// Levenshtein distance (names are short).
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) {
    row[j] = j;
  }
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

/// The error line for a first argument that is neither a flag nor a subcommand ("" when it is
/// one, or absent): names it, the closest subcommand when one is close, and the list.
std::string unknown_subcommand_error(CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') {
    return "";
  }
  const std::string given = argv[1];
  std::string closest, known;
  std::size_t best = given.size() / 2 + 1;  // farther than this suggests nothing
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    const std::string& name = sub->get_name();
    if (name == given) {
      return "";
    }
    known += known.empty() ? name : ", " + name;
    if (const std::size_t d = edit_distance(given, name); d < best) {
      best = d;
      closest = name;
    }
  }
  return "unknown subcommand '" + given + "'" +
         (closest.empty() ? "" : "; did you mean '" + closest + "'?") + " (subcommands: " + known +
         ")";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "cpsim — simulate context-parallel training (Ulysses, UPipe, Ring, all-gather, FPDT, USP):\n"
      "step time, throughput, peak memory, the longest context, and launcher settings.",
      "cpsim"};
  app.set_version_flag("--version", std::string("cpsim ") + CPSIM_VERSION);
  app.require_subcommand(1);
  app.footer(
      "Lengths accept 131072, 128K, 3M (K = 1024, M = 1024^2).\n"
      "Built-in data is read from $CPSIM_DATA_DIR or the source tree's data/.\n"
      "Run `cpsim SUBCOMMAND --help` for the flags of each subcommand.");

  cpsim::cli::SimulateArgs sim_args;
  cpsim::cli::CatalogArgs models_args, hardware_args;
  CLI::App* simulate = cpsim::cli::register_simulate(app, sim_args);
  cpsim::cli::MaxLenArgs maxlen_args;
  CLI::App* maxlen = cpsim::cli::register_maxlen(app, maxlen_args);
  cpsim::cli::PlanArgs plan_args;
  CLI::App* plan = cpsim::cli::register_plan(app, plan_args);
  cpsim::cli::ValidateArgs validate_args;
  CLI::App* validate = cpsim::cli::register_validate(app, validate_args);
  cpsim::cli::ReportArgs sweep_args, report_args;
  CLI::App* sweep = cpsim::cli::register_sweep(app, sweep_args);
  CLI::App* report = cpsim::cli::register_report(app, report_args);
  cpsim::cli::CalibrateArgs calibrate_args;
  calibrate_args.argv.assign(argv, argv + argc);
  CLI::App* calibrate = cpsim::cli::register_calibrate(app, calibrate_args);
  CLI::App* models = cpsim::cli::register_models(app, models_args);
  CLI::App* hardware = cpsim::cli::register_hardware(app, hardware_args);

  if (const std::string error = unknown_subcommand_error(app, argc, argv); !error.empty()) {
    std::cerr << "cpsim: error: " << error << "\n";
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "cpsim: error: " << e.what() << "\n";
    return 2;
  }
  try {
    if (simulate->parsed()) {
      return cpsim::cli::run_simulate(sim_args);
    }
    if (maxlen->parsed()) {
      return cpsim::cli::run_maxlen(maxlen_args);
    }
    if (plan->parsed()) {
      return cpsim::cli::run_plan(plan_args);
    }
    if (validate->parsed()) {
      return cpsim::cli::run_validate(validate_args);
    }
    if (sweep->parsed()) {
      return cpsim::cli::run_sweep(sweep_args);
    }
    if (report->parsed()) {
      return cpsim::cli::run_report(report_args);
    }
    if (calibrate->parsed()) {
      return cpsim::cli::run_calibrate(calibrate_args);
    }
    if (models->parsed()) {
      return cpsim::cli::run_models(models_args);
    }
    if (hardware->parsed()) {
      return cpsim::cli::run_hardware(hardware_args);
    }
  } catch (const cpsim::sim::ConfigError& e) {
    std::cerr << "cpsim: error: " << cpsim::cli::refusal_text(e) << "\n";
    return 2;
  } catch (const cpsim::InputError& e) {
    std::cerr << "cpsim: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "cpsim: internal error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
