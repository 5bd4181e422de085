// Communication sweeps: NCCL collectives over groups of local GPUs (one process, one host thread
// per GPU, communicators from ncclCommInitAll) or over processes (calibrate run --mpi, one GPU
// each, ncclCommInitRank), pinned host<->device copies, and the interference of communication with
// attention.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <memory>
#include <nccl.h>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cpsim/calibrate/mpi_run.hpp"
#include "cpsim/calibrate/rank_threads.hpp"

#include "kernels.hpp"
#include "measure_internal.hpp"

namespace cpsim::calibrate::cuda {
namespace {

using models::Collective;

constexpr Collective kOps[] = {Collective::kAllToAll, Collective::kAllGather,
                               Collective::kReduceScatter, Collective::kAllReduce,
                               Collective::kSendRecv};

std::vector<std::int64_t> collective_sizes(bool quick) {
  std::vector<std::int64_t> sizes;
  if (quick) {
    for (const int e : {10, 14, 18, 22, 26, 28, 30}) {
      sizes.push_back(std::int64_t{1} << e);
    }
  } else {
    for (int e = 10; e <= 30; ++e) {
      sizes.push_back(std::int64_t{1} << e);
    }
  }
  return sizes;
}

std::vector<int> group_sizes(const Session& s) {
  std::vector<int> groups;
  if (s.gpus < 2) {
    return groups;
  }
  if (s.options.quick) {
    // 2, 4, 8, ... (the CP group sizes the profile keeps curves for) and all GPUs.
    for (int g = 2; g <= s.gpus; g *= 2) {
      groups.push_back(g);
    }
    if (groups.back() != s.gpus) {
      groups.push_back(s.gpus);
    }
  } else {
    for (int g = 2; g <= s.gpus; ++g) {
      groups.push_back(g);
    }
  }
  return groups;
}

std::vector<std::int64_t> copy_sizes(bool quick) {
  std::vector<std::int64_t> sizes;
  if (quick) {
    for (const int e : {20, 24, 28}) {
      sizes.push_back(std::int64_t{1} << e);
    }
  } else {
    for (int e = 16; e <= 30; e += 2) {
      sizes.push_back(std::int64_t{1} << e);
    }
  }
  return sizes;
}

std::vector<std::int64_t> all_gpu_copy_sizes(bool quick) {
  return quick ? std::vector<std::int64_t>{std::int64_t{1} << 26}
               : std::vector<std::int64_t>{std::int64_t{1} << 24, std::int64_t{1} << 28};
}

constexpr CopyDirection kDirections[] = {CopyDirection::kHostToDevice, CopyDirection::kDeviceToHost,
                                         CopyDirection::kDuplex};

/// NCCL communicators of one group of local devices, or this rank's one communicator of a group
/// spanning processes (MPI mode).
class Comms {
 public:
  explicit Comms(const std::vector<int>& devices) : comms_(devices.size(), nullptr) {
    CPSIM_NCCL_CHECK(
        ncclCommInitAll(comms_.data(), static_cast<int>(devices.size()), devices.data()));
  }
  /// ncclCommInitRank on the current device (nccl-tests src/common.cu:217-219@a0b82b2).
  Comms(const ncclUniqueId& id, int ranks, int rank) : comms_(1, nullptr) {
    CPSIM_NCCL_CHECK(ncclCommInitRank(comms_.data(), ranks, id, rank));
  }
  ~Comms() {
    for (ncclComm_t c : comms_) {
      if (c != nullptr) {
        (void)ncclCommDestroy(c);
      }
    }
  }
  Comms(const Comms&) = delete;
  Comms& operator=(const Comms&) = delete;
  ncclComm_t operator[](std::size_t i) const { return comms_[i]; }
  std::size_t size() const { return comms_.size(); }
  /// ncclCommAbort on every communicator (the error path: ncclCommDestroy would wait for the hung
  /// work); the destructor then has nothing left to destroy.
  void abort() noexcept {
    for (ncclComm_t& c : comms_) {
      if (c != nullptr) {
        (void)ncclCommAbort(c);
        c = nullptr;
      }
    }
  }
  bool aborted() const {
    return std::all_of(comms_.begin(), comms_.end(), [](ncclComm_t c) { return c == nullptr; });
  }

