// `calibrate run --mpi`'s driver without MPI: ranks are threads of this process and the
// ProcessGroup a rendezvous board (tests/calibrate/mpi runs the same fake NCCL under a real
// mpirun). Two nodes ("a", "b") of two ranks: the groups, unique ids, slowest-rank times, rank-0
// writes and the failure paths.
#include "cpsim/calibrate/mpi_run.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cpsim/models/error.hpp"

#include "mpi/fake_rank_rig.hpp"

namespace cpsim::calibrate {
namespace {

using ::testing::HasSubstr;

/// What ProcessGroup::abort throws here (MPI_Abort would end the process).
struct Aborted {
  int code;
};

/// Contributions of the members of one collective call of one communicator.
class Board {
 public:
  /// Deposits `mine` as `member` of `size` in call `key`; every member's contribution once all
  /// have arrived, nothing after `timeout_s`.
  std::optional<std::vector<std::string>> exchange(
      const std::string& key, int member, int size, const std::string& mine, double timeout_s) {
    std::unique_lock<std::mutex> lock(mutex_);
    std::vector<std::string>& slot = slots_[key];
    slot.resize(static_cast<std::size_t>(size));
    slot[static_cast<std::size_t>(member)] = mine;
    ++arrived_[key];
    cv_.notify_all();
    if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                      [&] { return arrived_[key] == size; })) {
      return std::nullopt;
    }
    return slot;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<std::string>> slots_;
  std::map<std::string, int> arrived_;
};

constexpr double kBlockingWait_s = 30.0;  // calls that MPI would block in

class ThreadGroup final : public ProcessGroup {
 public:
  ThreadGroup(Board& board,
              std::string id,
              std::vector<int> members,
              int world_rank,
              std::vector<std::string> hosts)
      : board_(board),
        id_(std::move(id)),
        members_(std::move(members)),
        world_rank_(world_rank),
        hosts_(std::move(hosts)) {
    rank_ = static_cast<int>(std::find(members_.begin(), members_.end(), world_rank_) -
                             members_.begin());
  }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  std::string host() const override { return hosts_[static_cast<std::size_t>(world_rank_)]; }
  std::unique_ptr<ProcessGroup> split_shared() override {
    const auto first = std::find(hosts_.begin(), hosts_.end(), host());
    return split(static_cast<int>(first - hosts_.begin()), rank_);
  }
  std::unique_ptr<ProcessGroup> split(int color, int key) override {
    const auto all = call(std::to_string(color) + " " + std::to_string(key), kBlockingWait_s);
    std::vector<std::tuple<int, int, int>> same;  // key, rank, world rank
    for (std::size_t r = 0; r < all.size(); ++r) {
      std::istringstream in(all[r]);
      int c = 0;
      int k = 0;
      in >> c >> k;
      if (c == color) {
        same.emplace_back(k, static_cast<int>(r), members_[r]);
      }
    }
    std::sort(same.begin(), same.end());
    std::vector<int> members;
    for (const auto& entry : same) {
      members.push_back(std::get<2>(entry));
    }
    return std::make_unique<ThreadGroup>(
        board_, id_ + "/" + std::to_string(seq_) + ":" + std::to_string(color), members,
        world_rank_, hosts_);
  }
  void broadcast(std::vector<std::uint8_t>& bytes, int root) override {
    const auto all = call(std::string(bytes.begin(), bytes.end()), kBlockingWait_s);
    const std::string& from = all[static_cast<std::size_t>(root)];
    bytes.assign(from.begin(), from.end());
  }
  std::optional<std::vector<double>> max_all(const std::vector<double>& values,
                                             double timeout_s) override {
    std::string mine(values.size() * sizeof(double), '\0');
    std::memcpy(mine.data(), values.data(), mine.size());
    const auto all = board_.exchange(next_key(), rank_, size(), mine, timeout_s);
    if (!all) {
      return std::nullopt;
    }
    std::vector<double> out(values.size(), -1e300);
    for (const std::string& text : *all) {
      std::vector<double> v(values.size());
      std::memcpy(v.data(), text.data(), text.size());
      for (std::size_t i = 0; i < v.size(); ++i) {
        out[i] = std::max(out[i], v[i]);
      }
    }
    return out;
  }
  std::vector<std::string> gather(const std::string& text, int root) override {
    auto all = call(text, kBlockingWait_s);
    return rank_ == root ? all : std::vector<std::string>{};
  }
  [[noreturn]] void abort(int code) override { throw Aborted{code}; }

 private:
  std::string next_key() { return id_ + "#" + std::to_string(seq_++); }
  std::vector<std::string> call(const std::string& mine, double timeout_s) {
    auto all = board_.exchange(next_key(), rank_, size(), mine, timeout_s);
    if (!all) {
      throw std::runtime_error("a blocking call waited " + std::to_string(timeout_s) + " s");
    }
    return *all;
  }

