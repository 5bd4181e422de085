#include "cpsim/planner/maxlen.hpp"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/units.hpp"

namespace cpsim::planner {

const char* to_string(BindingConstraint::Kind k) {
  switch (k) {
    case BindingConstraint::Kind::kNone:
      return "none";
    case BindingConstraint::Kind::kGpuMemory:
      return "gpu_memory";
    case BindingConstraint::Kind::kHostMemory:
      return "host_memory";
    case BindingConstraint::Kind::kLengthLimit:
      return "length_limit";
    case BindingConstraint::Kind::kDivisibility:
      return "divisibility";
    case BindingConstraint::Kind::kKernelLimit:
      return "kernel_limit";
    case BindingConstraint::Kind::kStepTime:
      return "step_time";
  }
  return "?";
}

// Sequence parallelism splits each CP rank's tokens over the TP group (check_head_layout).
std::int64_t required_multiple(const sim::ScheduleInputs& in) {
  return sim::cp_scheme(in.parallel.method).seq_multiple(in.parallel) *
         std::max(1, in.parallel.tp_degree);
}

std::string default_refusal_text(const sim::ConfigError& e) {
  return fmt::format("{}: {}", sim::to_string(e.quantity()), e.what());
}

namespace {

struct Probe {
  bool fits = false;
  std::optional<sim::StepReport> report;  // absent when the length itself is refused
  std::string refusal;
  /// The simulation stopped once device memory passed the usable capacity (Need::kFits): `fits`
  /// is false and final, the report is not the step's.
  bool partial = false;
};

/// What a caller reads of a probe: `fits` alone, or its whole report as well (pressure, binding,
/// the step at the longest length), or the report with the caching allocator replayed (the
/// reserved memory decides whether it fits), or both reports from one run (the length the search
/// expects to answer: its replay is then not a second simulation).
enum class Need { kFits, kReport, kReserved, kReportAndReserved };

BindingConstraint binding_of(const Probe& p, std::int64_t seq) {
  BindingConstraint b;
  b.seq_len = seq;
  if (!p.report) {
    b.kind = BindingConstraint::Kind::kLengthLimit;
    b.text = p.refusal;
    return b;
  }
  const sim::StepReport& r = *p.report;
  if (!r.fits_kernels) {
    b.kind = BindingConstraint::Kind::kKernelLimit;
    b.text = fmt::format("at {}: {}", format_length(seq), r.kernel_limit);
    return b;
  }
  const std::int64_t usable = r.gpu_capacity_bytes - r.gpu_margin_bytes;
  if (!r.fits_gpu && r.peak_memory_bytes <= usable) {
    // The allocated peak fits; the caching allocator's segments do not.
    b.kind = BindingConstraint::Kind::kGpuMemory;
    b.rank = r.peak_rank;
    b.op = r.peak_op;
    b.category = "reserved";
    b.used_bytes = r.reserved_peak_bytes;
    b.limit_bytes = usable;
    b.text = fmt::format(
        "GPU reserved memory at {}: the caching allocator holds {} of {} on rank {} ({} "
        "allocated at its peak){}",
        format_length(seq), format_bytes(static_cast<double>(b.used_bytes)),
        format_bytes(static_cast<double>(b.limit_bytes)), b.rank,
        format_bytes(static_cast<double>(r.peak_memory_bytes)),
        r.allocator_out_of_memory ? "; out of memory from fragmentation"
        : r.allocator_cache_releases > 0
            ? fmt::format("; it reaches the whole GPU and empties its cache {} time(s)",
                          r.allocator_cache_releases)
            : "");
    return b;
  }
  if (!r.fits_gpu) {
    b.kind = BindingConstraint::Kind::kGpuMemory;
    b.rank = r.peak_rank;
    b.op = r.peak_op;
    b.used_bytes = r.peak_memory_bytes;
    b.limit_bytes = usable;
    std::size_t top = static_cast<std::size_t>(sim::MemCategory::kActivations);
    for (std::size_t c = top; c < sim::kMemCategoryCount; ++c) {
      if (r.breakdown_at_peak[c] > r.breakdown_at_peak[top])
        top = c;
    }
    b.category = sim::to_string(static_cast<sim::MemCategory>(top));
    b.text = fmt::format(
        "GPU memory at {}: {} needed of {} on rank {}, at {}; largest "
        "sequence-dependent category {} ({})",
        format_length(seq), format_bytes(static_cast<double>(b.used_bytes)),
        format_bytes(static_cast<double>(b.limit_bytes)), b.rank, b.op, b.category,
        format_bytes(static_cast<double>(r.breakdown_at_peak[top])));
  } else {
    b.kind = BindingConstraint::Kind::kHostMemory;
    b.used_bytes = r.host_memory_bytes;
    b.limit_bytes = r.host_capacity_bytes - r.host_margin_bytes;
    b.text = fmt::format("host memory at {}: {} of pinned buffers per node, {} available",
                         format_length(seq), format_bytes(static_cast<double>(b.used_bytes)),
                         format_bytes(static_cast<double>(b.limit_bytes)));
  }
  return b;
}

// Bisection between `good` (passes; 0: none) and `bad` (fails), adjacent at the end: the last k
// that passes and the first that fails, each with its report (`passes` must be monotone between).
template <class At, class Passes>
void bisect(std::int64_t& good,
            sim::StepReport& good_report,
            std::int64_t& bad,
            sim::StepReport& bad_report,
            const At& at,
            const Passes& passes) {
  while (bad - good > 1) {
    const std::int64_t mid = good + (bad - good) / 2;
    sim::StepReport r = at(mid);
    if (passes(r)) {
      good = mid;
      good_report = std::move(r);
    } else {
      bad = mid;
      bad_report = std::move(r);
    }
  }
}

/// The probes of one search: evaluated on demand (get), or ahead of demand by a helper thread
/// (hint: the length the search will likely ask for next; enqueue: one it will certainly ask for;
/// speculate: one it will ask for if its current guess at the answer holds). A hint for a length
/// already known or under way, or while the helper is busy, is dropped; an enqueued or speculative
/// probe waits for the helper, unless the search asks for it first. A search that would wait for
/// the helper evaluates enqueued (not speculative) probes meanwhile. Which lengths were evaluated
/// speculatively, and on which thread, changes nothing the search reads: a probe's outcome depends
/// only on its length (a probe evaluated only for whether it fits is evaluated again when its
/// report is read).
class ProbeCache {
 public:
  /// `caller_scratch`: the search thread's buffers (nullptr: the cache's own).
  ProbeCache(const sim::ScheduleInputs& base,
             std::int64_t step,
             int threads,
             RefusalText refusal_text,
             EvaluationScratch* caller_scratch)
      : base_(base),
        step_(step),
        refusal_text_(std::move(refusal_text)),
        caller_scratch_(caller_scratch != nullptr ? *caller_scratch : own_scratch_) {
    if (threads > 1) {
      helper_ = std::thread([this] { help(); });
    }
  }
  ProbeCache(const ProbeCache&) = delete;
  ProbeCache& operator=(const ProbeCache&) = delete;
  ~ProbeCache() {
    if (helper_.joinable()) {
      {
        const std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
      }
      cv_.notify_all();
      helper_.join();
    }
  }

