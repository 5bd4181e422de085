#include "cpsim/calibrate/raw_merge.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"

namespace cpsim::calibrate {
namespace {

template <typename T>
void append(std::vector<T>& to, const std::vector<T>& from) {
  to.insert(to.end(), from.begin(), from.end());
}

/// Notes one line per context field in which `other` contradicts `first`.
void note_conflicts(std::vector<std::string>& conflicts,
                    const NamedRaw& first,
                    const NamedRaw& other) {
  const RawContext& a = first.raw.context;
  const RawContext& b = other.raw.context;
  auto check = [&](const char* field, const std::string& x, const std::string& y) {
    if (x != y && x != "unknown" && y != "unknown") {
      conflicts.push_back(fmt::format("merged files disagree on {}: {} '{}' vs {} '{}'", field,
                                      first.name, x, other.name, y));
    }
  };
  check("device", a.device, b.device);
  check("nccl_version", a.nccl_version, b.nccl_version);
  check("driver_version", a.driver_version, b.driver_version);
  check("method.timer", a.method.timer, b.method.timer);
  if (a.sm_count > 0 && b.sm_count > 0 && a.sm_count != b.sm_count) {
    check("sm_count", std::to_string(a.sm_count), std::to_string(b.sm_count));
  }
}

}  // namespace

MergedRaw merge_raw(const std::vector<NamedRaw>& files) {
  if (files.empty()) {
    throw InputError("RAW", "no raw file given");
  }
  if (files.size() == 1) {
    return MergedRaw{files.front().raw, {}};
  }
  std::vector<std::string> conflicts;
  RawCalibration merged;
  merged.context = files.front().raw.context;
  merged.context.notes.clear();
  merged.context.gpu_count = 0;
  merged.context.device_count = 0;
  int all_ranks = 0;
  for (const NamedRaw& file : files) {
    const RawContext& c = file.raw.context;
    if (c.method.timer != "nccl-tests" && c.mpi.ranks == 0) {
      // nccl-tests logs and MPI runs count ranks over all nodes, not the GPUs of one node.
      merged.context.gpu_count = std::max(merged.context.gpu_count, c.gpu_count);
      merged.context.device_count = std::max(merged.context.device_count, c.device_count);
    }
    all_ranks = std::max(all_ranks, c.gpu_count);
    for (const std::string& note : c.notes) {
      merged.context.notes.push_back(fmt::format("{}: {}", file.name, note));
    }
    if (&file != &files.front()) {
      note_conflicts(conflicts, files.front(), file);
    }
    const RawSamples& s = file.raw.samples;
    RawSamples& m = merged.samples;
    append(m.gemm, s.gemm);
    append(m.attention, s.attention);
    append(m.memory, s.memory);
    append(m.collectives, s.collectives);
    append(m.host_copies, s.host_copies);
    append(m.interference, s.interference);
    append(m.launch, s.launch);
  }
  if (merged.context.gpu_count == 0) {
    merged.context.gpu_count = all_ranks;
  }
  merged.context.device_count = std::max(merged.context.device_count, merged.context.gpu_count);
  merged.context.notes.insert(merged.context.notes.end(), conflicts.begin(), conflicts.end());
  return MergedRaw{std::move(merged), std::move(conflicts)};
}

}  // namespace cpsim::calibrate
