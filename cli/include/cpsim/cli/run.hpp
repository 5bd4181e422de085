#pragma once
// The command line as a function: parses the arguments, runs the subcommand and reports a failure
// as data. The `cpsim` binary and the Python bindings are two front ends over it, so both give the
// same answers, the same bytes and the same error kind and field.

#include <optional>
#include <string>
#include <vector>

namespace cpsim::cli {

/// One failed run: what `cpsim` prints on stderr (and, with --json, as {"error": ...}).
struct Failure {
  int exit_status = 1;
  std::string kind;   ///< input | io | internal | does_not_fit
  std::string field;  ///< the flag or field at fault, may be empty
  std::string path;   ///< io: the output, may be empty
  std::string message;
  int error_number = 0;  ///< io: errno
};

struct RunOutcome {
  /// 0 done, 1 I/O or internal failure, 2 bad input, 3 does not fit (main.cpp's header).
  int exit_status = 0;
  std::optional<Failure> failure;  ///< set when the run ended with an exception
};

/// Runs `cpsim ARGS...` (`args` without the program name), writing to std::cout as the binary does.
RunOutcome run_command_line(const std::vector<std::string>& args);

struct CapturedRun {
  RunOutcome outcome;
  std::string output;  ///< what the run wrote to std::cout
};

/// As run_command_line, with std::cout captured into `output` for the duration of the call.
/// Calls are serialised: std::cout is one stream per process. Outputs named `-` (standard output as
/// a file: `--trace -`) still go to descriptor 1.
CapturedRun run_captured(const std::vector<std::string>& args);

}  // namespace cpsim::cli