  /// The probe at k·step; rethrows what its evaluation threw (other than a refused length). With
  /// Need::kFits a length that does not fit may be simulated only until its memory passes the
  /// usable capacity; a later Need::kReport evaluates it again in full. Need::kReportAndReserved
  /// returns the report (as kReport) and keeps the reserved one for get(k, Need::kReserved).
  const Probe& get(std::int64_t k, Need need = Need::kReport) {
    std::unique_lock<std::mutex> lock(mutex_);
    Slot& slot = slots_[slot_key(k, need)];
    for (;;) {
      if (slot.state == Slot::kDone && slot.probe.partial && need != Need::kFits) {
        slot.state = Slot::kEmpty;
      }
      if (slot.state == Slot::kEmpty || slot.state == Slot::kQueued) {
        // A queued whole report also answers whether it fits.
        if (!(slot.state == Slot::kQueued && slot.need == Need::kReport && need == Need::kFits)) {
          slot.need = need;
        }
        run_on_caller(lock, slot, k);
      }
      if (slot.state == Slot::kDone) {
        break;
      }
      // The helper evaluates it: evaluate what is queued for it meanwhile, then wait.
      if (!steal_queued(lock)) {
        cv_.wait(lock, [&slot] { return slot.state == Slot::kDone; });
      }
    }
    if (slot.error) {
      std::rethrow_exception(slot.error);
    }
    return slot.probe;
  }