 private:
  std::vector<ncclComm_t> comms_;
};

/// Median over repetitions of the time per launch until the slowest stream finished;
/// `launch(iteration)` enqueues work on every stream.
double time_multi(const std::vector<const Stream*>& streams,
                  const TimingConfig& config,
                  const std::function<void(int)>& launch) {
  std::vector<std::unique_ptr<Event>> start;
  std::vector<std::unique_ptr<Event>> stop;
  for (const Stream* s : streams) {
    start.push_back(std::make_unique<Event>(s->device()));
    stop.push_back(std::make_unique<Event>(s->device()));
  }
  auto record = [&](std::vector<std::unique_ptr<Event>>& events) {
    for (std::size_t i = 0; i < streams.size(); ++i) {
      const DeviceGuard guard(streams[i]->device());
      CPSIM_CUDA_CHECK(cudaEventRecord(events[i]->get(), streams[i]->get()));
    }
  };
  auto slowest = [&]() {
    double t = 0.0;
    for (std::size_t i = 0; i < streams.size(); ++i) {
      CPSIM_CUDA_CHECK(cudaEventSynchronize(stop[i]->get()));
      t = std::max(t, elapsed_s(*start[i], *stop[i]));
    }
    return t;
  };
  int iteration = 0;
  record(start);
  launch(iteration++);
  record(stop);
  double estimate = slowest();
  if (estimate < 0.05) {
    for (int w = 1; w < config.warmup; ++w) {
      launch(iteration++);
    }
  }
  estimate = std::max(estimate, 1e-7);
  const int inner =
      static_cast<int>(std::clamp(std::ceil(config.target_rep_s / estimate), 1.0,
                                  static_cast<double>(std::max(1, config.max_inner))));
  const int reps = estimate > 0.25 ? 3 : (estimate > 0.05 ? 5 : config.repetitions);
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    record(start);
    for (int i = 0; i < inner; ++i) {
      launch(iteration++);
    }
    record(stop);
    times.push_back(slowest() / inner);
  }
  return median(std::move(times));
}

/// Per-rank buffers of one collective group, with rotation against L2.
struct RankBuffers {
  DeviceBuffer send;
  DeviceBuffer recv;
};

/// Enqueues one collective of nccl-tests size `size` on one rank, from that rank's host thread (a
/// group of local GPUs) or process (MPI): grouped only around the point-to-point calls. In place as
/// nccl-tests (src/common.cu:597-599@a0b82b2, the *InplaceOffset of each test): input and output
/// in the receive buffer, all-gather's input at its rank's slot of the output, reduce-scatter's
/// output at its rank's slot of the input.
void enqueue_rank_collective(Collective op,
                             std::int64_t size,
                             bool in_place,
                             char* send_buffer,
                             char* recv,
                             int rank,
                             int g,
                             ncclComm_t comm,
                             cudaStream_t stream) {
  const auto bytes = static_cast<std::size_t>(size);
  const auto ug = static_cast<std::size_t>(g);
  const std::size_t slot = bytes / ug * static_cast<std::size_t>(rank);
  char* send = in_place ? recv : send_buffer;
  switch (op) {
    case Collective::kAllToAll: {
      const std::size_t chunk = bytes / ug;
      CPSIM_NCCL_CHECK(ncclGroupStart());
      for (int p = 0; p < g; ++p) {
        const auto pi = static_cast<std::size_t>(p);
        CPSIM_NCCL_CHECK(ncclSend(send + pi * chunk, chunk, ncclInt8, p, comm, stream));
        CPSIM_NCCL_CHECK(ncclRecv(recv + pi * chunk, chunk, ncclInt8, p, comm, stream));
      }
      CPSIM_NCCL_CHECK(ncclGroupEnd());
      break;
    }
    case Collective::kAllGather:
      CPSIM_NCCL_CHECK(ncclAllGather(in_place ? recv + slot : send, recv, bytes / ug / 2,
                                     ncclBfloat16, comm, stream));
      break;
    case Collective::kReduceScatter:
      CPSIM_NCCL_CHECK(ncclReduceScatter(send, in_place ? recv + slot : recv, bytes / ug / 2,
                                         ncclBfloat16, ncclSum, comm, stream));
      break;
    case Collective::kAllReduce:
      CPSIM_NCCL_CHECK(ncclAllReduce(send, recv, bytes / 2, ncclBfloat16, ncclSum, comm, stream));
      break;
    case Collective::kSendRecv:
      CPSIM_NCCL_CHECK(ncclGroupStart());
      CPSIM_NCCL_CHECK(ncclSend(send, bytes, ncclInt8, (rank + 1) % g, comm, stream));
      CPSIM_NCCL_CHECK(ncclRecv(recv, bytes, ncclInt8, (rank + g - 1) % g, comm, stream));
      CPSIM_NCCL_CHECK(ncclGroupEnd());
      break;
  }
}

/// The completion of NCCL work on a group: each rank's stop event (cudaEventQuery), the
/// communicators' asynchronous errors (ncclCommGetAsyncError), and ncclCommAbort.
class NcclPoll final : public CompletionPoll {
 public:
  NcclPoll(Comms& comms, std::vector<const Event*> stops, std::vector<int> devices)
      : comms_(comms), stops_(std::move(stops)), devices_(std::move(devices)) {}

