// Communication sweeps: NCCL collectives over groups of local GPUs (one process drives all of
// them through ncclCommInitAll), pinned host<->device copies, and the interference of
// communication with attention.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <memory>
#include <nccl.h>
#include <string>
#include <vector>

#include <fmt/format.h>

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
    groups.push_back(2);
    if (s.gpus > 2) {
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

/// NCCL communicators of one group of local devices.
class Comms {
 public:
  explicit Comms(const std::vector<int>& devices) : comms_(devices.size(), nullptr) {
    CPSIM_NCCL_CHECK(
        ncclCommInitAll(comms_.data(), static_cast<int>(devices.size()), devices.data()));
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

/// The nccl-tests size actually moved for a requested size (counts rounded to whole elements),
/// 0 when too small for the group.
std::int64_t effective_size(Collective op, int g, std::int64_t size) {
  switch (op) {
    case Collective::kAllToAll:
      return size / g / 2 * 2 * g;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
      return size / (2 * g) * 2 * g;
    case Collective::kAllReduce:
      return size / 2 * 2;
    case Collective::kSendRecv:
      return size;
  }
  return size;
}

/// Enqueues one collective of nccl-tests size `size` on every rank of the group.
void enqueue_collective(Collective op,
                        std::int64_t size,
                        std::size_t offset,
                        const Comms& comms,
                        const std::vector<std::unique_ptr<Stream>>& streams,
                        const std::vector<RankBuffers>& buffers,
                        int g) {
  CPSIM_NCCL_CHECK(ncclGroupStart());
  const auto bytes = static_cast<std::size_t>(size);
  for (int r = 0; r < g; ++r) {
    const auto ri = static_cast<std::size_t>(r);
    char* send = buffers[ri].send.at<char>(offset);
    char* recv = buffers[ri].recv.at<char>(offset);
    cudaStream_t stream = streams[ri]->get();
    const ncclComm_t comm = comms[ri];
    const auto ug = static_cast<std::size_t>(g);
    switch (op) {
      case Collective::kAllToAll: {
        const std::size_t chunk = bytes / ug;
        for (int p = 0; p < g; ++p) {
          const auto pi = static_cast<std::size_t>(p);
          CPSIM_NCCL_CHECK(ncclSend(send + pi * chunk, chunk, ncclInt8, p, comm, stream));
          CPSIM_NCCL_CHECK(ncclRecv(recv + pi * chunk, chunk, ncclInt8, p, comm, stream));
        }
        break;
      }
      case Collective::kAllGather:
        CPSIM_NCCL_CHECK(ncclAllGather(send, recv, bytes / ug / 2, ncclBfloat16, comm, stream));
        break;
      case Collective::kReduceScatter:
        CPSIM_NCCL_CHECK(
            ncclReduceScatter(send, recv, bytes / ug / 2, ncclBfloat16, ncclSum, comm, stream));
        break;
      case Collective::kAllReduce:
        CPSIM_NCCL_CHECK(ncclAllReduce(send, recv, bytes / 2, ncclBfloat16, ncclSum, comm, stream));
        break;
      case Collective::kSendRecv:
        CPSIM_NCCL_CHECK(ncclSend(send, bytes, ncclInt8, (r + 1) % g, comm, stream));
        CPSIM_NCCL_CHECK(ncclRecv(recv, bytes, ncclInt8, (r + g - 1) % g, comm, stream));
        break;
    }
  }
  CPSIM_NCCL_CHECK(ncclGroupEnd());
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Collectives

std::size_t plan_collectives(const Session& s) {
  return group_sizes(s).size() * std::size(kOps) * collective_sizes(s.options.quick).size();
}

void run_collectives(Session& s) {
  const std::vector<int> groups = group_sizes(s);
  if (groups.empty()) {
    s.notes.push_back(
        "collectives skipped: only one GPU was measured (NCCL needs at least two); the fitted "
        "profile keeps the base profile's collectives");
    return;
  }
  const std::vector<std::int64_t> sizes = collective_sizes(s.options.quick);
  const auto largest = static_cast<std::size_t>(sizes.back());
  for (const int g : groups) {
    const std::vector<int> devices(s.devices.begin(), s.devices.begin() + g);
    s.progress.start(fmt::format("NCCL init, {} GPUs", g));
    const Comms comms(devices);
    std::vector<std::unique_ptr<Stream>> streams;
    std::vector<RankBuffers> buffers;
    const std::size_t arena = largest + s.rotation_bytes;
    for (const int d : devices) {
      streams.push_back(std::make_unique<Stream>(d));
      buffers.push_back({DeviceBuffer(d, arena), DeviceBuffer(d, arena)});
      const DeviceGuard guard(d);
      CPSIM_CUDA_CHECK(
          cudaMemsetAsync(buffers.back().send.at<void>(), 0, arena, streams.back()->get()));
    }
    std::vector<const Stream*> stream_ptrs;
    for (const auto& st : streams) {
      stream_ptrs.push_back(st.get());
    }
    for (const Collective op : kOps) {
      for (const std::int64_t requested : sizes) {
        s.progress.start(fmt::format("NCCL {} {} GPUs {}", collective_name(op), g,
                                     bytes_label(static_cast<double>(requested))));
        const std::int64_t size = effective_size(op, g, requested);
        if (size <= 0) {
          s.progress.done();
          continue;
        }
        const std::size_t set = (static_cast<std::size_t>(size) + 255) / 256 * 256;
        const int sets = rotation_sets(set, arena, s.rotation_bytes);
        const double t = time_multi(stream_ptrs, s.timing, [&](int iteration) {
          const std::size_t offset = static_cast<std::size_t>(iteration % sets) * set;
          enqueue_collective(op, size, offset, comms, streams, buffers, g);
        });
        const double algbw = static_cast<double>(size) / t;
        s.samples.collectives.push_back({op, g, size, t, algbw, algbw * busbw_factor(op, g)});
        if (op == Collective::kAllToAll && g == s.gpus && requested == (std::int64_t{1} << 28)) {
          s.all_to_all_256m_s = t;
        }
        s.progress.done();
      }
    }
  }
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

  CopyRig(int d, std::size_t bytes)
      : device(d),
        host_src(std::make_unique<PinnedBuffer>(bytes)),
        host_dst(std::make_unique<PinnedBuffer>(bytes)),
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
  for (const int d : s.devices) {
    s.progress.start(fmt::format("pinned host buffers, GPU {}", d));
    const CopyRig rig(d, largest);
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
  for (const int d : s.devices) {
    rigs.push_back(std::make_unique<CopyRig>(d, all_largest));
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
    const CopyRig rig(device, kChunk);
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
    s.notes.push_back("interference with all-to-all skipped: one GPU");
    return;
  }
  // Background 2: a 256 MiB NCCL all-to-all over all GPUs, back to back.
  s.progress.start("interference: attention under all-to-all");
  const Comms comms(s.devices);
  constexpr std::int64_t kSize = std::int64_t{1} << 28;
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<RankBuffers> buffers;
  for (const int d : s.devices) {
    streams.push_back(std::make_unique<Stream>(d));
    buffers.push_back({DeviceBuffer(d, static_cast<std::size_t>(kSize)),
                       DeviceBuffer(d, static_cast<std::size_t>(kSize))});
  }
  const std::int64_t size = effective_size(Collective::kAllToAll, s.gpus, kSize);
  double t_a2a = s.all_to_all_256m_s;
  if (t_a2a <= 0.0) {
    std::vector<const Stream*> ptrs;
    for (const auto& st : streams) {
      ptrs.push_back(st.get());
    }
    t_a2a = time_multi(ptrs, s.timing, [&](int /*iteration*/) {
      enqueue_collective(Collective::kAllToAll, size, 0, comms, streams, buffers, s.gpus);
    });
  }
  const int n = static_cast<int>(std::ceil(window / std::max(t_a2a, 1e-5))) + 2;
  for (int i = 0; i < n; ++i) {
    enqueue_collective(Collective::kAllToAll, size, 0, comms, streams, buffers, s.gpus);
  }
  const double with_comm = bench.time_forward(compute, s.timing, shape);
  for (const auto& st : streams) {
    const DeviceGuard g(st->device());
    CPSIM_CUDA_CHECK(cudaStreamSynchronize(st->get()));
  }
  s.samples.interference.push_back({"all_to_all", foreground, s.gpus, alone, with_comm});
  s.progress.done();
}

}  // namespace cpsim::calibrate::cuda
