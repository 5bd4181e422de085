#include "report_html.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <string_view>

#include <fmt/format.h>

#include "cpsim/models/units.hpp"

namespace cpsim::cli {
namespace {

using sim::MemCategory;
using sim::OpKind;
using sim::Stream;

constexpr double kGiBd = 1024.0 * 1024.0 * 1024.0;
constexpr const char* kOomColor = "#d62728";
constexpr const char* kLimitColor = "#d62728";
constexpr const char* kReservedColor = "#555555";

// ------------------------------------------------------------------------------------------------
// Text and numbers

std::string esc(std::string_view s) {
  std::string o;
  o.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      case '\'':
        o += "&#39;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

// A coordinate with 0.1 px precision, without a trailing ".0".
std::string px(double v) {
  if (!std::isfinite(v)) {
    v = 0.0;
  }
  const double r = std::round(v * 10.0) / 10.0;
  std::string s = fmt::format("{:.1f}", r == 0.0 ? 0.0 : r);
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) {
    s.resize(s.size() - 2);
  }
  return s;
}

std::string gib(double bytes) {
  return format_bytes(bytes);
}

std::string shorten(const std::string& s, std::size_t n) {
  if (s.size() <= n) {
    return s;
  }
  return s.substr(0, n - 3) + "...";
}

// Steps of 1, 2, 2.5, 5 × 10^k giving about `target` intervals over `span`.
double nice_step(double span, int target) {
  if (!(span > 0.0)) {
    return 1.0;
  }
  const double raw = span / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  const double nice = f <= 1.0 ? 1.0 : f <= 2.0 ? 2.0 : f <= 2.5 ? 2.5 : f <= 5.0 ? 5.0 : 10.0;
  return nice * mag;
}

int decimals_for(double step) {
  int d = 0;
  double scaled = step;
  while (d < 6 && std::fabs(scaled - std::round(scaled)) > 1e-6 * std::max(1.0, scaled)) {
    scaled *= 10.0;
    ++d;
  }
  return d;
}

struct Ticks {
  std::vector<double> values;
  int decimals = 0;
};

Ticks linear_ticks(double lo, double hi, int target) {
  Ticks t;
  const double step = nice_step(hi - lo, target);
  t.decimals = decimals_for(step);
  const auto first = static_cast<long long>(std::ceil(lo / step - 1e-9));
  const auto last = static_cast<long long>(std::floor(hi / step + 1e-9));
  for (long long k = first; k <= last; ++k) {
    t.values.push_back(static_cast<double>(k) * step);
  }
  return t;
}

std::string tick_label(double v, int decimals) {
  const double r = std::fabs(v) < 1e-12 ? 0.0 : v;
  return fmt::format("{:.{}f}", r, decimals);
}

struct Scale {
  double d0 = 0.0, d1 = 1.0, r0 = 0.0, r1 = 1.0;
  bool log = false;
  double operator()(double v) const {
    double a = v, b0 = d0, b1 = d1;
    if (log) {
      a = std::log(std::max(v, 1e-300));
      b0 = std::log(d0);
      b1 = std::log(d1);
    }
    if (b1 == b0) {
      return (r0 + r1) / 2.0;
    }
    return r0 + (a - b0) / (b1 - b0) * (r1 - r0);
  }
};

// Time axis unit for a step of `seconds`.
struct TimeUnit {
  double seconds = 1.0;
  const char* name = "s";
};

TimeUnit time_unit(double seconds) {
  if (seconds < 2e-3) {
    return {1e-6, "µs"};
  }
  if (seconds < 2.0) {
    return {1e-3, "ms"};
  }
  if (seconds < 300.0) {
    return {1.0, "s"};
  }
  if (seconds < 3.0 * 3600.0) {
    return {60.0, "min"};
  }
  return {3600.0, "h"};
}

// ------------------------------------------------------------------------------------------------
// Colours

std::string method_color(const std::string& method, std::size_t index) {
  for (const sim::CpImplementation* m : sim::cp_implementations()) {
    if (method == m->name()) {
      return std::string(m->report_color());
    }
  }
  static constexpr std::array<const char*, 4> kMore = {"#e377c2", "#7f7f7f", "#bcbd22", "#393b79"};
  return kMore[index % kMore.size()];
}

// Memory bands, bottom to top.
constexpr int kBands = 6;
constexpr std::array<const char*, kBands> kBandName = {
    "fixed", "model_states", "param_gather", "activations", "attention", "other"};
constexpr std::array<const char*, kBands> kBandColor = {"#9e9e9e", "#4e79a7", "#76b7b2",
                                                        "#59a14f", "#f28e2b", "#b07aa1"};
constexpr std::array<const char*, kBands> kBandHelp = {
    "CUDA context, NCCL buffers, cuBLAS workspace",
    "sharded fp32 parameters, gradients, optimizer states",
    "FSDP all-gathered parameters and unsharded gradients",
    "tensors saved for backward (checkpoints, linear inputs)",
    "attention-stage buffers: QKV, outputs, LSE, gradients",
    "MLP tiles, norms, loss chunks, residual gradients, workspaces"};

// Timeline bar classes.
constexpr int kBarClasses = 13;
constexpr std::array<const char*, kBarClasses> kBarName = {
    "GEMM",      "attention fwd", "attention bwd", "elementwise",    "loss",
    "optimizer", "all-to-all",    "all-gather",    "reduce-scatter", "all-reduce",
    "send/recv", "copy D2H",      "copy H2D"};
constexpr std::array<const char*, kBarClasses> kBarColor = {
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#59a14f",
    "#8cd17d", "#499894", "#86bcb6", "#b6992d", "#9c755f", "#d4a6c8"};

int bar_class(const sim::Workload& w, const sim::Op& o) {
  switch (o.kind) {
    case OpKind::kGemm:
      return 0;
    case OpKind::kAttentionFwd:
      return 1;
    case OpKind::kAttentionBwd:
      return 2;
    case OpKind::kElementwise:
      return 3;
    case OpKind::kLoss:
      return 4;
    case OpKind::kOptimizer:
      return 5;
    case OpKind::kCopyD2H:
      return 11;
    case OpKind::kCopyH2D:
      return 12;
    case OpKind::kCollective:
      break;
  }
  if (o.collective == sim::kNone) {
    return 6;
  }
  switch (w.collectives[static_cast<std::size_t>(o.collective)].kind) {
    case models::Collective::kAllToAll:
      return 6;
    case models::Collective::kAllGather:
      return 7;
    case models::Collective::kReduceScatter:
      return 8;
    case models::Collective::kAllReduce:
      return 9;
    case models::Collective::kSendRecv:
      return 10;
  }
  return 6;
}

constexpr int kPhases = 4;
constexpr std::array<const char*, kPhases> kPhaseColor = {"#c6dbef", "#fdd0a2", "#c7e9c0",
                                                          "#dadaeb"};

// ------------------------------------------------------------------------------------------------
// SVG pieces

using Out = std::string;

template <typename... Args>
void put(Out& o, fmt::format_string<Args...> f, Args&&... args) {
  fmt::format_to(std::back_inserter(o), f, std::forward<Args>(args)...);
}

void svg_open(Out& o, const std::string& id, int w, int h, const std::string& label) {
  put(o,
      "<svg id=\"{}\" class=\"chart\" viewBox=\"0 0 {} {}\" width=\"{}\" height=\"{}\" "
      "role=\"img\" aria-label=\"{}\">\n",
      id, w, h, w, h, esc(label));
}

void text(Out& o,
          double x,
          double y,
          const std::string& s,
          const char* anchor = "start",
          const char* cls = nullptr) {
  put(o, "<text x=\"{}\" y=\"{}\"", px(x), px(y));
  if (std::string_view(anchor) != "start") {
    put(o, " text-anchor=\"{}\"", anchor);
  }
  if (cls != nullptr) {
    put(o, " class=\"{}\"", cls);
  }
  put(o, ">{}</text>\n", esc(s));
}

struct Plot {
  double left, top, right, bottom;
};

// Horizontal grid lines with labels on the left.
void y_axis(Out& o,
            const Plot& p,
            const Scale& y,
            const std::vector<double>& values,
            const std::vector<std::string>& labels,
            const std::string& title) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double yy = y(values[i]);
    put(o, "<line class=\"grid\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>\n", px(p.left), px(yy),
        px(p.right), px(yy));
    text(o, p.left - 6, yy + 4, labels[i], "end", "tick");
  }
  const double cy = (p.top + p.bottom) / 2;
  put(o,
      "<text class=\"axis-title\" text-anchor=\"middle\" transform=\"translate({},{}) "
      "rotate(-90)\">{}</text>\n",
      px(p.left - 52), px(cy), esc(title));
}

