#include "cpsim/calibrate/profile_fit.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cpsim/calibrate/collective_fit.hpp"
#include "cpsim/calibrate/fit.hpp"
#include "cpsim/models/error.hpp"
#include "cpsim/models/units.hpp"

namespace cpsim::calibrate {
namespace {

using models::Collective;
using models::LogCurve;

// ---------------------------------------------------------------------------------------------
// Small statistics

double median(std::vector<double> v) {
  if (v.empty()) {
    return 0.0;
  }
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct ErrorStats {
  double sum = 0.0;
  double max = 0.0;
  std::size_t n = 0;
  void add(double predicted, double measured) {
    const double rel = std::abs(predicted - measured) / measured;
    sum += rel;
    max = std::max(max, rel);
    ++n;
  }
  double mape() const { return n == 0 ? 0.0 : sum / static_cast<double>(n); }
};

std::string percent(double fraction) {
  return fmt::format("{:.1f}%", fraction * 100.0);
}

/// "1K", "16K", "1M" for powers of two and their multiples, else the number.
std::string short_length(double x) {
  const auto v = static_cast<std::int64_t>(std::llround(x));
  return format_length(v);
}

// ---------------------------------------------------------------------------------------------
// Curves fitted by grouping samples on a key, with a hold-out over whole groups.

/// Sorted distinct keys and, per sample, the index of its key.
struct Groups {
  std::vector<double> keys;
  std::vector<std::size_t> of_sample;
};

Groups make_groups(const std::vector<double>& sample_keys) {
  Groups g;
  g.keys = sample_keys;
  std::sort(g.keys.begin(), g.keys.end());
  g.keys.erase(std::unique(g.keys.begin(), g.keys.end()), g.keys.end());
  g.of_sample.reserve(sample_keys.size());
  for (const double k : sample_keys) {
    g.of_sample.push_back(static_cast<std::size_t>(
        std::lower_bound(g.keys.begin(), g.keys.end(), k) - g.keys.begin()));
  }
  return g;
}

/// Fits a model on all samples and on the samples of all but every k-th key (never the last key),
/// and measures the time errors of both. `fit(mask)` returns a model fitted to the samples whose
/// mask entry is true; `predict(model, i)` the time of sample i.
template <typename Fit, typename Predict>
auto assess(CurveFit& row,
            const std::vector<double>& keys,
            const std::vector<double>& times,
            std::size_t every_k,
            Fit&& fit,
            Predict&& predict) {
  const Groups groups = make_groups(keys);
  const std::size_t n = times.size();
  row.samples = n;
  if (groups.keys.size() >= std::max<std::size_t>(3, every_k)) {
    std::vector<bool> held_key(groups.keys.size(), false);
    for (std::size_t j = 0; j + 1 < groups.keys.size(); ++j) {
      held_key[j] = (j + 1) % every_k == 0;
    }
    std::vector<bool> train(n);
    for (std::size_t i = 0; i < n; ++i) {
      train[i] = !held_key[groups.of_sample[i]];
    }
    const auto model = fit(train);
    ErrorStats held;
    for (std::size_t i = 0; i < n; ++i) {
      if (!train[i]) {
        held.add(predict(model, i), times[i]);
      }
    }
    row.held_out = held.n;
    row.holdout_mape = held.mape();
    row.holdout_max = held.max;
  }
  const auto model = fit(std::vector<bool>(n, true));
  ErrorStats all;
  for (std::size_t i = 0; i < n; ++i) {
    all.add(predict(model, i), times[i]);
  }
  row.fit_mape = all.mape();
  row.fit_max = all.max;
  return model;
}

/// Curve through (x, median y) per group of the used samples; x is the geometric mean of the
/// group's x values (the x itself when the group holds one x).
LogCurve group_curve(const Groups& groups,
                     const std::vector<double>& xs,
                     const std::vector<double>& ys,
                     const std::vector<bool>& use) {
  std::vector<std::vector<double>> group_x(groups.keys.size());
  std::vector<std::vector<double>> group_y(groups.keys.size());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (use[i] && std::isfinite(ys[i]) && ys[i] > 0.0) {
      group_x[groups.of_sample[i]].push_back(std::log2(xs[i]));
      group_y[groups.of_sample[i]].push_back(ys[i]);
    }
  }
  std::vector<std::pair<double, double>> points;
  for (std::size_t g = 0; g < groups.keys.size(); ++g) {
    if (group_y[g].empty()) {
      continue;
    }
    double mean_log = 0.0;
    for (const double lx : group_x[g]) {
      mean_log += lx;
    }
    mean_log /= static_cast<double>(group_x[g].size());
    const double x = std::exp2(mean_log);
    if (!points.empty() && x <= points.back().first) {
      continue;  // keys are increasing, so this cannot happen except by rounding
    }
    points.emplace_back(x, median(group_y[g]));
  }
  return LogCurve(std::move(points));
}

// ---------------------------------------------------------------------------------------------
// Provenance strings

class Sources {
 public:
  explicit Sources(const RawContext& c) : c_(c) {}

  /// "measured: <device>, driver <v>, <date>, cpsim calibrate, N samples, MAPE x%; <detail>"
  std::string measured(const CurveFit& row, const std::string& detail) const {
    std::string s =
        fmt::format("measured: {}, driver {}, {}, {}, {} samples, MAPE {}", c_.device,
                    c_.driver_version, c_.date, tool(), row.samples, percent(row.fit_mape));
    if (row.held_out > 0) {
      s += fmt::format(" (hold-out {} on {} points)", percent(row.holdout_mape), row.held_out);
    }
    if (!detail.empty()) {
      s += "; " + detail;
    }
    return s;
  }

  std::string read(const std::string& what) const {
    return fmt::format("measured: {}, driver {}, {}, cpsim calibrate, (read) {}", c_.device,
                       c_.driver_version, c_.date, what);
  }

  /// What produced the measurements.
  std::string tool() const {
    return c_.method.timer == "nccl-tests" ? "nccl-tests logs" : "cpsim calibrate";
  }

 private:
  const RawContext& c_;
};

// ---------------------------------------------------------------------------------------------
// Fitting context shared by the parts

/// Out-of-place times per size of one collective, group size and span (nccl-tests' in-place half
/// is kept aside for a cross-check).
struct CollectiveGroupKey {
  models::Span span;
  Collective op;
  int ranks;
  auto operator<=>(const CollectiveGroupKey&) const = default;
};
using TimesBySize = std::map<std::int64_t, std::vector<double>>;

struct Fitter {
  const RawCalibration& raw;
  const models::HardwareProfile& base;
  const FitOptions& options;
  Sources sources;
  ProfileFit out;