  /// Whether the probe at k has its whole report, or is under way.
  bool known(std::int64_t k) {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto it = slots_.find(k);
    if (it == slots_.end() || it->second.state == Slot::kEmpty ||
        it->second.state == Slot::kQueued) {
      return false;
    }
    return !(it->second.state == Slot::kDone && it->second.probe.partial);
  }

  /// Whether a length's report and reserved report can come from one run (kReportAndReserved).
  bool one_run_for_both() const { return base_.parallel.pp_degree <= 1; }

  void hint(std::int64_t k, Need need = Need::kReport) { offer(k, need, Offer::kHint); }

  /// A probe the search will ask for: the helper evaluates it when free, unless asked first.
  void enqueue(std::int64_t k, Need need) { offer(k, need, Offer::kCertain); }

  /// A probe the search will ask for if its guess holds: the helper evaluates it when free; the
  /// search does not take it up while waiting.
  void speculate(std::int64_t k, Need need) { offer(k, need, Offer::kSpeculative); }

 private:
  // Probes with the allocator replayed are kept apart from the others, under −k.
  static std::int64_t slot_key(std::int64_t k, Need need) {
    return need == Need::kReserved ? -k : k;
  }

  struct Slot {
    enum State { kEmpty, kQueued, kRunning, kDone };
    State state = kEmpty;
    Need need = Need::kReport;  // what the evaluation under way or queued computes
    Probe probe;
    std::exception_ptr error;
  };
  /// What one evaluation found: the slot of its need and, for kReportAndReserved, the reserved.
  struct Evaluated {
    Slot slot;
    std::optional<Slot> reserved;
  };
  struct Queued {
    std::int64_t k = 0;
    Need need = Need::kReport;
    bool speculative = false;
  };
  enum class Offer { kHint, kCertain, kSpeculative };

  void offer(std::int64_t k, Need need, Offer kind) {
    if (!helper_.joinable()) {
      return;
    }
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      const std::int64_t key = slot_key(k, need);
      if (const auto it = slots_.find(key); it != slots_.end()) {
        if (kind == Offer::kCertain && it->second.state == Slot::kQueued) {
          for (Queued& q : queue_) {
            q.speculative = q.speculative && slot_key(q.k, q.need) != key;
          }
        }
        return;
      }
      if (helper_busy_ && kind == Offer::kHint) {
        return;
      }
      Slot& slot = slots_[key];
      slot.need = need;
      if (helper_busy_) {
        slot.state = Slot::kQueued;
        queue_.push_back({k, need, kind == Offer::kSpeculative});
        return;
      }
      slot.state = Slot::kRunning;
      hinted_ = k;
      hinted_need_ = need;
      helper_busy_ = true;
    }
    cv_.notify_all();
  }

  /// Stores what evaluating the probe at k found; `lock` is held.
  void store(std::int64_t k, Need need, Evaluated done) {
    Slot& slot = slots_[slot_key(k, need)];
    slot.probe = std::move(done.slot.probe);
    slot.error = done.slot.error;
    slot.state = Slot::kDone;
    if (done.reserved) {
      Slot& reserved = slots_[slot_key(k, Need::kReserved)];
      if (reserved.state == Slot::kEmpty || reserved.state == Slot::kQueued) {
        reserved.probe = std::move(done.reserved->probe);
        reserved.error = done.reserved->error;
        reserved.state = Slot::kDone;
      }
    }
    cv_.notify_all();
  }

  /// Evaluates `slot` (the probe at k) on the search's thread; `lock` is held on entry and exit.
  void run_on_caller(std::unique_lock<std::mutex>& lock, Slot& slot, std::int64_t k) {
    slot.state = Slot::kRunning;
    const Need need = slot.need;
    lock.unlock();
    Evaluated done = evaluate_at(k, caller_scratch_, caller_k_, need);
    lock.lock();
    store(k, need, std::move(done));
  }

  /// The first probe still queued (speculative ones too when `speculative`), taken off the queue
  /// (nullopt: none). `lock` is held.
  std::optional<Queued> pop_queued(bool speculative) {
    for (auto it = queue_.begin(); it != queue_.end();) {
      const Queued q = *it;
      if (slots_[slot_key(q.k, q.need)].state != Slot::kQueued) {
        it = queue_.erase(it);
        continue;
      }
      if (q.speculative && !speculative) {
        ++it;
        continue;
      }
      queue_.erase(it);
      return q;
    }
    return std::nullopt;
  }