void x_axis(Out& o,
            const Plot& p,
            const Scale& x,
            const std::vector<double>& values,
            const std::vector<std::string>& labels,
            const std::string& title,
            bool grid) {
  put(o, "<line class=\"axis\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>\n", px(p.left),
      px(p.bottom), px(p.right), px(p.bottom));
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double xx = x(values[i]);
    if (grid) {
      put(o, "<line class=\"grid\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>\n", px(xx), px(p.top),
          px(xx), px(p.bottom));
    }
    put(o, "<line class=\"axis\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>\n", px(xx), px(p.bottom),
        px(xx), px(p.bottom + 5));
    if (!labels[i].empty()) {
      text(o, xx, p.bottom + 18, labels[i], "middle", "tick");
    }
  }
  text(o, (p.left + p.right) / 2, p.bottom + 38, title, "middle", "axis-title");
}

void legend_swatch(Out& o, double x, double y, const char* color, const std::string& label) {
  put(o, "<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/>\n", px(x), px(y - 10),
      color);
  text(o, x + 18, y, label, "start", "legend");
}

void no_data(Out& o, const std::string& id, const std::string& message) {
  svg_open(o, id, 1100, 80, message);
  text(o, 550, 45, message, "middle", "empty");
  o += "</svg>\n";
}

std::vector<std::string> tick_labels(const Ticks& t) {
  std::vector<std::string> l;
  for (double v : t.values) {
    l.push_back(tick_label(v, t.decimals));
  }
  return l;
}

// Time axis of the step shared by the memory and timeline charts (same plot x-range).
constexpr double kWideLeft = 80, kWideRight = 930;
constexpr int kWideWidth = 1100;

// ------------------------------------------------------------------------------------------------
// 1. Memory over one step (rank 0), stacked by category.

struct MemPoint {
  SimTime t = 0;
  std::array<double, kBands> v{};
  double total() const {
    double s = 0;
    for (double b : v) {
      s += b;
    }
    return s;
  }
};

std::vector<MemPoint> memory_series(const sim::Workload& w,
                                    const sim::SimResult& r,
                                    int buckets_wanted,
                                    int* raw) {
  std::vector<sim::MemorySample> s;
  for (const auto& m : r.memory_samples) {
    if (m.rank == 0) {
      s.push_back(m);
    }
  }
  std::stable_sort(s.begin(), s.end(), [](const sim::MemorySample& a, const sim::MemorySample& b) {
    return a.time_ns < b.time_ns;
  });
  const sim::StaticMemory sm = w.static_memory.empty() ? sim::StaticMemory{} : w.static_memory[0];
  auto to_point = [&](SimTime t, const std::array<std::int64_t, sim::kMemCategoryCount>& dev) {
    MemPoint p;
    p.t = t;
    p.v[0] = static_cast<double>(sm.fixed_overhead_bytes);
    p.v[1] = static_cast<double>(dev[0] + sm.model_states_bytes);
    for (int c = 1; c < sim::kMemCategoryCount; ++c) {
      p.v[static_cast<std::size_t>(c + 1)] = static_cast<double>(dev[static_cast<std::size_t>(c)]);
    }
    return p;
  };
  std::vector<MemPoint> pts;
  if (s.empty() || s.front().time_ns > 0) {
    pts.push_back(to_point(0, {}));
  }
  for (std::size_t k = 0; k < s.size(); ++k) {
    // The state after all changes at one instant.
    if (k + 1 < s.size() && s[k + 1].time_ns == s[k].time_ns) {
      continue;
    }
    pts.push_back(to_point(s[k].time_ns, s[k].device_bytes));
  }
  *raw = static_cast<int>(pts.size());
  const SimTime T = std::max<SimTime>(r.step_time_ns, 1);
  // Downsample to the upper envelope: equal time buckets (one per pixel column, at most
  // kMaxMemoryPoints), each showing the state with the highest total during the bucket (the one it
  // starts in or one reached inside it), so the peak survives; equal neighbours are merged.
  const auto buckets = static_cast<SimTime>(std::clamp(buckets_wanted, 1, kMaxMemoryPoints));
  std::vector<MemPoint> out;
  std::size_t i = 0;
  MemPoint cur = pts.front();
  for (SimTime b = 0; b < buckets; ++b) {
    const SimTime t0 = b * T / buckets;
    const SimTime t1 = b + 1 == buckets ? T + 1 : (b + 1) * T / buckets;
    bool have = i >= pts.size() || pts[i].t > t0;  // the state carried in lasts a while
    MemPoint best = cur;
    for (; i < pts.size() && pts[i].t < t1; ++i) {
      cur = pts[i];
      if (!have || cur.total() > best.total()) {
        best = cur;
        have = true;
      }
    }
    best.t = t0;
    if (out.empty() || out.back().v != best.v) {
      out.push_back(best);
    }
  }
  return out;
}

