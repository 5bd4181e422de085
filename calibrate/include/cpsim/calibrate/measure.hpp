#pragma once
/// @file The measurement backend of `cpsim calibrate run`: microbenchmarks on the local GPUs
/// (attention, GEMM, memory bandwidth, NCCL collectives, host copies, interference, launch
/// overhead) written as raw calibration data. The CUDA implementation lives in calibrate/cuda/ and
/// is built only when a CUDA compiler is found; otherwise make_measure_backend() returns a backend
/// that refuses to run. docs/CALIBRATION.md describes the method.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cpsim/calibrate/raw.hpp"
#include "cpsim/calibrate/run_control.hpp"
#include "cpsim/models/error.hpp"
#include "cpsim/models/transformer.hpp"

namespace cpsim::calibrate {

class RankRig;  // mpi_run.hpp

/// A GEMM weight shape of a built-in model: n output features, k input features.
struct GemmWidth {
  std::int64_t n = 0;
  std::int64_t k = 0;
  std::string origin;  ///< e.g. "llama3-8b qkv"
};

/// The distinct (n, k) weight shapes of the given models' layers: fused qkv, attention output,
/// fused gate+up, down projection. Sorted by (n, k), each once (origins joined).
std::vector<GemmWidth> model_gemm_widths(const std::vector<models::TransformerSpec>& models);

/// The driver release ("580.159.04") in the first line of /proc/driver/nvidia/version, or
/// "unknown": the first word after "Kernel Module" that starts with a digit and holds a dot. The
/// open kernel module's line has a word between them ("... Open Kernel Module for x86_64
/// 580.159.04 Release Build ..."), the proprietary one's not ("... x86_64 Kernel Module
/// 570.86.15 Tue ...").
inline std::string driver_release_from_version_line(std::string_view line) {
  const std::size_t at = line.find("Kernel Module");
  std::string_view rest = at == std::string_view::npos ? line : line.substr(at + 13);
  while (!rest.empty()) {
    const std::size_t begin = rest.find_first_not_of(" \t");
    if (begin == std::string_view::npos) {
      break;
    }
    rest.remove_prefix(begin);
    const std::size_t end = std::min(rest.find_first_of(" \t"), rest.size());
    const std::string_view word = rest.substr(0, end);
    if (word.front() >= '0' && word.front() <= '9' && word.find('.') != std::string_view::npos) {
      return std::string(word);
    }
    rest.remove_prefix(end);
  }
  return "unknown";
}

struct MeasureOptions {
  bool quick = false;                  ///< fewer points per sweep (minutes, not tens of minutes)
  int gpus = 0;                        ///< GPUs to use, 0 = all visible
  std::int64_t max_seq = 0;            ///< longest attention length to try, 0 = up to what fits
  std::vector<GemmWidth> gemm_widths;  ///< (n, k) shapes of the GEMM sweep
  std::vector<std::string> argv;       ///< recorded in the raw file
  std::string cpsim_version;           ///< recorded in the raw file
};

/// Progress of a run: `done` of `total` steps finished, `label` the step now running.
using ProgressFn = std::function<void(std::size_t done, std::size_t total, const std::string&)>;

/// A failing CUDA, NCCL or cuBLAS call during a run: the message names the call, the file and
/// line, and the library's error name.
class MeasureError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// What a sweep may use, decided by the run (run.hpp).
struct SweepControl {
  bool nccl_usable = true;              ///< false after a collective timed out or failed
  double collective_timeout_s = 120.0;  ///< deadline of every wait on NCCL work
  /// A progress step starts (finished = false) or ends (true).
  std::function<void(const std::string& label, bool finished)> step;
};

/// The samples and notes of one sweep.
struct SweepOutput {
  RawSamples samples;
  std::vector<std::string> notes;
};

/// The measuring side of `calibrate run`: the CUDA module, a backend that refuses (no CUDA), or
/// the tests' fake. run_calibration (run.hpp) drives it sweep by sweep.
class MeasureBackend {
 public:
  virtual ~MeasureBackend() = default;
  MeasureBackend() = default;
  MeasureBackend(const MeasureBackend&) = delete;
  MeasureBackend& operator=(const MeasureBackend&) = delete;

