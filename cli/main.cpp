// cpsim: simulator and memory/throughput planner for context-parallel long-context training.
// Exit status: 0 success, 2 bad input (one line on stderr naming the flag or field), 1 an output
// that could not be written (one line naming the path; standard output included) or an internal
// error. With --json (or sweep --format json) a failure also prints one JSON object on standard
// output: {"error": {"kind": "input" | "io" | "internal", "field": ..., "path": ..., "message":
// ...}}. A closed pipe on standard output (`cpsim plan | head -1`) ends the run quietly: by SIGPIPE
// as usual, or with status 1 and no message when SIGPIPE is ignored.
#include <cerrno>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cpsim/cli/run.hpp"

#include "output.hpp"

namespace {

/// True when the command line asks for JSON output: --json, or --format json / --format=json.
bool json_requested(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      break;
    }
    if (arg == "--json" || arg == "--format=json" ||
        (arg == "--format" && i + 1 < argc && std::string(argv[i + 1]) == "json")) {
      return true;
    }
  }
  return false;
}

void print_json_error(const cpsim::cli::Failure& f) {
  nlohmann::json error = {{"kind", f.kind}, {"message", f.message}};
  error["field"] = f.field.empty() ? nlohmann::json(nullptr) : nlohmann::json(f.field);
  if (f.kind == "io") {
    error["path"] = f.path;
  }
  std::cout << nlohmann::json{{"error", error}}.dump(2) << "\n";
}

/// Reports a failure and a failed standard output; returns the exit status.
int finish(cpsim::cli::StdoutGuard& out,
           int status,
           const std::optional<cpsim::cli::Failure>& failure,
           bool json) {
  const int stdout_error = out.finish();
  const bool stdout_broken_pipe =
      stdout_error == EPIPE ||
      (failure && failure->path == "<stdout>" && failure->error_number == EPIPE);
  if (stdout_broken_pipe) {
    return 1;  // the reader went away: nothing to tell it, and no one asked for an error line
  }
  if (failure) {
    std::cerr << (failure->kind == "internal"       ? "cpsim: internal error: "
                  : failure->kind == "does_not_fit" ? "cpsim: does not fit: "
                                                    : "cpsim: error: ")
              << failure->message << "\n";
    if (json && stdout_error == 0) {
      print_json_error(*failure);
      (void)out.finish();
    }
    return failure->exit_status;
  }
  if (stdout_error != 0) {
    std::cerr << "cpsim: error: writing <stdout>: " << std::strerror(stdout_error) << "\n";
    return 1;
  }
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  cpsim::cli::StdoutGuard out;
  const cpsim::cli::RunOutcome outcome =
      cpsim::cli::run_command_line(std::vector<std::string>(argv + 1, argv + argc));
  return finish(out, outcome.exit_status, outcome.failure, json_requested(argc, argv));
}