void memory_chart(Out& o, const StepDetail& d, std::string* caption) {
  const auto& w = *d.evaluation.workload;
  const auto& r = *d.evaluation.result;
  const auto& rep = d.evaluation.report;
  int raw = 0;
  const int columns = static_cast<int>(kWideRight - kWideLeft);
  const std::vector<MemPoint> pts = memory_series(w, r, columns, &raw);
  const SimTime T = std::max<SimTime>(r.step_time_ns, 1);
  const double step_s = simtime_to_seconds(T);
  const TimeUnit unit = time_unit(step_s);

  std::size_t peak_i = 0;
  for (std::size_t i = 0; i < pts.size(); ++i) {
    if (pts[i].total() > pts[peak_i].total()) {
      peak_i = i;
    }
  }
  const double peak = pts.empty() ? 0.0 : pts[peak_i].total();
  const double cap = static_cast<double>(rep.gpu_capacity_bytes);
  const auto reserved = static_cast<double>(rep.reserved_peak_bytes);  // 0: not modelled
  const double ymax_gib = std::max({peak, cap, reserved}) * 1.06 / kGiBd;

  const int H = 400;
  const Plot p{kWideLeft, 30, kWideRight, 340};
  const Scale x{0.0, step_s / unit.seconds, p.left, p.right};
  const Scale y{0.0, ymax_gib, p.bottom, p.top};
  svg_open(o, "svg-memory", kWideWidth, H,
           fmt::format("GPU memory of rank 0 over one step, {} at {}", d.method,
                       format_length(d.seq_len)));
  const Ticks yt = linear_ticks(0.0, ymax_gib, 8);
  y_axis(o, p, y, yt.values, tick_labels(yt), "GPU memory (GiB)");

  // Stacked areas: the area under each cumulative level, top level first, in the colour of the
  // band it ends with, so each band shows between its level and the one below.
  auto gx = [&](SimTime t) { return x(simtime_to_seconds(t) / unit.seconds); };
  for (int k = kBands - 1; k >= 0; --k) {
    auto level = [&](const MemPoint& m) {
      double s = 0;
      for (int b = 0; b <= k; ++b) {
        s += m.v[static_cast<std::size_t>(b)];
      }
      return y(s / kGiBd);
    };
    std::string path = fmt::format("M{},{}", px(p.left), px(p.bottom));
    std::string last_x, last_y;
    for (std::size_t i = 0; i < pts.size(); ++i) {
      const std::string xs = px(gx(pts[i].t));
      const std::string ys = px(level(pts[i]));
      if (i == 0) {
        path += fmt::format("V{}", ys);
        last_x = px(p.left);
        last_y = ys;
        if (xs != last_x) {
          path += "H" + xs;
          last_x = xs;
        }
        continue;
      }
      if (ys == last_y) {
        continue;
      }
      if (xs != last_x) {
        path += "H" + xs;
        last_x = xs;
      }
      path += "V" + ys;
      last_y = ys;
    }
    path += fmt::format("H{}V{}Z", px(p.right), px(p.bottom));
    put(o, "<path class=\"area\" fill=\"{}\" d=\"{}\"><title>{}</title></path>\n",
        kBandColor[static_cast<std::size_t>(k)], path,
        esc(fmt::format("{} and below", kBandName[static_cast<std::size_t>(k)])));
  }

  const Ticks xt = linear_ticks(0.0, step_s / unit.seconds, 10);
  x_axis(o, p, x, xt.values, tick_labels(xt), fmt::format("time in the step ({})", unit.name),
         false);

  // GPU limit.
  const double ly = y(cap / kGiBd);
  put(o, "<line class=\"limit\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\"/>\n",
      px(p.left), px(ly), px(p.right), px(ly), kLimitColor);
  text(o, p.right - 4, ly - 6, fmt::format("GPU memory {}", gib(cap)), "end", "limit-label");

  // Reserved memory (the caching allocator model): what nvidia-smi would show at most.
  if (reserved > 0) {
    const double ry = y(reserved / kGiBd);
    put(o, "<line class=\"reserved\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\"/>\n",
        px(p.left), px(ry), px(p.right), px(ry), kReservedColor);
    const double ty = std::abs(ry - ly) < 14 ? ry + 16 : ry - 6;
    text(o, p.left + 6, ty, fmt::format("reserved (nvidia-smi) {}", gib(reserved)), "start",
         "reserved-label");
  }

  // Peak marker.
  if (!pts.empty()) {
    const double pxx = gx(pts[peak_i].t);
    const double pyy = y(peak / kGiBd);
    put(o, "<circle cx=\"{}\" cy=\"{}\" r=\"4\" class=\"peak\"/>\n", px(pxx), px(pyy));
    const bool left = pxx > (p.left + p.right) / 2;
    const double ty = std::abs(pyy - ly) < 18 ? pyy + 18 : pyy - 8;
    text(o, left ? pxx - 8 : pxx + 8, ty, fmt::format("peak {}", gib(peak)), left ? "end" : "start",
         "peak-label");
  }

  // Legend: bands top to bottom as stacked.
  double ly2 = p.top + 10;
  text(o, 950, ly2, "category (stacked)", "start", "legend-title");
  ly2 += 20;
  for (int k = kBands - 1; k >= 0; --k) {
    legend_swatch(o, 950, ly2, kBandColor[static_cast<std::size_t>(k)],
                  kBandName[static_cast<std::size_t>(k)]);
    ly2 += 20;
  }
  ly2 += 6;
  put(o, "<line class=\"limit\" x1=\"950\" y1=\"{}\" x2=\"962\" y2=\"{}\" stroke=\"{}\"/>\n",
      px(ly2 - 4), px(ly2 - 4), kLimitColor);
  text(o, 968, ly2, "GPU limit", "start", "legend");
  ly2 += 20;
  if (reserved > 0) {
    put(o, "<line class=\"reserved\" x1=\"950\" y1=\"{}\" x2=\"962\" y2=\"{}\" stroke=\"{}\"/>\n",
        px(ly2 - 4), px(ly2 - 4), kReservedColor);
    text(o, 968, ly2, "reserved peak", "start", "legend");
    ly2 += 20;
  }
  put(o, "<circle cx=\"956\" cy=\"{}\" r=\"4\" class=\"peak\"/>\n", px(ly2 - 4));
  text(o, 968, ly2, "peak of rank 0", "start", "legend");
  o += "</svg>\n";

  *caption = fmt::format(
      "{} at {} ({} tokens): device memory of rank 0 of {} over one step of {}. Peak of rank 0 "
      "{}{}; "
      "{} memory changes downsampled to {} points (the highest total in each of {} time buckets, "
      "one "
      "per pixel).",
      d.method, format_length(d.seq_len), d.seq_len, w.represented_ranks,
      format_seconds(rep.step_time_s), gib(peak),
      rep.peak_rank == 0 && !rep.peak_op.empty() ? ", at " + rep.peak_op : "", raw, pts.size(),
      columns);
  if (rep.peak_rank != 0) {
    *caption += fmt::format(" The highest peak of the step is on rank {}: {} at {}.", rep.peak_rank,
                            gib(static_cast<double>(rep.peak_memory_bytes)), rep.peak_op);
  }
  if (reserved > 0) {
    *caption += fmt::format(
        " The dotted line is the memory PyTorch's caching allocator would hold at most (reserved, "
        "what nvidia-smi shows), from a model of the allocator replayed over the step: {}.",
        gib(reserved));
  }
}

