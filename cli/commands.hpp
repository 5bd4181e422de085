#pragma once
// Subcommands: each registers its flags on a CLI11 subcommand and runs after parsing.

#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cpsim/planner/batches.hpp"
#include "cpsim/planner/search.hpp"
#include "cpsim/sim/schedule.hpp"

#include "config_options.hpp"

namespace cpsim::cli {

/// Exit status of `simulate` and `maxlen` when the answer is "does not fit": the configuration
/// simulated does not fit (GPU, host or kernel limits; with several methods: none fits), or not
/// even the shortest length searched fits. 2 stays bad input, 1 an I/O or internal failure.
inline constexpr int kExitDoesNotFit = 3;

/// "Nothing fits" as an answer rather than bad input (`plan` when no configuration fits): exits
/// kExitDoesNotFit with one line, kind "does_not_fit", naming the flag whose value nothing fits.
class DoesNotFit : public std::runtime_error {
 public:
  DoesNotFit(std::string field, const std::string& message)
      : std::runtime_error(field + ": " + message), field_(std::move(field)) {}
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

CLI::App* register_simulate(CLI::App& app, SimulateArgs& args);
int run_simulate(const SimulateArgs& args);
/// `simulate --lengths`: the step over sampled packed batches (packed_batches.cpp).
void add_batch_options(CLI::App* simulate, SimulateArgs& args);
/// The flags `plan --lengths` shares with it (the plan's --seq is the packed sequence).
void add_plan_batch_options(CLI::App* plan, SimulateArgs& args);
/// The batch options the flags give (--lengths set). @throws InputError naming the flag.
planner::BatchOptions batch_options(const SimulateArgs& args);
/// @throws InputError naming a packed-batch flag given without --lengths.
void check_batch_flags_need_lengths(const SimulateArgs& args);
/// `plan --lengths`: the plan's first max(top, 5) configurations ranked again under packed
/// batches, the ranking's answer for the table and JSON.
struct PlanBatches {
  planner::BatchOptions options;
  std::vector<planner::Candidate> candidates;  ///< the configurations studied, in plan order
  std::vector<planner::BatchRanking> ranking;  ///< best first
};
/// Reorders `ranked` (best first): the studied candidates in the ranking's order ahead of the
/// rest; `why_best` then says what the packed batches found.
PlanBatches rank_plan_by_batches(const SimulateArgs& args,
                                 const sim::ScheduleInputs& base,
                                 int top,
                                 std::vector<planner::Candidate>& ranked,
                                 std::string& why_best,
                                 const std::function<void(int, int)>& progress);
std::string plan_batches_table(const PlanBatches& b);
nlohmann::json plan_batches_json(const PlanBatches& b);
int run_simulate_batches(const SimulateArgs& args);

struct MaxLenArgs {
  SimulateArgs config;
  std::string granularity = "64K";
  std::string launcher;       ///< --launcher: the configuration as that launcher runs it
  std::string max_step_time;  ///< --max-step-time: a duration; empty: no cap
  bool json = false;
};
CLI::App* register_maxlen(CLI::App& app, MaxLenArgs& args);
int run_maxlen(const MaxLenArgs& args);

struct PlanArgs {
  SimulateArgs config;
  std::string seq;  // empty = longest context
  bool max_context = false;
  std::string methods;  // empty: --method if given, else all
  int top = 5;
  std::string granularity = "64K";
  bool fixed_recipe = false;
  bool allow_data_parallel = false;
  std::string dataset;  ///< --dataset: what launchers that name the data get (arctic)
  int threads = 2;
  std::string launcher;  ///< --launcher: search only what it runs, without writing its file
  std::string emit;
  std::string launcher_version;  ///< --launcher-version: the release of --emit/--launcher
  std::string out;
  bool json = false;
  std::string format = "table";  ///< --format: table, json (as --json) or csv
  bool all = false;              ///< --all: every configuration generated (csv, json)
  std::string max_step_time;     ///< --max-step-time: longest-context mode's cap; empty: none
  std::string progress;  ///< --progress: auto | always | never (empty: $CPSIM_PROGRESS, auto)
};
CLI::App* register_plan(CLI::App& app, PlanArgs& args);
int run_plan(const PlanArgs& args);

struct ValidateArgs {
  std::string only;
  bool json = false;
};
CLI::App* register_validate(CLI::App& app, ValidateArgs& args);
int run_validate(const ValidateArgs& args);

/// `cpsim sweep` and `cpsim report`: every method over a range of lengths.
struct ReportArgs {
  SimulateArgs config;
  std::string methods = "all";
  std::string seq;               // one length instead of a sweep
  std::string sweep;             // LO..HI, powers of two between; empty = 128K..8M without --seq
  std::string format = "table";  // sweep: table | csv | json
  std::string html;              // report: the file to write
  std::string detail_method;     // report: method of the memory and timeline charts
  std::string detail_seq;        // report: length of those charts
  std::string progress;          // --progress (empty: $CPSIM_PROGRESS, else auto)
};
CLI::App* register_sweep(CLI::App& app, ReportArgs& args);
int run_sweep(const ReportArgs& args);
CLI::App* register_report(CLI::App& app, ReportArgs& args);
int run_report(const ReportArgs& args);

/// `cpsim calibrate run` and `cpsim calibrate fit` (docs/CALIBRATION.md).
struct CalibrateArgs {
  CLI::App* run_command = nullptr;
  CLI::App* fit_command = nullptr;
  CLI::App* import_command = nullptr;
  std::vector<std::string> argv;  // the whole command line, recorded in the raw file
  // run
  std::string out;
  bool quick = false;
  int gpus = 0;  // 0 = all visible
  std::string max_seq;
  bool resume = false;
  std::string only;  // comma-separated sweeps
  std::string skip;
  double collective_timeout_s = 120.0;
  bool mpi = false;  // one process per GPU under mpirun/srun: the collectives across nodes
  // import nccl-tests
  std::vector<std::string> logs;
  std::string import_out;
  std::string op;  // collective of logs that do not name their program
  // fit
  std::vector<std::string> raws;
  std::string fit_out;
  std::string base = "h100-sxm-80g";
  double max_mape = 0.15;
  bool force = false;
  std::string name;
};
CLI::App* register_calibrate(CLI::App& app, CalibrateArgs& args);
int run_calibrate(const CalibrateArgs& args);

struct CatalogArgs {
  bool json = false;
  std::string name;  // hardware, models, implementations: show one in full
};
CLI::App* register_models(CLI::App& app, CatalogArgs& args);
int run_models(const CatalogArgs& args);
CLI::App* register_hardware(CLI::App& app, CatalogArgs& args);
int run_hardware(const CatalogArgs& args);
CLI::App* register_implementations(CLI::App& app, CatalogArgs& args);
int run_implementations(const CatalogArgs& args);

}  // namespace cpsim::cli
