// `cpsim calibrate run` sweep by sweep (run.hpp): selection, --resume, writing after every sweep,
// a failing sweep as a note, pre-run check warnings. docs/CALIBRATION.md "Robust runs".
#include "cpsim/calibrate/run.hpp"

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cpsim/calibrate/utc_time.hpp"
#include "cpsim/models/error.hpp"

namespace cpsim::calibrate {
namespace {

std::string known_sweeps() {
  std::string out;
  for (const std::string_view name : kSweepNames) {
    out += fmt::format("{}{}", out.empty() ? "" : ", ", name);
  }
  return out;
}

bool contains(const std::vector<std::string>& list, std::string_view name) {
  return std::find(list.begin(), list.end(), name) != list.end();
}

/// The samples array a sweep owns, moved from `from` into `to` (replacing what `to` held).
void take_samples(std::string_view sweep, RawSamples& to, RawSamples&& from) {
  if (sweep == "launch") {
    to.launch = std::move(from.launch);
  } else if (sweep == "memory") {
    to.memory = std::move(from.memory);
  } else if (sweep == "gemm") {
    to.gemm = std::move(from.gemm);
  } else if (sweep == "attention") {
    to.attention = std::move(from.attention);
  } else if (sweep == "collectives") {
    to.collectives = std::move(from.collectives);
  } else if (sweep == "host_copies") {
    to.host_copies = std::move(from.host_copies);
  } else if (sweep == "interference") {
    to.interference = std::move(from.interference);
  }
}

/// A --resume file must come from the same node, software and sweep options.
void check_same_run(const RawContext& was, const RawContext& now, const std::string& path) {
  const std::vector<std::tuple<const char*, std::string, std::string>> fields = {
      {"device", was.device, now.device},
      {"gpu_count", std::to_string(was.gpu_count), std::to_string(now.gpu_count)},
      {"sm_count", std::to_string(was.sm_count), std::to_string(now.sm_count)},
      {"driver_version", was.driver_version, now.driver_version},
      {"cuda_runtime_version", was.cuda_runtime_version, now.cuda_runtime_version},
      {"nccl_version", was.nccl_version, now.nccl_version},
      {"cublaslt_version", was.cublaslt_version, now.cublaslt_version},
      {"cpsim_version", was.cpsim_version, now.cpsim_version},
      {"quick", was.quick ? "true" : "false", now.quick ? "true" : "false"},
  };
  for (const auto& [key, a, b] : fields) {
    if (a != b) {
      throw InputError("--resume",
                       fmt::format("{} was measured with context.{} {}, this run has {}: resume "
                                   "only the same node and cpsim (write another --out, or run "
                                   "without --resume)",
                                   path, key, a, b));
    }
  }
}

/// The sweeps --only/--skip leave, in run order. @throws InputError naming the flag.
std::vector<std::string> selected_sweeps(const RunRequest& request) {
  for (const auto& [flag, list] : {std::pair{"--only", &request.only}, {"--skip", &request.skip}}) {
    for (const std::string& name : *list) {
      (void)parse_sweep_list(name, flag);
    }
  }
  std::vector<std::string> out;
  for (const std::string_view name : kSweepNames) {
    if ((request.only.empty() || contains(request.only, name)) && !contains(request.skip, name)) {
      out.emplace_back(name);
    }
  }
  return out;
}

/// Counts finished steps over the whole run and reports them.
class RunProgress {
 public:
  RunProgress(const ProgressFn& fn, std::size_t total) : fn_(fn), total_(total) {}
  void step(const std::string& label, bool finished) {
    if (finished) {
      done_ = std::min(total_, done_ + 1);
    }
    if (fn_) {
      fn_(done_, total_, label);
    }
  }
  /// A sweep ended (possibly early): the steps it planned count as done.
  void sweep_ended(std::size_t done_after) { done_ = std::min(total_, done_after); }
  void finish() {
    if (fn_) {
      fn_(total_, total_, "done");
    }
  }