  bool complete() override {
    for (std::size_t i = 0; i < stops_.size(); ++i) {
      const DeviceGuard guard(devices_[i]);
      const cudaError_t e = cudaEventQuery(stops_[i]->get());
      if (e == cudaErrorNotReady) {
        return false;
      }
      if (e != cudaSuccess) {
        error_ = fmt::format("rank {}: cudaEventQuery failed with {} ({})", i, cudaGetErrorName(e),
                             cudaGetErrorString(e));
        return false;
      }
    }
    return true;
  }

  std::optional<std::string> error() override {
    if (error_) {
      return error_;
    }
    for (std::size_t i = 0; i < comms_.size(); ++i) {
      if (comms_[i] == nullptr) {
        continue;
      }
      ncclResult_t async = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comms_[i], &async);
      if (r != ncclSuccess) {
        return fmt::format("rank {}: ncclCommGetAsyncError failed with {}", i,
                           ncclGetErrorString(r));
      }
      if (async != ncclSuccess && async != ncclInProgress) {
        return fmt::format("rank {}: asynchronous NCCL error {}", i, ncclGetErrorString(async));
      }
    }
    return std::nullopt;
  }

  void abort() override { comms_.abort(); }

 private:
  Comms& comms_;
  std::vector<const Event*> stops_;
  std::vector<int> devices_;
  std::optional<std::string> error_;
};

/// A group of the first `ranks` GPUs with NCCL: the rig the collective sweep drives.
class NcclRig final : public CollectiveRig {
 public:
  explicit NcclRig(const Session& s) : all_devices_(s.devices), rotation_bytes_(s.rotation_bytes) {}

  void open(int ranks, std::int64_t largest_size_bytes) override {
    close();
    ranks_ = ranks;
    const std::vector<int> devices(all_devices_.begin(), all_devices_.begin() + ranks);
    comms_ = std::make_unique<Comms>(devices);
    threads_ = std::make_unique<RankThreads>(ranks);
    arena_ = static_cast<std::size_t>(largest_size_bytes) + rotation_bytes_;
    std::vector<const Event*> stops;
    for (const int d : devices) {
      streams_.push_back(std::make_unique<Stream>(d));
      buffers_.push_back({DeviceBuffer(d, arena_), DeviceBuffer(d, arena_)});
      start_.push_back(std::make_unique<Event>(d));
      stop_.push_back(std::make_unique<Event>(d));
      stops.push_back(stop_.back().get());
      const DeviceGuard guard(d);
      CPSIM_CUDA_CHECK(
          cudaMemsetAsync(buffers_.back().send.at<void>(), 0, arena_, streams_.back()->get()));
    }
    poll_ = std::make_unique<NcclPoll>(*comms_, std::move(stops), devices);
  }