  /// "cuda" or "none".
  virtual std::string name() const = 0;
  /// Why a run cannot start on this machine ("no CUDA device ...", "built without CUDA ..."), or
  /// nothing when it can. Cheap; touches no GPU memory.
  virtual std::optional<std::string> unavailable_reason() const = 0;
  /// Starts a run: picks the GPUs, reads the context (versions, clocks) and the pre-run checks
  /// (context.checks), nothing measured yet. @throws InputError (field "calibrate" or "--gpus")
  /// when unavailable or for bad options; MeasureError when a CUDA call fails.
  virtual RawContext open(const MeasureOptions& options) = 0;
  /// Progress steps of `sweep` (one of kSweepNames), after open().
  virtual std::size_t plan(std::string_view sweep) const = 0;
  /// Runs `sweep` (any but "collectives"), after open(). @throws MeasureError.
  virtual SweepOutput run_sweep(std::string_view sweep, const SweepControl& control) = 0;
  /// What the collective sweep measures (groups empty with one GPU) and its timing rules.
  virtual CollectivePlan collective_plan() const = 0;
  virtual TimingPlan timing_plan() const = 0;
  /// The rig the collective sweep drives.
  virtual std::unique_ptr<CollectiveRig> collective_rig() = 0;
  /// MPI mode (one process per GPU, `calibrate run --mpi`): reads the context and pre-run checks
  /// of this rank's GPU only — device `local_rank`, or 0 when the launcher left one visible — and
  /// nothing else; collective_plan() (ops and sizes) and timing_plan() are valid after it.
  /// @throws InputError when unavailable; MeasureError when a CUDA call fails.
  virtual RawContext open_rank(const MeasureOptions& options, int local_rank) = 0;
  /// This rank's NCCL side (mpi_run.hpp), after open_rank().
  virtual std::unique_ptr<RankRig> rank_rig() = 0;
};

/// A backend that cannot measure (no CUDA in this build, or the module does not load): every
/// call that would measure throws InputError("calibrate", why).
class RefusingBackend : public MeasureBackend {
 public:
  RefusingBackend(std::string name, std::string why)
      : name_(std::move(name)), why_(std::move(why)) {}
  std::string name() const override { return name_; }
  std::optional<std::string> unavailable_reason() const override { return why_; }
  RawContext open(const MeasureOptions& /*options*/) override { refuse(); }
  std::size_t plan(std::string_view /*sweep*/) const override { refuse(); }
  SweepOutput run_sweep(std::string_view /*sweep*/, const SweepControl& /*control*/) override {
    refuse();
  }
  CollectivePlan collective_plan() const override { refuse(); }
  TimingPlan timing_plan() const override { refuse(); }
  std::unique_ptr<CollectiveRig> collective_rig() override { refuse(); }
  RawContext open_rank(const MeasureOptions& /*options*/, int /*local_rank*/) override { refuse(); }
  std::unique_ptr<RankRig> rank_rig() override { refuse(); }

 private:
  [[noreturn]] void refuse() const { throw InputError("calibrate", why_); }
  std::string name_;
  std::string why_;
};

/// The CUDA backend when this cpsim was built with CUDA and its module loads, else a
/// RefusingBackend that says why ("this cpsim was built without CUDA ...").
std::unique_ptr<MeasureBackend> make_measure_backend();

/// A text progress bar on a stream (stderr): redrawn in place on a terminal, one line per 10 %
/// otherwise.
class ProgressBar {
 public:
  explicit ProgressBar(bool terminal);
  void operator()(std::size_t done, std::size_t total, const std::string& label);
  void finish();

 private:
  bool terminal_;
  int last_decile_ = -1;
  std::size_t last_width_ = 0;
};

}  // namespace cpsim::calibrate