  models::HardwareProfile& p() { return out.profile; }
  void set_source(const std::string& path, std::string source) {
    out.profile.provenance[path] = std::move(source);
  }
  CurveFit& add_row(std::string name, bool checked = true) {
    CurveFit row;
    row.curve = std::move(name);
    row.checked = checked;
    out.curves.push_back(std::move(row));
    return out.curves.back();
  }
  void note(std::string text) { out.notes.push_back(std::move(text)); }
  /// An alpha-beta fit's errors in its row, with the hold-out's when there are samples enough.
  void record_alpha_beta(CurveFit& row,
                         const AlphaBetaFit& fit,
                         const std::vector<TimingSample>& samples) const {
    row.samples = fit.samples;
    row.fit_mape = fit.mape;
    row.fit_max = fit.max_abs_rel_error;
    if (samples.size() >= std::max<std::size_t>(3, options.holdout_every)) {
      const HoldoutError h = holdout_error(samples, options.holdout_every);
      row.held_out = h.held_out;
      row.holdout_mape = h.mape;
      row.holdout_max = h.max_abs_rel_error;
    }
  }

  void fit_context();
  void fit_launch();
  void fit_memory();
  void fit_gemm();
  void note_gemm_layouts();
  void fit_attention();
  void fit_attention_kernel(const std::string& kernel);
  /// The model a kernel's curves go into: the base's entry, or new tiles with their sources.
  models::AttentionKernelModel attention_model_start(const std::string& kernel,
                                                     const std::string& path,
                                                     bool in_base);
  struct AttentionVariant;
  /// The fitted curve against the base's published fa3 and cudnn curves, in the row's detail
  /// and note.
  void compare_with_published(const std::string& kernel,
                              const AttentionVariant& v,
                              const LogCurve& curve,
                              std::string& detail,
                              CurveFit& row) const;
  /// One of a kernel's four curves from its samples; false when none was measured.
  bool fit_attention_curve(const std::string& kernel,
                           const std::string& path,
                           bool in_base,
                           const AttentionVariant& v,
                           const std::vector<const AttentionSample*>& all,
                           models::AttentionKernelModel& model,
                           std::vector<std::pair<std::string, std::string>>& new_sources);
  void fit_host_link();
  struct HostLinkDirection;
  /// One direction's alpha-beta fit over single-GPU copies; its intercept, or nothing when it
  /// has no samples.
  std::optional<double> fit_host_link_direction(const HostLinkDirection& d);
  void note_host_copies_all_at_once();
  void fit_collectives();
  void fit_collective_group(const CollectiveGroupKey& key,
                            const TimesBySize& times,
                            const TimesBySize* in_place,
                            bool in_profile);
  /// A fitted group's model into the profile (the main curve when `in_profile`, which drops the
  /// base's per-group curves; always its by_ranks entry), with its sources.
  void store_collective_model(const CollectiveGroupKey& key,
                              const std::string& path,
                              const models::CollectiveModel& model,
                              const CurveFit& row,
                              const std::string& detail,
                              bool in_profile);
  void fit_interference();
};

void Fitter::fit_context() {
  const RawContext& c = raw.context;
  p().name = options.profile_name;
  p().gpu_name = c.device;
  p().description = fmt::format(
      "Measured by {} on {} x {} ({}); coefficients the measurement does not cover "
      "are from the base profile '{}' with their original source.",
      sources.tool(), c.gpu_count, c.device, c.date,
      options.base_name.empty() ? base.name : options.base_name);
  if (c.sm_count > 0) {
    if (c.sm_count != base.sm_count) {
      note(
          fmt::format("the device has {} SMs, the base profile '{}' {} ({}): peak FLOP/s and HBM "
                      "bandwidth are the base's spec values; pick a matching --base",
                      c.sm_count, base.name, base.sm_count, base.gpu_name));
    }
    p().sm_count = c.sm_count;
    set_source("gpu.sm_count", sources.read("cudaDeviceProp::multiProcessorCount"));
  }
  if (c.hbm_capacity_bytes > 0) {
    p().hbm_capacity_bytes = c.hbm_capacity_bytes;
    set_source("gpu.hbm_capacity_bytes", sources.read("cudaDeviceProp::totalGlobalMem"));
  }
  if (c.method.timer == "nccl-tests") {
    note(
        fmt::format("node.gpus_per_node: nccl-tests logs do not say how many GPUs a node has; "
                    "kept from the base ({})",
                    base.gpus_per_node));
  } else if (c.mpi.ranks > 0) {
    p().gpus_per_node = c.mpi.ranks_per_node;
    set_source("node.gpus_per_node",
               sources.read(fmt::format("MPI ranks per node (one per GPU) of calibrate run --mpi "
                                        "on {} nodes",
                                        c.mpi.nodes)));
  } else if (c.device_count > 0 && !raw.samples.collectives.empty()) {
    p().gpus_per_node = c.device_count;
    set_source("node.gpus_per_node", sources.read("cudaGetDeviceCount on one node"));
  }
}

// Back-to-back empty kernels time two things: the host's cost per launch (host clock around the
// launch loop) and the device's per-kernel time (events around it). When the device runs each
// kernel faster than the host issues the next, the device time equals the host time and the
// device's own gap is not observable (seen on an H200 node: 3.21-3.51 us both). The host cost is
// node.host_issue.launch_s; the device time becomes compute.kernel_launch_s only when it exceeds
// the host's by kDeviceBoundLaunch.
void Fitter::fit_launch() {
  constexpr double kDeviceBoundLaunch = 1.1;
  const auto& samples = raw.samples.launch;
  if (samples.empty()) {
    note("compute.kernel_launch_s: no launch samples; kept from the base");
    return;
  }
  std::vector<double> device;
  std::vector<double> host;
  for (const LaunchSample& s : samples) {
    device.push_back(s.device_time_s);
    host.push_back(s.host_time_s);
  }
  const double device_s = median(device);
  const double host_s = median(host);
  auto add_median_row = [&](const char* curve, const std::vector<double>& values, double value,
                            const char* what) {
    CurveFit& row = add_row(curve, false);
    ErrorStats e;
    for (const double t : values) {
      e.add(value, t);
    }
    row.samples = values.size();
    row.fit_mape = e.mape();
    row.fit_max = e.max;
    row.note = fmt::format("{:.2f} us per launch ({}), median", value * 1e6, what);
    return row;
  };
  if (p().host_issue.enabled() && host_s > 0.0) {
    const CurveFit& row = add_median_row("node.host_issue.launch_s", host, host_s, "host");
    p().host_issue.launch_s = host_s;
    set_source("node.host_issue.launch_s",
               sources.measured(row,
                                "host time per back-to-back empty kernel launch "
                                "(cudaLaunchKernel), steady clock around the loop, median"));
  }
  if (device_s <= kDeviceBoundLaunch * host_s) {
    note(fmt::format(
        "compute.kernel_launch_s: kept from the base: the launches were host-bound ({:.2f} us "
        "per kernel on the device, {:.2f} us per launch on the host), so the device's own "
        "per-kernel gap is not observable",
        device_s * 1e6, host_s * 1e6));
    return;
  }
  const CurveFit& row = add_median_row("compute.kernel_launch_s", device, device_s, "device");
  p().kernel_launch_s = device_s;
  set_source("compute.kernel_launch_s",
             sources.measured(row,
                              "device time per back-to-back empty kernel, CUDA events "
                              "around the loop, median over loops (device-bound: over "
                              "1.1 x the host's time per launch)"));
}

void Fitter::fit_memory() {
  std::vector<TimingSample> samples;
  for (const MemorySample& s : raw.samples.memory) {
    samples.push_back({static_cast<double>(s.bytes), s.time_s});
  }
  if (samples.empty()) {
    note("compute.memory_bound_efficiency: no memory samples; kept from the base");
    return;
  }
  std::sort(samples.begin(), samples.end(),
            [](const TimingSample& a, const TimingSample& b) { return a.bytes < b.bytes; });
  CurveFit& row = add_row("compute.memory_bound_efficiency");
  AlphaBetaFit fit;
  try {
    fit = fit_alpha_beta(samples);
  } catch (const InputError& e) {
    throw InputError("samples.memory", e.what());
  }
  record_alpha_beta(row, fit, samples);
  double eff = fit.bandwidth_bytes_per_s / p().hbm_bandwidth_bytes_per_s;
  row.note = fmt::format("{:.0f} GB/s achieved of {:.0f} GB/s", fit.bandwidth_bytes_per_s / 1e9,
                         p().hbm_bandwidth_bytes_per_s / 1e9);
  if (eff > 1.0) {
    note(
        fmt::format("memory: measured {:.0f} GB/s exceeds the base's HBM bandwidth {:.0f} GB/s; "
                    "efficiency capped at 1 (is --base the right GPU?)",
                    fit.bandwidth_bytes_per_s / 1e9, p().hbm_bandwidth_bytes_per_s / 1e9));
    eff = 1.0;
  }
  p().memory_bound_efficiency = eff;
  set_source("compute.memory_bound_efficiency",
             sources.measured(row, fmt::format("copy kernel, alpha-beta fit {:.0f} GB/s (read + "
                                               "written bytes) / spec {:.0f} GB/s",
                                               fit.bandwidth_bytes_per_s / 1e9,
                                               p().hbm_bandwidth_bytes_per_s / 1e9)));
}

void Fitter::fit_gemm() {
  const auto& samples = raw.samples.gemm;
  if (samples.empty()) {
    note("compute.gemm_*: no GEMM samples; kept from the base");
    return;
  }
  const double peak = p().peak_bf16_flops_per_s;
  const double launch = p().kernel_launch_s;
  const double hbm = p().hbm_bandwidth_bytes_per_s * p().memory_bound_efficiency;
  std::vector<double> flops, bytes, keys, times, eff;
  for (const GemmSample& s : samples) {
    const double m = static_cast<double>(s.m);
    const double n = static_cast<double>(s.n);
    const double k = static_cast<double>(s.k);
    const double f = 2.0 * m * n * k;
    flops.push_back(f);
    bytes.push_back(2.0 * (m * k + k * n + m * n));
    keys.push_back(std::round(std::log2(f) * 4.0) / 4.0);  // quarter-octave bins of FLOPs
    times.push_back(s.time_s);
    const double busy = std::max(s.time_s - launch, 0.5 * s.time_s);
    eff.push_back(f / (busy * peak));
  }
  const Groups groups = make_groups(keys);
  CurveFit& row = add_row("compute.gemm_efficiency_by_flops");
  const LogCurve curve = assess(
      row, keys, times, options.holdout_every,
      [&](const std::vector<bool>& use) { return group_curve(groups, flops, eff, use); },
      [&](const LogCurve& c, std::size_t i) {
        const double e = std::min(1.0, c(flops[i], 1.0));
        return launch + std::max(flops[i] / (peak * e), bytes[i] / hbm);
      });
  double best = 0.0;
  for (const auto& [x, y] : curve.points()) {
    best = std::max(best, y);
  }
  std::vector<std::pair<double, double>> normalized;
  for (const auto& [x, y] : curve.points()) {
    normalized.emplace_back(x, y / best);
  }
  double max_eff = best;
  if (max_eff > 1.0) {
    note(
        fmt::format("gemm: measured {:.0f} TFLOP/s exceeds the base's peak {:.0f} TFLOP/s; "
                    "efficiency capped at 1 (is --base the right GPU?)",
                    best * peak / 1e12, peak / 1e12));
    max_eff = 1.0;
  }
  row.note = fmt::format("best {:.0f} TFLOP/s = {:.1f}% of peak", best * peak / 1e12, best * 100);
  p().gemm_max_efficiency = max_eff;
  p().gemm_efficiency_by_flops = LogCurve(std::move(normalized));
  std::array<std::size_t, 3> per_layout{};
  for (const GemmSample& s : samples) {
    ++per_layout[static_cast<std::size_t>(s.layout)];
  }
  const std::string detail = fmt::format(
      "bf16 (fp32 accumulate), {} samples ({} forward, {} dgrad, {} wgrad) in {} quarter-octave "
      "FLOP bins, median per bin",
      samples.size(), per_layout[0], per_layout[1], per_layout[2], curve.points().size());
  note_gemm_layouts();
  set_source(
      "compute.gemm_max_efficiency",
      sources.measured(row, "best bin of the GEMM sweep / peak_bf16_flops_per_s; " + detail));
  set_source("compute.gemm_efficiency_by_flops",
             sources.measured(row, "efficiency per FLOP bin / gemm_max_efficiency; " + detail));
}

// How the backward's GEMMs compare with the forward of the same layer shape: the median ratio of
// their times over the shapes measured in both (a note; the curve takes every sample).
void Fitter::note_gemm_layouts() {
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, std::array<double, 3>> by_shape;
  for (const GemmSample& s : raw.samples.gemm) {
    by_shape[{s.m, s.n, s.k}][static_cast<std::size_t>(s.layout)] = s.time_s;
  }
  for (const GemmLayout layout : {GemmLayout::kDgrad, GemmLayout::kWgrad}) {
    std::vector<double> ratios;
    for (const auto& [shape, times] : by_shape) {
      const double forward = times[0];
      const double other = times[static_cast<std::size_t>(layout)];
      if (forward > 0.0 && other > 0.0) {
        ratios.push_back(other / forward);
      }
    }
    if (!ratios.empty()) {
      note(fmt::format("gemm: {} takes {:.2f} x the forward's time (median over {} shapes)",
                       to_string(layout), median(ratios), ratios.size()));
    }
  }
}

void Fitter::fit_attention() {
  std::set<std::string> kernels;
  for (const AttentionSample& s : raw.samples.attention) {
    kernels.insert(s.kernel);
  }
  if (kernels.empty()) {
    note("compute.attention_kernels: no attention samples; kept from the base");
    return;
  }
  for (const std::string& k : kernels) {
    fit_attention_kernel(k);
  }
}

struct Fitter::AttentionVariant {
  AttentionPass pass;
  bool causal;
  const char* key;
  LogCurve models::AttentionKernelModel::*curve;
};

namespace {

// The head dim the curves are for: 128 (the published curves' and most models') when measured,
// else the one measured most.
std::int64_t curve_head_dim(const std::map<std::int64_t, std::size_t>& head_dims) {
  if (head_dims.count(128) != 0) {
    return 128;
  }
  std::int64_t head_dim = 0;
  std::size_t most = 0;
  for (const auto& [d, count] : head_dims) {
    if (count > most) {
      most = count;
      head_dim = d;
    }
  }
  return head_dim;
}

// One curve's samples (a pass, causal or not, one head dim): square shapes and, among them, the
// most heads measured at each length (what the curve is fitted to), and unequal lengths.
struct CurveSamples {
  std::vector<const AttentionSample*> square, rect, many;
  std::map<std::int64_t, std::int64_t> max_heads;  // per length, square shapes
};

CurveSamples curve_samples(const std::vector<const AttentionSample*>& all,
                           AttentionPass pass,
                           bool causal,
                           std::int64_t head_dim) {
  CurveSamples c;
  for (const AttentionSample* s : all) {
    if (s->pass != pass || s->causal != causal || s->head_dim != head_dim) {
      continue;
    }
    if (s->q_len == s->kv_len) {
      c.square.push_back(s);
      auto& h = c.max_heads[s->q_len];
      h = std::max(h, s->heads);
    } else {
      c.rect.push_back(s);
    }
  }
  for (const AttentionSample* s : c.square) {
    if (s->heads == c.max_heads[s->q_len]) {
      c.many.push_back(s);
    }
  }
  return c;
}

// The mean of the fitted curve over a published one at the fitted points.
double mean_ratio_to(const LogCurve& fitted, const LogCurve& published, std::string* ratios) {
  double ratio_sum = 0.0;
  for (const auto& [x, y] : fitted.points()) {
    const double r = y / published(x, y);
    ratio_sum += r;
    if (ratios != nullptr) {
      *ratios += fmt::format("{}{:.2f} @{}", ratios->empty() ? "" : ", ", r, short_length(x));
    }
  }
  return ratio_sum / static_cast<double>(fitted.points().size());
}

}  // namespace

void Fitter::fit_attention_kernel(const std::string& kernel) {
  const std::string path = "compute.attention_kernels." + kernel;
  std::vector<const AttentionSample*> all;
  std::map<std::int64_t, std::size_t> head_dims;
  for (const AttentionSample& s : raw.samples.attention) {
    if (s.kernel == kernel) {
      all.push_back(&s);
      ++head_dims[s.head_dim];
    }
  }
  const bool in_base = base.attention_kernels.count(kernel) != 0;
  models::AttentionKernelModel model = attention_model_start(kernel, path, in_base);
  model.head_dim = curve_head_dim(head_dims);
  set_source(path + ".head_dim", sources.read(fmt::format(
                                     "head_dim of the measured {} points the curves use", kernel)));

  const AttentionVariant variants[] = {
      {AttentionPass::kForward, true, "fwd_causal_flops_per_s",
       &models::AttentionKernelModel::fwd_causal_flops_per_s},
      {AttentionPass::kForward, false, "fwd_full_flops_per_s",
       &models::AttentionKernelModel::fwd_full_flops_per_s},
      {AttentionPass::kBackward, true, "bwd_causal_flops_per_s",
       &models::AttentionKernelModel::bwd_causal_flops_per_s},
      {AttentionPass::kBackward, false, "bwd_full_flops_per_s",
       &models::AttentionKernelModel::bwd_full_flops_per_s},
  };
  bool complete = true;
  std::vector<std::pair<std::string, std::string>> new_sources;
  for (const AttentionVariant& v : variants) {
    complete = fit_attention_curve(kernel, path, in_base, v, all, model, new_sources) && complete;
  }
  if (!complete && !in_base) {
    // A new kernel needs all four curves: drop the sources recorded for it above.
    auto& prov = p().provenance.edit();
    for (auto it = prov.lower_bound(path + ".");
         it != prov.end() && it->first.rfind(path + ".", 0) == 0;) {
      it = prov.erase(it);
    }
    return;
  }
  for (auto& [curve_path, source] : new_sources) {
    set_source(curve_path, std::move(source));
  }
  p().attention_kernels[kernel] = std::move(model);
}

models::AttentionKernelModel Fitter::attention_model_start(const std::string& kernel,
                                                           const std::string& path,
                                                           bool in_base) {
  if (in_base) {
    return base.attention_kernels.at(kernel);
  }
  models::AttentionKernelModel model;
  if (kernel == "cpsim-flash") {
    model.fwd_block_m = kCpsimFlashBlockM;
    model.bwd_block_n = kCpsimFlashBlockN;
    set_source(path + ".fwd_block_m",
               "(read) cpsim-flash forward tile: 64 query rows per CTA; "
               "calibrate/cuda/flash_attention.cu");
    set_source(path + ".bwd_block_n",
               "(read) cpsim-flash backward tile: 64 key rows per CTA; "
               "calibrate/cuda/flash_attention.cu");
    return model;
  }
  const auto fa3 = base.attention_kernels.find("fa3");
  if (fa3 == base.attention_kernels.end()) {
    set_source(path + ".fwd_block_m", "assumption: 128-row tiles (no base entry to copy)");
    set_source(path + ".bwd_block_n", "assumption: 128-row tiles (no base entry to copy)");
    return model;
  }
  model.fwd_block_m = fa3->second.fwd_block_m;
  model.bwd_block_n = fa3->second.bwd_block_n;
  for (const char* key : {".fwd_block_m", ".bwd_block_n"}) {
    const auto it = base.provenance.find("compute.attention_kernels.fa3" + std::string(key));
    set_source(path + key,
               "(inferred) copied from the base's fa3 entry: " +
                   (it != base.provenance.end() ? it->second : std::string("no source")));
  }
  return model;
}

bool Fitter::fit_attention_curve(const std::string& kernel,
                                 const std::string& path,
                                 bool in_base,
                                 const AttentionVariant& v,
                                 const std::vector<const AttentionSample*>& all,
                                 models::AttentionKernelModel& model,
                                 std::vector<std::pair<std::string, std::string>>& new_sources) {
  const std::int64_t head_dim = model.head_dim;
  const double launch = p().kernel_launch_s;
  const std::int64_t sms = p().sm_count;
  const std::int64_t ref_block = model.fwd_block_m;
  const std::string curve_path = path + "." + v.key;
  const bool fwd = v.pass == AttentionPass::kForward;
  const std::int64_t block = fwd ? model.fwd_block_m : model.bwd_block_n;
  auto axis = [fwd](const AttentionSample& s) { return fwd ? s.q_len : s.kv_len; };
  auto occupancy = [&](const AttentionSample& s) {
    const std::int64_t len = axis(s);
    return attention_occupancy_factor(s.heads * ((len + block - 1) / block), sms, ref_block);
  };
  CurveSamples cs = curve_samples(all, v.pass, v.causal, head_dim);
  const std::vector<const AttentionSample*>& square = cs.square;
  const std::vector<const AttentionSample*>& rect = cs.rect;
  const std::vector<const AttentionSample*>& many = cs.many;
  std::map<std::int64_t, std::int64_t>& max_heads = cs.max_heads;
  if (many.empty()) {
    note(fmt::format("{}: no square {} samples at head_dim {}; {}", curve_path, v.key, head_dim,
                     in_base ? "kept from the base" : "kernel skipped"));
    return false;
  }

  std::vector<double> xs, ys, times, flops, occ;
  for (const AttentionSample* s : many) {
    const double f = attention_flops(*s);
    const double o = occupancy(*s);
    const double busy = std::max(s->time_s - launch, 0.5 * s->time_s);
    xs.push_back(static_cast<double>(axis(*s)));
    ys.push_back(f / (busy * o));
    times.push_back(s->time_s);
    flops.push_back(f);
    occ.push_back(o);
  }
  const Groups groups = make_groups(xs);
  CurveFit& row = add_row(curve_path);
  const LogCurve curve = assess(
      row, xs, times, options.holdout_every,
      [&](const std::vector<bool>& use) { return group_curve(groups, xs, ys, use); },
      [&](const LogCurve& c, std::size_t i) {
        return launch + flops[i] / (c(xs[i], 1.0) * occ[i]);
      });
  std::string detail = fmt::format(
      "{} {} bf16 d={}, the most heads per launch at each length, through the occupancy model "
      "(fwd_block_m {}, bwd_block_n {}, {} SMs)",
      kernel, v.key, head_dim, model.fwd_block_m, model.bwd_block_n, sms);
  compare_with_published(kernel, v, curve, detail, row);
  model.*(v.curve) = curve;
  new_sources.emplace_back(curve_path, sources.measured(row, detail));

  // Cross-checks of the occupancy model and of the length axis (printed, not gated).
  auto check_row = [&](const std::vector<const AttentionSample*>& samples, bool fewer_heads,
                       const char* suffix, const char* what) {
    ErrorStats e;
    for (const AttentionSample* s : samples) {
      if (!fewer_heads || s->heads != max_heads[s->q_len]) {
        e.add(launch +
                  attention_flops(*s) / (curve(static_cast<double>(axis(*s)), 1.0) * occupancy(*s)),
              s->time_s);
      }
    }
    if (e.n > 0) {
      CurveFit& check = add_row(curve_path + suffix, false);
      check.samples = e.n;
      check.fit_mape = e.mape();
      check.fit_max = e.max;
      check.note = what;
    }
  };
  check_row(square, true, " [fewer heads]", "occupancy model on the few-head launches");
  check_row(rect, false, " [q_len != kv_len]", "unequal lengths (ring steps, FPDT chunks)");
  return true;
}

void Fitter::compare_with_published(const std::string& kernel,
                                    const AttentionVariant& v,
                                    const LogCurve& curve,
                                    std::string& detail,
                                    CurveFit& row) const {
  const auto fa3_it = base.attention_kernels.find("fa3");
  if (kernel != "fa3" && fa3_it != base.attention_kernels.end()) {
    std::string ratios;
    const double mean = mean_ratio_to(curve, fa3_it->second.*(v.curve), &ratios);
    detail += fmt::format(
        "; kernel efficiency vs the base's published fa3 curve at the same "
        "length: {} (mean {:.2f})",
        ratios, mean);
    row.note = fmt::format("{:.2f} x fa3", mean);
  }
  const auto cudnn_it = base.attention_kernels.find("cudnn");
  if (cudnn_it != base.attention_kernels.end() && kernel != "cudnn") {
    const double mean = mean_ratio_to(curve, cudnn_it->second.*(v.curve), nullptr);
    detail += fmt::format("; vs the base's published cudnn curve: mean {:.2f}", mean);
    row.note += fmt::format("{}{:.2f} x cudnn", row.note.empty() ? "" : ", ", mean);
  }
}

struct Fitter::HostLinkDirection {
  CopyDirection direction;
  const char* key;
  double models::HostLinkModel::*field;
  double bytes_factor;  // duplex: both directions move `bytes`
};

void Fitter::fit_host_link() {
  const HostLinkDirection directions[] = {
      {CopyDirection::kHostToDevice, "h2d_bytes_per_s", &models::HostLinkModel::h2d_bytes_per_s,
       1.0},
      {CopyDirection::kDeviceToHost, "d2h_bytes_per_s", &models::HostLinkModel::d2h_bytes_per_s,
       1.0},
      {CopyDirection::kDuplex, "duplex_total_bytes_per_s",
       &models::HostLinkModel::duplex_total_bytes_per_s, 2.0},
  };
  std::vector<double> alphas;
  for (const HostLinkDirection& d : directions) {
    const std::optional<double> alpha = fit_host_link_direction(d);
    if (alpha && d.direction != CopyDirection::kDuplex) {
      alphas.push_back(*alpha);
    }
  }
  if (!alphas.empty()) {
    double alpha = 0.0;
    for (const double a : alphas) {
      alpha += a;
    }
    alpha = std::max(0.0, alpha / static_cast<double>(alphas.size()));
    p().host_link.alpha_s = alpha;
    set_source(
        "node.host_link.alpha_s",
        fmt::format("measured: {}, driver {}, {}, cpsim calibrate, mean intercept of the "
                    "h2d/d2h alpha-beta fits ({:.2f} us)",
                    raw.context.device, raw.context.driver_version, raw.context.date, alpha * 1e6));
  }
  note_host_copies_all_at_once();
}

std::optional<double> Fitter::fit_host_link_direction(const HostLinkDirection& d) {
  const std::string path = fmt::format("node.host_link.{}", d.key);
  std::vector<TimingSample> samples;
  std::map<int, double> per_gpu_largest;
  std::int64_t largest = 0;
  for (const HostCopySample& s : raw.samples.host_copies) {
    if (s.direction == d.direction && s.gpus == 1) {
      samples.push_back({d.bytes_factor * static_cast<double>(s.bytes), s.time_s});
      largest = std::max(largest, s.bytes);
    }
  }
  if (samples.empty()) {
    note(path + ": no single-GPU samples; kept from the base");
    return std::nullopt;
  }
  for (const HostCopySample& s : raw.samples.host_copies) {
    if (s.direction == d.direction && s.gpus == 1 && s.bytes == largest) {
      per_gpu_largest[s.gpu] = d.bytes_factor * static_cast<double>(s.bytes) / s.time_s;
    }
  }
  std::sort(samples.begin(), samples.end(),
            [](const TimingSample& a, const TimingSample& b) { return a.bytes < b.bytes; });
  AlphaBetaFit fit;
  try {
    fit = fit_alpha_beta(samples);
  } catch (const InputError& e) {
    throw InputError("samples.host_copies", fmt::format("{}: {}", d.key, e.what()));
  }
  CurveFit& row = add_row(path);
  record_alpha_beta(row, fit, samples);
  row.note = fmt::format("{:.1f} GB/s", fit.bandwidth_bytes_per_s / 1e9);
  std::string per_gpu;
  double slowest = fit.bandwidth_bytes_per_s;
  for (const auto& [gpu, bw] : per_gpu_largest) {
    per_gpu += fmt::format("{}{}: {:.1f}", per_gpu.empty() ? "" : ", ", gpu, bw / 1e9);
    slowest = std::min(slowest, bw);
  }
  if (per_gpu_largest.size() > 1 && slowest < 0.8 * fit.bandwidth_bytes_per_s) {
    note(
        fmt::format("{}: one GPU reaches only {:.1f} GB/s at {} (others up to {:.1f} GB/s); "
                    "the profile uses the pooled fit",
                    path, slowest / 1e9, format_bytes(static_cast<double>(largest)),
                    fit.bandwidth_bytes_per_s / 1e9));
  }
  (p().host_link.*(d.field)) = fit.bandwidth_bytes_per_s;
  set_source(path, sources.measured(
                       row, fmt::format("pinned cudaMemcpyAsync (copy engines), alpha-beta fit "
                                        "pooled over single GPUs; GB/s per GPU at {}: {}",
                                        format_bytes(static_cast<double>(largest)), per_gpu)));
  return fit.alpha_s;
}

// All GPUs at once: no profile field; reported.
void Fitter::note_host_copies_all_at_once() {
  std::map<std::pair<CopyDirection, std::int64_t>, std::pair<double, int>> all_at_once;
  for (const HostCopySample& s : raw.samples.host_copies) {
    if (s.gpus > 1) {
      auto& entry = all_at_once[{s.direction, s.bytes}];
      entry = {static_cast<double>(s.bytes) / s.time_s *
                   (s.direction == CopyDirection::kDuplex ? 2.0 : 1.0),
               s.gpus};
    }
  }
  std::map<CopyDirection, std::pair<std::int64_t, std::pair<double, int>>> largest_all;
  for (const auto& [key, value] : all_at_once) {
    largest_all[key.first] = {key.second, value};
  }
  for (const auto& [direction, entry] : largest_all) {
    note(
        fmt::format("host copies, {} GPUs at once, {} at {}: {:.1f} GB/s per GPU (not in the "
                    "profile, which models one host link per GPU)",
                    entry.second.second, to_string(direction),
                    format_bytes(static_cast<double>(entry.first)), entry.second.first / 1e9));
  }
}

/// Bytes on the wire per rank as the simulator counts them (sim/src/cost_model.cpp).
double wire_bytes(Collective op, int ranks, std::int64_t size) {
  const std::int64_t n = std::max(1, ranks);
  switch (op) {
    case Collective::kSendRecv:
      return static_cast<double>(size);
    case Collective::kAllReduce:
      return static_cast<double>(2 * (size / n) * (n - 1));
    case Collective::kAllToAll:
    case Collective::kAllGather:
    case Collective::kReduceScatter:
      return static_cast<double>((size / n) * (n - 1));
  }
  return static_cast<double>(size);
}

/// "1K-64K: alpha 12.3 us, 45 GB/s; 128K-1G: ..." (bandwidth in the wire-bytes convention).
std::string describe_regimes(const CollectiveCurveFit& f) {
  std::string out;
  for (const CollectiveRegime& g : f.regimes) {
    const std::string bw = std::isinf(g.bandwidth_bytes_per_s)
                               ? std::string("flat")
                               : fmt::format("{:.1f} GB/s", g.bandwidth_bytes_per_s / 1e9);
    out += fmt::format("{}{}-{}: alpha {:.1f} us, {}", out.empty() ? "" : "; ",
                       format_bytes(g.first_size_bytes), format_bytes(g.last_size_bytes),
                       g.alpha_s * 1e6, bw);
  }
  return out;
}

/// The profile's form of a fitted curve: alpha (without collective_launch_s), the peak busbw
/// and the efficiency per measured size, all from the model (not the measurements), so that the
/// simulator's t = alpha + launch + wire / (peak · eff) reproduces the model at every size.
models::CollectiveModel to_profile_model(const CollectiveCurveFit& f,
                                         const std::vector<CollectivePoint>& points,
                                         double launch_s) {
  models::CollectiveModel m;
  m.alpha_s = std::max(0.0, f.regimes.front().alpha_s - launch_s);
  const double total_alpha = m.alpha_s + launch_s;
  std::vector<double> bw(points.size(), 0.0);
  double peak = 0.0;
  double any_peak = 0.0;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const double busy = f.predicted_s[i] - total_alpha;
    if (busy > 0.0) {
      bw[i] = points[i].wire_bytes / busy;
      any_peak = std::max(any_peak, bw[i]);
      if (busy >= 0.5 * f.predicted_s[i]) {
        peak = std::max(peak, bw[i]);  // bandwidth-bound sizes only
      }
    }
  }
  peak = peak > 0.0 ? peak : any_peak;
  std::vector<std::pair<double, double>> eff;
  for (std::size_t i = 0; i < points.size(); ++i) {
    if (bw[i] > 0.0) {
      eff.emplace_back(points[i].size_bytes, std::min(1.0, bw[i] / peak));
    }
  }
  if (eff.empty() || !(peak > 0.0)) {
    // Time never exceeds the fixed cost: no bandwidth can be told; keep a nominal one.
    peak = f.regimes.back().bandwidth_bytes_per_s;
    peak = std::isfinite(peak) ? peak : 1e12;
    eff.assign(1, {points.back().size_bytes, 1.0});
  }
  m.peak_busbw_bytes_per_s = peak;
  m.efficiency_by_size = LogCurve(std::move(eff));
  return m;
}

void Fitter::fit_collectives() {
  const auto& samples = raw.samples.collectives;
  if (samples.empty()) {
    note(raw.context.gpu_count < 2
             ? "collectives: one GPU measured, no collectives; all kept from the base"
             : "collectives: no samples; all kept from the base");
    return;
  }
  std::map<CollectiveGroupKey, TimesBySize> out_of_place;
  std::map<CollectiveGroupKey, TimesBySize> in_place;
  for (const CollectiveSample& s : samples) {
    const models::Span span = s.nodes > 1 ? models::Span::kInterNode : models::Span::kIntraNode;
    (s.in_place ? in_place : out_of_place)[{span, s.op, s.ranks}][s.size_bytes].push_back(s.time_s);
  }
  if (out_of_place.empty()) {
    note("collectives: only in-place samples; the fit uses them");
    out_of_place.swap(in_place);
  }
  std::map<std::pair<models::Span, Collective>, int> largest;
  for (const auto& [key, times] : out_of_place) {
    int& n = largest[{key.span, key.op}];
    n = std::max(n, key.ranks);
  }
  if (std::none_of(largest.begin(), largest.end(), [](const auto& entry) {
        return entry.first.first == models::Span::kInterNode;
      })) {
    note(
        "collectives.inter_node: no samples across nodes (one process measures one node; "
        "calibrate run --mpi or imported multi-node nccl-tests logs measure them); kept from the "
        "base");
  }
  for (const Collective op :
       {Collective::kAllToAll, Collective::kAllGather, Collective::kReduceScatter,
        Collective::kAllReduce, Collective::kSendRecv}) {
    if (largest.count({models::Span::kIntraNode, op}) == 0) {
      note(fmt::format("collectives.intra_node.{}: no samples; kept from the base",
                       models::to_string(op)));
    }
  }
  // Per span and op, the largest group first: its curve is the one the profile holds.
  for (auto it = out_of_place.begin(); it != out_of_place.end();) {
    auto end = it;
    while (end != out_of_place.end() && end->first.span == it->first.span &&
           end->first.op == it->first.op) {
      ++end;
    }
    for (auto group = end; group != it;) {
      --group;
      const auto in_place_it = in_place.find(group->first);
      fit_collective_group(group->first, group->second,
                           in_place_it == in_place.end() ? nullptr : &in_place_it->second,
                           group->first.ranks == largest[{group->first.span, group->first.op}]);
    }
    it = end;
  }
}

void Fitter::fit_collective_group(const CollectiveGroupKey& key,
                                  const TimesBySize& times,
                                  const TimesBySize* in_place,
                                  bool in_profile) {
  const std::string path =
      fmt::format("collectives.{}.{}", models::to_string(key.span), models::to_string(key.op));
  const std::string what = fmt::format("{} on {} ranks", models::to_string(key.op), key.ranks);
  std::vector<CollectivePoint> points;
  bool repeated = false;
  for (const auto& [size, ts] : times) {
    repeated = repeated || ts.size() > 1;
    points.push_back({static_cast<double>(size), std::max(1.0, wire_bytes(key.op, key.ranks, size)),
                      median(ts)});
  }
  if (points.size() < 2) {
    note(fmt::format("{} ({}): one size only; not fitted", path, what));
    return;
  }
  CollectiveCurveFit f;
  try {
    f = fit_collective_curve(points, CollectiveFitOptions{});
  } catch (const InputError& e) {
    throw InputError("samples.collectives", fmt::format("{}: {}", what, e.what()));
  }
  CurveFit& row = add_row(in_profile ? path : fmt::format("{} ({} ranks)", path, key.ranks));
  row.samples = points.size();
  row.fit_mape = f.fit_mape;
  row.fit_max = f.fit_max;
  row.held_out = f.held_out;
  row.holdout_mape = f.holdout_mape;
  row.holdout_max = f.holdout_max;
  for (const CollectiveOutlier& o : f.outliers) {
    row.outliers.push_back(
        {fmt::format("{} {} ranks {}: measured {:.1f} us, expected {:.1f} us ({:+.0f}%; {})",
                     models::to_string(key.op), key.ranks, format_bytes(o.size_bytes),
                     o.measured_s * 1e6, o.expected_s * 1e6, o.deviation() * 100.0, o.reason),
         o.deviation()});
  }
  const std::string regimes = describe_regimes(f);
  note(fmt::format("{} ({}): {} regime(s): {}{}", path, what, f.regimes.size(), regimes,
                   repeated ? "; median of the repeated samples per size" : ""));
  if (in_place != nullptr) {
    std::vector<double> ratio;
    for (const auto& [size, ts] : *in_place) {
      if (const auto it = times.find(size); it != times.end()) {
        ratio.push_back(median(ts) / median(it->second));
      }
    }
    note(
        fmt::format("{} ({}): in-place / out-of-place time, median over {} sizes: {:.3f} (the fit "
                    "uses out-of-place)",
                    path, what, ratio.size(), median(ratio)));
  }
  const models::CollectiveModel model = to_profile_model(f, points, p().collective_launch_s);
  row.note =
      fmt::format("{} ranks, {} regime(s), alpha {:.1f} us, peak busbw {:.0f} GB/s{}{}", key.ranks,
                  f.regimes.size(), model.alpha_s * 1e6, model.peak_busbw_bytes_per_s / 1e9,
                  f.outliers.empty() ? "" : fmt::format(", {} outlier(s)", f.outliers.size()),
                  in_profile ? "; the main curve" : "; in the profile's by_ranks");
  const std::string detail = fmt::format(
      "NCCL {}, nccl-tests size and busbw conventions; piecewise alpha-beta over {} regime(s) "
      "({}){}",
      what, f.regimes.size(), regimes,
      f.outliers.empty() ? "" : fmt::format("; {} outlier(s) left out", f.outliers.size()));
  store_collective_model(key, path, model, row, detail, in_profile);
}

void Fitter::store_collective_model(const CollectiveGroupKey& key,
                                    const std::string& path,
                                    const models::CollectiveModel& model,
                                    const CurveFit& row,
                                    const std::string& detail,
                                    bool in_profile) {
  models::CollectiveModel& target = p().collectives[key.span][key.op];
  const auto set_sources = [&](const std::string& at) {
    set_source(at + ".alpha_s",
               sources.measured(row, detail + "; alpha here excludes compute.collective_launch_s"));
    set_source(at + ".peak_busbw_bytes_per_s",
               sources.measured(row, detail + "; best model busbw among bandwidth-bound sizes"));
    set_source(at + ".efficiency_by_size",
               sources.measured(row, detail + "; model busbw per measured size / peak"));
  };
  if (in_profile) {
    // The largest group is fitted first: it replaces the main curve and any per-group curves
    // the base had for this collective.
    static_cast<models::CollectiveCurve&>(target) = model;
    target.by_ranks.clear();
    auto& prov = p().provenance.edit();
    const std::string by_prefix = path + ".by_ranks.";
    for (auto it = prov.lower_bound(by_prefix);
         it != prov.end() && it->first.rfind(by_prefix, 0) == 0;) {
      it = prov.erase(it);
    }
    set_sources(path);
  }
  target.by_ranks[key.ranks] = static_cast<const models::CollectiveCurve&>(model);
  set_sources(fmt::format("{}.by_ranks.{}", path, key.ranks));
}

void Fitter::fit_interference() {
  std::vector<double> comm, copies;
  for (const InterferenceSample& s : raw.samples.interference) {
    (s.background == "all_to_all" ? comm : copies)
        .push_back(s.time_concurrent_s / s.time_alone_s - 1.0);
  }
  if (!copies.empty()) {
    note(
        fmt::format("attention under concurrent host copies: {:+.1f}% (median of {}; not in the "
                    "profile)",
                    median(copies) * 100.0, copies.size()));
  }
  if (comm.empty()) {
    note(
        "compute.compute_slowdown_under_comm: no all-to-all interference samples; kept from the "
        "base");
    return;
  }
  const double f = median(comm);
  CurveFit& row = add_row("compute.compute_slowdown_under_comm", false);
  row.samples = comm.size();
  ErrorStats e;
  for (const double x : comm) {
    e.add(1.0 + f, 1.0 + x);
  }
  row.fit_mape = e.mape();
  row.fit_max = e.max;
  row.note = fmt::format("{:+.1f}% under all-to-all", f * 100.0);
  p().compute_slowdown_under_comm = std::max(0.0, f);
  set_source("compute.compute_slowdown_under_comm",
             sources.measured(row,
                              "median of (time with a concurrent NCCL all-to-all / time "
                              "alone) - 1, attention forward; clamped at 0"));
}

}  // namespace