// ------------------------------------------------------------------------------------------------
// 2. Step timeline per stream (rank 0).

std::string busy_percent(double fraction) {
  const double p = 100.0 * fraction;
  return p > 0.0 && p < 9.95 ? fmt::format("{:.1f} %", p) : fmt::format("{:.0f} %", p);
}

void timeline_chart(Out& o, const StepDetail& d, std::string* caption) {
  const auto& w = *d.evaluation.workload;
  const auto& r = *d.evaluation.result;
  const auto& rep = d.evaluation.report;
  const SimTime T = std::max<SimTime>(r.step_time_ns, 1);
  const double step_s = simtime_to_seconds(T);
  const TimeUnit unit = time_unit(step_s);
  const int cols = static_cast<int>(kWideRight - kWideLeft);  // one column per pixel
  const double colw = static_cast<double>(T) / cols;

  // Time each bar class (and, on the compute stream, each phase) covers in each pixel column.
  std::vector<std::vector<std::array<double, kBarClasses>>> cover(
      sim::kStreamCount,
      std::vector<std::array<double, kBarClasses>>(static_cast<std::size_t>(cols)));
  std::vector<std::array<double, kPhases>> phase(static_cast<std::size_t>(cols));
  std::array<bool, kBarClasses> used{};
  std::int64_t n_ops = 0;
  for (const sim::OpInterval& iv : r.intervals) {
    const sim::Op& op = w.ops[static_cast<std::size_t>(iv.op)];
    if (op.rank != 0 || iv.end_ns <= iv.start_ns) {
      continue;
    }
    ++n_ops;
    const int cls = bar_class(w, op);
    used[static_cast<std::size_t>(cls)] = true;
    const double s = static_cast<double>(iv.start_ns);
    const double e = static_cast<double>(iv.end_ns);
    const int c0 = std::clamp(static_cast<int>(std::floor(s / colw)), 0, cols - 1);
    const int c1 = std::clamp(static_cast<int>(std::floor(e / colw)), 0, cols - 1);
    for (int c = c0; c <= c1; ++c) {
      const double ov = std::min(e, (c + 1) * colw) - std::max(s, c * colw);
      if (ov <= 0) {
        continue;
      }
      cover[static_cast<std::size_t>(op.stream)][static_cast<std::size_t>(c)]
           [static_cast<std::size_t>(cls)] += ov;
      if (op.stream == Stream::kCompute) {
        phase[static_cast<std::size_t>(c)][static_cast<std::size_t>(op.phase)] += ov;
      }
    }
  }

  const double row_h = 30, bar_h = 22;
  const double strip_y = 34, rows_y = 56;
  const Plot p{kWideLeft, strip_y, kWideRight, rows_y + sim::kStreamCount * row_h + 4};
  int used_count = 0;
  for (bool u : used) {
    used_count += u ? 1 : 0;
  }
  const int H = static_cast<int>(std::max(p.bottom + 60, 40.0 + (used_count + kPhases + 3) * 18));
  const Scale x{0.0, step_s / unit.seconds, p.left, p.right};
  svg_open(o, "svg-timeline", kWideWidth, H,
           fmt::format("Step timeline of rank 0 per stream, {} at {}", d.method,
                       format_length(d.seq_len)));

  // Phase strip above the streams (from the compute stream).
  text(o, p.left - 6, strip_y + 9, "phase", "end", "tick");
  {
    int c = 0;
    while (c < cols) {
      const auto& ph = phase[static_cast<std::size_t>(c)];
      int best = -1;
      double most = 0;
      for (int k = 0; k < kPhases; ++k) {
        if (ph[static_cast<std::size_t>(k)] > most) {
          most = ph[static_cast<std::size_t>(k)];
          best = k;
        }
      }
      int e = c + 1;
      while (e < cols) {
        const auto& q = phase[static_cast<std::size_t>(e)];
        int b2 = -1;
        double m2 = 0;
        for (int k = 0; k < kPhases; ++k) {
          if (q[static_cast<std::size_t>(k)] > m2) {
            m2 = q[static_cast<std::size_t>(k)];
            b2 = k;
          }
        }
        if (b2 != best) {
          break;
        }
        ++e;
      }
      if (best >= 0) {
        put(o, "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"12\" fill=\"{}\"/>\n", px(p.left + c),
            px(strip_y), e - c, kPhaseColor[static_cast<std::size_t>(best)]);
      }
      c = e;
    }
  }

  // One row per stream: columns coloured by the class that covers most of the column, lighter
  // where the stream is busy for only part of the column; runs of equal columns merged.
  for (int s = 0; s < sim::kStreamCount; ++s) {
    const double ry = rows_y + s * row_h;
    const double busy = rep.stream_busy_s[static_cast<std::size_t>(s)];
    put(o, "<g><title>{}</title>\n",
        esc(fmt::format("{}: busy {} of {} ({})", sim::to_string(static_cast<Stream>(s)),
                        format_seconds(busy), format_seconds(step_s),
                        busy_percent(busy / step_s))));
    put(o, "<rect class=\"lane\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>\n", px(p.left),
        px(ry), px(p.right - p.left), px(bar_h));
    text(o, p.left - 6, ry + 11, sim::to_string(static_cast<Stream>(s)), "end", "tick");
    text(o, p.left - 6, ry + 22, busy_percent(busy / step_s), "end", "tick-small");
    const auto& cv = cover[static_cast<std::size_t>(s)];
    auto column = [&](int c, int* cls, int* lvl) {
      const auto& a = cv[static_cast<std::size_t>(c)];
      double total = 0, most = 0;
      *cls = -1;
      for (int k = 0; k < kBarClasses; ++k) {
        total += a[static_cast<std::size_t>(k)];
        if (a[static_cast<std::size_t>(k)] > most) {
          most = a[static_cast<std::size_t>(k)];
          *cls = k;
        }
      }
      const double frac = std::min(1.0, total / colw);
      *lvl = std::clamp(static_cast<int>(std::ceil(frac * 4.0 - 1e-9)), 1, 4);
    };
    int c = 0;
    while (c < cols) {
      int cls = 0, lvl = 0;
      column(c, &cls, &lvl);
      int e = c + 1;
      while (e < cols) {
        int c2 = 0, l2 = 0;
        column(e, &c2, &l2);
        if (c2 != cls || l2 != lvl) {
          break;
        }
        ++e;
      }
      if (cls >= 0) {
        put(o, "<rect class=\"b{}{}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>\n", cls,
            lvl < 4 ? fmt::format(" o{}", lvl) : std::string(), px(p.left + c), px(ry), e - c,
            px(bar_h));
      }
      c = e;
    }
    o += "</g>\n";
  }
  const Ticks xt = linear_ticks(0.0, step_s / unit.seconds, 10);
  x_axis(o, p, x, xt.values, tick_labels(xt), fmt::format("time in the step ({})", unit.name),
         false);

  // Legend: op classes present, then phases.
  double ly = 20;
  text(o, 950, ly, "op kind", "start", "legend-title");
  ly += 18;
  for (int k = 0; k < kBarClasses; ++k) {
    if (!used[static_cast<std::size_t>(k)]) {
      continue;
    }
    legend_swatch(o, 950, ly, kBarColor[static_cast<std::size_t>(k)],
                  kBarName[static_cast<std::size_t>(k)]);
    ly += 18;
  }
  ly += 6;
  text(o, 950, ly, "phase (strip)", "start", "legend-title");
  ly += 18;
  for (int k = 0; k < kPhases; ++k) {
    legend_swatch(o, 950, ly, kPhaseColor[static_cast<std::size_t>(k)],
                  sim::to_string(static_cast<sim::Phase>(k)));
    ly += 18;
  }
  o += "</svg>\n";

  *caption = fmt::format(
      "{} at {}: the {} ops of rank 0 on its five streams, one pixel column per {} of the step; a "
      "column takes the colour of the op kind that covers most of it and is lighter when the "
      "stream "
      "is busy for only part of it. Step {}, exposed (not covered by compute) {}.",
      d.method, format_length(d.seq_len), n_ops, format_seconds(step_s / cols),
      format_seconds(step_s), format_seconds(rep.exposed_comm_s));
}