 private:
  const ProgressFn& fn_;
  std::size_t total_;
  std::size_t done_ = 0;
};

/// The raw file as it stands: run-level notes, then each sweep's notes prefixed with its name.
RawCalibration assemble(const RawContext& context,
                        const std::vector<std::string>& run_notes,
                        const std::map<std::string, SweepRecord>& records,
                        const RawSamples& samples) {
  RawCalibration raw;
  raw.context = context;
  raw.context.notes = run_notes;
  raw.context.sweeps.clear();
  for (const std::string_view name : kSweepNames) {
    const auto it = records.find(std::string(name));
    if (it == records.end()) {
      continue;
    }
    raw.context.sweeps.push_back(it->second);
    for (const std::string& note : it->second.notes) {
      raw.context.notes.push_back(fmt::format("{}: {}", name, note));
    }
  }
  raw.samples = samples;
  return raw;
}

/// One sweep; a MeasureError becomes the record's failure. `nccl_usable` turns false when the
/// collectives lost a group.
SweepRecord run_one(MeasureBackend& backend,
                    const std::string& name,
                    const RunRequest& request,
                    const WaitClock& clock,
                    RunProgress& progress,
                    bool& nccl_usable,
                    RawSamples& samples) {
  SweepRecord record{name, "done", "unknown", {}};
  const auto step = [&progress](const std::string& label, bool finished) {
    progress.step(label, finished);
  };
  try {
    if (name == "collectives") {
      CollectivePlan plan = backend.collective_plan();
      plan.timeout_s = request.collective_timeout_s;
      if (plan.groups.empty()) {
        record.notes.emplace_back(
            "skipped: only one GPU was measured (NCCL needs at least two); the fitted profile "
            "keeps the base profile's collectives");
      } else {
        const std::unique_ptr<CollectiveRig> rig = backend.collective_rig();
        CollectiveSweepResult result =
            run_collective_sweep(*rig, plan, backend.timing_plan(), clock, step);
        samples.collectives = std::move(result.samples);
        record.notes = std::move(result.notes);
        if (result.nccl_unusable) {
          record.status = result.timed_out ? "timed_out" : "failed";
          nccl_usable = false;
        }
      }
    } else {
      const SweepControl control{nccl_usable, request.collective_timeout_s, step};
      SweepOutput output = backend.run_sweep(name, control);
      take_samples(name, samples, std::move(output.samples));
      record.notes = std::move(output.notes);
    }
  } catch (const MeasureError& e) {
    record.status = "failed";
    record.notes.push_back(fmt::format("failed, its samples were dropped: {}", e.what()));
    take_samples(name, samples, RawSamples{});
  }
  record.date = utc_now();
  return record;
}

}  // namespace

std::vector<std::string> parse_sweep_list(const std::string& text, const std::string& flag) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string name = text.substr(start, comma - start);
    if (std::find(kSweepNames.begin(), kSweepNames.end(), name) == kSweepNames.end()) {
      throw InputError(flag, fmt::format("unknown sweep '{}'; known: {}", name, known_sweeps()));
    }
    if (!contains(out, name)) {
      out.push_back(name);
    }
    start = comma + 1;
  }
  return out;
}

