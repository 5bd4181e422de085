// `calibrate run --mpi` under a real mpirun with NCCL faked below its calls (fake_rank_rig.hpp):
// run by tests/calibrate/mpi/run_mpi_test.py with 4 ranks on two fake nodes
// ($CPSIM_CALIBRATE_MPI_RANKS_PER_NODE=2). The MPI side is the real module
// (libcpsim_calibrate_mpi.so, through make_mpi_world).
//
// Usage: cpsim_calibrate_mpi_fake --out FILE --report DIR [--timeout S] [--grace S]
//        [--fail|--hang|--block R:G:OP:SIZE]   (world rank, group index from 0, op, size)
// Writes DIR/rank<R>.txt: "open <group> <ranks> <rank> <id>", "abort <group>", "writes <n>".
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cpsim/calibrate/mpi_run.hpp"
#include "cpsim/models/error.hpp"

#include "fake_rank_rig.hpp"

namespace {

using cpsim::calibrate::fake_mpi::FakeBackend;
using cpsim::calibrate::fake_mpi::Faults;
using cpsim::calibrate::fake_mpi::parse_fault;

/// Temporary file and rename, as the CLI's writer: never a half-written file.
void write_atomically(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace

int main(int argc, char** argv) {
  std::filesystem::path out;
  std::filesystem::path report_dir;
  cpsim::calibrate::MpiRunRequest request;
  request.collective_timeout_s = 1.0;
  request.agreement_grace_s = 1.0;
  Faults faults;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--out") {
      out = value;
    } else if (flag == "--report") {
      report_dir = value;
    } else if (flag == "--timeout") {
      request.collective_timeout_s = std::stod(value);
    } else if (flag == "--grace") {
      request.agreement_grace_s = std::stod(value);
    } else if (flag == "--fail") {
      faults.fail = parse_fault(value);
    } else if (flag == "--hang") {
      faults.hang = parse_fault(value);
    } else if (flag == "--block") {
      faults.block = parse_fault(value);
    } else {
      std::cerr << "unknown flag " << flag << "\n";
      return 64;
    }
  }
  if (const char* env = std::getenv("CPSIM_CALIBRATE_MPI_RANKS_PER_NODE")) {
    request.ranks_per_node_override = std::atoi(env);
  }
  request.out = out;
  request.options.cpsim_version = "test";
  request.options.argv = {"cpsim_calibrate_mpi_fake"};
  try {
    const std::unique_ptr<cpsim::calibrate::ProcessGroup> world =
        cpsim::calibrate::make_mpi_world();
    std::ostringstream report;
    int writes = 0;
    FakeBackend backend(world->rank(), faults, report);
    const cpsim::calibrate::MpiRunSummary summary =
        cpsim::calibrate::run_mpi_calibration(*world, backend, request,
                                              [&](const std::string& text) {
                                                ++writes;
                                                write_atomically(out, text);
                                              },
                                              {});
    report << "writes " << writes << "\n";
    std::ofstream(report_dir / ("rank" + std::to_string(world->rank()) + ".txt")) << report.str();
    // As the CLI: rank 0 carries the status, the others exit 0 (a launcher kills the job when
    // one process exits otherwise, maybe before rank 0 has written its report).
    return world->rank() == 0 && summary.failed ? 1 : 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
