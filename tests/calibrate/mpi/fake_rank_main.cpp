// `calibrate run --mpi` under a real mpirun with NCCL faked below its calls: run by
// tests/calibrate/mpi/run_mpi_test.py with 4 ranks on two fake nodes
// ($CPSIM_CALIBRATE_MPI_RANKS_PER_NODE=2). The MPI side is the real module
// (libcpsim_calibrate_mpi.so, through make_mpi_world); the backend and its rank rig are fakes:
//
// - unique ids: a group's root makes "fake-id:<world rank>:<count>"; every rank records the id it
//   was opened with, so the script checks that a group's ranks share their root's id;
// - time per call: alpha + size / bandwidth (intra-node for the first group opened, the node
//   group, inter-node after), times (1 + 0.25 x world rank): the run must keep the slowest rank's
//   time, (1 + 0.25 x 3) x the model;
// - --fail R:G:OP:SIZE: an asynchronous NCCL error on world rank R in the G-th group opened (0
//   based), at that op and nccl-tests size; --hang ...: that wait never completes (deadline,
//   abort); --block ...: the enqueue itself blocks for 600 s (a call without deadline).
//
// Usage: cpsim_calibrate_mpi_fake --out FILE --report DIR [--timeout S] [--grace S]
//        [--fail|--hang|--block R:G:OP:SIZE]
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

namespace {

using cpsim::calibrate::CollectivePlan;
using cpsim::calibrate::CompletionPoll;
using cpsim::calibrate::MeasureOptions;
using cpsim::calibrate::RankRig;
using cpsim::calibrate::RawContext;
using cpsim::models::Collective;

/// Where a fault strikes: world rank, group index, op, nccl-tests size.
struct Fault {
  int rank = -1;
  int group = -1;
  std::string op;
  std::int64_t size_bytes = 0;
};

std::optional<Fault> parse_fault(const std::string& text) {
  Fault f;
  std::istringstream in(text);
  std::string rank;
  std::string group;
  std::string size;
  if (!std::getline(in, rank, ':') || !std::getline(in, group, ':') ||
      !std::getline(in, f.op, ':') || !std::getline(in, size)) {
    return std::nullopt;
  }
  f.rank = std::stoi(rank);
  f.group = std::stoi(group);
  f.size_bytes = std::stoll(size);
  return f;
}

class FakePoll final : public CompletionPoll {
 public:
  bool hung = false;
  std::optional<std::string> async_error;
  int* aborts = nullptr;
  bool complete() override { return !hung; }
  std::optional<std::string> error() override { return async_error; }
  void abort() override { ++*aborts; }
};

struct Faults {
  std::optional<Fault> fail;
  std::optional<Fault> hang;
  std::optional<Fault> block;
};

class FakeRankRig final : public RankRig {
 public:
  FakeRankRig(int world_rank, Faults faults, std::ostream& report)
      : world_rank_(world_rank), faults_(std::move(faults)), report_(report) {
    poll_.aborts = &aborts_;
  }

  std::vector<std::uint8_t> unique_id() override {
    const std::string id = "fake-id:" + std::to_string(world_rank_) + ":" + std::to_string(ids_++);
    return {id.begin(), id.end()};
  }

  void open(const std::vector<std::uint8_t>& id,
            int ranks,
            int rank,
            std::int64_t /*largest*/) override {
    ++group_;
    aborts_ = 0;
    ranks_ = ranks;
    report_ << "open " << group_ << " " << ranks << " " << rank << " "
            << std::string(id.begin(), id.end()) << "\n";
  }

