#pragma once
/// @file The measurement backend of `cpsim calibrate run`: microbenchmarks on the local GPUs
/// (attention, GEMM, memory bandwidth, NCCL collectives, host copies, interference, launch
/// overhead) written as raw calibration data. The CUDA implementation lives in calibrate/cuda/ and
/// is built only when a CUDA compiler is found; otherwise make_measure_backend() returns a backend
/// that refuses to run. docs/CALIBRATION.md describes the method.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpsim/calibrate/raw.hpp"
#include "cpsim/models/transformer.hpp"

namespace cpsim::calibrate {

/// A GEMM weight shape of a built-in model: n output features, k input features.
struct GemmWidth {
  std::int64_t n = 0;
  std::int64_t k = 0;
  std::string origin;  ///< e.g. "llama3-8b qkv"
};

/// The distinct (n, k) weight shapes of the given models' layers: fused qkv, attention output,
/// fused gate+up, down projection. Sorted by (n, k), each once (origins joined).
std::vector<GemmWidth> model_gemm_widths(const std::vector<models::TransformerSpec>& models);

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

class MeasureBackend {
 public:
  virtual ~MeasureBackend() = default;
  MeasureBackend() = default;
  MeasureBackend(const MeasureBackend&) = delete;
  MeasureBackend& operator=(const MeasureBackend&) = delete;

  /// "cuda" or "none".
  virtual std::string name() const = 0;
  /// Why run() cannot start on this machine ("no CUDA device ...", "built without CUDA ..."), or
  /// nothing when it can. Cheap; touches no GPU memory.
  virtual std::optional<std::string> unavailable_reason() const = 0;
  /// Runs every sweep. @throws InputError (field "calibrate") when unavailable or for bad options;
  /// MeasureError when a CUDA/NCCL/cuBLAS call fails.
  virtual RawCalibration run(const MeasureOptions& options, const ProgressFn& progress) = 0;
};

/// The CUDA backend when this cpsim was built with CUDA, else one whose run() throws
/// InputError("calibrate", "this cpsim was built without CUDA ...").
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
