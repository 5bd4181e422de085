#include "report_html.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <string_view>

#include <fmt/format.h>

#include "cpsim/models/units.hpp"

#include "report_data.hpp"

namespace cpsim::cli {
namespace {

using sim::MemCategory;
using sim::OpKind;
using sim::Phase;
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
  for (const sim::CpScheme* m : sim::cp_schemes()) {
    if (method == m->name()) {
      return std::string(m->report_color());
    }
  }
  static constexpr std::array<const char*, 4> kMore = {"#e377c2", "#7f7f7f", "#bcbd22", "#393b79"};
  return kMore[index % kMore.size()];
}

const char* memory_band_color(int band) {
  const MemoryBand b = memory_band(band);
  if (b.fixed) {
    return "#9e9e9e";
  }
  switch (b.category) {
    case MemCategory::kModelStates:
      return "#4e79a7";
    case MemCategory::kParamGather:
      return "#76b7b2";
    case MemCategory::kGradBuffers:
      return "#edc948";
    case MemCategory::kActivations:
      return "#59a14f";
    case MemCategory::kAttention:
      return "#f28e2b";
    case MemCategory::kOther:
      return "#b07aa1";
  }
  return "#b07aa1";
}

const char* collective_color(models::Collective c) {
  switch (c) {
    case models::Collective::kAllToAll:
      return "#59a14f";
    case models::Collective::kAllGather:
      return "#8cd17d";
    case models::Collective::kReduceScatter:
      return "#499894";
    case models::Collective::kAllReduce:
      return "#86bcb6";
    case models::Collective::kSendRecv:
      return "#b6992d";
  }
  return "#59a14f";
}

const char* op_class_color(OpClass c) {
  switch (c.kind) {
    case OpKind::kGemm:
      return "#4e79a7";
    case OpKind::kAttentionFwd:
      return "#f28e2b";
    case OpKind::kAttentionBwd:
      return "#e15759";
    case OpKind::kElementwise:
      return "#76b7b2";
    case OpKind::kLoss:
      return "#edc948";
    case OpKind::kOptimizer:
      return "#b07aa1";
    case OpKind::kCollective:
      return collective_color(c.collective);
    case OpKind::kCopyD2H:
      return "#9c755f";
    case OpKind::kCopyH2D:
      return "#d4a6c8";
  }
  return "#4e79a7";
}

const char* phase_color(Phase phase) {
  switch (phase) {
    case Phase::kForward:
      return "#c6dbef";
    case Phase::kRecompute:
      return "#fdd0a2";
    case Phase::kBackward:
      return "#c7e9c0";
    case Phase::kOptimizer:
      return "#dadaeb";
  }
  return "#c6dbef";
}

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

// The outline of the area under the cumulative level of bands 0..k, as an SVG path: steps along
// the points, horizontal and vertical moves only, pixel-rounded moves merged.
template <typename X, typename Y>
std::string stacked_area_path(
    const std::vector<MemPoint>& pts, int k, const Plot& p, const X& gx, const Y& y) {
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
  return path;
}

// The GPU's limit and, when modelled, the reserved memory as lines; returns the limit's y.
double memory_limit_lines(Out& o, const Plot& p, const Scale& y, double cap, double reserved) {
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
  return ly;
}

// Legend: bands top to bottom as stacked, the limit, the reserved memory, the peak.
void memory_legend(Out& o, const Plot& p, bool reserved) {
  double ly2 = p.top + 10;
  text(o, 950, ly2, "category (stacked)", "start", "legend-title");
  ly2 += 20;
  for (int k = kMemoryBandCount - 1; k >= 0; --k) {
    legend_swatch(o, 950, ly2, memory_band_color(k), std::string(memory_band_name(k)));
    ly2 += 20;
  }
  ly2 += 6;
  put(o, "<line class=\"limit\" x1=\"950\" y1=\"{}\" x2=\"962\" y2=\"{}\" stroke=\"{}\"/>\n",
      px(ly2 - 4), px(ly2 - 4), kLimitColor);
  text(o, 968, ly2, "GPU limit", "start", "legend");
  ly2 += 20;
  if (reserved) {
    put(o, "<line class=\"reserved\" x1=\"950\" y1=\"{}\" x2=\"962\" y2=\"{}\" stroke=\"{}\"/>\n",
        px(ly2 - 4), px(ly2 - 4), kReservedColor);
    text(o, 968, ly2, "reserved peak", "start", "legend");
    ly2 += 20;
  }
  put(o, "<circle cx=\"956\" cy=\"{}\" r=\"4\" class=\"peak\"/>\n", px(ly2 - 4));
  text(o, 968, ly2, "peak of rank 0", "start", "legend");
}

std::string memory_caption(
    const StepDetail& d, double peak, int raw, std::size_t points, int columns) {
  const auto& rep = d.evaluation.report;
  const auto reserved = static_cast<double>(rep.reserved_peak_bytes);
  std::string caption = fmt::format(
      "{} at {} ({} tokens): device memory of rank 0 of {} over one step of {}. Peak of rank 0 "
      "{}{}; "
      "{} memory changes downsampled to {} points (the highest total in each of {} time buckets, "
      "one "
      "per pixel).",
      d.method, format_length(d.seq_len), d.seq_len, d.evaluation.workload->represented_ranks,
      format_seconds(rep.step_time_s), gib(peak),
      rep.peak_rank == 0 && !rep.peak_op.empty() ? ", at " + rep.peak_op : "", raw, points,
      columns);
  if (rep.peak_rank != 0) {
    caption += fmt::format(" The highest peak of the step is on rank {}: {} at {}.", rep.peak_rank,
                           gib(static_cast<double>(rep.peak_memory_bytes)), rep.peak_op);
  }
  if (reserved > 0) {
    caption += fmt::format(
        " The dotted line is the memory PyTorch's caching allocator would hold at most (reserved, "
        "what nvidia-smi shows), from a model of the allocator replayed over the step: {}.",
        gib(reserved));
  }
  return caption;
}

void memory_chart(Out& o, const StepDetail& d, std::string* caption) {
  const auto& w = *d.evaluation.workload;
  const auto& r = *d.evaluation.result;
  const auto& rep = d.evaluation.report;
  const int columns = static_cast<int>(kWideRight - kWideLeft);
  const MemorySeries series = memory_series(w, r, columns);
  const std::vector<MemPoint>& pts = series.points;
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
  for (int k = kMemoryBandCount - 1; k >= 0; --k) {
    put(o, "<path class=\"area\" fill=\"{}\" d=\"{}\"><title>{}</title></path>\n",
        memory_band_color(k), stacked_area_path(pts, k, p, gx, y),
        esc(fmt::format("{} and below", memory_band_name(k))));
  }

  const Ticks xt = linear_ticks(0.0, step_s / unit.seconds, 10);
  x_axis(o, p, x, xt.values, tick_labels(xt), fmt::format("time in the step ({})", unit.name),
         false);
  const double ly = memory_limit_lines(o, p, y, cap, reserved);

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
  memory_legend(o, p, reserved > 0);
  o += "</svg>\n";
  *caption = memory_caption(d, peak, series.states, pts.size(), columns);
}

// ------------------------------------------------------------------------------------------------
// 2. Step timeline per stream (rank 0).

std::string busy_percent(double fraction) {
  const double p = 100.0 * fraction;
  return p > 0.0 && p < 9.95 ? fmt::format("{:.1f} %", p) : fmt::format("{:.0f} %", p);
}

// The phase that covers most of one column; -1 when none does.
int dominant_phase(const std::array<double, sim::kPhaseCount>& ph) {
  int best = -1;
  double most = 0;
  for (int k = 0; k < sim::kPhaseCount; ++k) {
    if (ph[static_cast<std::size_t>(k)] > most) {
      most = ph[static_cast<std::size_t>(k)];
      best = k;
    }
  }
  return best;
}

// The phase strip above the streams (from the compute stream): runs of columns of one phase.
void phase_strip(
    Out& o, const TimelineCoverage& coverage, const Plot& p, double strip_y, int cols) {
  const auto& phase = coverage.by_phase;
  text(o, p.left - 6, strip_y + 9, "phase", "end", "tick");
  int c = 0;
  while (c < cols) {
    const int best = dominant_phase(phase[static_cast<std::size_t>(c)]);
    int e = c + 1;
    while (e < cols && dominant_phase(phase[static_cast<std::size_t>(e)]) == best) {
      ++e;
    }
    if (best >= 0) {
      put(o, "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"12\" fill=\"{}\"/>\n", px(p.left + c),
          px(strip_y), e - c, phase_color(static_cast<Phase>(best)));
    }
    c = e;
  }
}

// One stream's row: columns coloured by the class that covers most of the column, lighter where
// the stream is busy for only part of the column; runs of equal columns merged.
void stream_row(Out& o,
                const TimelineCoverage& coverage,
                const sim::StepReport& rep,
                const Plot& p,
                int s,
                double ry,
                double bar_h,
                double step_s,
                int cols) {
  const double busy = rep.stream_busy_s[static_cast<std::size_t>(s)];
  put(o, "<g><title>{}</title>\n",
      esc(fmt::format("{}: busy {} of {} ({})", sim::to_string(static_cast<Stream>(s)),
                      format_seconds(busy), format_seconds(step_s), busy_percent(busy / step_s))));
  put(o, "<rect class=\"lane\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>\n", px(p.left),
      px(ry), px(p.right - p.left), px(bar_h));
  text(o, p.left - 6, ry + 11, sim::to_string(static_cast<Stream>(s)), "end", "tick");
  text(o, p.left - 6, ry + 22, busy_percent(busy / step_s), "end", "tick-small");
  const auto& cv = coverage.by_class[static_cast<std::size_t>(s)];
  const double colw = coverage.column_ns;
  auto column = [&](int c, int* cls, int* lvl) {
    const auto& a = cv[static_cast<std::size_t>(c)];
    double total = 0, most = 0;
    *cls = -1;
    for (int k = 0; k < kOpClassCount; ++k) {
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

// Legend: op classes present, then phases.
void timeline_legend(Out& o, const std::array<bool, kOpClassCount>& used) {
  constexpr auto kClasses = all_op_classes();
  double ly = 20;
  text(o, 950, ly, "op kind", "start", "legend-title");
  ly += 18;
  for (int k = 0; k < kOpClassCount; ++k) {
    if (!used[static_cast<std::size_t>(k)]) {
      continue;
    }
    const OpClass c = kClasses[static_cast<std::size_t>(k)];
    legend_swatch(o, 950, ly, op_class_color(c), std::string(op_class_name(c)));
    ly += 18;
  }
  ly += 6;
  text(o, 950, ly, "phase (strip)", "start", "legend-title");
  ly += 18;
  for (int k = 0; k < sim::kPhaseCount; ++k) {
    legend_swatch(o, 950, ly, phase_color(static_cast<Phase>(k)),
                  sim::to_string(static_cast<Phase>(k)));
    ly += 18;
  }
}

void timeline_chart(Out& o, const StepDetail& d, std::string* caption) {
  const auto& w = *d.evaluation.workload;
  const auto& r = *d.evaluation.result;
  const auto& rep = d.evaluation.report;
  const SimTime T = std::max<SimTime>(r.step_time_ns, 1);
  const double step_s = simtime_to_seconds(T);
  const TimeUnit unit = time_unit(step_s);
  const int cols = static_cast<int>(kWideRight - kWideLeft);  // one column per pixel

  const TimelineCoverage coverage = timeline_coverage(w, r, cols);
  const double row_h = 30, bar_h = 22;
  const double strip_y = 34, rows_y = 56;
  const Plot p{kWideLeft, strip_y, kWideRight, rows_y + sim::kStreamCount * row_h + 4};
  int used_count = 0;
  for (bool u : coverage.used) {
    used_count += u ? 1 : 0;
  }
  const int H =
      static_cast<int>(std::max(p.bottom + 60, 40.0 + (used_count + sim::kPhaseCount + 3) * 18));
  const Scale x{0.0, step_s / unit.seconds, p.left, p.right};
  svg_open(o, "svg-timeline", kWideWidth, H,
           fmt::format("Step timeline of rank 0 per stream, {} at {}", d.method,
                       format_length(d.seq_len)));
  phase_strip(o, coverage, p, strip_y, cols);
  for (int s = 0; s < sim::kStreamCount; ++s) {
    stream_row(o, coverage, rep, p, s, rows_y + s * row_h, bar_h, step_s, cols);
  }
  const Ticks xt = linear_ticks(0.0, step_s / unit.seconds, 10);
  x_axis(o, p, x, xt.values, tick_labels(xt), fmt::format("time in the step ({})", unit.name),
         false);
  timeline_legend(o, coverage.used);
  o += "</svg>\n";

  *caption = fmt::format(
      "{} at {}: the {} ops of rank 0 on its five streams, one pixel column per {} of the step; a "
      "column takes the colour of the op kind that covers most of it and is lighter when the "
      "stream "
      "is busy for only part of it. Step {}, exposed (not covered by compute) {}.",
      d.method, format_length(d.seq_len), coverage.ops, format_seconds(step_s / cols),
      format_seconds(step_s), format_seconds(rep.exposed_comm_s));
}

// ------------------------------------------------------------------------------------------------
// 3. Throughput and peak memory vs sequence length.

std::vector<double> log2_ticks(const std::vector<std::int64_t>& lengths) {
  std::vector<double> t;
  for (std::int64_t l : lengths) {
    t.push_back(static_cast<double>(l));
  }
  return t;
}

// The y axis of a chart over lengths: its scale, tick values and labels.
struct YAxis {
  Scale scale;
  std::vector<double> values;
  std::vector<std::string> labels;
};

// Log axis with ticks at 1, 2, 5 × 10^k; with fewer than two in range, the range widens to
// include them.
YAxis log_y_axis(double lo, double hi, const Plot& p) {
  YAxis a;
  lo = std::max(lo, hi * 1e-6);
  double d0 = lo / 1.5, d1 = hi * 1.5;
  auto collect = [&]() {
    a.values.clear();
    for (int e = static_cast<int>(std::floor(std::log10(d0))) - 1;
         e <= static_cast<int>(std::ceil(std::log10(d1))); ++e) {
      for (double m : {1.0, 2.0, 5.0}) {
        const double v = m * std::pow(10.0, e);
        if (v >= d0 * 0.999 && v <= d1 * 1.001) {
          a.values.push_back(v);
        }
      }
    }
  };
  collect();
  if (a.values.size() < 2) {
    d0 = std::pow(10.0, std::floor(std::log10(d0)));
    d1 = std::pow(10.0, std::ceil(std::log10(d1)));
    collect();
  }
  a.scale = Scale{d0, d1, p.bottom, p.top, true};
  for (double v : a.values) {
    a.labels.push_back(v >= 1e6   ? fmt::format("{:.0f}M", v / 1e6)
                       : v >= 1e4 ? fmt::format("{:.0f}k", v / 1e3)
                       : v >= 1   ? fmt::format("{:.0f}", v)
                                  : fmt::format("{}", v));
  }
  return a;
}

// Linear axis: percent from a round 5 % below the lowest point to just above 100 %, else from 0
// to 8 % above the highest.
YAxis linear_y_axis(double lo, double hi, bool percent, const Plot& p) {
  YAxis a;
  const double bottom = percent ? std::max(0.0, 5.0 * std::floor(lo / 5.0) - 5.0) : 0.0;
  const double top = percent ? std::max(hi, 100.0) + 2.0 : hi * 1.08;
  a.scale = Scale{bottom, top, p.bottom, p.top};
  const Ticks t = linear_ticks(bottom, top, 7);
  a.values = t.values;
  for (double v : a.values) {
    a.labels.push_back(tick_label(v, t.decimals) + (percent ? " %" : ""));
  }
  return a;
}

// Each series' lines (solid between points that fit, dashed where either end does not), then its
// points (a cross where it does not fit).
void length_series(Out& o, const std::vector<Series>& series, const Scale& x, const Scale& y) {
  for (const auto& s : series) {
    std::string solid, dashed;
    for (std::size_t i = 0; i + 1 < s.points.size(); ++i) {
      const auto& a = s.points[i];
      const auto& b = s.points[i + 1];
      std::string& d = a.fits && b.fits ? solid : dashed;
      d += fmt::format("M{},{}L{},{}", px(x(static_cast<double>(a.seq))), px(y(a.value)),
                       px(x(static_cast<double>(b.seq))), px(y(b.value)));
    }
    const std::string color = method_color(s.name, s.method_index);
    if (!solid.empty()) {
      put(o, "<path class=\"series\" stroke=\"{}\" d=\"{}\"/>\n", color, solid);
    }
    if (!dashed.empty()) {
      put(o, "<path class=\"series dashed\" stroke=\"{}\" d=\"{}\"/>\n", color, dashed);
    }
  }
  for (const auto& s : series) {
    const std::string color = method_color(s.name, s.method_index);
    for (const auto& pt : s.points) {
      const double cx = x(static_cast<double>(pt.seq));
      const double cy = y(pt.value);
      if (pt.fits) {
        put(o, "<circle cx=\"{}\" cy=\"{}\" r=\"4\" fill=\"{}\"><title>{}</title></circle>\n",
            px(cx), px(cy), color, esc(pt.tip));
      } else {
        put(o,
            "<path class=\"oom\" stroke=\"{}\" d=\"M{},{}L{},{}M{},{}L{},{}\"><title>{}</title>"
            "</path>\n",
            kOomColor, px(cx - 5), px(cy - 5), px(cx + 5), px(cy + 5), px(cx - 5), px(cy + 5),
            px(cx + 5), px(cy - 5), esc(pt.tip));
      }
    }
  }
}

// Legend below the axis title, flowing over rows: the series, then the OOM mark.
void length_legend(Out& o, const std::vector<Series>& series, const Plot& p, int width) {
  double lx = p.left - 40, ly = 380;
  auto advance = [&](std::size_t chars) {
    const double wdt = 34 + 7.2 * static_cast<double>(chars);
    if (lx + wdt > width - 6) {
      lx = p.left - 40;
      ly += 20;
    }
    const double at = lx;
    lx += wdt;
    return at;
  };
  for (const auto& s : series) {
    const double at = advance(s.name.size());
    const std::string color = method_color(s.name, s.method_index);
    put(o,
        "<line class=\"series\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\"/><circle "
        "cx=\"{}\" cy=\"{}\" r=\"3.5\" fill=\"{}\"/>\n",
        px(at), px(ly - 4), px(at + 22), px(ly - 4), color, px(at + 11), px(ly - 4), color);
    text(o, at + 27, ly, s.name, "start", "legend");
  }
  const std::string oom = "does not fit (OOM)";
  const double at = advance(oom.size());
  put(o, "<path class=\"oom\" stroke=\"{}\" d=\"M{},{}L{},{}M{},{}L{},{}\"/>\n", kOomColor,
      px(at + 6), px(ly - 9), px(at + 16), px(ly + 1), px(at + 6), px(ly + 1), px(at + 16),
      px(ly - 9));
  text(o, at + 27, ly, oom, "start", "legend");
}

void length_chart(Out& o,
                  const std::string& id,
                  const std::string& title,
                  const std::string& y_title,
                  const std::vector<std::int64_t>& lengths,
                  const std::vector<Series>& series,
                  bool log_y,
                  double limit_gib,
                  bool percent = false) {
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
  const YAxis ya = log_y ? log_y_axis(lo, hi, p) : linear_y_axis(lo, hi, percent, p);
  const Scale& y = ya.scale;
  y_axis(o, p, y, ya.values, ya.labels, y_title);
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
    text(o, p.left + 4, ly - 5, fmt::format("usable: capacity − margin, {:.1f} GiB", limit_gib),
         "start", "limit-label");
  }
  length_series(o, series, x, y);
  length_legend(o, series, p, W);
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
  for (const OpClass c : all_op_classes()) {
    s += fmt::format("svg rect.b{}{{fill:{};}}\n", op_class_index(c), op_class_color(c));
  }
  return s;
}

void setup_table(Out& o, const ReportPage& page) {
  const auto rows = setup_rows(page);
  if (rows.empty()) {
    return;
  }
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

namespace {

// The page's head, title and the line naming the methods, lengths and version.
void page_head(Out& o, const ReportPage& page) {
  o += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  o += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  put(o, "<title>{}</title>\n<style>{}{}</style>\n</head>\n<body>\n<main>\n", esc(page.title),
      kStyle, bar_css());
  put(o, "<h1>{}</h1>\n", esc(page.title));
  std::string names;
  for (const auto& m : page.methods) {
    names += (names.empty() ? "" : ", ") + m.method;
  }
  put(o, "<p class=\"sub\">Methods: {}. Sequence lengths: {}{}. Simulated by {}.</p>\n", esc(names),
      format_length(page.lengths.front()),
      page.lengths.size() > 1 ? " to " + format_length(page.lengths.back()) + " (powers of two)"
                              : std::string(),
      esc(page.version));
}

// Sections 1 and 2: one step of one configuration.
void step_sections(Out& o, const ReportPage& page) {
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
}

// Section 3: throughput and peak vs length.
void length_section(Out& o, const ReportPage& page) {
  const LengthSeries lengths = length_series(page);
  const std::vector<std::string>& notes = lengths.notes;
  o += "<section id=\"sec-throughput\">\n<h2>3. Throughput and peak memory vs sequence "
       "length</h2>\n";
  o +=
      "<p class=\"cap\">One line per method; a red × marks a length that does not fit (GPU or host "
      "memory); the line is dashed where it does not fit. The memory chart plots what the fit is "
      "judged on, the caching allocator's reserved memory with the fixed overheads, against the "
      "capacity less the margin. Throughput is simulated even where the "
      "step would run out of memory, and drawn relative to the fastest method that fits at each "
      "length (100 %; where none fits, the fastest simulated), so methods a few per cent apart "
      "stay apart; the absolute tokens/s per GPU is in each point's tooltip and in the tables "
      "below.</p>\n<div class=\"row\">\n";
  length_chart(o, "svg-throughput", "Training throughput relative to the fastest",
               "tokens/s per GPU, % of the fastest that fits", page.lengths,
               lengths.relative_throughput, false, 0.0, true);
  length_chart(o, "svg-peak", "GPU memory the fit is judged on (highest rank)",
               "reserved GPU memory (GiB)", page.lengths, lengths.peak, false, lengths.usable_gib);
  o += "</div>\n";
  if (!notes.empty()) {
    o += "<ul class=\"notes\">\n";
    for (const auto& n : notes) {
      put(o, "<li>{}</li>\n", esc(n));
    }
    o += "</ul>\n";
  }
  o += "</section>\n";
}

// Section 4: the longest context per method and what stops each one step longer.
void maxlen_section(Out& o, const ReportPage& page) {
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
}

// ------------------------------------------------------------------------------------------------
// 6. Packed batches: the step time's distribution per load balancer, as the share of batches
// whose step takes at most t (a step function per balancer), and the one-document step.

void batches_chart(Out& o, const BatchDetail& b) {
  constexpr int W = 1100, H = 420;
  const Plot p{78, 40, 1080, 318};
  double lo = b.study.one_document_step_s, hi = b.study.one_document_step_s;
  for (const planner::BalancerStudy& s : b.study.balancers) {
    for (const double t : s.step_s) {
      lo = std::min(lo, t);
      hi = std::max(hi, t);
    }
  }
  const double pad = std::max((hi - lo) * 0.05, hi * 0.01);
  const TimeUnit unit = time_unit(hi);
  const Scale x{(lo - pad) / unit.seconds, (hi + pad) / unit.seconds, p.left, p.right, false};
  const Scale y{0.0, 100.0, p.bottom, p.top, false};
  const std::string title = fmt::format("Step time over {} packed batches: {} at {}",
                                        b.options.batches, b.method, format_length(b.seq_len));
  svg_open(o, "svg-batches", W, H, title);
  text(o, (p.left + p.right) / 2, 22, title, "middle", "chart-title");
  const Ticks yt = linear_ticks(0.0, 100.0, 5);
  std::vector<std::string> yl;
  for (const double v : yt.values) {
    yl.push_back(tick_label(v, yt.decimals) + " %");
  }
  y_axis(o, p, y, yt.values, yl, "batches with a step at most this long");
  const Ticks xt = linear_ticks(x.d0, x.d1, 10);
  x_axis(o, p, x, xt.values, tick_labels(xt), fmt::format("step time ({})", unit.name), true);
  const double one = x(b.study.one_document_step_s / unit.seconds);
  put(o, "<line class=\"limit\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\"/>\n", px(one),
      px(p.top), px(one), px(p.bottom), kLimitColor);
  text(o, one + 4, p.top + 12, "one document a sequence", "start", "limit-label");
  double lx = p.left - 40, ly = 376.0;
  for (std::size_t i = 0; i < b.study.balancers.size(); ++i) {
    const planner::BalancerStudy& s = b.study.balancers[i];
    std::vector<double> sorted = s.step_s;
    std::sort(sorted.begin(), sorted.end());
    std::string d = fmt::format("M{},{}", px(x(sorted.front() / unit.seconds)), px(y(0.0)));
    for (std::size_t k = 0; k < sorted.size(); ++k) {
      const double xx = x(sorted[k] / unit.seconds);
      const double share = 100.0 * static_cast<double>(k + 1) / static_cast<double>(sorted.size());
      d += fmt::format("L{},{}L{},{}", px(xx),
                       px(y(100.0 * static_cast<double>(k) / static_cast<double>(sorted.size()))),
                       px(xx), px(y(share)));
    }
    const std::string color = method_color(std::string(s.balancer.name), i + 1);
    put(o, "<path class=\"series\" stroke=\"{}\" d=\"{}\"/>\n", color, d);
    const std::string label =
        fmt::format("{}: p50 {}, p95 {}, imbalance p50 {:.2f}", s.balancer.name,
                    format_seconds(s.p50_s), format_seconds(s.p95_s), s.imbalance_p50);
    const double width = 40 + 6.6 * static_cast<double>(label.size());
    if (lx + width > W - 6) {  // the legend flows over rows
      lx = p.left - 40;
      ly += 20;
    }
    put(o, "<line class=\"series\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\"/>\n",
        px(lx), px(ly), px(lx + 22), px(ly), color);
    text(o, lx + 27, ly + 4, label, "start", "legend");
    lx += width;
  }
  o += "</svg>\n";
}

void batches_section(Out& o, const ReportPage& page) {
  if (!page.batches) {
    return;
  }
  const BatchDetail& b = *page.batches;
  o += "<section id=\"sec-batches\">\n<h2>6. Packed batches</h2>\n";
  put(o,
      "<p class=\"cap\">{} at {}: documents from {} ({} packing, seed {}), packed into "
      "sequences of {} tokens and split over the CP ranks by each load balancer; each step "
      "simulated with every rank's attention under the document mask (docs/PACKING.md). "
      "Recommended: {}.</p>\n",
      esc(b.method), esc(format_length(b.seq_len)), esc(b.options.lengths.origin),
      models::to_string(b.options.packing), b.options.seed, b.seq_len,
      esc(std::string(b.study.best().balancer.name)));
  batches_chart(o, b);
  o += "</section>\n";
}

}  // namespace

std::string render_report_html(const ReportPage& page) {
  Out o;
  o.reserve(1 << 20);
  page_head(o, page);
  step_sections(o, page);
  length_section(o, page);
  maxlen_section(o, page);
  // 5: configuration.
  o += "<section id=\"sec-config\">\n<h2>5. Configuration and results</h2>\n";
  setup_table(o, page);
  methods_table(o, page);
  o += "</section>\n";
  batches_section(o, page);
  put(o,
      "<footer>Generated by {}. Self-contained: no scripts, fonts or images are loaded.</footer>\n",
      esc(page.version));
  o += "</main>\n</body>\n</html>\n";
  return o;
}

}  // namespace cpsim::cli
