// `cpsim calibrate run --mpi`: the collective sweep over nodes, one process per GPU, on a
// ProcessGroup (MPI) and a RankRig (NCCL). docs/CALIBRATION.md "Several nodes (--mpi)".
//
// nccl-tests' method (NVIDIA/nccl-tests, src/common.cu @a0b82b2): the NCCL unique id is created
// by rank 0 of the communicator's MPI group and broadcast with MPI_Bcast (1548-1554), every rank
// calls ncclCommInitRank (217-219); per size the out-of-place half, then the in-place half
// (939-940), each after one untimed call (BenchTime, 701-703); the reported time is reduced over
// the ranks with MPI_Allreduce, MPI_MAX when run with `-a 3` (119-120, 343-347; the default, 1, is
// the mean). cpsim takes the maximum: a collective ends when its slowest rank does. The warm-up per
// communicator at the largest and smallest size is that of its releases up to 2.13
// (src/common.cu:487-499@cbe7f65), as in the single-process sweep (collective_sweep.cpp).
#include "cpsim/calibrate/mpi_run.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cpsim/calibrate/utc_time.hpp"
#include "cpsim/models/error.hpp"

namespace cpsim::calibrate {
namespace {

using models::Collective;

enum Status { kOk = 0, kTimedOut = 1, kFailed = 2 };

/// One communicator of the sweep on this rank.
struct GroupSpec {
  std::string label;   ///< e.g. "4 ranks on 2 nodes (all ranks)"
  ProcessGroup* comm;  ///< this rank's MPI group of it
  int ranks;
  int nodes;
};

/// The group was given up on every rank (its communicators aborted); `note` says why.
struct GroupLost {
  std::string note;
  bool timed_out = false;
};

std::string size_label(std::int64_t bytes) {
  const auto b = static_cast<double>(bytes);
  if (bytes >= (std::int64_t{1} << 20)) {
    return fmt::format("{:.1f} MiB", b / static_cast<double>(1 << 20));
  }
  return fmt::format("{:.1f} KiB", b / 1024.0);
}

/// The sweep of one run: holds the world, the rig and (rank 0) the raw file as written.
class MpiSweep {
 public:
  MpiSweep(ProcessGroup& world,
           RankRig& rig,
           const MpiRunRequest& request,
           const RawWriter& write,
           const WaitClock& clock,
           const ProgressFn& progress,
           MpiRunSummary& summary)
      : world_(world),
        rig_(rig),
        request_(request),
        write_(write),
        clock_(clock),
        progress_(progress),
        summary_(summary) {}

  /// Progress steps: one per group, op and size.
  std::size_t total_steps() const { return total_steps_; }

  /// The groups in order; returns false when one was lost (noted, later ones skipped).
  bool run(const std::vector<GroupSpec>& groups,
           const CollectivePlan& plan,
           const TimingPlan& timing) {
    for (const GroupSpec& g : groups) {
      for (const Collective op : plan.ops) {
        for (const std::int64_t requested : plan.sizes_bytes) {
          total_steps_ += effective_collective_size(op, g.ranks, requested) > 0 ? 1 : 0;
        }
      }
    }
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      try {
        run_group(groups[gi], plan, timing);
      } catch (const GroupLost& lost) {
        std::string rest;
        for (std::size_t later = gi + 1; later < groups.size(); ++later) {
          rest += fmt::format("{}{}", rest.empty() ? "" : ", ", groups[later].label);
        }
        notes_.push_back(lost.note);
        notes_.push_back(fmt::format(
            "collectives stopped: the samples before the failure are kept; {}",
            rest.empty() ? "no later group was left" : fmt::format("skipped: {}", rest)));
        status_ = lost.timed_out ? "timed_out" : "failed";
        commit(true);
        return false;
      }
      commit(gi + 1 == groups.size());
    }
    return true;
  }