// ------------------------------------------------------------------------------------------------
// 3. Throughput and peak memory vs sequence length.

struct SeriesPoint {
  std::int64_t seq = 0;
  double value = 0;
  bool fits = true;
  std::string tip;
};

struct Series {
  std::string name;
  std::string color;
  std::vector<SeriesPoint> points;
};

std::vector<double> log2_ticks(const std::vector<std::int64_t>& lengths) {
  std::vector<double> t;
  for (std::int64_t l : lengths) {
    t.push_back(static_cast<double>(l));
  }
  return t;
}

void length_chart(Out& o,
                  const std::string& id,
                  const std::string& title,
                  const std::string& y_title,
                  const std::vector<std::int64_t>& lengths,
                  const std::vector<Series>& series,
                  bool log_y,
                  double limit_gib) {
  const int W = 580, H = 420;
  const Plot p{78, 40, 560, 318};
  double lo = 1e300, hi = 0;
  for (const auto& s : series) {
    for (const auto& pt : s.points) {
      lo = std::min(lo, pt.value);
      hi = std::max(hi, pt.value);
    }
  }
  if (limit_gib > 0) {
    hi = std::max(hi, limit_gib);
  }
  if (hi <= 0) {
    hi = 1;
    lo = 1;
  }
  const double x0 = static_cast<double>(lengths.front());
  const double x1 = static_cast<double>(lengths.back());
  const double pad = lengths.size() == 1 ? 2.0 : std::pow(x1 / x0, 0.05);
  const Scale x{x0 / pad, x1 * pad, p.left, p.right, true};
  svg_open(o, id, W, H, title);
  text(o, (p.left + p.right) / 2, 22, title, "middle", "chart-title");
  Scale y;
  std::vector<double> yv;
  std::vector<std::string> yl;
  if (log_y) {
    lo = std::max(lo, hi * 1e-6);
    double d0 = lo / 1.5, d1 = hi * 1.5;
    // Ticks at 1, 2, 5 × 10^k; with fewer than two in range, widen the range to include them.
    auto collect = [&]() {
      yv.clear();
      for (int e = static_cast<int>(std::floor(std::log10(d0))) - 1;
           e <= static_cast<int>(std::ceil(std::log10(d1))); ++e) {
        for (double m : {1.0, 2.0, 5.0}) {
          const double v = m * std::pow(10.0, e);
          if (v >= d0 * 0.999 && v <= d1 * 1.001) {
            yv.push_back(v);
          }
        }
      }
    };
    collect();
    if (yv.size() < 2) {
      d0 = std::pow(10.0, std::floor(std::log10(d0)));
      d1 = std::pow(10.0, std::ceil(std::log10(d1)));
      collect();
    }
    y = Scale{d0, d1, p.bottom, p.top, true};
    for (double v : yv) {
      yl.push_back(v >= 1e6   ? fmt::format("{:.0f}M", v / 1e6)
                   : v >= 1e4 ? fmt::format("{:.0f}k", v / 1e3)
                   : v >= 1   ? fmt::format("{:.0f}", v)
                              : fmt::format("{}", v));
    }
  } else {
    const double top = hi * 1.08;
    y = Scale{0.0, top, p.bottom, p.top};
    const Ticks t = linear_ticks(0.0, top, 7);
    yv = t.values;
    for (double v : yv) {
      yl.push_back(tick_label(v, t.decimals));
    }
  }
  y_axis(o, p, y, yv, yl, y_title);
  std::vector<double> xv = log2_ticks(lengths);
  std::vector<std::string> xl;
  const std::size_t every = lengths.size() > 10 ? 2 : 1;
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    xl.push_back(i % every == 0 ? format_length(lengths[i]) : std::string());
  }
  x_axis(o, p, x, xv, xl, "sequence length (tokens, log2 scale)", true);
  if (limit_gib > 0) {
    const double ly = y(limit_gib);
    put(o, "<line class=\"limit\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\"/>\n",
        px(p.left), px(ly), px(p.right), px(ly), kLimitColor);
    text(o, p.left + 4, ly - 5, fmt::format("GPU memory {:.1f} GiB", limit_gib), "start",
         "limit-label");
  }
  // Lines: solid between points that fit, dashed where either end does not.
  for (const auto& s : series) {
    std::string solid, dashed;
    for (std::size_t i = 0; i + 1 < s.points.size(); ++i) {
      const auto& a = s.points[i];
      const auto& b = s.points[i + 1];
      std::string& d = a.fits && b.fits ? solid : dashed;
      d += fmt::format("M{},{}L{},{}", px(x(static_cast<double>(a.seq))), px(y(a.value)),
                       px(x(static_cast<double>(b.seq))), px(y(b.value)));
    }
    if (!solid.empty()) {
      put(o, "<path class=\"series\" stroke=\"{}\" d=\"{}\"/>\n", s.color, solid);
    }
    if (!dashed.empty()) {
      put(o, "<path class=\"series dashed\" stroke=\"{}\" d=\"{}\"/>\n", s.color, dashed);
    }
  }
  for (const auto& s : series) {
    for (const auto& pt : s.points) {
      const double cx = x(static_cast<double>(pt.seq));
      const double cy = y(pt.value);
      if (pt.fits) {
        put(o, "<circle cx=\"{}\" cy=\"{}\" r=\"4\" fill=\"{}\"><title>{}</title></circle>\n",
            px(cx), px(cy), s.color, esc(pt.tip));
      } else {
        put(o,
            "<path class=\"oom\" stroke=\"{}\" d=\"M{},{}L{},{}M{},{}L{},{}\"><title>{}</title>"
            "</path>\n",
            kOomColor, px(cx - 5), px(cy - 5), px(cx + 5), px(cy + 5), px(cx - 5), px(cy + 5),
            px(cx + 5), px(cy - 5), esc(pt.tip));
      }
    }
  }
  // Legend below the axis title, flowing over rows.
  double lx = p.left - 40, ly = 380;
  auto advance = [&](std::size_t chars) {
    const double wdt = 34 + 7.2 * static_cast<double>(chars);
    if (lx + wdt > W - 6) {
      lx = p.left - 40;
      ly += 20;
    }
    const double at = lx;
    lx += wdt;
    return at;
  };
  for (const auto& s : series) {
    const double at = advance(s.name.size());
    put(o,
        "<line class=\"series\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\"/><circle "
        "cx=\"{}\" cy=\"{}\" r=\"3.5\" fill=\"{}\"/>\n",
        px(at), px(ly - 4), px(at + 22), px(ly - 4), s.color, px(at + 11), px(ly - 4), s.color);
    text(o, at + 27, ly, s.name, "start", "legend");
  }
  const std::string oom = "does not fit (OOM)";
  const double at = advance(oom.size());
  put(o, "<path class=\"oom\" stroke=\"{}\" d=\"M{},{}L{},{}M{},{}L{},{}\"/>\n", kOomColor,
      px(at + 6), px(ly - 9), px(at + 16), px(ly + 1), px(at + 6), px(ly + 1), px(at + 16),
      px(ly - 9));
  text(o, at + 27, ly, oom, "start", "legend");
  o += "</svg>\n";
}

