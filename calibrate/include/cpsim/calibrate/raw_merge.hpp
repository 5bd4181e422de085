#pragma once
/// @file Merging several raw calibration files (e.g. `calibrate run` output and imported
/// nccl-tests logs) into one, for `cpsim calibrate fit RAW...`.

#include <string>
#include <utility>
#include <vector>

#include "cpsim/calibrate/raw.hpp"

namespace cpsim::calibrate {

/// A raw file and the name it is reported under (its path).
struct NamedRaw {
  std::string name;
  RawCalibration raw;
};

struct MergedRaw {
  RawCalibration raw;
  std::vector<std::string> conflicts;  ///< also in raw.context.notes
};

/// All samples of all files, in file order. The context is the first file's, with gpu_count and
/// device_count the largest of the files not imported from nccl-tests (whose rank counts span
/// nodes; the largest of those when all are), and a note per context field (device, NCCL version,
/// driver, SM count, timer) that another file contradicts, naming both files; every file's own
/// notes are kept, prefixed with its name. One file is returned unchanged.
/// @throws InputError (field "RAW") when `files` is empty.
MergedRaw merge_raw(const std::vector<NamedRaw>& files);

}  // namespace cpsim::calibrate
