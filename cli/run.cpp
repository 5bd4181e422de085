// The command line as a function (cpsim/cli/run.hpp): subcommand registration, parsing, and each
// kind of failure mapped to its exit status.
#include "cpsim/cli/run.hpp"

#include <algorithm>
#include <cctype>
#include <exception>
#include <iostream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cpsim/models/error.hpp"

#include "commands.hpp"
#include "config_flags.hpp"
#include "output.hpp"

namespace cpsim::cli {

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

/// The first `--flag` a CLI11 message names ("--gpus: ...", "Could not convert: --gpus = x"); empty
/// when it names none.
std::string field_of_parse_error(const std::string& message) {
  for (std::size_t at = message.find("--"); at != std::string::npos;
       at = message.find("--", at + 2)) {
    if (at > 0 && message[at - 1] != ' ') {
      continue;
    }
    std::size_t end = at + 2;
    while (end < message.size() &&
           (std::isalnum(static_cast<unsigned char>(message[end])) != 0 || message[end] == '-')) {
      ++end;
    }
    if (end > at + 2) {
      return message.substr(at, end - at);
    }
  }
  return "";
}

// Every subcommand's arguments and its parser (registered once, in place: the parsers hold
// references to the arguments).
struct Subcommands {
  SimulateArgs simulate_args;
  MaxLenArgs maxlen_args;
  PlanArgs plan_args;
  ValidateArgs validate_args;
  ReportArgs sweep_args, report_args;
  CalibrateArgs calibrate_args;
  CatalogArgs models_args, hardware_args, implementations_args;
  CLI::App* simulate = nullptr;
  CLI::App* maxlen = nullptr;
  CLI::App* plan = nullptr;
  CLI::App* validate = nullptr;
  CLI::App* sweep = nullptr;
  CLI::App* report = nullptr;
  CLI::App* calibrate = nullptr;
  CLI::App* models = nullptr;
  CLI::App* hardware = nullptr;
  CLI::App* implementations = nullptr;
};

void describe_app(CLI::App& app) {
  app.set_version_flag("--version", std::string("cpsim ") + CPSIM_VERSION);
  app.require_subcommand(1);
  app.footer(
      "Lengths accept 131072, 128K, 3M (K = 1024, M = 1024^2).\n"
      "Built-in data is read from $CPSIM_DATA_DIR, else the source tree's data/ (the Python "
      "package: its installed copy).\n"
      "Output files: `-` is standard output; a file is replaced only once it is completely "
      "written.\n"
      "Exit status: 0 done; 1 an output could not be written or an internal error; 2 bad input "
      "(one line naming the flag or field); 3 does not fit (`simulate`: the configuration, or with "
      "several methods every one of them; `maxlen`: not even the shortest length, for any method "
      "asked), with the full answer printed as usual; `plan`: no configuration, one line naming "
      "the closest); `validate` exits 1 when a case misses.\n"
      "Run `cpsim SUBCOMMAND --help` for the flags of each subcommand.");
}

void register_subcommands(CLI::App& app, Subcommands& s, int argc, char** argv) {
  s.simulate = register_simulate(app, s.simulate_args);
  s.maxlen = register_maxlen(app, s.maxlen_args);
  s.plan = register_plan(app, s.plan_args);
  s.validate = register_validate(app, s.validate_args);
  s.sweep = register_sweep(app, s.sweep_args);
  s.report = register_report(app, s.report_args);
  s.calibrate_args.argv.assign(argv, argv + argc);
  s.calibrate = register_calibrate(app, s.calibrate_args);
  s.models = register_models(app, s.models_args);
  s.hardware = register_hardware(app, s.hardware_args);
  s.implementations = register_implementations(app, s.implementations_args);
}

// Runs the subcommand that was parsed.
int run_parsed(const Subcommands& s) {
  if (s.simulate->parsed()) {
    return run_simulate(s.simulate_args);
  }
  if (s.maxlen->parsed()) {
    return run_maxlen(s.maxlen_args);
  }
  if (s.plan->parsed()) {
    return run_plan(s.plan_args);
  }
  if (s.validate->parsed()) {
    return run_validate(s.validate_args);
  }
  if (s.sweep->parsed()) {
    return run_sweep(s.sweep_args);
  }
  if (s.report->parsed()) {
    return run_report(s.report_args);
  }
  if (s.calibrate->parsed()) {
    return run_calibrate(s.calibrate_args);
  }
  if (s.models->parsed()) {
    return run_models(s.models_args);
  }
  if (s.hardware->parsed()) {
    return run_hardware(s.hardware_args);
  }
  if (s.implementations->parsed()) {
    return run_implementations(s.implementations_args);
  }
  return 0;
}

// run_parsed, with each kind of failure mapped to its exit status and `failure`.
int run_reporting_failure(const Subcommands& s, std::optional<Failure>& failure) {
  try {
    return run_parsed(s);
  } catch (const DoesNotFit& e) {
    failure = Failure{kExitDoesNotFit, "does_not_fit", e.field(), "", e.what(), 0};
    return kExitDoesNotFit;
  } catch (const cpsim::sim::ConfigError& e) {
    const cpsim::InputError refused = flag_error(e);
    failure = Failure{2, "input", refused.field(), "", refused.what(), 0};
    return 2;
  } catch (const cpsim::InputError& e) {
    failure = Failure{2, "input", e.field(), "", e.what(), 0};
    return 2;
  } catch (const OutputError& e) {
    failure = Failure{1, "io", e.field(), e.path(), e.what(), e.error_number()};
    return 1;
  } catch (const std::exception& e) {
    failure = Failure{1, "internal", "", "", e.what(), 0};
    return 1;
  }
}

/// Registers every subcommand, parses and runs the chosen one. Fills `failure` and returns its exit
/// status when the run fails with an exception.
int run_cpsim(int argc, char** argv, std::optional<Failure>& failure) {
  CLI::App app{
      "cpsim — simulate context-parallel training (Ulysses, UPipe, Ring, all-gather, FPDT, USP):\n"
      "step time, throughput, peak memory, the longest context, and launcher settings.",
      "cpsim"};
  describe_app(app);
  Subcommands s;
  register_subcommands(app, s, argc, argv);
  if (const std::string error = unknown_subcommand_error(app, argc, argv); !error.empty()) {
    failure = Failure{2, "input", "", "", error, 0};
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
    failure = Failure{2, "input", field_of_parse_error(e.what()), "", e.what(), 0};
    return 2;
  }
  return run_reporting_failure(s, failure);
}

}  // namespace

RunOutcome run_command_line(const std::vector<std::string>& args) {
  std::vector<std::string> storage;
  storage.reserve(args.size() + 1);
  storage.emplace_back("cpsim");
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  argv.reserve(storage.size() + 1);
  for (std::string& arg : storage) {
    argv.push_back(arg.data());
  }
  argv.push_back(nullptr);
  RunOutcome outcome;
  outcome.exit_status = run_cpsim(static_cast<int>(storage.size()), argv.data(), outcome.failure);
  return outcome;
}

CapturedRun run_captured(const std::vector<std::string>& args) {
  // std::cout is one stream per process: one captured run at a time.
  static std::mutex cout_in_use;
  const std::lock_guard<std::mutex> lock(cout_in_use);
  std::ostringstream buffer;
  std::streambuf* const previous = std::cout.rdbuf(buffer.rdbuf());
  CapturedRun run;
  try {
    run.outcome = run_command_line(args);
  } catch (...) {
    std::cout.rdbuf(previous);
    throw;
  }
  std::cout.flush();
  std::cout.rdbuf(previous);
  run.output = std::move(buffer).str();
  return run;
}

}  // namespace cpsim::cli
