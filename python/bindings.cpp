// cpsim._cpsim: the command line as a function, for the Python layer in cpsim/ (docs: python/cpsim
// and README "From Python"). One entry point keeps the two front ends identical: the Python layer
// turns keyword arguments into the same flags, and the same parsing, checks and output code run.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <string>
#include <vector>

#include "cpsim/cli/run.hpp"

namespace nb = nanobind;

namespace {

/// (exit status, captured standard output, failure or None); a failure is a dict with the keys of
/// the CLI's {"error": ...}: kind, field, path, message, plus exit_status and error_number.
nb::tuple run(const std::vector<std::string>& args) {
  cpsim::cli::CapturedRun captured;
  {
    const nb::gil_scoped_release unlocked;  // the plan search runs its own threads
    captured = cpsim::cli::run_captured(args);
  }
  nb::object failure = nb::none();
  if (const auto& f = captured.outcome.failure) {
    nb::dict d;
    d["exit_status"] = f->exit_status;
    d["kind"] = f->kind;
    d["field"] = f->field.empty() ? nb::none() : nb::cast(f->field);
    d["path"] = f->path.empty() ? nb::none() : nb::cast(f->path);
    d["message"] = f->message;
    d["error_number"] = f->error_number;
    failure = std::move(d);
  }
  return nb::make_tuple(captured.outcome.exit_status,
                        nb::bytes(captured.output.data(), captured.output.size()), failure);
}

}  // namespace

NB_MODULE(_cpsim, m) {
  m.doc() =
      "cpsim's engine in process: run(args) runs `cpsim ARGS...` with standard output captured.";
  m.attr("__version__") = CPSIM_VERSION;
  m.def("run", &run, nb::arg("args"),
        "Runs `cpsim ARGS...` in this process. Returns (exit_status, stdout bytes, failure), "
        "failure None or a dict: exit_status, kind (input | io | internal | does_not_fit), field, "
        "path, message, error_number.");
}
