#pragma once
/// @file `cpsim calibrate run --mpi`: the collective sweep across nodes, one process per GPU
/// started by the user's launcher (mpirun, srun). MPI sits behind ProcessGroup (implemented by
/// the module libcpsim_calibrate_mpi.so, loaded with dlopen), NCCL behind RankRig (the CUDA
/// module, or the tests' fake), so the driver here links neither. docs/CALIBRATION.md "Several
/// nodes (--mpi)" describes the method.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cpsim/calibrate/measure.hpp"
#include "cpsim/calibrate/raw.hpp"
#include "cpsim/calibrate/run.hpp"
#include "cpsim/calibrate/run_control.hpp"

namespace cpsim::calibrate {

/// An MPI communicator. Blocking calls are only made while every rank is known to be alive (after
/// an agreement); the agreement itself (max_all) has a deadline.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// This process's host (MPI_Get_processor_name).
  virtual std::string host() const = 0;
  /// The ranks that share this rank's node (MPI_Comm_split_type, MPI_COMM_TYPE_SHARED).
  virtual std::unique_ptr<ProcessGroup> split_shared() = 0;
  /// MPI_Comm_split: ranks of equal `color`, ordered by `key`.
  virtual std::unique_ptr<ProcessGroup> split(int color, int key) = 0;
  /// MPI_Bcast of `bytes` (the same length on every rank) from `root`.
  virtual void broadcast(std::vector<std::uint8_t>& bytes, int root) = 0;
  /// Element-wise maximum over the ranks (MPI_Iallreduce polled with MPI_Test); nothing when the
  /// ranks did not all arrive within `timeout_s` (a process hung outside a deadline wait, or died).
  virtual std::optional<std::vector<double>> max_all(const std::vector<double>& values,
                                                     double timeout_s) = 0;
  /// Every rank's `text` at `root`, in rank order (MPI_Gather + MPI_Gatherv); empty elsewhere.
  virtual std::vector<std::string> gather(const std::string& text, int root) = 0;
  /// Ends every process of the job with `code` (MPI_Abort); the way out of a hung peer.
  [[noreturn]] virtual void abort(int code) = 0;
};

/// One rank's side of NCCL in an MPI run (one GPU per process): ncclGetUniqueId on a group's root,
/// ncclCommInitRank on every rank, collectives between events, the deadline poll and
/// ncclCommAbort. The CUDA module implements it; tests fake it. Calls throw MeasureError when a
/// CUDA or NCCL call fails.
class RankRig {
 public:
  virtual ~RankRig() = default;
  RankRig() = default;
  RankRig(const RankRig&) = delete;
  RankRig& operator=(const RankRig&) = delete;
  /// ncclGetUniqueId, as bytes (called on the root of a group only).
  virtual std::vector<std::uint8_t> unique_id() = 0;
  /// ncclCommInitRank(ranks, id, rank) and buffers for sizes up to `largest_size_bytes`.
  virtual void open(const std::vector<std::uint8_t>& id,
                    int ranks,
                    int rank,
                    std::int64_t largest_size_bytes) = 0;
  /// Enqueues `calls` collectives back to back between a start and a stop event; returns at once.
  /// In place as nccl-tests: all-gather sends from its slot of the output, reduce-scatter writes
  /// into its slot of the input, the others use one buffer for both.
  virtual void enqueue(models::Collective op,
                       std::int64_t size_bytes,
                       int calls,
                       bool in_place) = 0;
  /// The completion of the last enqueue on this rank (stop event, asynchronous error, abort).
  virtual CompletionPoll& poll() = 0;
  /// Seconds from start to stop event of the last enqueue on this rank (complete only).
  virtual double elapsed_s() = 0;
  /// ncclCommAbort of this rank's communicator, if one is open and not aborted yet (any state).
  virtual void abort() = 0;
  /// Frees the communicator (ncclCommDestroy, or memory only after an abort) and the buffers;
  /// nothing when none is open.
  virtual void close() = 0;
};

struct MpiRunRequest {
  MeasureOptions options;               ///< quick, argv, version (gpus and max_seq unused)
  std::filesystem::path out;            ///< raw file (written by rank 0 only)
  double collective_timeout_s = 120.0;  ///< deadline of one wait on NCCL work
  /// Testing: nodes are blocks of this many consecutive ranks instead of the hosts MPI reports
  /// (0: the hosts). Set from $CPSIM_CALIBRATE_MPI_RANKS_PER_NODE by the CLI.
  int ranks_per_node_override = 0;
  /// Seconds every rank waits for the others beyond the collective deadline before giving up on
  /// them (rank 0 writes the file, then MPI_Abort); the other ranks wait twice as long.
  double agreement_grace_s = 30.0;
};

struct MpiRunSummary {
  RawCalibration raw;   ///< as last written (rank 0; other ranks: empty)
  bool failed = false;  ///< a collective failed or timed out on some rank
  int rank = 0;
  std::vector<std::string> warnings;  ///< pre-run check warnings of every rank (rank 0)
};

/// Runs the MPI collective sweep: nodes from `world` (split_shared or the override), one NCCL
/// communicator per group — each node's ranks, the world, and the ranks of equal local rank
/// across the nodes — from a unique id rank 0 of the group creates and broadcasts; per group, op
/// and size nccl-tests' order (warm-up at the largest and smallest size, then per size the
/// out-of-place and the in-place half, each after an untimed call); every repetition's time is the
/// maximum over the world's ranks. Rank 0 alone calls `write`, after the context and after every
/// group. A failing or hung rank aborts its group on every rank (noted, later groups skipped); a
/// rank that does not reach an agreement within the deadline makes rank 0 write and call
/// world.abort(1). `progress` is called on rank 0 only. @throws InputError (every rank the same)
/// for an unusable layout; MeasureError when a rank could not open its GPU (nothing measured).
MpiRunSummary run_mpi_calibration(ProcessGroup& world,
                                  MeasureBackend& backend,
                                  const MpiRunRequest& request,
                                  const RawWriter& write,
                                  const ProgressFn& progress,
                                  const WaitClock& clock = steady_wait_clock());

/// MPI_Init_thread through the module libcpsim_calibrate_mpi.so (dlopen, RTLD_GLOBAL as Open MPI
/// needs for its plugins): the world communicator, finalised when released.
/// @throws InputError("--mpi", why) when this cpsim was built without MPI or the module does not
/// load.
std::unique_ptr<ProcessGroup> make_mpi_world();

}  // namespace cpsim::calibrate
