// The FPDT builder lists, for an op that reads the blocks of many chunks, only the reads that can
// change the simulation (attention_fpdt.cpp): the latest producer of what it reads, and the last
// reader of each chunk on a stream. Listing every chunk each op reads, as a literal transcription
// of FPDT would, must give the same step: time, events, and every rank's memory and stream times.
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "cpsim/sim/engine.hpp"
#include "cpsim/sim/schedule.hpp"

#include "helpers.hpp"

namespace cpsim::sim {
namespace {

using models::CpMethod;
using testing::inputs;

constexpr std::int64_t kK = 1 << 10;

const std::string& name_of(const Workload& w, std::int32_t name) {
  return w.names[static_cast<std::size_t>(name)];
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

// The number in "...[<letter><n>]" at the end of a name.
std::int64_t tag_index(const std::string& name) {
  const std::size_t open = name.rfind('[');
  return std::stoll(name.substr(open + 2, name.size() - open - 3));
}

// `w` with `extra[op]` added to the reads of op (and their producers to its dependencies).
Workload with_reads(const Workload& w, const std::map<OpId, std::vector<TensorId>>& extra) {
  Workload out = w;
  out.edges.clear();
  for (Tensor& t : out.tensors) {
    t.consumers = 0;
  }
  for (std::size_t i = 0; i < w.ops.size(); ++i) {
    const Op& o = w.ops[i];
    Op& n = out.ops[i];
    std::vector<TensorId> reads(w.edges.begin() + o.inputs_begin, w.edges.begin() + o.inputs_end);
    if (const auto it = extra.find(static_cast<OpId>(i)); it != extra.end()) {
      reads.insert(reads.end(), it->second.begin(), it->second.end());
    }
    std::vector<OpId> deps(w.edges.begin() + o.deps_begin, w.edges.begin() + o.deps_end);
    for (const TensorId t : reads) {
      const OpId p = w.tensors[static_cast<std::size_t>(t)].producer;
      if (p != kNone && std::find(deps.begin(), deps.end(), p) == deps.end()) {
        deps.push_back(p);
      }
    }
    n.deps_begin = static_cast<std::int32_t>(out.edges.size());
    out.edges.insert(out.edges.end(), deps.begin(), deps.end());
    n.deps_end = n.inputs_begin = static_cast<std::int32_t>(out.edges.size());
    for (const TensorId t : reads) {
      out.edges.push_back(t);
      out.tensors[static_cast<std::size_t>(t)].consumers += 1;
    }
    n.inputs_end = n.outputs_begin = static_cast<std::int32_t>(out.edges.size());
    out.edges.insert(out.edges.end(), w.edges.begin() + o.outputs_begin,
                     w.edges.begin() + o.outputs_end);
    n.outputs_end = static_cast<std::int32_t>(out.edges.size());
  }
  return out;
}

// Every chunk each multi-chunk op of FPDT reads, found by name among the tensors its rank made in
// the same layer: the forward fetch of chunks 1..i-1 (or, on the GPU, the attention over them) and
// the backward fetch of query chunks j+1.. (or, on the GPU, the attention backward over them).
std::map<OpId, std::vector<TensorId>> every_read(const Workload& w, std::int64_t nc, bool offload) {
  // (rank, layer, phase) -> tensor name -> id, for tensors produced in that pass.
  std::map<std::tuple<int, int, Phase>, std::map<std::string, TensorId>> made;
  for (std::size_t t = 0; t < w.tensors.size(); ++t) {
    const Tensor& ten = w.tensors[t];
    if (ten.producer == kNone) {
      continue;
    }
    const Op& p = w.ops[static_cast<std::size_t>(ten.producer)];
    made[{p.rank, p.layer, p.phase}][name_of(w, ten.name)] = static_cast<TensorId>(t);
  }
  // In its own pass (`backward` false), or for a backward op in the backward (`backward` true) or
  // in the pass that saved the chunks (the recompute under full checkpointing, else the forward).
  auto find = [&](const Op& o, bool backward, const std::string& name) {
    Phase phase = o.phase;
    if (o.phase == Phase::kBackward && !backward) {
      phase = made.count({o.rank, o.layer, Phase::kRecompute}) > 0 ? Phase::kRecompute
                                                                   : Phase::kForward;
    }
    const auto& m = made.at({o.rank, o.layer, phase});
    const auto it = m.find(name);
    return it == m.end() ? kNone : it->second;
  };
  // Head-sharded tensors are the all-to-all outputs, or the inputs themselves without all-to-all.
  auto either = [&](const Op& o, bool backward, const std::string& a, const std::string& b) {
    const TensorId t = find(o, backward, a);
    return t != kNone ? t : find(o, backward, b);
  };
  std::map<OpId, std::vector<TensorId>> extra;
  for (std::size_t i = 0; i < w.ops.size(); ++i) {
    const Op& o = w.ops[i];
    const std::string& name = name_of(w, o.name);
    std::vector<TensorId>& add = extra[static_cast<OpId>(i)];
    if (o.phase != Phase::kBackward) {
      if (offload && starts_with(name, "fetch_kv1..")) {
        for (std::int64_t c = 1; c < tag_index(name); ++c) {
          add.push_back(find(o, false, "kv_host[c" + std::to_string(c) + "]"));
        }
      } else if (!offload && starts_with(name, "attn_fwd[k0..")) {
        for (std::int64_t c = 0; c < tag_index(name); ++c) {
          const std::string tag = "[c" + std::to_string(c) + "]";
          add.push_back(either(o, false, "a2a_kv" + tag, "kv_rope" + tag));
        }
      }
      continue;
    }
    const bool fetch = offload && starts_with(name, "fetch_q_rest");
    const bool attend = !offload && starts_with(name, "attn_bwd[q");
    if (!fetch && !attend) {
      continue;
    }
    for (std::int64_t c = tag_index(name) + 1; c < nc; ++c) {
      const std::string tag = "[c" + std::to_string(c) + "]";
      if (fetch) {
        add.push_back(find(o, false, "q_host" + tag));
        add.push_back(find(o, false, "out_host" + tag));
        add.push_back(find(o, true, "dout_host" + tag));
      } else {
        add.push_back(either(o, false, "a2a_q" + tag, "q_rope" + tag));
        add.push_back(find(o, false, "attn_out_h" + tag));
        add.push_back(find(o, false, "lse" + tag));
        add.push_back(either(o, true, "a2a_dout" + tag, "dout_slice" + tag));
      }
    }
  }
  for (auto& [op, reads] : extra) {
    for (const TensorId t : reads) {
      EXPECT_NE(t, kNone) << name_of(w, w.ops[static_cast<std::size_t>(op)].name);
    }
    std::erase(reads, kNone);
  }
  return extra;
}

void expect_same(const SimResult& a, const SimResult& b) {
  EXPECT_EQ(a.step_time_ns, b.step_time_ns);
  EXPECT_EQ(a.events, b.events);
  ASSERT_EQ(a.memory.size(), b.memory.size());
  for (std::size_t r = 0; r < a.memory.size(); ++r) {
    EXPECT_EQ(a.memory[r].peak_bytes, b.memory[r].peak_bytes) << r;
    EXPECT_EQ(a.memory[r].peak_time_ns, b.memory[r].peak_time_ns) << r;
    EXPECT_EQ(a.memory[r].peak_op, b.memory[r].peak_op) << r;
    EXPECT_EQ(a.memory[r].breakdown_at_peak, b.memory[r].breakdown_at_peak) << r;
    EXPECT_EQ(a.memory[r].category_peak, b.memory[r].category_peak) << r;
    EXPECT_EQ(a.memory[r].host_peak_bytes, b.memory[r].host_peak_bytes) << r;
    EXPECT_EQ(a.busy[r].busy_ns, b.busy[r].busy_ns) << r;
  }
}

struct Case {
  int gpus;
  bool offload;
  models::CheckpointMode ac;
  bool all_ranks;
};

TEST(Fpdt, OmittedReadsChangeNothing) {
  for (const Case& c : {Case{8, true, models::CheckpointMode::kFull, false},
                        Case{8, false, models::CheckpointMode::kFull, false},
                        Case{8, true, models::CheckpointMode::kNone, true},
                        Case{8, false, models::CheckpointMode::kSelective, false},
                        Case{1, true, models::CheckpointMode::kNone, false},
                        Case{1, false, models::CheckpointMode::kFull, false}}) {
    SCOPED_TRACE(::testing::Message() << c.gpus << " GPUs, offload " << c.offload << ", ac "
                                      << models::to_string(c.ac) << ", all ranks " << c.all_ranks);
    ScheduleInputs in = inputs(CpMethod::kFpdt, "qwen3-4b", c.gpus, 512 * kK);
    in.parallel.fpdt_chunk = 64 * kK;
    in.parallel.fpdt_offload = c.offload;
    in.recipe.checkpointing = c.ac;
    in.recipe.checkpoint_offload = c.ac == models::CheckpointMode::kFull;
    const Workload w = build_step(in, {.all_ranks = c.all_ranks});
    const auto extra = every_read(w, 8, c.offload);
    std::size_t added = 0;
    for (const auto& [op, reads] : extra) {
      added += reads.size();
    }
    EXPECT_GT(added, 100U);  // the literal transcription reads O(nc²) chunks per layer
    const Workload full = with_reads(w, extra);
    expect_same(simulate(w, in.hardware), simulate(full, in.hardware));
  }
}

}  // namespace
}  // namespace cpsim::sim
