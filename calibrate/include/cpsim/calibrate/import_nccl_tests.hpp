#pragma once
/// @file Reads the text output of NVIDIA nccl-tests (all_reduce_perf, all_gather_perf,
/// reduce_scatter_perf, alltoall_perf, sendrecv_perf; single- or multi-node, with or without the
/// `_mpi` suffix) into raw calibration samples (docs/CALIBRATION.md "Importing nccl-tests logs").

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cpsim/calibrate/raw.hpp"
#include "cpsim/models/hardware.hpp"

namespace cpsim::calibrate {

/// One nccl-tests run (one results table) read from a log.
struct NcclTestsRun {
  std::string source;   ///< the log's path as given
  std::string program;  ///< e.g. "all_reduce_perf"; empty when the log does not name it
  models::Collective op = models::Collective::kAllReduce;
  int ranks = 0;                ///< distinct "Rank N" lines
  int nodes = 0;                ///< distinct host names on those lines
  std::string device;           ///< GPU name of the rank lines ("A + B" when they differ)
  std::string nccl_version;     ///< "2.26.2", "unknown" when the log does not say
  int warmup_iters = 0;         ///< from the "# nThread ..." header, 0 when absent
  int iters = 0;                ///< timed iterations per size (time is their mean), 0 when absent
  double avg_busbw_gb_s = 0.0;  ///< "# Avg bus bandwidth" as printed (GB/s), 0 when absent
  /// Out-of-place and in-place sample of every row, in row order (in_place false, then true).
  std::vector<CollectiveSample> samples;
  std::size_t skipped_rows = 0;  ///< rows of size 0 (too few elements per rank), not imported
};

/// The collective an nccl-tests program measures ("alltoall_perf", "all_gather_perf_mpi", ...);
/// nullopt for programs cpsim has no model of (broadcast_perf, reduce_perf, ...) and other text.
std::optional<models::Collective> collective_of_nccl_tests_program(std::string_view program);

/// Parses one log. `op` is used when the log does not name its program (the command line or
/// "# Collective test starting:" line); when it does, the two must agree.
/// @throws InputError whose field is "<origin>:<line>" for a malformed row or header, "<origin>"
///         when the log has no results table or no rank lines, and "--op" when the collective
///         cannot be told or disagrees with the log.
NcclTestsRun parse_nccl_tests_log(const std::string& text,
                                  const std::string& origin,
                                  std::optional<models::Collective> op);

/// Reads and parses a log file; the origin in errors is the path as given.
/// @throws InputError as parse_nccl_tests_log, or (field: the path) when it cannot be read.
NcclTestsRun load_nccl_tests_log(const std::filesystem::path& path,
                                 std::optional<models::Collective> op);

/// A raw calibration holding the runs' collective samples. The context records each source log,
/// program, rank and node count and NCCL version in `notes`, the device and NCCL version (joined
/// when they differ) and `argv`; the method is "nccl-tests" / "mean".
RawCalibration raw_from_nccl_tests(const std::vector<NcclTestsRun>& runs,
                                   const std::vector<std::string>& argv,
                                   const std::string& cpsim_version);

}  // namespace cpsim::calibrate