  /// Each rank's events and calls are issued by its own host thread (RankThreads), all at once;
  /// returns when every thread has enqueued.
  void enqueue(Collective op, std::int64_t size_bytes, int calls) override {
    const std::size_t set = (static_cast<std::size_t>(size_bytes) + 255) / 256 * 256;
    const int sets = rotation_sets(set, arena_, rotation_bytes_);
    const int first = iteration_;
    iteration_ += calls;
    threads_->run([&](int r) {
      const auto ri = static_cast<std::size_t>(r);
      const Stream& stream = *streams_[ri];
      const DeviceGuard guard(stream.device());
      CPSIM_CUDA_CHECK(cudaEventRecord(start_[ri]->get(), stream.get()));
      for (int c = 0; c < calls; ++c) {
        const std::size_t offset = static_cast<std::size_t>((first + c) % sets) * set;
        enqueue_rank_collective(op, size_bytes, false, buffers_[ri].send.at<char>(offset),
                                buffers_[ri].recv.at<char>(offset), r, ranks_, (*comms_)[ri],
                                stream.get());
      }
      CPSIM_CUDA_CHECK(cudaEventRecord(stop_[ri]->get(), stream.get()));
    });
  }

  CompletionPoll& poll() override { return *poll_; }

  double elapsed_s() override {
    double t = 0.0;
    for (std::size_t i = 0; i < stop_.size(); ++i) {
      t = std::max(t, cuda::elapsed_s(*start_[i], *stop_[i]));
    }
    return t;
  }

  /// After an abort the communicators are gone (Comms::abort); streams, events and buffers are
  /// freed either way.
  void close() override {
    threads_.reset();
    poll_.reset();
    start_.clear();
    stop_.clear();
    buffers_.clear();
    streams_.clear();
    comms_.reset();
  }

 private:
  std::vector<int> all_devices_;
  std::size_t rotation_bytes_;
  int ranks_ = 0;
  std::size_t arena_ = 0;
  int iteration_ = 0;
  std::unique_ptr<Comms> comms_;
  std::unique_ptr<RankThreads> threads_;  ///< one host thread per GPU of the group
  std::vector<std::unique_ptr<Stream>> streams_;
  std::vector<RankBuffers> buffers_;
  std::vector<std::unique_ptr<Event>> start_;
  std::vector<std::unique_ptr<Event>> stop_;
  std::unique_ptr<NcclPoll> poll_;
};

/// This process's rank of an NCCL group spanning processes (`calibrate run --mpi`): one GPU, one
/// communicator from ncclCommInitRank, one stream, events and rotated buffers.
class NcclRankRig final : public RankRig {
 public:
  explicit NcclRankRig(const Session& s)
      : device_(s.devices.front()), rotation_bytes_(s.rotation_bytes) {}
  ~NcclRankRig() override { close(); }
  NcclRankRig(const NcclRankRig&) = delete;
  NcclRankRig& operator=(const NcclRankRig&) = delete;

  std::vector<std::uint8_t> unique_id() override {
    ncclUniqueId id{};
    CPSIM_NCCL_CHECK(ncclGetUniqueId(&id));
    std::vector<std::uint8_t> bytes(sizeof(id));
    std::memcpy(bytes.data(), &id, sizeof(id));
    return bytes;
  }

  void open(const std::vector<std::uint8_t>& id,
            int ranks,
            int rank,
            std::int64_t largest_size_bytes) override {
    close();
    ncclUniqueId uid{};
    if (id.size() != sizeof(uid)) {
      throw MeasureError(
          fmt::format("NCCL unique id of {} bytes received, {} expected", id.size(), sizeof(uid)));
    }
    std::memcpy(&uid, id.data(), sizeof(uid));
    const DeviceGuard guard(device_);
    ranks_ = ranks;
    rank_ = rank;
    comms_ = std::make_unique<Comms>(uid, ranks, rank);
    arena_ = static_cast<std::size_t>(largest_size_bytes) + rotation_bytes_;
    stream_ = std::make_unique<Stream>(device_);
    send_ = std::make_unique<DeviceBuffer>(device_, arena_);
    recv_ = std::make_unique<DeviceBuffer>(device_, arena_);
    start_ = std::make_unique<Event>(device_);
    stop_ = std::make_unique<Event>(device_);
    CPSIM_CUDA_CHECK(cudaMemsetAsync(send_->at<void>(), 0, arena_, stream_->get()));
    CPSIM_CUDA_CHECK(cudaMemsetAsync(recv_->at<void>(), 0, arena_, stream_->get()));
    poll_ = std::make_unique<NcclPoll>(*comms_, std::vector<const Event*>{stop_.get()},
                                       std::vector<int>{device_});
  }