// ------------------------------------------------------------------------------------------------
// 4. Longest context per method.

void maxlen_chart(Out& o, const ReportPage& page) {
  const auto& ms = page.methods;
  const double row_h = 34;
  const Plot p{110, 40, 760, 40 + row_h * static_cast<double>(ms.size()) + 6};
  const int H = static_cast<int>(p.bottom + 52);
  std::int64_t longest = 0;
  for (const auto& m : ms) {
    if (m.has_max && m.max_error.empty()) {
      longest = std::max(longest, m.max.max_seq_len);
    }
  }
  // The axis covers the longest context and the swept lengths; ticks in M (or K) tokens.
  if (longest == 0 && !page.lengths.empty()) {
    longest = page.lengths.back();
  }
  const bool in_m = longest >= 2 * kMiB;
  const double unit = in_m ? static_cast<double>(kMiB) : static_cast<double>(kKiB);
  const double dmax = std::max(1.0, static_cast<double>(longest) * 1.08 / unit);
  const Scale x{0.0, dmax, p.left, p.right};
  svg_open(o, "svg-maxlen", kWideWidth, H, "Longest context per method");
  text(o, (p.left + p.right) / 2, 22,
       fmt::format("Longest sequence that fits (searched in steps of {})",
                   format_length(page.max_granularity)),
       "middle", "chart-title");
  const Ticks t = linear_ticks(0.0, dmax, 8);
  std::vector<std::string> labels;
  for (double v : t.values) {
    const double tokens = v * unit;
    labels.push_back(tokens <= 0 ? std::string("0")
                     : std::fabs(tokens - std::round(tokens)) < 1e-6
                         ? format_length(static_cast<std::int64_t>(std::llround(tokens)))
                         : tick_label(v, t.decimals) + (in_m ? "M" : "K"));
  }
  x_axis(o, p, x, t.values, labels, "tokens", true);
  for (std::size_t i = 0; i < ms.size(); ++i) {
    const auto& m = ms[i];
    const double ry = p.top + row_h * static_cast<double>(i) + 6;
    text(o, p.left - 8, ry + 15, m.method, "end", "tick");
    const std::string color = method_color(m.method, i);
    if (!m.error.empty() || !m.max_error.empty()) {
      const std::string why = !m.error.empty() ? m.error : m.max_error;
      put(o, "<g><title>{}</title>\n", esc(why));
      text(o, p.left + 6, ry + 15, "cannot run: " + shorten(why, 110), "start", "muted");
      o += "</g>\n";
      continue;
    }
    if (!m.has_max) {
      continue;
    }
    const auto& r = m.max;
    if (r.max_seq_len == 0) {
      put(o, "<g><title>{}</title>\n", esc(r.binding.text));
      text(o, p.left + 6, ry + 15, fmt::format("not even {} fits", format_length(r.step)), "start",
           "muted");
      o += "</g>\n";
      continue;
    }
    const double xe = x(static_cast<double>(r.max_seq_len) / unit);
    put(o,
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"22\" fill=\"{}\"><title>{}</title></rect>\n",
        px(p.left), px(ry), px(xe - p.left), color,
        esc(fmt::format("{}: {} ({} tokens); one step more: {}", m.method,
                        format_length(r.max_seq_len), r.max_seq_len, r.binding.text)));
    text(o, xe + 6, ry + 15,
         fmt::format("{}  ·  {:.1f} tokens/s/GPU, peak {}", format_length(r.max_seq_len),
                     r.at_max.tokens_per_s_per_gpu,
                     gib(static_cast<double>(r.at_max.peak_memory_bytes))),
         "start", "bar-label");
  }
  o += "</svg>\n";
}

// ------------------------------------------------------------------------------------------------
// Page