std::vector<std::string> check_warnings(const RawContext& context) {
  // Policy thresholds, not measurements: memory in use above 2 GiB before cpsim allocates
  // anything, a clock more than 10 % under its maximum.
  constexpr std::int64_t kBusyMemory_bytes = std::int64_t{2} << 30;
  constexpr double kClockFraction = 0.9;
  std::vector<std::string> out;
  for (const GpuCheck& g : context.checks) {
    if (g.other_processes > 0) {
      out.push_back(fmt::format(
          "GPU {}: {} other compute process(es) use it ({}): every time measured on it may be "
          "too slow; stop them and measure again",
          g.gpu, g.other_processes, g.source));
    }
    if (g.memory_used_bytes > kBusyMemory_bytes) {
      out.push_back(fmt::format("GPU {}: {:.1f} GiB of {:.1f} GiB in use before measuring ({})",
                                g.gpu, static_cast<double>(g.memory_used_bytes) / (1 << 30),
                                static_cast<double>(g.memory_total_bytes) / (1 << 30), g.source));
    }
    std::string slowing;
    for (const std::string& reason : g.throttle_reasons) {
      if (reason != "gpu_idle") {
        slowing += fmt::format("{}{}", slowing.empty() ? "" : ", ", reason);
      }
    }
    if (!slowing.empty()) {
      out.push_back(fmt::format("GPU {}: clocks held down by {} (SM clock {:.0f} of {:.0f} MHz)",
                                g.gpu, slowing, g.sm_clock_mhz, g.sm_clock_max_mhz));
    }
  }
  if (context.sm_clock_measured_mhz > 0.0 && context.sm_clock_max_mhz > 0.0 &&
      context.sm_clock_measured_mhz < kClockFraction * context.sm_clock_max_mhz) {
    out.push_back(fmt::format(
        "the SM clock measured under load is {:.0f} MHz, under 90 % of the maximum {:.0f} MHz: "
        "clocks locked low, power capping or throttling slow every kernel",
        context.sm_clock_measured_mhz, context.sm_clock_max_mhz));
  }
  return out;
}

RunSummary run_calibration(MeasureBackend& backend,
                           const RunRequest& request,
                           const ProgressFn& progress,
                           const RawWriter& write,
                           const WaitClock& clock) {
  const std::vector<std::string> selected = selected_sweeps(request);
  RawCalibration prior;
  const bool resuming = request.resume && std::filesystem::exists(request.out);
  if (resuming) {
    prior = load_raw(request.out, "--resume");
    if (prior.context.sweeps.empty()) {
      throw InputError("--resume", fmt::format("{} has no record of its sweeps (context.sweeps): "
                                               "it was not written by `calibrate run` of this "
                                               "version; write another --out or drop --resume",
                                               request.out.string()));
    }
  }
  const RawContext context = backend.open(request.options);
  if (resuming) {
    check_same_run(prior.context, context, request.out.string());
  }

  RunSummary summary;
  summary.warnings = check_warnings(context);
  std::vector<std::string> run_notes = context.notes;
  run_notes.insert(run_notes.end(), summary.warnings.begin(), summary.warnings.end());
  std::map<std::string, SweepRecord> records;
  RawSamples samples;
  for (SweepRecord& r : prior.context.sweeps) {
    if (r.status == "done") {
      take_samples(r.name, samples, RawSamples(prior.samples));
      summary.kept.push_back(r.name);
      records[r.name] = std::move(r);
    }
  }
  std::vector<std::string> to_run;
  std::size_t total = 0;
  for (const std::string& name : selected) {
    if (!contains(summary.kept, name)) {
      to_run.push_back(name);
      total += backend.plan(name);
    }
  }
  const auto save = [&] {
    summary.raw = assemble(context, run_notes, records, samples);
    write(write_raw(summary.raw));
  };
  save();  // the context and checks, before the first sweep

  RunProgress bar(progress, total);
  bool nccl_usable = true;
  std::size_t planned = 0;
  for (const std::string_view view : kSweepNames) {
    const std::string name(view);
    if (contains(summary.kept, name)) {
      continue;
    }
    if (!contains(to_run, name)) {
      records[name] = SweepRecord{name, "skipped", "unknown", {"not selected (--only/--skip)"}};
      continue;
    }
    SweepRecord record = run_one(backend, name, request, clock, bar, nccl_usable, samples);
    planned += backend.plan(name);
    bar.sweep_ended(planned);
    (record.status == "done" ? summary.ran : summary.failed).push_back(name);
    records[name] = std::move(record);
    save();
  }
  save();  // the sweeps skipped after the last one that ran
  bar.finish();
  return summary;
}

}  // namespace cpsim::calibrate