double attention_occupancy_factor(std::int64_t tiles, std::int64_t sm_count, std::int64_t block) {
  constexpr std::int64_t kReferenceTokensTimesHeads = 16 * 16384;
  const std::int64_t sms = std::max<std::int64_t>(1, sm_count);
  auto occ = [sms](std::int64_t t) {
    t = std::max<std::int64_t>(1, t);
    return static_cast<double>(t) / static_cast<double>(sms * ((t + sms - 1) / sms));
  };
  const std::int64_t ref_tiles = kReferenceTokensTimesHeads / std::max<std::int64_t>(1, block);
  return std::min(1.0, occ(tiles) / occ(ref_tiles));
}

double attention_flops(const AttentionSample& s) {
  double visible = static_cast<double>(s.kv_len);
  if (s.causal) {
    const double extra = static_cast<double>(std::max<std::int64_t>(0, s.kv_len - s.q_len));
    visible = (extra + static_cast<double>(s.kv_len)) / 2.0;
  }
  const double fwd = 4.0 * static_cast<double>(s.q_len) * visible * static_cast<double>(s.heads) *
                     static_cast<double>(s.head_dim);
  return s.pass == AttentionPass::kForward ? fwd : 2.5 * fwd;
}

namespace {

/// Per kernel: how many of its curves carry a "measured:" source. The recipes' kernels first.
std::vector<AttentionKernelOrigin> attention_origins(const models::HardwareProfile& profile,
                                                     const RawCalibration& raw) {
  std::vector<std::string> names = {"fa3", "fa2", "cudnn", "sdpa", "cpsim-flash"};
  std::set<std::string> others;
  for (const auto& [name, model] : profile.attention_kernels) {
    others.insert(name);
  }
  for (const AttentionSample& s : raw.samples.attention) {
    others.insert(s.kernel);
  }
  for (const std::string& name : others) {
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      names.push_back(name);
    }
  }
  std::vector<AttentionKernelOrigin> out;
  for (const std::string& name : names) {
    AttentionKernelOrigin o;
    o.kernel = name;
    o.samples = static_cast<std::size_t>(
        std::count_if(raw.samples.attention.begin(), raw.samples.attention.end(),
                      [&name](const AttentionSample& s) { return s.kernel == name; }));
    if (profile.attention_kernels.count(name) != 0) {
      o.curves = 4;
      for (const char* curve : {"fwd_causal_flops_per_s", "fwd_full_flops_per_s",
                                "bwd_causal_flops_per_s", "bwd_full_flops_per_s"}) {
        const auto it =
            profile.provenance.find(fmt::format("compute.attention_kernels.{}.{}", name, curve));
        if (it != profile.provenance.end() && it->second.rfind("measured:", 0) == 0) {
          ++o.measured_curves;
        }
      }
    }
    out.push_back(std::move(o));
  }
  return out;
}

}  // namespace

