#include "report_data.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "cpsim/models/transformer.hpp"

namespace cpsim::cli {
namespace {

constexpr double kGiBd = 1024.0 * 1024.0 * 1024.0;

// The class list and the index agree for every class.
constexpr bool op_class_indices_agree() {
  const auto classes = all_op_classes();
  for (std::size_t i = 0; i < classes.size(); ++i) {
    if (op_class_index(classes[i]) != static_cast<int>(i)) {
      return false;
    }
  }
  return true;
}
static_assert(op_class_indices_agree());

std::string_view op_kind_name(sim::OpKind k) {
  switch (k) {
    case sim::OpKind::kGemm:
      return "GEMM";
    case sim::OpKind::kAttentionFwd:
      return "attention fwd";
    case sim::OpKind::kAttentionBwd:
      return "attention bwd";
    case sim::OpKind::kElementwise:
      return "elementwise";
    case sim::OpKind::kLoss:
      return "loss";
    case sim::OpKind::kOptimizer:
      return "optimizer";
    case sim::OpKind::kCollective:
      return "collective";
    case sim::OpKind::kCopyD2H:
      return "copy D2H";
    case sim::OpKind::kCopyH2D:
      return "copy H2D";
  }
  return "?";
}

std::string_view collective_name(models::Collective c) {
  switch (c) {
    case models::Collective::kAllToAll:
      return "all-to-all";
    case models::Collective::kAllGather:
      return "all-gather";
    case models::Collective::kReduceScatter:
      return "reduce-scatter";
    case models::Collective::kAllReduce:
      return "all-reduce";
    case models::Collective::kSendRecv:
      return "send/recv";
  }
  return "?";
}

}  // namespace

std::string gib(double bytes) {
  return format_bytes(bytes);
}

// ---- Memory over one step -----------------------------------------------------------------------

std::string_view memory_band_name(int band) {
  const MemoryBand b = memory_band(band);
  return b.fixed ? "fixed" : sim::to_string(b.category);
}

double MemPoint::total() const {
  double s = 0;
  for (double b : v) {
    s += b;
  }
  return s;
}

MemorySeries memory_series(const sim::Workload& w, const sim::SimResult& r, int buckets_wanted) {
  std::vector<sim::MemorySample> s;
  for (const auto& m : r.memory_samples) {
    if (m.rank == 0) {
      s.push_back(m);
    }
  }
  std::stable_sort(s.begin(), s.end(), [](const sim::MemorySample& a, const sim::MemorySample& b) {
    return a.time_ns < b.time_ns;
  });
  const sim::StaticMemory sm = w.static_memory.empty() ? sim::StaticMemory{} : w.static_memory[0];
  auto to_point = [&](SimTime t, const std::array<std::int64_t, sim::kMemCategoryCount>& dev) {
    MemPoint p;
    p.t = t;
    for (int band = 0; band < kMemoryBandCount; ++band) {
      const MemoryBand b = memory_band(band);
      double& v = p.v[static_cast<std::size_t>(band)];
      if (b.fixed) {
        v = static_cast<double>(sm.fixed_overhead_bytes);
        continue;
      }
      std::int64_t bytes = dev[static_cast<std::size_t>(b.category)];
      if (b.category == sim::MemCategory::kModelStates) {
        bytes += sm.model_states_bytes;
      }
      v = static_cast<double>(bytes);
    }
    return p;
  };
  std::vector<MemPoint> pts;
  if (s.empty() || s.front().time_ns > 0) {
    pts.push_back(to_point(0, {}));
  }
  for (std::size_t k = 0; k < s.size(); ++k) {
    // The state after all changes at one instant.
    if (k + 1 < s.size() && s[k + 1].time_ns == s[k].time_ns) {
      continue;
    }
    pts.push_back(to_point(s[k].time_ns, s[k].device_bytes));
  }
  MemorySeries series;
  series.states = static_cast<int>(pts.size());
  const SimTime T = std::max<SimTime>(r.step_time_ns, 1);
  // Downsample to the upper envelope: equal time buckets (one per pixel column, at most
  // kMaxMemoryPoints), each showing the state with the highest total during the bucket (the one it
  // starts in or one reached inside it), so the peak survives; equal neighbours are merged.
  const auto buckets = static_cast<SimTime>(std::clamp(buckets_wanted, 1, kMaxMemoryPoints));
  std::vector<MemPoint>& out = series.points;
  std::size_t i = 0;
  MemPoint cur = pts.front();
  for (SimTime b = 0; b < buckets; ++b) {
    const SimTime t0 = b * T / buckets;
    const SimTime t1 = b + 1 == buckets ? T + 1 : (b + 1) * T / buckets;
    bool have = i >= pts.size() || pts[i].t > t0;  // the state carried in lasts a while
    MemPoint best = cur;
    for (; i < pts.size() && pts[i].t < t1; ++i) {
      cur = pts[i];
      if (!have || cur.total() > best.total()) {
        best = cur;
        have = true;
      }
    }
    best.t = t0;
    if (out.empty() || out.back().v != best.v) {
      out.push_back(best);
    }
  }
  return series;
}

// ---- Step timeline ------------------------------------------------------------------------------

OpClass op_class(const sim::Workload& w, const sim::Op& op) {
  OpClass c{op.kind};
  if (op.kind == sim::OpKind::kCollective && op.collective != sim::kNone) {
    c.collective = w.collectives[static_cast<std::size_t>(op.collective)].kind;
  }
  return c;
}

std::string_view op_class_name(OpClass c) {
  return c.kind == sim::OpKind::kCollective ? collective_name(c.collective) : op_kind_name(c.kind);
}

TimelineCoverage timeline_coverage(const sim::Workload& w, const sim::SimResult& r, int columns) {
  const SimTime T = std::max<SimTime>(r.step_time_ns, 1);
  TimelineCoverage tc;
  tc.columns = columns;
  tc.column_ns = static_cast<double>(T) / columns;
  const double colw = tc.column_ns;
  tc.by_class.assign(sim::kStreamCount, std::vector<std::array<double, kOpClassCount>>(
                                            static_cast<std::size_t>(columns)));
  tc.by_phase.assign(static_cast<std::size_t>(columns), {});
  for (const sim::OpInterval& iv : r.intervals) {
    const sim::Op& op = w.ops[static_cast<std::size_t>(iv.op)];
    if (op.rank != 0 || iv.end_ns <= iv.start_ns) {
      continue;
    }
    ++tc.ops;
    const auto cls = static_cast<std::size_t>(op_class_index(op_class(w, op)));
    tc.used[cls] = true;
    const double s = static_cast<double>(iv.start_ns);
    const double e = static_cast<double>(iv.end_ns);
    const int c0 = std::clamp(static_cast<int>(std::floor(s / colw)), 0, columns - 1);
    const int c1 = std::clamp(static_cast<int>(std::floor(e / colw)), 0, columns - 1);
    for (int c = c0; c <= c1; ++c) {
      const double ov = std::min(e, (c + 1) * colw) - std::max(s, c * colw);
      if (ov <= 0) {
        continue;
      }
      tc.by_class[static_cast<std::size_t>(op.stream)][static_cast<std::size_t>(c)][cls] += ov;
      if (op.stream == sim::Stream::kCompute) {
        tc.by_phase[static_cast<std::size_t>(c)][static_cast<std::size_t>(op.phase)] += ov;
      }
    }
  }
  return tc;
}

// ---- Throughput and peak vs length --------------------------------------------------------------

namespace {

// Each point in % of the best at its length: the fastest point that fits there, or the fastest
// of all where none fits.
std::vector<Series> relative_to_best(const std::vector<Series>& throughput) {
  std::map<std::int64_t, std::pair<double, double>> best;  // seq -> (best fitting, best of all)
  for (const Series& s : throughput) {
    for (const SeriesPoint& pt : s.points) {
      auto& [fitting, any] = best[pt.seq];
      any = std::max(any, pt.value);
      if (pt.fits) {
        fitting = std::max(fitting, pt.value);
      }
    }
  }
  std::vector<Series> out = throughput;
  for (Series& s : out) {
    for (SeriesPoint& pt : s.points) {
      const auto& [fitting, any] = best.at(pt.seq);
      const double reference = fitting > 0 ? fitting : any;
      pt.value = reference > 0 ? 100.0 * pt.value / reference : 0.0;
      pt.tip += fmt::format(" ({:.1f} % of the fastest {}at this length)", pt.value,
                            fitting > 0 ? "that fits " : "");
    }
  }
  return out;
}

}  // namespace

LengthSeries length_series(const ReportPage& page) {
  LengthSeries out;
  for (std::size_t i = 0; i < page.methods.size(); ++i) {
    const auto& m = page.methods[i];
    if (!m.error.empty()) {
      out.notes.push_back(fmt::format("{}: cannot run this configuration: {}", m.method, m.error));
      continue;
    }
    Series a{m.method, i, {}};
    Series b = a;
    for (const auto& pt : m.points) {
      if (!pt.error.empty()) {
        out.notes.push_back(
            fmt::format("{} at {}: cannot run: {}", m.method, format_length(pt.seq_len), pt.error));
        continue;
      }
      const auto& rep = pt.report;
      // Fit is judged on the reserved memory (the allocated peak where the allocator is not
      // replayed) against the capacity less the margin: the chart draws both.
      out.usable_gib =
          std::max(out.usable_gib,
                   static_cast<double>(rep.gpu_capacity_bytes - rep.gpu_margin_bytes) / kGiBd);
      const std::int64_t judged =
          rep.reserved_checked ? rep.reserved_peak_bytes : rep.peak_memory_bytes;
      const std::string tip = fmt::format(
          "{} at {}: {:.1f} tokens/s/GPU, step {}, peak {}, {} {}, {}", m.method,
          format_length(pt.seq_len), rep.tokens_per_s_per_gpu, format_seconds(rep.step_time_s),
          gib(static_cast<double>(rep.peak_memory_bytes)),
          rep.reserved_checked ? "reserved" : "allocated", gib(static_cast<double>(judged)),
          rep.fits() ? "fits" : "does not fit (" + rep.binding + ")");
      a.points.push_back({pt.seq_len, rep.tokens_per_s_per_gpu, rep.fits(), tip});
      b.points.push_back({pt.seq_len, static_cast<double>(judged) / kGiBd, rep.fits(), tip});
    }
    out.throughput.push_back(std::move(a));
    out.peak.push_back(std::move(b));
  }
  out.relative_throughput = relative_to_best(out.throughput);
  return out;
}

// ---- Configuration ------------------------------------------------------------------------------

std::vector<std::pair<std::string, std::string>> setup_rows(const ReportPage& page) {
  const MethodSweep* ref = nullptr;
  for (const auto& m : page.methods) {
    if (m.error.empty()) {
      ref = &m;
      break;
    }
  }
  if (ref == nullptr) {
    return {};
  }
  const auto& in = ref->inputs;
  const auto& md = in.model;
  const auto& hw = in.hardware;
  const auto& r = in.recipe;
  const auto params = models::count_parameters(md);
  std::vector<std::pair<std::string, std::string>> rows = {
      {"model",
       fmt::format("{}: {:.2f} B parameters, {} layers, hidden {}, {} query / {} KV heads of {}, "
                   "FFN {}, vocabulary {}",
                   md.name, static_cast<double>(params.total) / 1e9, md.layers, md.hidden, md.heads,
                   md.kv_heads, md.head_dim, md.ffn_hidden, md.vocab)},
      {"GPUs",
       fmt::format("{} ({} per node, {} node{})", in.parallel.gpus, in.parallel.gpus_per_node,
                   (in.parallel.gpus + in.parallel.gpus_per_node - 1) / in.parallel.gpus_per_node,
                   in.parallel.gpus > in.parallel.gpus_per_node ? "s" : "")},
      {"hardware",
       fmt::format("{} ({}): {} HBM, {:.0f} TFLOP/s bf16 dense, {} pinned host memory per node",
                   hw.name, hw.gpu_name, gib(static_cast<double>(hw.hbm_capacity_bytes)),
                   hw.peak_bf16_flops_per_s / 1e12,
                   gib(static_cast<double>(hw.host_memory_bytes_per_node)))},
      {"recipe", r.name + (r.description.empty() ? "" : ": " + r.description)},
      {"ZeRO / FSDP",
       fmt::format("ZeRO-{}, prefetch {} layer{}, optimizer {}{}", r.zero_stage,
                   r.fsdp_prefetch_layers, r.fsdp_prefetch_layers == 1 ? "" : "s", r.optimizer,
                   r.optimizer_offload ? ", offloaded to host (CPU Adam)" : "")},
      {"activation checkpointing",
       fmt::format("{}{}", models::to_string(r.checkpointing),
                   r.checkpointing == models::CheckpointMode::kFull
                       ? (r.checkpoint_offload ? ", checkpoints offloaded to host"
                                               : ", checkpoints on GPU")
                       : "")},
      {"kernels and memory",
       fmt::format(
           "{} attention, {} MLP, {} norms, {} loss, CP communication in {}", r.attention_kernel,
           r.tiled_mlp
               ? (r.tiled_mlp_shards > 0 ? fmt::format("tiled ({} shards)", r.tiled_mlp_shards)
                                         : std::string("tiled"))
               : std::string("untiled"),
           r.tiled_norm ? "tiled" : "untiled",
           r.fused_loss ? "fused linear cross-entropy" : "materialised-logits",
           r.cp_comm_bytes == 4 ? "fp32" : "bf16")},
  };
  std::string lens;
  for (std::size_t i = 0; i < page.lengths.size(); ++i) {
    lens += (i ? ", " : "") + format_length(page.lengths[i]);
  }
  rows.push_back({"sequence lengths", lens});
  return rows;
}

}  // namespace cpsim::cli
