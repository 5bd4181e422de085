#pragma once
// The fake NCCL side of `calibrate run --mpi` (a MeasureBackend whose RankRig fakes the calls
// below NCCL), shared by fake_rank_main.cpp (under a real mpirun) and mpi_run_test.cpp (ranks as
// threads):
//
// - unique ids: a group's root makes "fake-id:<world rank>:<count>"; every rank records the id it
//   was opened with ("open <group> <ranks> <rank> <id>" in its report);
// - time per call: alpha + size / bandwidth (intra-node for the first group opened, the node
//   group, inter-node after), times (1 + 0.25 x world rank), in place 3 % less: a run must keep
//   the slowest rank's time;
// - faults at (world rank, group index, op, nccl-tests size): `fail` an asynchronous NCCL error,
//   `hang` a wait that never completes, `block` an enqueue that blocks for 600 s.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cpsim/calibrate/mpi_run.hpp"

namespace cpsim::calibrate::fake_mpi {

using models::Collective;

/// Where a fault strikes: world rank, group index, op, nccl-tests size.
struct Fault {
  int rank = -1;
  int group = -1;
  std::string op;
  std::int64_t size_bytes = 0;
};

inline std::optional<Fault> parse_fault(const std::string& text) {
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
      return f && f->rank == world_rank_ && f->group == group_ && f->op == models::to_string(op) &&
             f->size_bytes == size_bytes;
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

class FakeBackend final : public MeasureBackend {
 public:
  FakeBackend(int world_rank, Faults faults, std::ostream& report)
      : world_rank_(world_rank), faults_(std::move(faults)), report_(report) {}
  std::string name() const override { return "fake-nccl"; }
  std::optional<std::string> unavailable_reason() const override { return std::nullopt; }
  RawContext open(const MeasureOptions& /*options*/) override {
    throw std::logic_error("MPI only");
  }
  std::size_t plan(std::string_view /*sweep*/) const override { return 0; }
  SweepOutput run_sweep(std::string_view /*sweep*/, const SweepControl& /*c*/) override {
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
  TimingPlan timing_plan() const override { return TimingPlan{3, 1e-3, 4}; }
  std::unique_ptr<CollectiveRig> collective_rig() override { return nullptr; }
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
    c.method = RawMethod{"cuda-event", "median", 1, 3, 0};
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

}  // namespace cpsim::calibrate::fake_mpi