  /// Evaluates one queued (not speculative) probe on the search's thread; false when none is.
  bool steal_queued(std::unique_lock<std::mutex>& lock) {
    const std::optional<Queued> next = pop_queued(false);
    if (!next) {
      return false;
    }
    run_on_caller(lock, slots_[slot_key(next->k, next->need)], next->k);
    return true;
  }

  /// Evaluates k·step in `scratch` (the calling thread's), which last evaluated `last_k`.
  Evaluated evaluate_at(std::int64_t k,
                        EvaluationScratch& scratch,
                        std::int64_t& last_k,
                        Need need = Need::kReport) const {
    // A longer probe than the scratch has seen builds a proportionally larger workload (FPDT and
    // UPipe grow with the length): room for it up front instead of growing vectors by doubling,
    // each doubling a copy into freshly faulted memory. Only capacities change.
    if (last_k > 0 && k > last_k) {
      const double grow = 1.1 * static_cast<double>(k) / static_cast<double>(last_k);
      auto room = [grow](auto& v) {
        const auto want = static_cast<std::size_t>(static_cast<double>(v.size()) * grow);
        if (want > v.capacity()) {
          v.clear();
          v.reserve(want);
        }
      };
      sim::Workload& w = scratch.workload;
      room(w.ops);
      room(w.tensors);
      room(w.edges);
      room(w.collectives);
    }
    last_k = std::max(last_k, k);
    Evaluated out;
    Slot& s = out.slot;
    sim::ScheduleInputs in = base_;
    in.parallel.seq_len = k * step_;
    // Only whether it fits: the run may stop once device memory passes capacity − margin, which
    // is exactly when the peak no longer fits (peak + margin > capacity), or once a node's host
    // memory passes the host capacity (fits_host is host ≤ capacity; host peaks only grow). A
    // run that does not stop is the same run as without the limits (they only end the loop).
    EvaluateOptions options;
    options.model_allocator = need == Need::kReserved || need == Need::kReportAndReserved;
    options.allocated_report_too = need == Need::kReportAndReserved;
    if (need == Need::kFits) {
      options.stop_above_device_bytes =
          std::max<std::int64_t>(1, base_.hardware.hbm_capacity_bytes - base_.margin.gpu_bytes);
      // Host memory fits while the node's peak + margin stays within the capacity; 0: never stop.
      const std::int64_t host = base_.hardware.host_memory_bytes_per_node;
      options.stop_above_host_bytes =
          host > 0 ? std::max<std::int64_t>(1, host - base_.margin.host_bytes) : 0;
    }
    try {
      Evaluation e = evaluate(in, options, scratch);
      if (options.allocated_report_too && !e.allocated_report) {
        throw std::logic_error("maxlen: no report without the allocator replay");
      }
      if (e.allocated_report) {
        Slot reserved;
        reserved.probe.report = std::move(e.report);
        reserved.probe.fits = reserved.probe.report->fits();
        out.reserved = std::move(reserved);
        e.report = std::move(*e.allocated_report);
      }
      s.probe.report = std::move(e.report);
      s.probe.partial = s.probe.report->stopped_early;
      s.probe.fits = !s.probe.partial && s.probe.report->fits();
    } catch (const sim::ConfigError& e) {
      // A length the method refuses ends the search there; anything else is an error.
      if (e.quantity() == sim::Quantity::kSeqLen ||
          e.quantity() == sim::Quantity::kSeqLenMultiple) {
        s.probe.refusal = refusal_text_ ? refusal_text_(e) : default_refusal_text(e);
      } else {
        s.error = std::current_exception();
      }
    } catch (...) {
      s.error = std::current_exception();
    }
    return out;
  }