ProfileFit fit_profile(const RawCalibration& raw,
                       const models::HardwareProfile& base,
                       const FitOptions& options) {
  if (options.holdout_every < 2) {
    throw InputError("holdout_every", "must be at least 2");
  }
  Fitter f{raw, base, options, Sources(raw.context), ProfileFit{}};
  f.out.profile = base;
  // Order matters: launch overhead and memory efficiency enter the GEMM and attention inversions.
  f.fit_context();
  f.fit_launch();
  f.fit_memory();
  f.fit_gemm();
  f.fit_attention();
  f.fit_host_link();
  f.fit_collectives();
  f.fit_interference();
  f.out.attention_origins = attention_origins(f.out.profile, raw);
  return std::move(f.out);
}

namespace {

/// The row's first outlier off by more than a factor 1 + max_mape, if any.
const CurveFit::Outlier* refused_outlier(const CurveFit& row, double max_mape) {
  for (const CurveFit::Outlier& o : row.outliers) {
    if (std::abs(std::log1p(o.deviation)) > std::log1p(max_mape)) {
      return &o;
    }
  }
  return nullptr;
}

}  // namespace

namespace {

/// Per attention kernel: measured here, or still the base profile's published curves.
std::string format_attention_origins(const ProfileFit& fit) {
  std::string out = "\nattention kernels (what each prediction with that kernel uses):\n";
  for (const AttentionKernelOrigin& o : fit.attention_origins) {
    std::string what;
    if (o.curves == 0) {
      what = o.samples > 0
                 ? fmt::format("not fitted ({} samples do not cover its four curves)", o.samples)
                 : "absent from the profile";
    } else if (o.measured_curves == o.curves) {
      what = fmt::format("measured ({} samples)", o.samples);
    } else if (o.measured_curves > 0) {
      what = fmt::format("{} of {} curves measured ({} samples), the rest published (base)",
                         o.measured_curves, o.curves, o.samples);
    } else {
      what = "published (the base profile's curves; not measured here)";
    }
    if (o.kernel == "cpsim-flash" && o.curves > 0) {
      what += "; cpsim's own harness kernel, not one recipes train with";
    }
    out += fmt::format("  {:<16} {}\n", o.kernel, what);
  }
  return out;
}

}  // namespace

