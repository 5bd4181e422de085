// One host thread per GPU for the single-process collective sweep (rank_threads.hpp): every rank's
// job runs on its own thread, all at once, the threads stay for the next call, and a thread's
// error reaches the caller.
#include "cpsim/calibrate/rank_threads.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "cpsim/calibrate/measure.hpp"

namespace cpsim::calibrate {
namespace {

/// Every rank waits until all `ranks` are inside the job at the same time (or 10 s pass): true
/// for every rank only when the jobs run at once, never when they run one after the other.
struct Rendezvous {
  explicit Rendezvous(int ranks) : ranks_(ranks) {}
  bool arrive() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (++arrived_ == ranks_) {
      cv_.notify_all();
    }
    return cv_.wait_for(lock, std::chrono::seconds(10), [this] { return arrived_ == ranks_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int ranks_;
  int arrived_ = 0;
};

TEST(RankThreads, RunsEveryRankOnItsOwnThreadAtOnceAndKeepsTheThreads) {
  constexpr int kRanks = 4;
  RankThreads threads(kRanks);
  EXPECT_EQ(threads.size(), kRanks);
  std::vector<std::thread::id> first(kRanks);
  std::vector<std::thread::id> second(kRanks);
  std::vector<int> met(kRanks, 0);
  Rendezvous all(kRanks);
  threads.run([&](int rank) {
    first[static_cast<std::size_t>(rank)] = std::this_thread::get_id();
    met[static_cast<std::size_t>(rank)] = all.arrive() ? 1 : 0;
  });
  EXPECT_EQ(met, std::vector<int>(kRanks, 1));  // all four were inside the job together
  threads.run(
      [&](int rank) { second[static_cast<std::size_t>(rank)] = std::this_thread::get_id(); });
  EXPECT_EQ(first, second);  // the same thread per rank, call after call
  const std::set<std::thread::id> distinct(first.begin(), first.end());
  EXPECT_EQ(distinct.size(), static_cast<std::size_t>(kRanks));
  EXPECT_EQ(distinct.count(std::this_thread::get_id()), 0U);
}

TEST(RankThreads, RethrowsAThreadsErrorAfterEveryRankReturnedAndStaysUsable) {
  RankThreads threads(3);
  std::atomic<int> finished{0};
  try {
    threads.run([&](int rank) {
      if (rank == 1) {
        throw MeasureError("ncclAllGather failed with unhandled system error (rank 1)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ++finished;
    });
    FAIL() << "no error";
  } catch (const MeasureError& e) {
    EXPECT_STREQ(e.what(), "ncclAllGather failed with unhandled system error (rank 1)");
  }
  EXPECT_EQ(finished.load(), 2);  // run() waited for the others
  std::atomic<int> again{0};
  threads.run([&](int /*rank*/) { ++again; });
  EXPECT_EQ(again.load(), 3);
}

}  // namespace
}  // namespace cpsim::calibrate
