#include "cpsim/planner/maxlen.hpp"

#include <algorithm>
#include <numeric>
#include <optional>

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
  }
  return "?";
}

std::int64_t required_multiple(const sim::ScheduleInputs& in) {
  const auto& p = in.parallel;
  std::int64_t m = p.cp_degree;
  if (p.ring_degree > 1 && p.ring_layout == models::RingLayout::kZigzag) {
    m = 2 * p.cp_degree;
  }
  if (p.method == models::CpMethod::kFpdt) {
    m = std::lcm(m, p.fpdt_chunk);
  }
  return m;
}

bool fits_with_margin(const sim::StepReport& r, std::int64_t margin) {
  return r.peak_memory_bytes + margin <= r.gpu_capacity_bytes && r.fits_host && r.fits_kernels;
}

namespace {

struct Probe {
  bool fits = false;
  std::optional<sim::StepReport> report;  // absent when the length itself is refused
  std::string refusal;
};

BindingConstraint binding_of(const Probe& p, std::int64_t seq, std::int64_t margin) {
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
  if (r.peak_memory_bytes + margin > r.gpu_capacity_bytes) {
    b.kind = BindingConstraint::Kind::kGpuMemory;
    b.rank = r.peak_rank;
    b.op = r.peak_op;
    b.used_bytes = r.peak_memory_bytes;
    b.limit_bytes = r.gpu_capacity_bytes - margin;
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
    b.limit_bytes = r.host_capacity_bytes;
    b.text = fmt::format("host memory at {}: {} of pinned buffers per node, {} available",
                         format_length(seq), format_bytes(static_cast<double>(b.used_bytes)),
                         format_bytes(static_cast<double>(b.limit_bytes)));
  }
  return b;
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
  std::vector<std::optional<Probe>> cache;
  auto probe = [&](std::int64_t k) -> const Probe& {
    if (static_cast<std::size_t>(k) >= cache.size()) {
      cache.resize(static_cast<std::size_t>(k) + 1);
    }
    auto& slot = cache[static_cast<std::size_t>(k)];
    if (!slot) {
      Probe p;
      sim::ScheduleInputs in = base;
      in.parallel.seq_len = k * res.step;
      try {
        p.report = evaluate(in).report;
        p.fits = fits_with_margin(*p.report, options.memory_margin_bytes);
      } catch (const InputError& e) {
        if (e.field() != "--seq") {
          throw;
        }
        p.refusal = e.what();
      }
      ++res.evaluations;
      slot = std::move(p);
    }
    return *slot;
  };

  std::int64_t lo = 0;  // largest k known to fit (0: none)
  std::int64_t hi = 1;  // a k known to fail once found
  // Galloping: 1, 2, 4, ... until a failure.
  while (hi <= k_max && probe(hi).fits) {
    lo = hi;
    hi *= 2;
  }
  hi = std::min(hi, k_max + 1);
  // Binary search in (lo, hi).
  for (;;) {
    while (hi - lo > 1) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      if (probe(mid).fits) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    // Neighbours: memory is not always monotone in the length (tile counts, loss chunks). One
    // step past the first failure must fail too; otherwise continue the search from there.
    if (hi + 1 <= k_max && probe(hi + 1).fits) {
      res.monotone = false;
      res.warnings.push_back(fmt::format(
          "memory is not monotone in the length: {} does not fit but {} does; searching on",
          format_length(hi * res.step), format_length((hi + 1) * res.step)));
      lo = hi + 1;
      std::int64_t stride = 1;
      while (lo + stride <= k_max && probe(lo + stride).fits) {
        lo += stride;
        stride *= 2;
      }
      hi = std::min(lo + stride, k_max + 1);
      continue;
    }
    break;
  }
  if (lo >= 2 && !probe(lo - 1).fits) {
    res.monotone = false;
    res.warnings.push_back(
        fmt::format("memory is not monotone in the length: {} fits but {} does not",
                    format_length(lo * res.step), format_length((lo - 1) * res.step)));
  }
  res.max_seq_len = lo * res.step;
  if (hi > k_max) {
    res.binding.kind = BindingConstraint::Kind::kLengthLimit;
    res.binding.seq_len = (k_max + 1) * res.step;
    res.binding.text =
        fmt::format("search ceiling of {} tokens reached", format_length(options.max_tokens));
  } else {
    res.binding = binding_of(probe(hi), hi * res.step, options.memory_margin_bytes);
  }
  if (lo > 0) {
    res.at_max = *probe(lo).report;
    res.headroom_bytes =
        res.at_max.gpu_capacity_bytes - options.memory_margin_bytes - res.at_max.peak_memory_bytes;
  }
  return res;
}

}  // namespace cpsim::planner