  /// Rank 0: the file as it stands (context, samples so far, the sweep's state) is written; until
  /// the sweep ends it reads `failed` (not finished), so a killed job says so.
  void commit(bool finished) {
    if (world_.rank() != 0) {
      return;
    }
    RawCalibration& raw = summary_.raw;
    for (SweepRecord& r : raw.context.sweeps) {
      if (r.name == "collectives") {
        r.status = finished ? status_ : "failed";
        r.date = utc_now();
        r.notes = notes_;
        if (!finished) {
          r.notes.push_back(
              fmt::format("not finished: the run was still measuring ({} samples "
                          "so far)",
                          samples_.size()));
        }
      }
    }
    raw.samples.collectives = samples_;
    write_(write_raw(raw));
  }

  const std::string& status() const { return status_; }

  /// Every rank's (status, value) maximum over the world, with the deadline; a rank missing the
  /// agreement ends the job (rank 0 writes first).
  std::vector<double> agree(std::vector<double> values, const std::string& what) {
    const double timeout_s =
        (request_.collective_timeout_s + request_.agreement_grace_s) * (world_.rank() == 0 ? 1 : 2);
    if (auto agreed = world_.max_all(values, timeout_s)) {
      return *agreed;
    }
    if (world_.rank() == 0) {
      notes_.push_back(fmt::format(
          "{}: not every rank answered within {:.0f} s (a process hung in a call without a "
          "deadline, e.g. ncclCommInitRank, or died); the job was ended with MPI_Abort",
          what, timeout_s));
      status_ = "timed_out";
      commit(true);
    }
    world_.abort(1);
    throw std::logic_error("MPI_Abort returned");  // ProcessGroup::abort never does
  }

  /// After a non-ok agreement: every rank gives its communicator up and rank 0 collects why.
  [[noreturn]] void lose_group(const std::string& what,
                               Status own,
                               const std::string& own_message,
                               Status worst) {
    rig_.abort();  // a peer failed: this rank's communicator is unusable too
    rig_.close();
    const std::vector<std::string> messages = world_.gather(
        own == kOk ? std::string()
                   : fmt::format("rank {} ({}): {}", world_.rank(), world_.host(), own_message),
        0);
    std::string why;
    for (const std::string& m : messages) {
      if (!m.empty()) {
        why += fmt::format("{}{}", why.empty() ? "" : "; ", m);
      }
    }
    throw GroupLost{fmt::format("{}: {}; the group's communicators were aborted (ncclCommAbort) "
                                "on every rank",
                                what, why),
                    worst == kTimedOut};
  }

 private:
  /// `calls` collectives on every rank, waited for under the deadline; the agreed time per call
  /// (maximum over the ranks). Throws GroupLost.
  double run_calls(
      const GroupSpec& g, Collective op, std::int64_t size_bytes, int calls, bool in_place) {
    Status status = kOk;
    std::string message;
    double per_call_s = 0.0;
    try {
      rig_.enqueue(op, size_bytes, calls, in_place);
      const WaitResult w = wait_with_deadline(rig_.poll(), request_.collective_timeout_s, clock_);
      if (w.status == WaitStatus::kComplete) {
        per_call_s = rig_.elapsed_s() / calls;
      } else {
        status = w.status == WaitStatus::kTimedOut ? kTimedOut : kFailed;
        message = fmt::format("{} ({})", w.status == WaitStatus::kTimedOut ? "timed out" : "failed",
                              w.message);
      }
    } catch (const MeasureError& e) {
      status = kFailed;
      message = e.what();
    }
    const std::string what =
        fmt::format("{} {} {} over {}", models::to_string(op), size_label(size_bytes),
                    in_place ? "in-place" : "out-of-place", g.label);
    const std::vector<double> agreed = agree({static_cast<double>(status), per_call_s}, what);
    if (agreed[0] > 0.0) {
      lose_group(what, status, message, static_cast<Status>(static_cast<int>(agreed[0])));
    }
    return agreed[1];
  }

