// CPU parts of the measurement front end: GEMM shapes from the models, the progress bar.
#include <algorithm>
#include <iostream>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "cpsim/calibrate/measure.hpp"

namespace cpsim::calibrate {

std::vector<GemmWidth> model_gemm_widths(const std::vector<models::TransformerSpec>& specs) {
  std::map<std::pair<std::int64_t, std::int64_t>, std::string> shapes;
  auto add = [&shapes](std::int64_t n, std::int64_t k, const std::string& origin) {
    std::string& o = shapes[{n, k}];
    o += o.empty() ? origin : ", " + origin;
  };
  for (const models::TransformerSpec& m : specs) {
    add(m.q_width() + 2 * m.kv_width(), m.hidden, m.name + " qkv");
    add(m.hidden, m.q_width(), m.name + " out");
    add(2 * m.ffn_hidden, m.hidden, m.name + " gate+up");
    add(m.hidden, m.ffn_hidden, m.name + " down");
  }
  std::vector<GemmWidth> out;
  out.reserve(shapes.size());
  for (auto& [nk, origin] : shapes) {
    out.push_back(GemmWidth{nk.first, nk.second, std::move(origin)});
  }
  return out;
}

ProgressBar::ProgressBar(bool terminal) : terminal_(terminal) {}

void ProgressBar::operator()(std::size_t done, std::size_t total, const std::string& label) {
  const double fraction =
      total == 0 ? 1.0 : std::min(1.0, static_cast<double>(done) / static_cast<double>(total));
  const int percent = static_cast<int>(fraction * 100.0);
  if (terminal_) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth);
    std::string bar(static_cast<std::size_t>(filled), '=');
    if (filled < kWidth) {
      bar += '>';
      bar += std::string(static_cast<std::size_t>(kWidth - filled - 1), ' ');
    }
    std::string line = fmt::format("[{}] {:3d}% {}", bar, percent, label);
    const std::size_t width = line.size();
    if (width < last_width_) {
      line += std::string(last_width_ - width, ' ');
    }
    last_width_ = width;
    std::cerr << '\r' << line << std::flush;
    return;
  }
  const int decile = percent / 10;
  if (decile != last_decile_) {
    last_decile_ = decile;
    std::cerr << fmt::format("calibrate: {:3d}% {}\n", percent, label) << std::flush;
  }
}

void ProgressBar::finish() {
  if (terminal_ && last_width_ > 0) {
    std::cerr << '\n' << std::flush;
    last_width_ = 0;
  }
}

}  // namespace cpsim::calibrate