  void help() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || helper_busy_; });
      if (stop_) {
        return;
      }
      std::int64_t k = hinted_;
      Need need = hinted_need_;
      for (;;) {
        lock.unlock();
        Evaluated done = evaluate_at(k, helper_scratch_, helper_k_, need);
        lock.lock();
        store(k, need, std::move(done));
        const std::optional<Queued> next = stop_ ? std::nullopt : pop_queued(true);
        if (!next) {
          break;
        }
        k = next->k;
        need = next->need;
        slots_[slot_key(k, need)].state = Slot::kRunning;
      }
      helper_busy_ = false;
    }
  }

  const sim::ScheduleInputs& base_;
  const std::int64_t step_;
  const RefusalText refusal_text_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::int64_t, Slot> slots_;  // std::map: references stay valid while it grows
  std::int64_t hinted_ = 0;
  Need hinted_need_ = Need::kReport;
  bool helper_busy_ = false;
  bool stop_ = false;
  std::list<Queued> queue_;  // offered while the helper was busy, in order
  EvaluationScratch own_scratch_;
  EvaluationScratch& caller_scratch_;  // used by get(), on the search's thread only
  EvaluationScratch helper_scratch_;   // used by the helper thread only
  std::int64_t caller_k_ = 0;          // the longest probe caller_scratch_ has built
  std::int64_t helper_k_ = 0;          // the longest probe helper_scratch_ has built
  std::thread helper_;                 // last: started once the members it uses exist
};

// The search decides on the allocated peak, a lower bound of the reserved memory (reserved
// segments hold every allocated byte), so its answer bounds the reserved one from above. Here the
// caching allocator is replayed at the answer (`reserved_at(k)`: the report at k·step with it
// replayed); while it does not fit, the length steps down, by strides that double until one
// fits, then bisects back up between the last two.
void check_reserved(MaxLenResult& result,
                    const std::function<sim::StepReport(std::int64_t)>& reserved_at) {
  if (result.max_seq_len <= 0) {
    return;
  }
  auto at = [&](std::int64_t k) {
    ++result.evaluations;
    return reserved_at(k);
  };
  std::int64_t good = result.max_seq_len / result.step;
  sim::StepReport good_report = at(good);
  if (good_report.fits()) {
    result.at_max = std::move(good_report);
    return;
  }
  std::int64_t bad = good;
  sim::StepReport bad_report = std::move(good_report);
  std::int64_t stride = 1;
  good = 0;
  for (std::int64_t k = bad - 1; k > 0; k = std::max<std::int64_t>(0, bad - stride)) {
    sim::StepReport r = at(k);
    if (r.fits()) {
      good = k;
      good_report = std::move(r);
      break;
    }
    bad = k;
    bad_report = std::move(r);
    stride *= 2;
  }
  bisect(good, good_report, bad, bad_report, at, [](const sim::StepReport& r) { return r.fits(); });
  Probe failed;
  failed.report = std::move(bad_report);
  result.binding = binding_of(failed, bad * result.step);
  result.max_seq_len = good * result.step;
  result.at_max = good > 0 ? std::move(good_report) : sim::StepReport{};
}

// The longest k (length / step) in [1, k_max] that fits, and the smallest above it that does not
// (lo, hi). Narrowing (lo, hi) to adjacent lengths: memory grows about linearly with the length,
// so the next length is where the line through the last two probes reaches the limit (secant);
// when that does not at least halve the interval twice running, or no line is available, the step
// doubles (no failure yet) or bisects. Only probes decide lo and hi, so the result is the one a
// bisection finds whenever memory is monotone in the length; only the probes asked differ. Then
// the neighbours: memory is not always monotone in the length (tile counts, loss chunks).
class LengthSearch {
 public:
  LengthSearch(ProbeCache& cache,
               const MaxLenOptions& options,
               std::int64_t k_max,
               MaxLenResult& result)
      : cache_(cache),
        options_(options),
        k_max_(k_max),
        parallel_(options.threads > 1),
        res_(result),
        hi_(k_max + 1) {}

  /// Narrows, checks the neighbours (warnings in the result), and searches on past a length
  /// that fits one step above the first failure.
  void run() {
    for (;;) {
      narrow();
      // What follows is known unless one step past the first failure fits: the caching allocator
      // replayed at the answer (the longest evaluation left) and the neighbour below it, queued
      // for the helper in that order while the search evaluates the one above.
      if (options_.check_reserved && lo_ >= 1 && lo_ <= k_max_) {
        cache_.enqueue(lo_, Need::kReserved);
      }
      if (lo_ >= 2) {
        cache_.enqueue(lo_ - 1, Need::kFits);
      }
      if (!fits_past_first_failure()) {
        break;
      }
    }
    if (lo_ >= 2 && !probe(lo_ - 1, Need::kFits).fits) {
      res_.monotone = false;
      res_.warnings.push_back(
          fmt::format("memory is not monotone in the length: {} fits but {} does not",
                      format_length(lo_ * res_.step), format_length((lo_ - 1) * res_.step)));
    }
  }