void check_fit_quality(const ProfileFit& fit, double max_mape) {
  for (const CurveFit& row : fit.curves) {
    if (row.checked && row.gate_error() > max_mape) {
      throw InputError(
          row.curve,
          fmt::format("{} MAPE {} exceeds --max-mape {} ({} samples); measure again or pass "
                      "--force to write the profile anyway",
                      row.held_out > 0 ? "hold-out" : "fit", percent(row.gate_error()),
                      percent(max_mape), row.samples));
    }
    if (const CurveFit::Outlier* o = row.checked ? refused_outlier(row, max_mape) : nullptr) {
      throw InputError(
          row.curve,
          fmt::format("outlier {} is off by more than --max-mape {} ({} outlier(s) in this "
                      "curve); measure again or pass --force to write the profile anyway",
                      o->name, percent(max_mape), row.outliers.size()));
    }
  }
}

std::string format_fit_report(const ProfileFit& fit, double max_mape) {
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"curve", "samples", "fit MAPE", "fit max", "held out", "hold-out MAPE",
                  "hold-out max", "status", "note"});
  for (const CurveFit& r : fit.curves) {
    const std::string status = !r.checked                                ? "info"
                               : r.gate_error() > max_mape               ? "EXCEEDS"
                               : refused_outlier(r, max_mape) != nullptr ? "OUTLIER"
                                                                         : "ok";
    rows.push_back({r.curve, std::to_string(r.samples), percent(r.fit_mape), percent(r.fit_max),
                    r.held_out > 0 ? std::to_string(r.held_out) : "-",
                    r.held_out > 0 ? percent(r.holdout_mape) : "-",
                    r.held_out > 0 ? percent(r.holdout_max) : "-", status, r.note});
  }
  std::vector<std::size_t> width(rows.front().size(), 0);
  for (const auto& row : rows) {
    for (std::size_t c = 0; c < row.size(); ++c) {
      width[c] = std::max(width[c], row[c].size());
    }
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      const bool numeric = c >= 1 && c <= 6;
      line += numeric ? fmt::format("{:>{}}", row[c], width[c])
                      : fmt::format("{:<{}}", row[c], width[c]);
      if (c + 1 < row.size()) {
        line += "  ";
      }
    }
    while (!line.empty() && line.back() == ' ') {
      line.pop_back();
    }
    out += line + "\n";
  }
  out += format_attention_origins(fit);
  std::string outliers;
  for (const CurveFit& r : fit.curves) {
    for (const CurveFit::Outlier& o : r.outliers) {
      outliers += "  - " + o.name + "\n";
    }
  }
  if (!outliers.empty()) {
    out +=
        "\noutliers (left out of the fit; refused above --max-mape unless --force):\n" + outliers;
  }
  if (!fit.notes.empty()) {
    out += "\nnotes:\n";
    for (const std::string& n : fit.notes) {
      out += "  - " + n + "\n";
    }
  }
  return out;
}

}  // namespace cpsim::calibrate