  /// One size, one half: an untimed call, a timed call that sizes the repetitions, the
  /// repetitions (median of the per-repetition maxima).
  double time_size(const GroupSpec& g,
                   Collective op,
                   std::int64_t size_bytes,
                   bool in_place,
                   const TimingPlan& timing) {
    return timed_median(timing,
                        [&](int calls) { return run_calls(g, op, size_bytes, calls, in_place); });
  }

  /// Opens the group's communicator: id on its root, MPI_Bcast, ncclCommInitRank; agreed.
  void open_group(const GroupSpec& g, std::int64_t largest_bytes) {
    Status status = kOk;
    std::string message;
    std::vector<std::uint8_t> id;
    try {
      if (g.comm->rank() == 0) {
        id = rig_.unique_id();
      }
    } catch (const MeasureError& e) {
      status = kFailed;
      message = e.what();
    }
    const std::string what = fmt::format("NCCL init over {}", g.label);
    // The id's length, agreed with the status: ranks that are not a root learn it here.
    const std::vector<double> agreed =
        agree({static_cast<double>(status), static_cast<double>(id.size())}, what);
    if (agreed[0] > 0.0) {
      lose_group(what, status, message, kFailed);
    }
    id.resize(static_cast<std::size_t>(agreed[1]));
    g.comm->broadcast(id, 0);
    try {
      rig_.open(id, g.ranks, g.comm->rank(), largest_bytes);
    } catch (const MeasureError& e) {
      status = kFailed;
      message = e.what();
    }
    if (agree({static_cast<double>(status)}, what)[0] > 0.0) {
      lose_group(what, status, message, kFailed);
    }
  }

  void run_group(const GroupSpec& g, const CollectivePlan& plan, const TimingPlan& timing) {
    const std::int64_t largest = plan.sizes_bytes.back();
    open_group(g, largest);
    for (const Collective op : plan.ops) {
      std::vector<std::int64_t> sizes;
      for (const std::int64_t requested : plan.sizes_bytes) {
        if (const std::int64_t s = effective_collective_size(op, g.ranks, requested); s > 0) {
          sizes.push_back(s);
        }
      }
      if (sizes.empty()) {
        continue;
      }
      // Per communicator and op: the largest, then the smallest size, untimed.
      (void)run_calls(g, op, sizes.back(), 1, false);
      (void)run_calls(g, op, sizes.front(), 1, false);
      for (const std::int64_t size : sizes) {
        if (world_.rank() == 0 && progress_) {
          progress_(
              steps_done_, total_steps(),
              fmt::format("NCCL {} {} over {}", models::to_string(op), size_label(size), g.label));
        }
        ++steps_done_;
        for (const bool in_place : {false, true}) {
          const double t = time_size(g, op, size, in_place, timing);
          const double algbw = static_cast<double>(size) / t;
          samples_.push_back(
              {op, g.ranks, size, t, algbw, algbw * busbw_factor(op, g.ranks), g.nodes, in_place});
        }
      }
    }
    rig_.close();
  }