  void enqueue(Collective op, std::int64_t size_bytes, int calls, bool in_place) override {
    const DeviceGuard guard(device_);
    const std::size_t set = (static_cast<std::size_t>(size_bytes) + 255) / 256 * 256;
    const int sets = rotation_sets(set, arena_, rotation_bytes_);
    CPSIM_CUDA_CHECK(cudaEventRecord(start_->get(), stream_->get()));
    for (int c = 0; c < calls; ++c) {
      const std::size_t offset = static_cast<std::size_t>(iteration_++ % sets) * set;
      enqueue_rank_collective(op, size_bytes, in_place, send_->at<char>(offset),
                              recv_->at<char>(offset), rank_, ranks_, (*comms_)[0], stream_->get());
    }
    CPSIM_CUDA_CHECK(cudaEventRecord(stop_->get(), stream_->get()));
  }

  CompletionPoll& poll() override { return *poll_; }

  double elapsed_s() override { return cuda::elapsed_s(*start_, *stop_); }

  void abort() override {
    if (comms_) {
      comms_->abort();
    }
  }

  /// After an abort the communicator is gone (Comms::abort); the rest is freed either way.
  void close() override {
    poll_.reset();
    start_.reset();
    stop_.reset();
    send_.reset();
    recv_.reset();
    stream_.reset();
    comms_.reset();
  }

 private:
  int device_;
  std::size_t rotation_bytes_;
  int ranks_ = 0;
  int rank_ = 0;
  std::size_t arena_ = 0;
  int iteration_ = 0;
  std::unique_ptr<Comms> comms_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<DeviceBuffer> send_;
  std::unique_ptr<DeviceBuffer> recv_;
  std::unique_ptr<Event> start_;
  std::unique_ptr<Event> stop_;
  std::unique_ptr<NcclPoll> poll_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Collectives

std::unique_ptr<RankRig> make_nccl_rank_rig(const Session& s) {
  return std::make_unique<NcclRankRig>(s);
}

std::size_t plan_collectives(const Session& s) {
  return group_sizes(s).size() * std::size(kOps) * collective_sizes(s.options.quick).size();
}

CollectivePlan collective_plan(const Session& s) {
  CollectivePlan plan;
  plan.groups = group_sizes(s);
  plan.ops.assign(std::begin(kOps), std::end(kOps));
  plan.sizes_bytes = collective_sizes(s.options.quick);
  return plan;
}

std::unique_ptr<CollectiveRig> make_nccl_rig(const Session& s) {
  return std::make_unique<NcclRig>(s);
}

// ---------------------------------------------------------------------------------------------
// Host copies

std::size_t plan_host_copies(const Session& s) {
  const bool q = s.options.quick;
  std::size_t n = static_cast<std::size_t>(s.gpus) * std::size(kDirections) * copy_sizes(q).size();
  if (s.gpus > 1) {
    n += std::size(kDirections) * all_gpu_copy_sizes(q).size();
  }
  return n;
}

namespace {

/// Buffers and streams of one GPU's host copies.
struct CopyRig {
  int device;
  std::unique_ptr<PinnedBuffer> host_src;
  std::unique_ptr<PinnedBuffer> host_dst;
  DeviceBuffer dev_src;
  DeviceBuffer dev_dst;
  std::unique_ptr<Stream> s1;
  std::unique_ptr<Stream> s2;
  std::unique_ptr<Event> fork;
  std::unique_ptr<Event> join;

  /// `cpus`: the GPU's NUMA node's (gpu_numa_placement), where its host buffers are allocated.
  CopyRig(int d, std::size_t bytes, const std::vector<int>& cpus)
      : device(d),
        host_src(std::make_unique<PinnedBuffer>(bytes, cpus)),
        host_dst(std::make_unique<PinnedBuffer>(bytes, cpus)),
        dev_src(d, bytes),
        dev_dst(d, bytes),
        s1(std::make_unique<Stream>(d)),
        s2(std::make_unique<Stream>(d)),
        fork(std::make_unique<Event>(d)),
        join(std::make_unique<Event>(d)) {}

