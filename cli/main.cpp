// cpsim: simulator and memory/throughput planner for context-parallel long-context training.
// Exit status: 0 success, 2 bad input (one line on stderr naming the flag or field), 1 internal
// error.
#include <exception>
#include <iostream>

#include <CLI/CLI.hpp>

#include "cpsim/models/error.hpp"

#include "commands.hpp"
#include "config_flags.hpp"

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