  void enqueue(Collective op, std::int64_t size_bytes, int calls, bool in_place) override {
    const auto at = [&](const std::optional<Fault>& f) {
      return f && f->rank == world_rank_ && f->group == group_ &&
             f->op == cpsim::models::to_string(op) && f->size_bytes == size_bytes;
    };
    if (at(faults_.block)) {
      std::this_thread::sleep_for(std::chrono::seconds(600));
    }
    poll_.hung = at(faults_.hang);
    if (at(faults_.fail)) {
      poll_.async_error = "rank " + std::to_string(world_rank_) +
                          ": asynchronous NCCL error unhandled system error (fake)";
    }
    // The node group is opened first: NVLink-like; the groups across nodes network-like.
    const bool intra = group_ == 0;
    const double alpha_s = intra ? 8e-6 : 25e-6;
    const double bandwidth = intra ? 150e9 : 20e9;
    const double skew = 1.0 + 0.25 * world_rank_;
    const double model_s = (alpha_s + static_cast<double>(size_bytes) / bandwidth) * skew;
    last_s_ = calls * model_s * (in_place ? 0.97 : 1.0);  // in place: 3 % faster
  }

  CompletionPoll& poll() override { return poll_; }
  double elapsed_s() override { return last_s_; }
  void abort() override { ++aborts_; }
  void close() override {
    if (aborts_ > 0) {
      report_ << "abort " << group_ << "\n";
    }
    aborts_ = 0;
    poll_.async_error.reset();
    poll_.hung = false;
  }

 private:
  int world_rank_;
  Faults faults_;
  std::ostream& report_;
  FakePoll poll_;
  int aborts_ = 0;
  int ids_ = 0;
  int group_ = -1;
  int ranks_ = 0;
  double last_s_ = 0.0;
};

class FakeBackend final : public cpsim::calibrate::MeasureBackend {
 public:
  FakeBackend(int world_rank, Faults faults, std::ostream& report)
      : world_rank_(world_rank), faults_(std::move(faults)), report_(report) {}
  std::string name() const override { return "fake-nccl"; }
  std::optional<std::string> unavailable_reason() const override { return std::nullopt; }
  RawContext open(const MeasureOptions& /*options*/) override {
    throw std::logic_error("MPI only");
  }
  std::size_t plan(std::string_view /*sweep*/) const override { return 0; }
  cpsim::calibrate::SweepOutput run_sweep(std::string_view /*sweep*/,
                                          const cpsim::calibrate::SweepControl& /*c*/) override {
    throw std::logic_error("MPI only");
  }
  CollectivePlan collective_plan() const override {
    CollectivePlan p;
    p.ops = {Collective::kAllToAll, Collective::kAllGather, Collective::kReduceScatter,
             Collective::kAllReduce, Collective::kSendRecv};
    for (int e = 10; e <= 24; e += 2) {
      p.sizes_bytes.push_back(std::int64_t{1} << e);
    }
    return p;
  }
  cpsim::calibrate::TimingPlan timing_plan() const override {
    return cpsim::calibrate::TimingPlan{3, 1e-3, 4};
  }
  std::unique_ptr<cpsim::calibrate::CollectiveRig> collective_rig() override { return nullptr; }
  RawContext open_rank(const MeasureOptions& options, int local_rank) override {
    RawContext c;
    c.device = "Fake H100";
    c.gpu_count = 1;
    c.device_count = 2;
    c.driver_version = "1.0";
    c.cuda_driver_version = "13.0";
    c.cuda_runtime_version = "13.0";
    c.nccl_version = "2.28.9";
    c.cublaslt_version = "13.0.0";
    c.sm_count = 132;
    c.hbm_capacity_bytes = std::int64_t{80} << 30;
    c.date = "2026-11-26T00:00:00Z";
    c.cpsim_version = options.cpsim_version;
    c.method = cpsim::calibrate::RawMethod{"cuda-event", "median", 1, 3, 0};
    c.notes.push_back("fake GPU " + std::to_string(local_rank));
    return c;
  }
  std::unique_ptr<RankRig> rank_rig() override {
    return std::make_unique<FakeRankRig>(world_rank_, faults_, report_);
  }

 private:
  int world_rank_;
  Faults faults_;
  std::ostream& report_;
};

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