constexpr const char* kStyle = R"(
body{font-family:"DejaVu Sans",Arial,Helvetica,sans-serif;color:#222;background:#fff;margin:0;}
main{max-width:1180px;margin:0 auto;padding:16px 20px 40px;}
h1{font-size:22px;margin:8px 0 4px;}
h2{font-size:17px;margin:26px 0 6px;border-bottom:1px solid #ddd;padding-bottom:4px;}
p.sub,p.cap,footer{color:#555;font-size:13px;margin:4px 0 8px;}
ul.notes{font-size:12.5px;color:#444;margin:6px 0;padding-left:20px;}
ul.notes li{margin:2px 0;}
.row{display:flex;flex-wrap:wrap;gap:12px;}
svg.chart{display:block;max-width:100%;height:auto;background:#fff;}
svg text{font-family:"DejaVu Sans",Arial,Helvetica,sans-serif;fill:#333;font-size:12px;}
svg text.tick{font-size:11px;fill:#444;}
svg text.tick-small{font-size:9.5px;fill:#777;}
svg text.axis-title{font-size:12px;fill:#333;}
svg text.chart-title{font-size:13.5px;font-weight:bold;}
svg text.legend{font-size:11.5px;}
svg text.legend-title{font-size:11.5px;font-weight:bold;}
svg text.limit-label{font-size:11px;fill:#d62728;paint-order:stroke;stroke:#fff;stroke-width:3px;}
svg text.peak-label{font-size:11.5px;font-weight:bold;fill:#111;paint-order:stroke;stroke:#fff;stroke-width:3px;}
svg text.bar-label{font-size:11.5px;}
svg text.muted,svg text.empty{fill:#888;font-style:italic;}
svg line.grid{stroke:#e4e4e4;stroke-width:1;}
svg line.axis{stroke:#666;stroke-width:1;}
svg line.limit{stroke-width:1.6;stroke-dasharray:6 4;}
svg line.reserved{stroke-width:1.4;stroke-dasharray:2 3;}
svg text.reserved-label{font-size:11px;fill:#555;paint-order:stroke;stroke:#fff;stroke-width:3px;}
svg circle.peak{fill:#111;stroke:#fff;stroke-width:1.5;}
svg rect.lane{fill:#f4f4f4;}
svg path.area{shape-rendering:crispEdges;}
svg .series{fill:none;stroke-width:2;}
svg .dashed{stroke-dasharray:5 4;}
svg path.oom{fill:none;stroke-width:2.4;}
svg .o1{opacity:.35;} svg .o2{opacity:.55;} svg .o3{opacity:.78;}
table{border-collapse:collapse;font-size:12.5px;margin:8px 0 14px;}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top;}
th{background:#f3f3f3;}
th.num{text-align:right;}
td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums;}
td.oom{background:#fdecea;}
td.na{color:#999;}
td.nowrap{white-space:nowrap;}
.scroll{overflow-x:auto;}
span.swatch{display:inline-block;width:10px;height:10px;margin-right:6px;border-radius:2px;}
)";

std::string bar_css() {
  std::string s;
  for (int k = 0; k < kBarClasses; ++k) {
    s += fmt::format("svg rect.b{}{{fill:{};}}\n", k, kBarColor[static_cast<std::size_t>(k)]);
  }
  return s;
}

void setup_table(Out& o, const ReportPage& page) {
  const MethodSweep* ref = nullptr;
  for (const auto& m : page.methods) {
    if (m.error.empty()) {
      ref = &m;
      break;
    }
  }
  if (ref == nullptr) {
    return;
  }
  const auto& in = ref->inputs;
  const auto& md = in.model;
  const auto& hw = in.hardware;
  const auto& r = in.recipe;
  const auto params = models::count_parameters(md);
  std::vector<std::pair<std::string, std::string>> rows = {
      {"model",
       fmt::format("{}: {:.2f} B parameters, {} layers, hidden {}, {} query / {} KV heads of {}, "
                   "FFN {}, vocabulary {}",
                   md.name, static_cast<double>(params.total) / 1e9, md.layers, md.hidden, md.heads,
                   md.kv_heads, md.head_dim, md.ffn_hidden, md.vocab)},
      {"GPUs",
       fmt::format("{} ({} per node, {} node{})", in.parallel.gpus, in.parallel.gpus_per_node,
                   (in.parallel.gpus + in.parallel.gpus_per_node - 1) / in.parallel.gpus_per_node,
                   in.parallel.gpus > in.parallel.gpus_per_node ? "s" : "")},
      {"hardware",
       fmt::format("{} ({}): {} HBM, {:.0f} TFLOP/s bf16 dense, {} pinned host memory per node",
                   hw.name, hw.gpu_name, gib(static_cast<double>(hw.hbm_capacity_bytes)),
                   hw.peak_bf16_flops_per_s / 1e12,
                   gib(static_cast<double>(hw.host_memory_bytes_per_node)))},
      {"recipe", r.name + (r.description.empty() ? "" : ": " + r.description)},
      {"ZeRO / FSDP",
       fmt::format("ZeRO-{}, prefetch {} layer{}, optimizer {}{}", r.zero_stage,
                   r.fsdp_prefetch_layers, r.fsdp_prefetch_layers == 1 ? "" : "s", r.optimizer,
                   r.optimizer_offload ? ", offloaded to host (CPU Adam)" : "")},
      {"activation checkpointing",
       fmt::format("{}{}", models::to_string(r.checkpointing),
                   r.checkpointing == models::CheckpointMode::kFull
                       ? (r.checkpoint_offload ? ", checkpoints offloaded to host"
                                               : ", checkpoints on GPU")
                       : "")},
      {"kernels and memory",
       fmt::format(
           "{} attention, {} MLP, {} norms, {} loss, CP communication in {}", r.attention_kernel,
           r.tiled_mlp
               ? (r.tiled_mlp_shards > 0 ? fmt::format("tiled ({} shards)", r.tiled_mlp_shards)
                                         : std::string("tiled"))
               : std::string("untiled"),
           r.tiled_norm ? "tiled" : "untiled",
           r.fused_loss ? "fused linear cross-entropy" : "materialised-logits",
           r.cp_comm_bytes == 4 ? "fp32" : "bf16")},
  };
  std::string lens;
  for (std::size_t i = 0; i < page.lengths.size(); ++i) {
    lens += (i ? ", " : "") + format_length(page.lengths[i]);
  }
  rows.push_back({"sequence lengths", lens});
  o += "<table id=\"config-setup\">\n";
  for (const auto& [k, v] : rows) {
    put(o, "<tr><th>{}</th><td>{}</td></tr>\n", esc(k), esc(v));
  }
  o += "</table>\n";
}

void methods_table(Out& o, const ReportPage& page) {
  o += "<table id=\"config-methods\">\n<tr><th>method</th><th>degrees</th><th>longest "
       "context</th><th>at the longest context</th><th>one step longer</th></tr>\n";
  for (std::size_t i = 0; i < page.methods.size(); ++i) {
    const auto& m = page.methods[i];
    put(o, "<tr><td class=\"nowrap\"><span class=\"swatch\" style=\"background:{}\"></span>{}</td>",
        method_color(m.method, i), esc(m.method));
    if (!m.error.empty()) {
      put(o, "<td colspan=\"4\" class=\"na\">cannot run this configuration: {}</td></tr>\n",
          esc(m.error));
      continue;
    }
    put(o, "<td>{}</td>", esc(m.degrees));
    if (!m.has_max) {
      o += "<td class=\"na\">-</td><td class=\"na\">-</td><td class=\"na\">-</td>";
    } else if (!m.max_error.empty()) {
      put(o, "<td colspan=\"3\" class=\"na\">cannot search: {}</td>", esc(m.max_error));
    } else if (m.max.max_seq_len == 0) {
      put(o, "<td class=\"num\">none</td><td class=\"na\">-</td><td>{}</td>",
          esc(m.max.binding.text));
    } else {
      const auto& r = m.max.at_max;
      put(o,
          "<td class=\"num\">{}</td><td class=\"nowrap\">step {}, {:.1f} tok/s/GPU, peak {}, "
          "headroom {}</td><td>{}</td>",
          format_length(m.max.max_seq_len), format_seconds(r.step_time_s), r.tokens_per_s_per_gpu,
          gib(static_cast<double>(r.peak_memory_bytes)),
          gib(static_cast<double>(m.max.headroom_bytes)), esc(m.max.binding.text));
    }
    o += "</tr>\n";
  }
  o += "</table>\n";

  o += "<p class=\"cap\">At each length: step time, tokens/s per GPU, peak GPU memory (highest "
       "rank) and whether the step fits; red cells do not fit (hover for the reason).</p>\n";
  o += "<div class=\"scroll\"><table id=\"config-results\">\n<tr><th>method</th>";
  for (std::int64_t l : page.lengths) {
    put(o, "<th class=\"num\">{}</th>", format_length(l));
  }
  o += "</tr>\n";
  for (std::size_t i = 0; i < page.methods.size(); ++i) {
    const auto& m = page.methods[i];
    put(o, "<tr><td class=\"nowrap\"><span class=\"swatch\" style=\"background:{}\"></span>{}</td>",
        method_color(m.method, i), esc(m.method));
    for (const auto& pt : m.points) {
      if (!pt.error.empty()) {
        put(o, "<td class=\"na\" title=\"{}\">cannot run</td>", esc(pt.error));
        continue;
      }
      const auto& rep = pt.report;
      put(o, "<td class=\"num{}\"{}>{}<br>{:.1f} tok/s<br>{}<br>{}</td>", rep.fits() ? "" : " oom",
          rep.fits() ? std::string() : fmt::format(" title=\"{}\"", esc(rep.binding)),
          format_seconds(rep.step_time_s), rep.tokens_per_s_per_gpu,
          gib(static_cast<double>(rep.peak_memory_bytes)),
          rep.fits() ? "fits" : (rep.fits_gpu ? "OOM (host)" : "OOM (GPU)"));
    }
    o += "</tr>\n";
  }
  o += "</table></div>\n";
}

}  // namespace

std::string render_report_html(const ReportPage& page) {
  Out o;
  o.reserve(1 << 20);
  o += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  o += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  put(o, "<title>{}</title>\n<style>{}{}</style>\n</head>\n<body>\n<main>\n", esc(page.title),
      kStyle, bar_css());
  put(o, "<h1>{}</h1>\n", esc(page.title));
  {
    std::string names;
    for (const auto& m : page.methods) {
      names += (names.empty() ? "" : ", ") + m.method;
    }
    put(o, "<p class=\"sub\">Methods: {}. Sequence lengths: {}{}. Simulated by {}.</p>\n",
        esc(names), format_length(page.lengths.front()),
        page.lengths.size() > 1 ? " to " + format_length(page.lengths.back()) + " (powers of two)"
                                : std::string(),
        esc(page.version));
  }

  // 1 and 2: one step of one configuration.
  std::string cap1, cap2;
  Out mem, tl;
  if (page.detail) {
    memory_chart(mem, *page.detail, &cap1);
    timeline_chart(tl, *page.detail, &cap2);
  } else {
    no_data(mem, "svg-memory", "no method runs at any length of the sweep");
    no_data(tl, "svg-timeline", "no method runs at any length of the sweep");
  }
  o += "<section id=\"sec-memory\">\n<h2>1. GPU memory over one step (rank 0)</h2>\n";
  put(o, "<p class=\"cap\">{}</p>\n{}</section>\n", esc(cap1), mem);
  o += "<section id=\"sec-timeline\">\n<h2>2. Step timeline per stream (rank 0)</h2>\n";
  put(o, "<p class=\"cap\">{}</p>\n{}</section>\n", esc(cap2), tl);

  // 3: throughput and peak vs length.
  std::vector<Series> tput, peak;
  std::vector<std::string> notes;
  double cap_gib = 0;
  for (std::size_t i = 0; i < page.methods.size(); ++i) {
    const auto& m = page.methods[i];
    if (!m.error.empty()) {
      notes.push_back(fmt::format("{}: cannot run this configuration: {}", m.method, m.error));
      continue;
    }
    Series a{m.method, method_color(m.method, i), {}};
    Series b = a;
    for (const auto& pt : m.points) {
      if (!pt.error.empty()) {
        notes.push_back(
            fmt::format("{} at {}: cannot run: {}", m.method, format_length(pt.seq_len), pt.error));
        continue;
      }
      const auto& rep = pt.report;
      cap_gib = std::max(cap_gib, static_cast<double>(rep.gpu_capacity_bytes) / kGiBd);
      const std::string tip = fmt::format(
          "{} at {}: {:.1f} tokens/s/GPU, step {}, peak {}, {}", m.method,
          format_length(pt.seq_len), rep.tokens_per_s_per_gpu, format_seconds(rep.step_time_s),
          gib(static_cast<double>(rep.peak_memory_bytes)),
          rep.fits() ? "fits" : "does not fit (" + rep.binding + ")");
      a.points.push_back({pt.seq_len, rep.tokens_per_s_per_gpu, rep.fits(), tip});
      b.points.push_back(
          {pt.seq_len, static_cast<double>(rep.peak_memory_bytes) / kGiBd, rep.fits(), tip});
    }
    tput.push_back(std::move(a));
    peak.push_back(std::move(b));
  }
  o += "<section id=\"sec-throughput\">\n<h2>3. Throughput and peak memory vs sequence "
       "length</h2>\n";
  o +=
      "<p class=\"cap\">One line per method; a red × marks a length that does not fit (GPU or host "
      "memory); the line is dashed where it does not fit. Throughput is simulated even where the "
      "step would run out of memory.</p>\n<div class=\"row\">\n";
  length_chart(o, "svg-throughput", "Training throughput", "tokens/s per GPU (log scale)",
               page.lengths, tput, true, 0.0);
  length_chart(o, "svg-peak", "Peak GPU memory (highest rank)", "peak GPU memory (GiB)",
               page.lengths, peak, false, cap_gib);
  o += "</div>\n";
  if (!notes.empty()) {
    o += "<ul class=\"notes\">\n";
    for (const auto& n : notes) {
      put(o, "<li>{}</li>\n", esc(n));
    }
    o += "</ul>\n";
  }
  o += "</section>\n";

  // 4: longest context.
  o += "<section id=\"sec-maxlen\">\n<h2>4. Longest context per method</h2>\n";
  o += "<p class=\"cap\">The longest sequence whose step fits in GPU and host memory, with the "
       "throughput and peak there; below, what stops each method one step longer.</p>\n";
  maxlen_chart(o, page);
  o += "<ul class=\"notes\">\n";
  for (const auto& m : page.methods) {
    if (!m.error.empty()) {
      put(o, "<li><b>{}</b>: cannot run: {}</li>\n", esc(m.method), esc(m.error));
    } else if (!m.max_error.empty()) {
      put(o, "<li><b>{}</b>: cannot search: {}</li>\n", esc(m.method), esc(m.max_error));
    } else if (m.has_max) {
      put(o, "<li><b>{}</b>: {}</li>\n", esc(m.method), esc(m.max.binding.text));
    }
  }
  o += "</ul>\n</section>\n";

  // 5: configuration.
  o += "<section id=\"sec-config\">\n<h2>5. Configuration and results</h2>\n";
  setup_table(o, page);
  methods_table(o, page);
  o += "</section>\n";
  put(o,
      "<footer>Generated by {}. Self-contained: no scripts, fonts or images are loaded.</footer>\n",
      esc(page.version));
  o += "</main>\n</body>\n</html>\n";
  return o;
}

}  // namespace cpsim::cli
