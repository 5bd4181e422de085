// `cpsim calibrate run` (microbenchmarks on this node -> raw JSON) and `cpsim calibrate fit` (raw
// JSON -> hardware profile). docs/CALIBRATION.md describes both.
#include <filesystem>
#include <iostream>
#include <string>
#include <unistd.h>

#include <fmt/format.h>

#include "cpsim/calibrate/measure.hpp"
#include "cpsim/calibrate/profile_fit.hpp"
#include "cpsim/calibrate/profile_io.hpp"
#include "cpsim/calibrate/raw.hpp"
#include "cpsim/models/error.hpp"
#include "cpsim/models/io.hpp"
#include "cpsim/models/units.hpp"

#include "commands.hpp"
#include "common.hpp"
#include "output.hpp"

namespace cpsim::cli {
namespace {

namespace fs = std::filesystem;

int run_measure(const CalibrateArgs& a) {
  if (a.out.empty()) {
    throw InputError("--out", "required: the raw measurements file to write");
  }
  if (a.gpus < 0) {
    throw InputError("--gpus", fmt::format("must be 0 (all) or positive, got {}", a.gpus));
  }
  calibrate::MeasureOptions options;
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

  const std::unique_ptr<calibrate::MeasureBackend> backend = calibrate::make_measure_backend();
  if (const auto reason = backend->unavailable_reason()) {
    throw InputError("calibrate", *reason);
  }
  check_output_writable(a.out, "--out");  // before an hour of measuring

  // GEMM widths: every built-in model (quick: llama3-8b only).
  const models::DataDir data = data_dir();
  std::vector<models::TransformerSpec> specs;
  for (const std::string& name : models::list_builtin(data, "models")) {
    if (!a.quick || name == "llama3-8b") {
      specs.push_back(models::load_model(name, data));
    }
  }
  options.gemm_widths = calibrate::model_gemm_widths(specs);

  calibrate::ProgressBar bar(::isatty(STDERR_FILENO) == 1);
  calibrate::RawCalibration raw;
  try {
    raw = backend->run(options, [&bar](std::size_t done, std::size_t total,
                                       const std::string& label) { bar(done, total, label); });
  } catch (const calibrate::MeasureError& e) {
    bar.finish();
    std::cerr << "cpsim: error: calibrate: " << e.what() << " (nothing was written)\n";
    return 1;
  } catch (...) {
    bar.finish();
    throw;
  }
  bar.finish();
  write_output(a.out, calibrate::write_raw(raw), "--out");

  const calibrate::RawSamples& s = raw.samples;
  std::cout << fmt::format(
      "wrote {}: {} x {}, {} GEMM, {} attention, {} memory, {} collective, {} host-copy, {} "
      "interference, {} launch samples\n",
      a.out, raw.context.gpu_count, raw.context.device, s.gemm.size(), s.attention.size(),
      s.memory.size(), s.collectives.size(), s.host_copies.size(), s.interference.size(),
      s.launch.size());
  for (const std::string& note : raw.context.notes) {
    std::cout << "note: " << note << "\n";
  }
  std::cout << fmt::format("next: cpsim calibrate fit {} --out PROFILE.json\n", a.out);
  return 0;
}

int run_fit(const CalibrateArgs& a) {
  if (a.fit_out.empty()) {
    throw InputError("--out", "required: the hardware profile to write");
  }
  if (!(a.max_mape > 0.0)) {
    throw InputError("--max-mape", fmt::format("must be positive, got {}", a.max_mape));
  }
  const calibrate::RawCalibration raw = calibrate::load_raw(a.raw, "RAW");
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
    throw std::logic_error(fmt::format("the fitted profile does not load: {}", e.what()));
  }

  std::cout << fmt::format("fit of {} ({} x {}, {}) onto base '{}'\n\n", a.raw,
                           raw.context.gpu_count, raw.context.device, raw.context.date, base.name);
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
      "Measure this node (run) and turn the measurements into a hardware profile (fit)");
  c->require_subcommand(1);

  a.run_command = c->add_subcommand(
      "run",
      "Microbenchmarks on the local GPUs: attention, GEMM, HBM, NCCL collectives, host copies, "
      "interference, launch overhead -> raw JSON (needs a CUDA build and a GPU)");
  a.run_command->add_option("--out", a.out, "raw measurements file to write (JSON)")
      ->required()
      ->check(output_path_check());
  a.run_command->add_flag("--quick", a.quick,
                          "fewer points per sweep (minutes instead of tens of minutes)");
  a.run_command->add_option("--gpus", a.gpus, "GPUs to use (default: all visible)");
  a.run_command->add_option("--max-seq", a.max_seq,
                            "longest attention length to try (default: up to what fits the "
                            "memory and a time cap per call)");

  a.fit_command =
      c->add_subcommand("fit",
                        "Least-squares fit of raw measurements into a hardware profile (schema "
                        "cpsim.hardware/1); prints the fit error per curve");
  a.fit_command->add_option("raw", a.raw, "raw measurements (from `cpsim calibrate run`)")
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
                   "refuse the fit when a curve's hold-out MAPE exceeds this fraction")
      ->capture_default_str();
  a.fit_command->add_flag("--force", a.force, "write the profile even when a curve exceeds it");
  a.fit_command->add_option("--name", a.name, "profile name (default: the output file's stem)");
  return c;
}

int run_calibrate(const CalibrateArgs& a) {
  if (a.run_command != nullptr && a.run_command->parsed()) {
    return run_measure(a);
  }
  return run_fit(a);
}

}  // namespace cpsim::cli