  Board& board_;
  std::string id_;
  std::vector<int> members_;
  int world_rank_;
  std::vector<std::string> hosts_;
  int rank_ = 0;
  int seq_ = 0;
};

/// What one rank's thread ended with.
struct RankResult {
  std::optional<MpiRunSummary> summary;
  std::optional<int> aborted;
  std::string error;
  int writes = 0;
  std::string last_write;
  std::string report;
};

/// Runs the driver on 4 threads, nodes "a" (ranks 0, 1) and "b" (2, 3).
std::vector<RankResult> run_ranks(const fake_mpi::Faults& faults, double timeout_s = 0.5) {
  Board board;
  const std::vector<std::string> hosts = {"a", "a", "b", "b"};
  std::vector<RankResult> results(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      RankResult& out = results[static_cast<std::size_t>(r)];
      ThreadGroup world(board, "world", {0, 1, 2, 3}, r, hosts);
      std::ostringstream report;
      fake_mpi::FakeBackend backend(r, faults, report);
      MpiRunRequest request;
      request.collective_timeout_s = timeout_s;
      request.agreement_grace_s = 0.5;
      request.options.cpsim_version = "test";
      try {
        out.summary = run_mpi_calibration(world, backend, request,
                                          [&](const std::string& text) {
                                            ++out.writes;
                                            out.last_write = text;
                                          },
                                          {});
      } catch (const Aborted& a) {
        out.aborted = a.code;
      } catch (const std::exception& e) {
        out.error = e.what();
      }
      out.report = report.str();
    });
  }
  for (std::thread& t : threads) {
    t.join();
  }
  return results;
}

const SweepRecord& collectives_record(const RawCalibration& raw) {
  for (const SweepRecord& r : raw.context.sweeps) {
    if (r.name == "collectives") {
      return r;
    }
  }
  throw std::logic_error("no collectives record");
}

TEST(MpiRun, MeasuresEveryGroupWithTheSlowestRanksTimeAndOnlyRankZeroWrites) {
  const std::vector<RankResult> ranks = run_ranks({});
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    ASSERT_TRUE(ranks[r].summary) << "rank " << r << ": " << ranks[r].error;
    EXPECT_EQ(ranks[r].writes, r == 0 ? 4 : 0) << "rank " << r;  // context + 3 groups
    EXPECT_FALSE(ranks[r].summary->failed);
  }
  const RawCalibration raw = parse_raw(ranks[0].last_write, "raw.json");
  EXPECT_EQ(raw.context.mpi.nodes, 2);
  EXPECT_EQ(raw.context.mpi.hosts, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(collectives_record(raw).status, "done");
  // The node groups' roots are ranks 0 and 2, the world's 0, the one-per-node groups' 0 and 1.
  EXPECT_THAT(ranks[3].report, HasSubstr("open 0 2 1 fake-id:2:0"));
  EXPECT_THAT(ranks[3].report, HasSubstr("open 1 4 3 fake-id:0:1"));
  EXPECT_THAT(ranks[3].report, HasSubstr("open 2 2 1 fake-id:1:0"));
  std::map<std::pair<int, int>, int> per_group;  // (ranks, nodes) -> samples
  for (const CollectiveSample& s : raw.samples.collectives) {
    ++per_group[{s.ranks, s.nodes}];
    const bool intra = s.nodes == 1;
    const double model_s =
        (intra ? 8e-6 : 25e-6) + static_cast<double>(s.size_bytes) / (intra ? 150e9 : 20e9);
    EXPECT_NEAR(s.time_s / (model_s * 1.75 * (s.in_place ? 0.97 : 1.0)), 1.0, 1e-9);
  }
  // 5 ops x 8 sizes x 2 halves per group.
  EXPECT_EQ(per_group,
            (std::map<std::pair<int, int>, int>{{{2, 1}, 80}, {{4, 2}, 80}, {{2, 2}, 80}}));
}

TEST(MpiRun, AFailingRankAbortsTheGroupEverywhereAndIsNamed) {
  fake_mpi::Faults faults;
  faults.fail = fake_mpi::parse_fault("2:1:all_gather:4096");
  const std::vector<RankResult> ranks = run_ranks(faults);
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    ASSERT_TRUE(ranks[r].summary) << "rank " << r << ": " << ranks[r].error;
    EXPECT_TRUE(ranks[r].summary->failed);
    EXPECT_THAT(ranks[r].report, HasSubstr("abort 1")) << "rank " << r;
  }
  const SweepRecord& record = collectives_record(ranks[0].summary->raw);
  EXPECT_EQ(record.status, "failed");
  EXPECT_THAT(record.notes.front(), HasSubstr("rank 2 (b): failed (rank 2: asynchronous NCCL"));
  EXPECT_THAT(record.notes.back(), HasSubstr("skipped: 2 ranks, one per node"));
}

TEST(MpiRun, AWaitThatNeverCompletesTimesOutAndIsAbortedOnEveryRank) {
  fake_mpi::Faults faults;
  faults.hang = fake_mpi::parse_fault("3:2:send_recv:1048576");
  const std::vector<RankResult> ranks = run_ranks(faults);
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    ASSERT_TRUE(ranks[r].summary) << "rank " << r << ": " << ranks[r].error;
    EXPECT_THAT(ranks[r].report, HasSubstr("abort 2")) << "rank " << r;
  }
  const SweepRecord& record = collectives_record(ranks[0].summary->raw);
  EXPECT_EQ(record.status, "timed_out");
  EXPECT_THAT(record.notes.front(),
              HasSubstr("send_recv 1.0 MiB out-of-place over 2 ranks, one per node (every local "
                        "rank at once): rank 3 (b): timed out (not complete after 0 s)"));
}

}  // namespace
}  // namespace cpsim::calibrate