  std::int64_t lo() const { return lo_; }
  std::int64_t hi() const { return hi_; }

  /// The probe at k, counted once in the result's evaluations.
  const Probe& probe(std::int64_t k, Need need = Need::kReport) {
    if (static_cast<std::size_t>(k) >= asked_.size()) {
      asked_.resize(static_cast<std::size_t>(k) + 1);
    }
    if (!asked_[static_cast<std::size_t>(k)]) {
      asked_[static_cast<std::size_t>(k)] = true;
      ++res_.evaluations;
    }
    return cache_.get(k, need);
  }

 private:
  struct Point {
    std::int64_t k;
    double pressure;
  };

  // Memory pressure of a probe: peak over the usable capacity of whichever memory binds (GPU or
  // host), 1 at the limit. Absent when a probe cannot guide interpolation (a refused length, a
  // kernel limit).
  static std::optional<double> pressure(const Probe& p) {
    if (!p.report || !p.report->fits_kernels) {
      return std::nullopt;
    }
    const sim::StepReport& r = *p.report;
    const double usable = static_cast<double>(r.gpu_capacity_bytes - r.gpu_margin_bytes);
    double x = usable > 0 ? static_cast<double>(r.peak_memory_bytes) / usable : 2.0;
    const double host_usable = static_cast<double>(r.host_capacity_bytes - r.host_margin_bytes);
    if (r.host_capacity_bytes > 0) {
      x = std::max(x,
                   host_usable > 0 ? static_cast<double>(r.host_memory_bytes) / host_usable : 2.0);
    }
    return x;
  }

  // Speculation (threads > 1): while the search evaluates a length, the helper evaluates the one
  // it will likely ask for next.
  void hint(std::int64_t k) {
    if (k >= 1 && k <= k_max_) {
      cache_.hint(k);
    }
  }

  std::int64_t next_k() const {
    std::int64_t k = 0;
    const bool line = points_.size() >= 2 && slow_steps_ < 2;
    if (line) {
      const Point& a = points_[points_.size() - 2];
      const Point& b = points_.back();
      const double slope = (b.pressure - a.pressure) / static_cast<double>(b.k - a.k);
      if (slope > 0.0) {
        const double at_limit = static_cast<double>(b.k) + (1.0 - b.pressure) / slope;
        k = static_cast<std::int64_t>(
            std::floor(std::min(at_limit, static_cast<double>(k_max_ + 1))));
      }
    }
    if (k <= lo_ || k >= hi_) {
      k = k <= lo_ && line
              ? lo_ + 1
              : (hi_ > k_max_ ? std::max<std::int64_t>(1, 2 * lo_) : lo_ + (hi_ - lo_) / 2);
    }
    if (hi_ > k_max_) {
      k = std::min(k, std::max<std::int64_t>(1, 8 * lo_));  // no failure yet: bound the leap
    }
    return std::clamp<std::int64_t>(k, lo_ + 1, std::min(hi_ - 1, k_max_));
  }

  // The pressure the line through the last two probes gives at k (nullopt: no line yet).
  std::optional<double> line_at(std::int64_t k) const {
    if (points_.size() < 2) {
      return std::nullopt;
    }
    const Point& a = points_[points_.size() - 2];
    const Point& b = points_.back();
    return b.pressure + (a.pressure - b.pressure) / static_cast<double>(a.k - b.k) *
                            static_cast<double>(k - b.k);
  }

  // The helper's guess while the search evaluates k. On a long leap before the first failure
  // (memory is often convex in the length, so secant leaps overshoot): the length the search
  // falls back to if k fails, about 7/8 of the way; it also builds a workload of about k's size
  // in the helper's buffers, which a later guess then reuses instead of growing them. At the
  // likely answer: the length above it (closing the bracket when k fits), then the neighbour
  // checks that follow if the guess holds (one past k + 1, one step below k). Otherwise what
  // follows k on the side the line through the last two probes puts it (fits when there is no
  // line): the next length that way, or where k closes the bracket the caching allocator at the
  // answer, the longest evaluation left.
  void give_helper(std::int64_t k, bool long_leap, std::optional<double> at_k, bool likely_answer) {
    if (long_leap) {
      const std::int64_t fallback = lo_ + (k - lo_) * 7 / 8;
      if (fallback > lo_) {
        cache_.speculate(fallback, Need::kReport);  // asked next if the leap fails (parallel)
      }
    } else if (likely_answer) {
      if (k + 1 < hi_) {
        hint(k + 1);
      }
      if (k + 2 <= k_max_) {
        cache_.speculate(k + 2, Need::kFits);
      }
      if (k - 1 > lo_) {
        cache_.speculate(k - 1, Need::kFits);
      }
    } else if (!at_k || *at_k <= 1.0) {
      if (k + 1 < hi_) {
        hint(k + 1);
      } else if (options_.check_reserved) {
        cache_.hint(k, Need::kReserved);
      } else {
        hint(k - 1);
      }
    } else if (k - 1 > lo_) {
      hint(k - 1);
    } else if (options_.check_reserved && lo_ >= 1) {
      cache_.hint(lo_, Need::kReserved);
    }
  }