  /// One copy (or, for duplex, one each way at once) enqueued on s1 (s2 joins back into s1).
  void enqueue(CopyDirection direction, std::size_t bytes) const {
    const DeviceGuard guard(device);
    switch (direction) {
      case CopyDirection::kHostToDevice:
        CPSIM_CUDA_CHECK(cudaMemcpyAsync(dev_dst.at<void>(), host_src->get(), bytes,
                                         cudaMemcpyHostToDevice, s1->get()));
        break;
      case CopyDirection::kDeviceToHost:
        CPSIM_CUDA_CHECK(cudaMemcpyAsync(host_dst->get(), dev_src.at<void>(), bytes,
                                         cudaMemcpyDeviceToHost, s1->get()));
        break;
      case CopyDirection::kDuplex:
        CPSIM_CUDA_CHECK(cudaEventRecord(fork->get(), s1->get()));
        CPSIM_CUDA_CHECK(cudaStreamWaitEvent(s2->get(), fork->get(), 0));
        CPSIM_CUDA_CHECK(cudaMemcpyAsync(dev_dst.at<void>(), host_src->get(), bytes,
                                         cudaMemcpyHostToDevice, s1->get()));
        CPSIM_CUDA_CHECK(cudaMemcpyAsync(host_dst->get(), dev_src.at<void>(), bytes,
                                         cudaMemcpyDeviceToHost, s2->get()));
        CPSIM_CUDA_CHECK(cudaEventRecord(join->get(), s2->get()));
        CPSIM_CUDA_CHECK(cudaStreamWaitEvent(s1->get(), join->get(), 0));
        break;
    }
  }
};

}  // namespace

void run_host_copies(Session& s) {
  const bool quick = s.options.quick;
  const std::vector<std::int64_t> sizes = copy_sizes(quick);
  const auto largest = static_cast<std::size_t>(sizes.back());
  std::vector<NumaPlacement> placement;
  for (const int d : s.devices) {
    placement.push_back(gpu_numa_placement(d));
    const NumaPlacement& p = placement.back();
    s.notes.push_back(p.node < 0
                          ? fmt::format("GPU {}: NUMA node unknown (no sysfs entry); pinned host "
                                        "buffers wherever the system put them",
                                        d)
                          : fmt::format("GPU {}: pinned host buffers on its NUMA node {} ({} CPUs)",
                                        d, p.node, p.cpus.size()));
  }
  for (std::size_t i = 0; i < s.devices.size(); ++i) {
    const int d = s.devices[i];
    s.progress.start(fmt::format("pinned host buffers, GPU {}", d));
    const CopyRig rig(d, largest, placement[i].cpus);
    for (const CopyDirection direction : kDirections) {
      for (const std::int64_t size : sizes) {
        s.progress.start(fmt::format("host copy GPU {} {} {}", d, to_string(direction),
                                     bytes_label(static_cast<double>(size))));
        const auto bytes = static_cast<std::size_t>(size);
        const double t = time_launches(*rig.s1, s.timing,
                                       [&](int /*iteration*/) { rig.enqueue(direction, bytes); });
        s.samples.host_copies.push_back({direction, d, 1, size, t});
        s.progress.done();
      }
    }
  }
  if (s.gpus < 2) {
    return;
  }
  const std::vector<std::int64_t> all_sizes = all_gpu_copy_sizes(quick);
  const auto all_largest = static_cast<std::size_t>(all_sizes.back());
  std::vector<std::unique_ptr<CopyRig>> rigs;
  std::vector<const Stream*> streams;
  for (std::size_t i = 0; i < s.devices.size(); ++i) {
    rigs.push_back(std::make_unique<CopyRig>(s.devices[i], all_largest, placement[i].cpus));
    streams.push_back(rigs.back()->s1.get());
  }
  for (const CopyDirection direction : kDirections) {
    for (const std::int64_t size : all_sizes) {
      s.progress.start(fmt::format("host copy all {} GPUs {} {}", s.gpus, to_string(direction),
                                   bytes_label(static_cast<double>(size))));
      const auto bytes = static_cast<std::size_t>(size);
      const double t = time_multi(streams, s.timing, [&](int /*iteration*/) {
        for (const auto& rig : rigs) {
          rig->enqueue(direction, bytes);
        }
      });
      s.samples.host_copies.push_back({direction, -1, s.gpus, size, t});
      s.progress.done();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Interference

std::size_t plan_interference(const Session& s) {
  return s.gpus > 1 ? 2 : 1;
}

void run_interference(Session& s) {
  const int device = s.devices.front();
  const AttentionShape shape{128, 32, s.options.quick ? 4096 : 8192, s.options.quick ? 4096 : 8192,
                             false};
  const std::string foreground = fmt::format("attention_fwd cpsim-flash d{} h{} s{}",
                                             shape.head_dim, shape.heads, shape.q_len);
  const DeviceGuard guard(device);
  CPSIM_CUDA_CHECK(flash_attention_prepare());
  const Stream compute(device);
  const std::size_t arena = std::min<std::size_t>(
      free_device_memory(device) / 4, 4 * AttentionBench::set_bytes(shape) + s.rotation_bytes);
  AttentionBench bench(device, arena, s.rotation_bytes);
  const double alone = bench.time_forward(compute, s.timing, shape);
  // How long the timed attention launches will run, with margin: the background must outlast it.
  const double window = 2.0 * (alone * (s.timing.warmup + 1) +
                               std::max(s.timing.target_rep_s, alone) * s.timing.repetitions) +
                        0.05;

  // Background 1: host copies both ways on the same GPU (copy engines).
  {
    s.progress.start("interference: attention under host copies");
    constexpr std::size_t kChunk = std::size_t{64} << 20;
    const CopyRig rig(device, kChunk, gpu_numa_placement(device).cpus);
    const double t_chunk = time_launches(
        *rig.s1, s.timing, [&](int /*iteration*/) { rig.enqueue(CopyDirection::kDuplex, kChunk); });
    const int n = static_cast<int>(std::ceil(window / std::max(t_chunk, 1e-5))) + 2;
    for (int i = 0; i < n; ++i) {
      rig.enqueue(CopyDirection::kDuplex, kChunk);
    }
    const double with_copies = bench.time_forward(compute, s.timing, shape);
    CPSIM_CUDA_CHECK(cudaStreamSynchronize(rig.s1->get()));
    s.samples.interference.push_back({"host_copies", foreground, 1, alone, with_copies});
    s.progress.done();
  }

  if (s.gpus < 2) {
    s.notes.push_back("with all-to-all skipped: one GPU");
    return;
  }
  if (!s.control.nccl_usable) {
    s.notes.push_back("with all-to-all skipped: a collective timed out or failed earlier");
    s.progress.done();
    return;
  }
  // Background 2: a 256 MiB NCCL all-to-all over all GPUs, back to back; every wait on it has
  // the run's deadline.
  s.progress.start("interference: attention under all-to-all");
  constexpr std::int64_t kSize = std::int64_t{1} << 28;
  const std::int64_t size = effective_collective_size(Collective::kAllToAll, s.gpus, kSize);
  NcclRig rig(s);
  rig.open(s.gpus, size);
  const WaitClock clock = steady_wait_clock();
  auto wait = [&](const char* what) {
    const WaitResult w = wait_with_deadline(rig.poll(), s.control.collective_timeout_s, clock);
    if (w.status != WaitStatus::kComplete) {
      s.notes.push_back(
          fmt::format("with all-to-all: the {} {} ({}); its communicators were aborted", what,
                      w.status == WaitStatus::kTimedOut ? "timed out" : "failed", w.message));
      rig.close();
      return false;
    }
    return true;
  };
  rig.enqueue(Collective::kAllToAll, size, 1);  // warm-up
  if (!wait("warm-up all-to-all")) {
    return;
  }
  rig.enqueue(Collective::kAllToAll, size, 1);
  if (!wait("timed all-to-all")) {
    return;
  }
  const double t_a2a = rig.elapsed_s();
  const int n = static_cast<int>(std::ceil(window / std::max(t_a2a, 1e-5))) + 2;
  rig.enqueue(Collective::kAllToAll, size, n);
  const double with_comm = bench.time_forward(compute, s.timing, shape);
  if (!wait("background all-to-all")) {
    return;
  }
  rig.close();
  s.samples.interference.push_back({"all_to_all", foreground, s.gpus, alone, with_comm});
  s.progress.done();
}

}  // namespace cpsim::calibrate::cuda
