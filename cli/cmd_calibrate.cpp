// `cpsim calibrate run` (microbenchmarks on this node -> raw JSON), `cpsim calibrate import
// nccl-tests` (nccl-tests logs -> raw JSON) and `cpsim calibrate fit` (raw JSON files -> hardware
// profile). docs/CALIBRATION.md describes them.
#include <algorithm>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <unistd.h>

#include <fmt/format.h>

#include "cpsim/calibrate/import_nccl_tests.hpp"
#include "cpsim/calibrate/measure.hpp"
#include "cpsim/calibrate/mpi_run.hpp"
#include "cpsim/calibrate/profile_fit.hpp"
#include "cpsim/calibrate/profile_io.hpp"
#include "cpsim/calibrate/raw.hpp"
#include "cpsim/calibrate/raw_merge.hpp"
#include "cpsim/calibrate/run.hpp"
#include "cpsim/models/error.hpp"
#include "cpsim/models/io.hpp"
#include "cpsim/models/units.hpp"

#include "commands.hpp"
#include "common.hpp"
#include "output.hpp"

namespace cpsim::cli {
namespace {

namespace fs = std::filesystem;

calibrate::RunRequest measure_request(const CalibrateArgs& a) {
  if (a.out.empty() || a.out == "-") {
    throw InputError("--out", "must be a file: calibrate run rewrites it after every sweep");
  }
  if (a.gpus < 0) {
    throw InputError("--gpus", fmt::format("must be 0 (all) or positive, got {}", a.gpus));
  }
  if (!(a.collective_timeout_s > 0.0)) {
    throw InputError("--collective-timeout",
                     fmt::format("must be positive seconds, got {}", a.collective_timeout_s));
  }
  calibrate::RunRequest request;
  request.out = a.out;
  request.resume = a.resume;
  request.collective_timeout_s = a.collective_timeout_s;
  if (!a.only.empty()) {
    request.only = calibrate::parse_sweep_list(a.only, "--only");
  }
  if (!a.skip.empty()) {
    request.skip = calibrate::parse_sweep_list(a.skip, "--skip");
  }
  calibrate::MeasureOptions& options = request.options;
  options.quick = a.quick;
  options.gpus = a.gpus;
  if (!a.max_seq.empty()) {
    options.max_seq = parse_length(a.max_seq, "--max-seq");
    if (options.max_seq < 1024) {
      throw InputError("--max-seq", "must be at least 1K");
    }
  }
  options.argv = a.argv;
  options.cpsim_version = CPSIM_VERSION;
  // GEMM widths: every built-in model (quick: llama3-8b only).
  const models::DataDir data = data_dir();
  std::vector<models::TransformerSpec> specs;
  for (const std::string& name : models::list_builtin(data, "models")) {
    if (!a.quick || name == "llama3-8b") {
      specs.push_back(models::load_model(name, data));
    }
  }
  options.gemm_widths = calibrate::model_gemm_widths(specs);
  return request;
}

int run_measure_mpi(const CalibrateArgs& a);

int run_measure(const CalibrateArgs& a) {
  if (a.mpi) {
    return run_measure_mpi(a);
  }
  const calibrate::RunRequest request = measure_request(a);
  const std::unique_ptr<calibrate::MeasureBackend> backend = calibrate::make_measure_backend();
  if (const auto reason = backend->unavailable_reason()) {
    throw InputError("calibrate", *reason);
  }
  check_output_writable(a.out, "--out");  // before an hour of measuring

  calibrate::ProgressBar bar(::isatty(STDERR_FILENO) == 1);
  calibrate::RunSummary summary;
  try {
    summary = calibrate::run_calibration(
        *backend, request,
        [&bar](std::size_t done, std::size_t total, const std::string& label) {
          bar(done, total, label);
        },
        [&a](const std::string& text) { write_output(a.out, text, "--out"); });
  } catch (const calibrate::MeasureError& e) {
    bar.finish();
    std::cerr << "cpsim: error: calibrate: " << e.what() << " (nothing was measured)\n";
    return 1;
  } catch (...) {
    bar.finish();
    throw;
  }
  bar.finish();

  const calibrate::RawCalibration& raw = summary.raw;
  const calibrate::RawSamples& s = raw.samples;
  std::cout << fmt::format(
      "wrote {}: {} x {}, {} GEMM, {} attention, {} memory, {} collective, {} host-copy, {} "
      "interference, {} launch samples\n",
      a.out, raw.context.gpu_count, raw.context.device, s.gemm.size(), s.attention.size(),
      s.memory.size(), s.collectives.size(), s.host_copies.size(), s.interference.size(),
      s.launch.size());
  for (const calibrate::SweepRecord& r : raw.context.sweeps) {
    const bool kept =
        std::find(summary.kept.begin(), summary.kept.end(), r.name) != summary.kept.end();
    std::cout << fmt::format("sweep {}: {}{}\n", r.name, r.status, kept ? " (kept, --resume)" : "");
  }
  for (const std::string& warning : summary.warnings) {
    std::cout << "warning: " << warning << "\n";
  }
  for (const std::string& note : raw.context.notes) {
    std::cout << "note: " << note << "\n";
  }
  if (!summary.failed.empty()) {
    std::cout << fmt::format(
        "some sweeps failed; after fixing the cause: cpsim calibrate run "
        "--out {} --resume\n",
        a.out);
  }
  std::cout << fmt::format("next: cpsim calibrate fit {} --out PROFILE.json\n", a.out);
  return summary.failed.empty() ? 0 : 1;
}

/// $CPSIM_CALIBRATE_MPI_RANKS_PER_NODE (testing on one host): nodes are blocks of this many
/// consecutive ranks; 0 when unset.
int ranks_per_node_override() {
  const char* env = std::getenv("CPSIM_CALIBRATE_MPI_RANKS_PER_NODE");
  if (env == nullptr || *env == '\0') {
    return 0;
  }
  char* end = nullptr;
  const long n = std::strtol(env, &end, 10);
  if (*end != '\0' || n < 1 || n > 1 << 20) {
    throw InputError("CPSIM_CALIBRATE_MPI_RANKS_PER_NODE",
                     fmt::format("must be a positive number of ranks, got '{}'", env));
  }
  return static_cast<int>(n);
}

/// --mpi: the flags of the single-process run that do not apply are refused before MPI starts.
calibrate::MpiRunRequest mpi_request(const CalibrateArgs& a) {
  const std::pair<bool, const char*> refused[] = {{a.gpus != 0, "--gpus"},
                                                  {!a.max_seq.empty(), "--max-seq"},
                                                  {a.resume, "--resume"},
                                                  {!a.only.empty(), "--only"},
                                                  {!a.skip.empty(), "--skip"}};
  for (const auto& [given, flag] : refused) {
    if (given) {
      throw InputError(flag,
                       "not with --mpi, which runs the collective sweep only, one rank per "
                       "GPU as the launcher started them");
    }
  }
  if (a.out.empty() || a.out == "-") {
    throw InputError("--out", "must be a file: calibrate run rewrites it as it measures");
  }
  if (!(a.collective_timeout_s > 0.0)) {
    throw InputError("--collective-timeout",
                     fmt::format("must be positive seconds, got {}", a.collective_timeout_s));
  }
  calibrate::MpiRunRequest request;
  request.out = a.out;
  request.collective_timeout_s = a.collective_timeout_s;
  request.ranks_per_node_override = ranks_per_node_override();
  request.options.quick = a.quick;
  request.options.argv = a.argv;
  request.options.cpsim_version = CPSIM_VERSION;
  return request;
}

/// Rank 0 checks that --out can be written; every rank learns the answer (2 when it cannot).
bool out_writable_on_rank0(calibrate::ProcessGroup& world, const CalibrateArgs& a, double wait_s) {
  std::exception_ptr error;
  if (world.rank() == 0) {
    try {
      check_output_writable(a.out, "--out");
    } catch (...) {
      error = std::current_exception();
    }
  }
  const auto agreed = world.max_all({error ? 1.0 : 0.0}, wait_s);
  if (!agreed) {
    world.abort(2);
  }
  if (error) {
    std::rethrow_exception(error);
  }
  return (*agreed)[0] == 0.0;
}

int run_measure_mpi(const CalibrateArgs& a) {
  const calibrate::MpiRunRequest request = mpi_request(a);
  const std::unique_ptr<calibrate::ProcessGroup> world = calibrate::make_mpi_world();
  const bool root = world->rank() == 0;
  if (!out_writable_on_rank0(*world, a, request.collective_timeout_s + request.agreement_grace_s)) {
    return 0;  // rank 0 reports it and exits 2
  }
  const std::unique_ptr<calibrate::MeasureBackend> backend = calibrate::make_measure_backend();
  calibrate::ProgressBar bar(root && ::isatty(STDERR_FILENO) == 1);
  calibrate::MpiRunSummary summary;
  try {
    summary = calibrate::run_mpi_calibration(
        *world, *backend, request,
        [&a](const std::string& text) { write_output(a.out, text, "--out"); },
        [&bar](std::size_t done, std::size_t total, const std::string& label) {
          bar(done, total, label);
        });
  } catch (const calibrate::MeasureError& e) {
    if (root) {
      bar.finish();
      std::cerr << "cpsim: error: calibrate: " << e.what() << " (nothing was measured)\n";
    }
    return root ? 1 : 0;
  } catch (const InputError&) {
    if (!root) {
      return 0;  // rank 0 says why and exits 2
    }
    throw;
  }
  // Rank 0 alone reports and carries the exit status: a launcher ends the whole job as soon as one
  // process exits with another status than 0, which could kill rank 0 before it has printed.
  if (!root) {
    return 0;
  }
  bar.finish();
  const calibrate::RawCalibration& raw = summary.raw;
  std::cout << fmt::format(
      "wrote {}: {} ranks on {} nodes ({} per node) x {}, {} collective "
      "samples\n",
      a.out, raw.context.mpi.ranks, raw.context.mpi.nodes, raw.context.mpi.ranks_per_node,
      raw.context.device, raw.samples.collectives.size());
  for (const std::string& note : raw.context.notes) {
    std::cout << "note: " << note << "\n";
  }
  for (const calibrate::SweepRecord& r : raw.context.sweeps) {
    if (r.name == "collectives") {
      std::cout << fmt::format("sweep collectives: {}\n", r.status);
      for (const std::string& note : r.notes) {
        std::cout << "note: " << note << "\n";
      }
    }
  }
  std::cout << fmt::format("next: cpsim calibrate fit NODE.json {} --out PROFILE.json\n", a.out);
  return summary.failed ? 1 : 0;
}

/// --op: a collective name ("all_to_all") or an nccl-tests program name ("alltoall_perf").
std::optional<models::Collective> parse_op(const std::string& text) {
  if (text.empty()) {
    return std::nullopt;
  }
  for (const models::Collective op :
       {models::Collective::kAllToAll, models::Collective::kAllGather,
        models::Collective::kReduceScatter, models::Collective::kAllReduce,
        models::Collective::kSendRecv}) {
    if (text == models::to_string(op)) {
      return op;
    }
  }
  if (auto op = calibrate::collective_of_nccl_tests_program(text)) {
    return op;
  }
  if (auto op = calibrate::collective_of_nccl_tests_program(text + "_perf")) {
    return op;
  }
  throw InputError("--op", fmt::format("unknown collective '{}'; known: all_to_all, all_gather, "
                                       "reduce_scatter, all_reduce, send_recv",
                                       text));
}

int run_import(const CalibrateArgs& a) {
  if (a.import_out.empty()) {
    throw InputError("--out", "required: the raw measurements file to write");
  }
  const std::optional<models::Collective> op = parse_op(a.op);
  std::vector<calibrate::NcclTestsRun> runs;
  for (const std::string& log : a.logs) {
    runs.push_back(calibrate::load_nccl_tests_log(log, op));
  }
  const calibrate::RawCalibration raw = calibrate::raw_from_nccl_tests(runs, a.argv, CPSIM_VERSION);
  const std::string text = calibrate::write_raw(raw);
  (void)calibrate::parse_raw(text, a.import_out);  // what fit will read back
  write_output(a.import_out, text, "--out");
  for (const calibrate::NcclTestsRun& run : runs) {
    std::cout << fmt::format(
        "{}: {} ({}), {} ranks on {} node(s), {}, NCCL {}: {} sizes (out-of-place and in-place)\n",
        run.source, models::to_string(run.op), run.program.empty() ? "--op" : run.program,
        run.ranks, run.nodes, run.device, run.nccl_version, run.samples.size() / 2);
  }
  std::cout << fmt::format("wrote {}: {} collective samples from {} log(s)\n", a.import_out,
                           raw.samples.collectives.size(), runs.size());
  std::cout << fmt::format("next: cpsim calibrate fit {} --out PROFILE.json\n", a.import_out);
  return 0;
}

int run_fit(const CalibrateArgs& a) {
  if (a.fit_out.empty()) {
    throw InputError("--out", "required: the hardware profile to write");
  }
  if (!(a.max_mape > 0.0)) {
    throw InputError("--max-mape", fmt::format("must be positive, got {}", a.max_mape));
  }
  std::vector<calibrate::NamedRaw> files;
  for (const std::string& path : a.raws) {
    files.push_back({path, calibrate::load_raw(path, "RAW")});
  }
  const calibrate::MergedRaw merged = calibrate::merge_raw(files);
  const calibrate::RawCalibration& raw = merged.raw;
  std::string names;
  for (const std::string& path : a.raws) {
    names += names.empty() ? path : " + " + path;
  }
  const models::DataDir data = data_dir();
  const models::HardwareProfile base = models::load_hardware(a.base, data, "--base");

  calibrate::FitOptions options;
  options.max_mape = a.max_mape;
  options.base_name = base.name;
  options.profile_name = a.name.empty() ? fs::path(a.fit_out).stem().string() : a.name;
  if (options.profile_name.empty()) {
    options.profile_name = "measured";
  }
  const calibrate::ProfileFit fit = calibrate::fit_profile(raw, base, options);
  const std::string text = calibrate::write_hardware_profile(fit.profile);
  try {
    (void)models::parse_hardware_profile(text, a.fit_out);
  } catch (const InputError& e) {
    // Measurements of another GPU than the base's: its spec values (peak, bandwidth, ranges)
    // cannot hold them. That is the choice of --base, not a fault of the fit.
    if (raw.context.sm_count > 0 && raw.context.sm_count != base.sm_count) {
      throw InputError(
          "--base", fmt::format("the measurements are from {} ({} SMs) and the base '{}' is {} "
                                "({} SMs): the fitted profile does not load ({}); pick the "
                                "base profile of the measured GPU",
                                raw.context.device, raw.context.sm_count, base.name, base.gpu_name,
                                base.sm_count, e.what()));
    }
    throw std::logic_error(fmt::format("the fitted profile does not load: {}", e.what()));
  }

  std::cout << fmt::format("fit of {} ({} x {}, {}) onto base '{}'\n\n", names,
                           raw.context.gpu_count, raw.context.device, raw.context.date, base.name);
  for (const std::string& conflict : merged.conflicts) {
    std::cout << "note: " << conflict << "\n";
  }
  if (!merged.conflicts.empty()) {
    std::cout << "\n";
  }
  std::cout << calibrate::format_fit_report(fit, a.max_mape);
  if (!a.force) {
    calibrate::check_fit_quality(fit, a.max_mape);
  }
  write_output(a.fit_out, text, "--out");
  std::cout << fmt::format("\nwrote {} (profile '{}'); use it with: cpsim simulate --hardware {}\n",
                           a.fit_out, fit.profile.name, a.fit_out);
  return 0;
}

}  // namespace

CLI::App* register_calibrate(CLI::App& app, CalibrateArgs& a) {
  CLI::App* c = app.add_subcommand(
      "calibrate",
      "Measure this node (run) or import nccl-tests logs (import), and turn the measurements "
      "into a hardware profile (fit)");
  c->require_subcommand(1);

  a.run_command = c->add_subcommand(
      "run",
      "Microbenchmarks on the local GPUs: attention, GEMM, HBM, NCCL collectives, host copies, "
      "interference, launch overhead -> raw JSON (needs a CUDA build and a GPU); with --mpi, "
      "under mpirun/srun, the collectives across nodes");
  a.run_command->add_option("--out", a.out, "raw measurements file to write (JSON)")
      ->required()
      ->check(output_path_check());
  a.run_command->add_flag("--quick", a.quick,
                          "fewer points per sweep (minutes instead of tens of minutes)");
  a.run_command->add_option("--gpus", a.gpus, "GPUs to use (default: all visible)");
  a.run_command->add_option("--max-seq", a.max_seq,
                            "longest attention length to try (default: up to what fits the "
                            "memory and a time cap per call)");
  a.run_command->add_flag("--resume", a.resume,
                          "keep the sweeps --out already holds as done (same node and cpsim) "
                          "and run the rest");
  a.run_command->add_option("--only", a.only,
                            "comma-separated sweeps to run: launch, memory, gemm, attention, "
                            "collectives, host_copies, interference");
  a.run_command->add_option("--skip", a.skip, "comma-separated sweeps not to run");
  a.run_command
      ->add_option("--collective-timeout", a.collective_timeout_s,
                   "seconds one wait on NCCL work may take before its communicators are "
                   "aborted and the remaining collectives skipped")
      ->capture_default_str();
  a.run_command->add_flag(
      "--mpi", a.mpi,
      "collectives across nodes, one process per GPU started by your launcher (mpirun -np 16 -H "
      "node1:8,node2:8 cpsim calibrate run --mpi --out inter.json; srun works the same): each "
      "node's ranks, all ranks, and one rank per node; nccl-tests' method, time = slowest rank; "
      "rank 0 writes --out (needs a cpsim built with MPI and CUDA)");

  a.import_command = c->add_subcommand(
      "import", "Convert measurements taken by other tools into a raw measurements file");
  a.import_command->require_subcommand(1);
  CLI::App* nccl = a.import_command->add_subcommand(
      "nccl-tests",
      "Text output of NVIDIA nccl-tests (all_reduce_perf, all_gather_perf, reduce_scatter_perf, "
      "alltoall_perf, sendrecv_perf; single- or multi-node) -> raw JSON");
  nccl->add_option("log", a.logs, "nccl-tests output files, one run each")->required();
  nccl->add_option("--out", a.import_out, "raw measurements file to write (JSON)")
      ->required()
      ->check(output_path_check());
  nccl->add_option("--op", a.op,
                   "collective of logs that do not name their program (all_to_all, all_gather, "
                   "reduce_scatter, all_reduce, send_recv)");

  a.fit_command =
      c->add_subcommand("fit",
                        "Least-squares fit of raw measurements into a hardware profile (schema "
                        "cpsim.hardware/1); prints the fit error per curve");
  a.fit_command
      ->add_option("raw", a.raws,
                   "raw measurements (from `cpsim calibrate run` or `import`); several are merged")
      ->required();
  a.fit_command->add_option("--out", a.fit_out, "hardware profile to write (JSON)")
      ->required()
      ->check(output_path_check());
  a.fit_command
      ->add_option("--base", a.base,
                   "profile whose coefficients fill what was not measured (built-in name "
                   "or file)")
      ->capture_default_str();
  a.fit_command
      ->add_option("--max-mape", a.max_mape,
                   "refuse the fit when a curve's hold-out MAPE, or one of its outliers, "
                   "exceeds this fraction")
      ->capture_default_str();
  a.fit_command->add_flag("--force", a.force, "write the profile even when a curve exceeds it");
  a.fit_command->add_option("--name", a.name, "profile name (default: the output file's stem)");
  return c;
}

int run_calibrate(const CalibrateArgs& a) {
  if (a.run_command != nullptr && a.run_command->parsed()) {
    return run_measure(a);
  }
  if (a.import_command != nullptr && a.import_command->parsed()) {
    return run_import(a);
  }
  return run_fit(a);
}

}  // namespace cpsim::cli
