#pragma once
// Progress of a long command on stderr (--progress): on a terminal one line redrawn in place at
// most every 100 ms and erased when the command prints its answer; elsewhere (a log, a pipe) a
// log line every 10 s. Both start once the command has run for two seconds (`always`: at once);
// `never` prints nothing. Without --progress, the environment's CPSIM_PROGRESS decides.

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <unistd.h>
#include <utility>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"

namespace cpsim::cli {

enum class ProgressMode { kAuto, kAlways, kNever };

/// `--progress` auto | always | never; not given: the environment's CPSIM_PROGRESS, else auto.
/// @throws InputError("--progress" or "CPSIM_PROGRESS").
inline ProgressMode parse_progress_mode(const std::string& flag) {
  const char* env = std::getenv("CPSIM_PROGRESS");
  const bool from_env = flag.empty() && env != nullptr;
  const std::string text = !flag.empty() ? flag : from_env ? std::string(env) : "auto";
  if (text == "auto") {
    return ProgressMode::kAuto;
  }
  if (text == "always") {
    return ProgressMode::kAlways;
  }
  if (text == "never") {
    return ProgressMode::kNever;
  }
  throw InputError(from_env ? "CPSIM_PROGRESS" : "--progress",
                   fmt::format("expected auto, always or never, got '{}'", text));
}

class Progress {
 public:
  explicit Progress(std::string command, ProgressMode mode = ProgressMode::kAuto)
      : command_(std::move(command)),
        mode_(mode),
        tty_(isatty(STDERR_FILENO) != 0),
        start_(std::chrono::steady_clock::now()) {}
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  ~Progress() { clear(); }

  void update(const std::string& what) {
    if (mode_ == ProgressMode::kNever) {
      return;
    }
    const auto now = std::chrono::steady_clock::now();
    if (mode_ == ProgressMode::kAuto && now - start_ < std::chrono::seconds(2)) {
      return;
    }
    if (!tty_) {  // a log line every 10 s (the first at once)
      if (logged_ && now - drawn_ < std::chrono::seconds(10)) {
        return;
      }
      std::cerr << fmt::format("cpsim {}: {}\n", command_, what) << std::flush;
      logged_ = true;
      drawn_ = now;
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
  std::string command_;
  ProgressMode mode_;
  bool tty_;
  bool logged_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point drawn_;
  bool shown_ = false;
  std::size_t width_ = 0;
};

}  // namespace cpsim::cli