  ProcessGroup& world_;
  RankRig& rig_;
  const MpiRunRequest& request_;
  const RawWriter& write_;
  const WaitClock& clock_;
  const ProgressFn& progress_;
  MpiRunSummary& summary_;
  std::size_t steps_done_ = 0;
  std::size_t total_steps_ = 0;
  std::vector<CollectiveSample> samples_;
  std::vector<std::string> notes_;
  std::string status_ = "done";
};

/// Nodes: blocks of `ranks_per_node_override` consecutive ranks (testing), else the hosts.
std::unique_ptr<ProcessGroup> node_group(ProcessGroup& world, int ranks_per_node_override) {
  if (ranks_per_node_override > 0) {
    return world.split(world.rank() / ranks_per_node_override, world.rank());
  }
  return world.split_shared();
}

/// Opens this rank's GPU; a failure on any rank is reported by rank 0 (naming the ranks) and
/// thrown on every rank: InputError when one was an InputError, else MeasureError.
RawContext open_ranks(ProcessGroup& world,
                      MeasureBackend& backend,
                      const MpiRunRequest& request,
                      int local_rank,
                      double timeout_s) {
  RawContext context;
  Status status = kOk;
  bool input_error = false;
  std::string message;
  try {
    context = backend.open_rank(request.options, local_rank);
  } catch (const InputError& e) {
    status = kFailed;
    input_error = true;
    message = e.what();
  } catch (const MeasureError& e) {
    status = kFailed;
    message = e.what();
  }
  const auto agreed =
      world.max_all({static_cast<double>(status), input_error ? 1.0 : 0.0}, timeout_s);
  if (!agreed) {
    world.abort(1);  // nothing written yet: a rank hung while opening its GPU
  }
  if ((*agreed)[0] == 0.0) {
    return context;
  }
  const std::vector<std::string> messages =
      world.gather(status == kOk ? std::string() : message, 0);
  // Ranks with the same message are named together (a build without CUDA says so on every rank).
  std::vector<std::pair<std::string, std::string>> by_message;  // message, ranks
  for (std::size_t r = 0; r < messages.size(); ++r) {
    if (messages[r].empty()) {
      continue;
    }
    auto it = std::find_if(by_message.begin(), by_message.end(),
                           [&](const auto& entry) { return entry.first == messages[r]; });
    if (it == by_message.end()) {
      by_message.emplace_back(messages[r], fmt::format("rank {}", r));
    } else {
      it->second += fmt::format(", {}", r);
    }
  }
  std::string why;
  for (const auto& [m, ranks] : by_message) {
    why += fmt::format("{}{}: {}", why.empty() ? "" : "; ", ranks, m);
  }
  if (world.rank() != 0) {
    why = "see rank 0";
  }
  if ((*agreed)[1] > 0.0) {
    throw InputError("--mpi", why);
  }
  throw MeasureError(why);
}

/// Rank 0: the hosts of the nodes (the host of each node's local rank 0, in world order), and a
/// note for every rank whose device or software differs from rank 0's.
void describe_ranks(ProcessGroup& world,
                    int local_rank,
                    const RawContext& own,
                    RawContext& context,
                    std::vector<std::string>& warnings) {
  const std::string identity = fmt::format("{}|{}|{}|{}", own.device, own.driver_version,
                                           own.cuda_runtime_version, own.nccl_version);
  const std::vector<std::string> hosts =
      world.gather(fmt::format("{}|{}", local_rank, world.host()), 0);
  const std::vector<std::string> identities = world.gather(identity, 0);
  std::string own_warnings;
  for (const std::string& w : check_warnings(own)) {
    own_warnings += fmt::format("{}{}", own_warnings.empty() ? "" : "\n", w);
  }
  const std::vector<std::string> all_warnings = world.gather(own_warnings, 0);
  for (std::size_t r = 0; r < hosts.size(); ++r) {
    const std::string& h = hosts[r];
    if (h.rfind("0|", 0) == 0) {
      context.mpi.hosts.push_back(h.substr(2));
    }
    const std::string host = h.substr(h.find('|') + 1);
    if (identities[r] != identities.front()) {
      context.notes.push_back(
          fmt::format("rank {} ({}) has device|driver|CUDA runtime|NCCL {}, rank 0 {}", r, host,
                      identities[r], identities.front()));
    }
    std::size_t start = 0;
    while (start < all_warnings[r].size()) {
      const std::size_t end = std::min(all_warnings[r].find('\n', start), all_warnings[r].size());
      warnings.push_back(
          fmt::format("rank {} ({}): {}", r, host, all_warnings[r].substr(start, end - start)));
      start = end + 1;
    }
  }
}

/// The groups this rank belongs to, in order: its node's ranks, all ranks, and the ranks of its
/// local rank on every node (every such group at once, as the CP groups of a step run).
std::vector<GroupSpec> sweep_groups(ProcessGroup& world,
                                    ProcessGroup& node,
                                    ProcessGroup& across,
                                    int nodes) {
  std::vector<GroupSpec> groups;
  const int per_node = node.size();
  if (per_node >= 2) {
    groups.push_back(
        {fmt::format("{} ranks of one node (every node at once)", per_node), &node, per_node, 1});
  }
  if (nodes >= 2) {
    groups.push_back({fmt::format("all {} ranks on {} nodes", world.size(), nodes), &world,
                      world.size(), nodes});
  }
  if (nodes >= 2 && per_node >= 2) {
    groups.push_back({fmt::format("{} ranks, one per node (every local rank at once)", nodes),
                      &across, nodes, nodes});
  }
  return groups;
}

}  // namespace

