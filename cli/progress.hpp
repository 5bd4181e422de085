#pragma once
// A progress line on stderr while a long command runs: only on a terminal, only once it has run
// for two seconds, redrawn at most every 100 ms, erased when the command prints its answer.

#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <unistd.h>

#include <fmt/format.h>

namespace cpsim::cli {

class Progress {
 public:
  explicit Progress(const char* command)
      : command_(command),
        tty_(isatty(STDERR_FILENO) != 0),
        start_(std::chrono::steady_clock::now()) {}
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  ~Progress() { clear(); }

  void update(const std::string& what) {
    if (!tty_) {
      return;
    }
    const auto now = std::chrono::steady_clock::now();
    if (!shown_ && now - start_ < std::chrono::seconds(2)) {
      return;
    }
    if (shown_ && now - drawn_ < std::chrono::milliseconds(100)) {
      return;
    }
    std::string line = fmt::format("cpsim {}: {}", command_, what);
    const std::size_t len = line.size();
    if (len < width_) {
      line.append(width_ - len, ' ');
    }
    width_ = std::max(width_, len);
    std::cerr << "\r" << line << std::flush;
    shown_ = true;
    drawn_ = now;
  }

  void clear() {
    if (shown_) {
      std::cerr << "\r" << std::string(width_, ' ') << "\r" << std::flush;
      shown_ = false;
      width_ = 0;
    }
  }

 private:
  const char* command_;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point drawn_;
  bool shown_ = false;
  std::size_t width_ = 0;
};

}  // namespace cpsim::cli