  // The next length to ask: the secant's, or after a failed long leap 7/8 of the leap (with a
  // helper, which evaluated it during the leap, that; alone, the larger of the two). Memory is
  // often convex in the length, so the line through the leap's end points reaches the limit
  // early; the line through the leap's end and its 7/8 point lands close to the limit.
  std::int64_t next_length() {
    std::int64_t k = next_k();
    if (leap_fallback_ > lo_ && leap_fallback_ < hi_) {
      k = parallel_ ? leap_fallback_ : std::max(k, leap_fallback_);
    }
    leap_fallback_ = 0;
    return k;
  }

  void narrow() {
    while (hi_ - lo_ > 1 && lo_ < k_max_) {
      const std::int64_t k = next_length();
      const bool long_leap = hi_ > k_max_ && k > 2 * lo_ + 1;
      const std::optional<double> at_k = line_at(k);
      // The answer, if the line through the last two probes holds: it puts k within the memory
      // limit and k + 1 past it. Its caching-allocator replay (checked at the answer) then comes
      // from k's own run instead of a second one. Not on a leap before the first failure, whose
      // line is drawn far from the limit, nor where the line does not reach the limit (what
      // stops the length is then not memory, e.g. a kernel's 32-bit indexing).
      const std::optional<double> after_k = line_at(k + 1);
      const bool likely_answer = options_.check_reserved && cache_.one_run_for_both() &&
                                 !long_leap && at_k && after_k && *at_k <= 1.0 && *after_k > 1.0;
      if (!cache_.known(k)) {
        give_helper(k, long_leap, at_k, likely_answer);
      }
      const std::int64_t width = hi_ > k_max_ ? 0 : hi_ - lo_;  // 0: no failure bracketed yet
      const Probe& p = probe(k, likely_answer ? Need::kReportAndReserved : Need::kReport);
      if (const std::optional<double> x = pressure(p)) {
        points_.push_back({k, *x});
      }
      if (p.fits) {
        lo_ = k;
      } else {
        leap_fallback_ = long_leap ? lo_ + (k - lo_) * 7 / 8 : 0;
        hi_ = k;
      }
      slow_steps_ = width > 0 && 2 * (hi_ - lo_) > width ? slow_steps_ + 1 : 0;
    }
    hi_ = std::min(hi_, k_max_ + 1);
  }

  // One step past the first failure must fail too; when it fits instead, the search goes on from
  // there (strides doubling while they fit), with a warning; returns whether it does.
  bool fits_past_first_failure() {
    if (hi_ + 1 > k_max_ || !probe(hi_ + 1, Need::kFits).fits) {
      return false;
    }
    res_.monotone = false;
    res_.warnings.push_back(fmt::format(
        "memory is not monotone in the length: {} does not fit but {} does; searching on",
        format_length(hi_ * res_.step), format_length((hi_ + 1) * res_.step)));
    lo_ = hi_ + 1;
    std::int64_t stride = 1;
    while (lo_ + stride <= k_max_ && probe(lo_ + stride).fits) {
      lo_ += stride;
      stride *= 2;
    }
    hi_ = std::min(lo_ + stride, k_max_ + 1);
    return true;
  }

  ProbeCache& cache_;
  const MaxLenOptions& options_;
  const std::int64_t k_max_;
  const bool parallel_;
  MaxLenResult& res_;
  std::vector<bool> asked_;
  std::int64_t lo_ = 0;  // largest k known to fit (0: none)
  std::int64_t hi_;      // smallest k known to fail (k_max + 1: none yet)
  std::vector<Point> points_;
  int slow_steps_ = 0;
  std::int64_t leap_fallback_ = 0;  // after a failed long leap: its 7/8 point
};

}  // namespace