MpiRunSummary run_mpi_calibration(ProcessGroup& world,
                                  MeasureBackend& backend,
                                  const MpiRunRequest& request,
                                  const RawWriter& write,
                                  const ProgressFn& progress,
                                  const WaitClock& clock) {
  MpiRunSummary summary;
  summary.rank = world.rank();
  const double setup_timeout_s = request.collective_timeout_s + request.agreement_grace_s;
  const std::unique_ptr<ProcessGroup> node = node_group(world, request.ranks_per_node_override);
  const int local_rank = node->rank();
  const int per_node = node->size();
  const std::unique_ptr<ProcessGroup> across = world.split(local_rank, world.rank());
  const auto layout =
      world.max_all({static_cast<double>(per_node), -per_node * 1.0}, setup_timeout_s);
  if (!layout) {
    world.abort(1);
  }
  if (world.size() < 2) {
    throw InputError("--mpi",
                     "1 rank: start one process per GPU with your launcher, e.g. mpirun "
                     "-np 16 -H node1:8,node2:8 cpsim calibrate run --mpi --out FILE");
  }
  if ((*layout)[0] != -(*layout)[1]) {
    throw InputError("--mpi", fmt::format("the nodes run between {:.0f} and {:.0f} ranks; start "
                                          "the same number on every node (one per GPU)",
                                          -(*layout)[1], (*layout)[0]));
  }
  const int nodes = world.size() / per_node;
  const RawContext own = open_ranks(world, backend, request, local_rank, setup_timeout_s);

  RawContext& c = summary.raw.context;
  c = own;
  c.gpu_count = world.size();
  c.device_count = world.size();
  c.mpi = RawMpi{world.size(), nodes, per_node, {}};
  c.argv = request.options.argv;
  describe_ranks(world, local_rank, own, c, summary.warnings);
  c.notes.insert(c.notes.end(), summary.warnings.begin(), summary.warnings.end());
  c.notes.push_back(fmt::format(
      "calibrate run --mpi: {} ranks (one GPU each) on {} nodes, {} per node; the time of every "
      "repetition is the maximum over the {} ranks (MPI_Allreduce MAX); pre-run checks of rank "
      "0's GPU in context.checks, the other ranks' warnings in these notes",
      world.size(), nodes, per_node, world.size()));
  for (const std::string_view name : kSweepNames) {
    if (name != "collectives") {
      c.sweeps.push_back(SweepRecord{std::string(name),
                                     "skipped",
                                     "unknown",
                                     {"calibrate run --mpi measures the collectives only"}});
    } else {
      c.sweeps.push_back(SweepRecord{std::string(name), "failed", "unknown", {}});
    }
  }

  const std::unique_ptr<RankRig> rig = backend.rank_rig();
  CollectivePlan plan = backend.collective_plan();
  plan.timeout_s = request.collective_timeout_s;
  MpiSweep sweep(world, *rig, request, write, clock, progress, summary);
  sweep.commit(false);  // the context, before the first collective
  summary.failed =
      !sweep.run(sweep_groups(world, *node, *across, nodes), plan, backend.timing_plan());
  if (world.rank() != 0) {
    summary.raw = RawCalibration{};
  }
  return summary;
}

}  // namespace cpsim::calibrate
