#pragma once
/// @file `cpsim calibrate run` sweep by sweep: each finished sweep is written at once (temporary
/// file + rename), a failing sweep becomes a note and the run goes on, --resume keeps the sweeps
/// an earlier run of the same node finished, --only/--skip choose sweeps, and the pre-run checks
/// (busy GPU, clocks, throttling) are reported. docs/CALIBRATION.md "Robust runs".

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "cpsim/calibrate/measure.hpp"
#include "cpsim/calibrate/raw.hpp"
#include "cpsim/calibrate/run_control.hpp"

namespace cpsim::calibrate {

struct RunRequest {
  MeasureOptions options;
  std::filesystem::path out;            ///< raw file (read back by --resume)
  bool resume = false;                  ///< keep the sweeps `out` already holds as done
  std::vector<std::string> only;        ///< sweeps to run (empty: all)
  std::vector<std::string> skip;        ///< sweeps not to run
  double collective_timeout_s = 120.0;  ///< deadline of one wait on NCCL work
};

struct RunSummary {
  RawCalibration raw;                 ///< as last written
  std::vector<std::string> ran;       ///< sweeps measured now and done
  std::vector<std::string> kept;      ///< sweeps kept from the file (--resume)
  std::vector<std::string> failed;    ///< sweeps that failed or timed out
  std::vector<std::string> warnings;  ///< pre-run check warnings (also in the notes)
};

/// Sweep names from a comma-separated list; @throws InputError(flag) naming an unknown sweep and
/// the known ones.
std::vector<std::string> parse_sweep_list(const std::string& text, const std::string& flag);

/// Warnings from the pre-run checks: other processes or memory in use, SM clock below 90 % of its
/// maximum (current reading or the clock64 measurement), a throttle reason that slows a busy GPU.
std::vector<std::string> check_warnings(const RawContext& context);

/// Writes the raw file's text; the CLI's writer stages it in a temporary file and renames it, so
/// the file is never half-written.
using RawWriter = std::function<void(const std::string& text)>;

/// Runs the sweeps on `backend` in kSweepNames order, handing the raw file to `write` once the
/// context is read and again after every sweep.
/// @throws InputError for bad flags or a --resume file of another node or run (exit 2);
/// MeasureError only from open() (nothing is measured then).
RunSummary run_calibration(MeasureBackend& backend,
                           const RunRequest& request,
                           const ProgressFn& progress,
                           const RawWriter& write,
                           const WaitClock& clock = steady_wait_clock());

}  // namespace cpsim::calibrate
