#pragma once
/// @file One host thread per GPU for the single-process collective sweep: each rank's NCCL calls
/// are issued by its own thread, as nccl-tests does with `-t N -g 1` (src/common.cu:1096-1100
/// @a0b82b2 starts one std::thread per -t; startColl groups calls only when one thread drives
/// several GPUs, :548), so enqueueing small collectives on 8 GPUs is not bound by one host
/// thread. Header-only: the CUDA module, which links no cpsim library, uses it.

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace cpsim::calibrate {

/// `ranks` threads kept for the life of a collective group. run(job) calls job(rank) on every
/// rank's thread at once and returns when all have returned; the first exception a thread threw
/// (in rank order) is rethrown by run(), after all have returned.
class RankThreads {
 public:
  explicit RankThreads(int ranks) : errors_(static_cast<std::size_t>(ranks)) {
    for (int r = 0; r < ranks; ++r) {
      threads_.emplace_back([this, r] { loop(r); });
    }
  }
  ~RankThreads() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    start_.notify_all();
    for (std::thread& t : threads_) {
      t.join();
    }
  }
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int size() const { return static_cast<int>(threads_.size()); }

  void run(const std::function<void(int rank)>& job) {
    std::unique_lock<std::mutex> lock(mutex_);
    job_ = &job;
    pending_ = size();
    for (std::exception_ptr& e : errors_) {
      e = nullptr;
    }
    ++generation_;
    start_.notify_all();
    done_.wait(lock, [this] { return pending_ == 0; });
    job_ = nullptr;
    for (const std::exception_ptr& e : errors_) {
      if (e) {
        std::rethrow_exception(e);
      }
    }
  }

 private:
  void loop(int rank) {
    std::uint64_t seen = 0;
    while (true) {
      const std::function<void(int)>* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        start_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) {
          return;
        }
        seen = generation_;
        job = job_;
      }
      try {
        (*job)(rank);
      } catch (...) {
        errors_[static_cast<std::size_t>(rank)] = std::current_exception();  // own slot only
      }
      const std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) {
        done_.notify_all();
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable start_;
  std::condition_variable done_;
  const std::function<void(int)>* job_ = nullptr;
  std::uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> threads_;  ///< last: started once the state above exists
};

}  // namespace cpsim::calibrate