void check_reserved_memory(const sim::ScheduleInputs& base,
                           MaxLenResult& result,
                           EvaluationScratch* scratch) {
  EvaluateOptions logged;
  logged.model_allocator = true;
  check_reserved(result, [&](std::int64_t k) {
    sim::ScheduleInputs in = base;
    in.parallel.seq_len = k * result.step;
    return scratch != nullptr ? evaluate(in, logged, *scratch).report : evaluate(in, logged).report;
  });
}

namespace {

// The longest length at most `result.max_seq_len` whose step takes at most `cap_s`, when the
// memory answer is slower than that: a bisection over the multiples of the step below it. The step
// time grows with the length (attention's work is quadratic in it, the rest linear, each GPU's
// share of both fixed by the degrees), so the first length over the cap bounds the answer. Every
// length below the memory answer fits (memory is taken to be monotone there, as in
// check_reserved).
void cap_step_time(MaxLenResult& result,
                   double cap_s,
                   const std::function<sim::StepReport(std::int64_t)>& step_at) {
  std::int64_t lo = 0, hi = result.max_seq_len / result.step;  // hi: over the cap
  sim::StepReport at_lo, at_hi = result.at_max;
  auto probe = [&](std::int64_t k) {
    ++result.evaluations;
    return step_at(k);
  };
  bisect(lo, at_lo, hi, at_hi, probe,
         [cap_s](const sim::StepReport& r) { return r.step_time_s <= cap_s; });
  BindingConstraint b;
  b.kind = BindingConstraint::Kind::kStepTime;
  b.seq_len = hi * result.step;
  b.text = fmt::format("step time at {}: {}, over the cap of {} (--max-step-time)",
                       format_length(b.seq_len), format_seconds(at_hi.step_time_s),
                       format_seconds(cap_s));
  result.binding = std::move(b);
  result.max_seq_len = lo * result.step;
  result.at_max = lo > 0 ? std::move(at_lo) : sim::StepReport{};
}

}  // namespace

MaxLenResult max_seq_len(const sim::ScheduleInputs& base, const MaxLenOptions& options) {
  if (options.granularity <= 0) {
    throw InputError("--granularity", "must be positive");
  }
  MaxLenResult res;
  res.step = std::lcm(options.granularity, required_multiple(base));
  if (res.step > options.max_tokens) {
    throw InputError("--granularity",
                     fmt::format("a step of {} tokens exceeds the search ceiling", res.step));
  }
  // Anything other than the length must be valid: check once at the smallest length.
  {
    sim::ScheduleInputs probe = base;
    probe.parallel.seq_len = res.step;
    (void)sim::derive_head_layout(probe);
  }
  const std::int64_t k_max = options.max_tokens / res.step;
  ProbeCache cache(base, res.step, options.threads, options.refusal_text, options.scratch);
  LengthSearch search(cache, options, k_max, res);
  search.run();
  const std::int64_t lo = search.lo(), hi = search.hi();
  res.max_seq_len = lo * res.step;
  if (hi > k_max) {
    res.binding.kind = BindingConstraint::Kind::kLengthLimit;
    res.binding.seq_len = (k_max + 1) * res.step;
    res.binding.text =
        fmt::format("search ceiling of {} tokens reached", format_length(options.max_tokens));
  } else {
    res.binding = binding_of(search.probe(hi), hi * res.step);
  }
  if (lo > 0) {
    res.at_max = *search.probe(lo).report;
  }
  if (options.check_reserved) {
    check_reserved(res, [&](std::int64_t k) {
      const Probe& p = cache.get(k, Need::kReserved);
      return p.report ? *p.report : sim::StepReport{};
    });
  }
  if (options.max_step_time_s > 0 && res.max_seq_len > 0 &&
      res.at_max.step_time_s > options.max_step_time_s) {
    const Need need = options.check_reserved ? Need::kReserved : Need::kReport;
    cap_step_time(res, options.max_step_time_s, [&](std::int64_t k) {
      const Probe& p = cache.get(k, need);
      return p.report ? *p.report : sim::StepReport{};
    });
  }
  res.headroom_bytes = res.max_seq_len > 0 ? res.at_max.gpu_headroom_bytes : 0;
  return res;
}

}  // namespace cpsim::planner
