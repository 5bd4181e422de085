// The implementations' ledgers: the documents (docs/implementations/<name>.md) list the rows the
// code has, the simulated ops carry those bytes at their sites, the worked examples of the
// documents come out of the simulator byte for byte, and the choice of implementation (asked for,
// recipe default, refused) follows its rules.
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cpsim/sim/implementation.hpp"
#include "cpsim/sim/schedule.hpp"

#include "evaluate_step.hpp"
#include "helpers.hpp"

namespace cpsim::sim {
namespace {

using models::CpMethod;
using testing::inputs;

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(' ');
  const auto e = s.find_last_not_of(' ');
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

/// The cells of the table under the "ledger rows" marker (header and separator skipped).
std::vector<std::vector<std::string>> document_rows(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::vector<std::vector<std::string>> rows;
  std::string line;
  bool in_table = false;
  int skipped = 0;
  while (std::getline(in, line)) {
    if (line.find("<!-- ledger rows: parsed by tests/sim/ledger_test.cpp -->") == 0) {
      in_table = true;
      continue;
    }
    if (!in_table) {
      continue;
    }
    if (line.empty() || line[0] != '|') {
      break;
    }
    if (skipped < 2) {  // header and separator
      ++skipped;
      continue;
    }
    std::vector<std::string> cells;
    std::stringstream cells_text(line.substr(1));
    std::string cell;
    while (std::getline(cells_text, cell, '|')) {
      cells.push_back(trim(cell));
    }
    rows.push_back(cells);
  }
  return rows;
}

TEST(Ledger, DocumentListsTheRowsOfTheCode) {
  ASSERT_GE(implementations().size(), 2U);
  for (const Implementation* impl : implementations()) {
    const std::string path = std::string(CPSIM_TEST_DATA_DIR) + "/../" + impl->ledger_document();
    const std::vector<std::vector<std::string>> doc = document_rows(path);
    ASSERT_EQ(doc.size(), impl->ledger().size()) << path;
    for (std::size_t i = 0; i < doc.size(); ++i) {
      const LedgerRow& row = impl->ledger()[i];
      ASSERT_EQ(doc[i].size(), 6U) << path << " row " << i;
      EXPECT_EQ(doc[i][0], row.id) << path;
      EXPECT_EQ(doc[i][1], to_string(row.site)) << path << " " << row.id;
      EXPECT_EQ(doc[i][2], to_string(row.when)) << path << " " << row.id;
      EXPECT_EQ(doc[i][3], row_formula(row)) << path << " " << row.id;
      EXPECT_EQ(doc[i][4], traffic_formula(row)) << path << " " << row.id;
      EXPECT_EQ(doc[i][5], row.tensor) << path << " " << row.id;
    }
  }
}

TEST(Ledger, RowBytesByHand) {
  // llama3-8b, 8 GPUs, 64K: s = 8192, H = 32, Hkv = 8, d = 128.
  ScheduleInputs in = inputs(CpMethod::kUlysses, "llama3-8b", 8, 64 * 1024);
  const LedgerUnits u = ledger_units(in, derive_head_layout(in));
  EXPECT_EQ(u.shd, 8192 * 32 * 128);
  EXPECT_EQ(u.shkd, 8192 * 8 * 128);
  EXPECT_EQ(u.sh, 8192 * 32);
  EXPECT_EQ(u.kv_heads_per_rank, 1);
  const LedgerRow row{"x", LedgerSite::kGradFinish, LedgerWhen::kAlways, 4, 16, 2, {}, "t"};
  EXPECT_EQ(row_bytes(row, u), 4 * 33554432LL + 16 * 8388608LL + 2 * 262144LL);
  EXPECT_EQ(row_formula(row), "4·sHd + 16·sHkv·d + 2·sH");
  EXPECT_EQ(traffic_formula(row), "0");
  const LedgerRow cast{"y", LedgerSite::kGradFinish, LedgerWhen::kAlways, 4, 0, 0, {6, 0, 4}, "t"};
  EXPECT_EQ(row_traffic_bytes(cast, u), 6 * 33554432LL + 4 * 262144LL);
  EXPECT_EQ(traffic_formula(cast), "6·sHd + 4·sH");

  // 16 GPUs: the 8 KV heads replicated to 16 (s = 4096); a row of the model's KV heads counts 8.
  in = inputs(CpMethod::kUlysses, "llama3-8b", 16, 64 * 1024);
  const LedgerUnits r = ledger_units(in, derive_head_layout(in));
  EXPECT_EQ(r.shkd, 4096 * 16 * 128);
  EXPECT_EQ(r.shkd_model, 4096 * 8 * 128);
  const LedgerRow model{"z",
                        LedgerSite::kHeldThroughBlock,
                        LedgerWhen::kAlways,
                        2,
                        4,
                        0,
                        {},
                        "t",
                        /*model_kv_heads=*/true};
  EXPECT_EQ(row_bytes(model, r), 2 * r.shd + 4 * 4096 * 8 * 128);
  EXPECT_EQ(row_formula(model), "2·sHd + 4·sHkv_m·d");
}

// Conditions read off the traces (docs/TRACING.md): deepspeed-ulysses's context and dQ copies (F18,
// B9) only with more than one query head per rank; yunchang's dK/dV input copy (B15) with more than
// one KV head per rank, at any Ulysses degree.
TEST(Ledger, HeadsPerRankDecideTheCopies) {
  const Implementation& ds = *find_implementation("deepspeed-ulysses");
  LedgerUnits u{
      .shd = 100, .shkd = 10, .sh = 1, .ulysses = 4, .kv_heads_per_rank = 2, .heads_per_rank = 8};
  EXPECT_EQ(ds.site_bytes(LedgerSite::kOutExchange, u), 2 * 100 + 2 * 100);  // F18 + F20
  EXPECT_EQ(ds.site_bytes(LedgerSite::kDqExchange, u), 2 * 100);             // B9
  u.heads_per_rank = 1;
  EXPECT_EQ(ds.site_bytes(LedgerSite::kOutExchange, u), 2 * 100);  // F20 alone
  EXPECT_EQ(ds.site_bytes(LedgerSite::kDqExchange, u), 0);

  const Implementation& yc = *find_implementation("yunchang-usp");
  LedgerUnits r{
      .shd = 100, .shkd = 10, .sh = 1, .ulysses = 1, .kv_heads_per_rank = 2, .heads_per_rank = 4};
  EXPECT_EQ(yc.site_bytes(LedgerSite::kDkvExchange, r), 2 * 10 + 2 * 10);  // B15 + B16 at u = 1
  r.kv_heads_per_rank = 1;
  EXPECT_EQ(yc.site_bytes(LedgerSite::kDkvExchange, r), 2 * 10);  // B16 alone
}

/// Workspace of rank 0's first op named `name` (or `name[...]`: UPipe's stages, FPDT's chunks)
/// in `phase` of block 5.
std::int64_t workspace_of(const Workload& w, const std::string& name, Phase phase) {
  for (const Op& op : w.ops) {
    const std::string& n = w.names[static_cast<std::size_t>(op.name)];
    if (op.rank == 0 && op.layer == 5 && op.phase == phase &&
        (n == name || n.rfind(name + "[", 0) == 0)) {
      return op.workspace_bytes;
    }
  }
  return -1;
}

/// Bytes an op keeps alive beside the tensor it exchanges: its inputs but the last (rank 0, block
/// 5, the first op named `name` in `phase`); -1 when there is no such op.
std::int64_t held_bytes_of(const Workload& w, const std::string& name, Phase phase) {
  for (const Op& op : w.ops) {
    if (op.rank == 0 && op.layer == 5 && op.phase == phase &&
        w.names[static_cast<std::size_t>(op.name)] == name) {
      std::int64_t bytes = 0;
      for (std::int32_t e = op.inputs_begin; e + 1 < op.inputs_end; ++e) {
        bytes += w.tensors[static_cast<std::size_t>(w.edges[static_cast<std::size_t>(e)])].bytes;
      }
      return bytes;
    }
  }
  return -1;
}

// The ops of one block carry, beyond the method's scheme, the sum of the rows at their site.
TEST(Ledger, OpsCarryTheRowsAtTheirSites) {
  const std::map<std::string, std::pair<LedgerSite, Phase>> sites = {
      {"a2a_q", {LedgerSite::kQExchange, Phase::kRecompute}},
      {"a2a_kv", {LedgerSite::kKvExchange, Phase::kRecompute}},
      {"attn_fwd", {LedgerSite::kCoreForward, Phase::kRecompute}},
      {"a2a_out", {LedgerSite::kOutExchange, Phase::kRecompute}},
      {"a2a_dout", {LedgerSite::kDoutExchange, Phase::kBackward}},
      {"attn_bwd", {LedgerSite::kCoreBackward, Phase::kBackward}},
      {"a2a_dq", {LedgerSite::kDqExchange, Phase::kBackward}},
      {"a2a_dkv", {LedgerSite::kDkvExchange, Phase::kBackward}},
      {"ring_attn_fwd0", {LedgerSite::kRingForwardStep, Phase::kRecompute}},
      {"ring_attn_bwd0", {LedgerSite::kRingBackwardStep, Phase::kBackward}},
  };
  std::vector<std::pair<const Implementation*, CpMethod>> runs;
  for (const Implementation* impl : implementations()) {
    // Ulysses and ring where it runs them (their schemes), else its first method (UPipe: U = u).
    for (const CpMethod m : {CpMethod::kUlysses, CpMethod::kRing}) {
      if (impl->runs(m)) {
        runs.emplace_back(impl, m);
      }
    }
    if (!impl->runs(CpMethod::kUlysses) && !impl->runs(CpMethod::kRing)) {
      runs.emplace_back(impl, impl->methods().front());
    }
  }
  for (const auto& [impl, method] : runs) {
    ScheduleInputs none = inputs(method, "qwen3-4b", 4, 64 * 1024);
    none.recipe.cp_comm_bytes = none.recipe.activation_bytes;
    if (method == CpMethod::kRing) {
      none.parallel.ring_degree = none.parallel.cp_degree;
    }
    ScheduleInputs with = none;
    with.parallel.implementation = std::string(impl->name());
    const LayoutCheck checked = checked_layout(with);
    ASSERT_EQ(checked.implementation, impl);
    const HeadLayout& layout = checked.layout;
    if (layout.kv_heads_eff != derive_head_layout(none).kv_heads_eff) {
      // The implementation reshapes K/V (repeat_kv): compare with the scheme at that shape.
      none.model.kv_heads = layout.kv_heads_eff;
    }
    const LedgerUnits units = ledger_units(with, layout);
    // qwen3-4b: 8 KV heads over 4 ranks (UPipe: one fetch of U = 4 KV heads, one per rank)
    if (method != CpMethod::kRing) {
      ASSERT_EQ(units.kv_heads_per_rank, method == CpMethod::kUPipe ? 1 : 2);
    }
    const Workload w_none = build_step(none);
    const Workload w_with = build_step(with);
    for (const auto& [name, where] : sites) {
      const std::int64_t base = workspace_of(w_none, name, where.second);
      const std::int64_t got = workspace_of(w_with, name, where.second);
      if (base < 0) {    // not an op of the scheme (the ring has no all-to-all) ...
        if (got >= 0) {  // ... but of the implementation's (a copy it makes without peers)
          EXPECT_EQ(got, impl->site_bytes(where.first, units)) << impl->name() << " " << name;
        }
        continue;
      }
      ASSERT_GE(base, 0) << impl->name() << " " << name;
      ASSERT_GE(got, 0) << impl->name() << " " << name;
      EXPECT_EQ(got - base, impl->site_bytes(where.first, units)) << impl->name() << " " << name;
    }
    // Held tensors: the output all-to-all keeps the projected Q, K, V; the gradients' all-to-all
    // what the backward kernel read and the incoming gradient.
    if (method == CpMethod::kUlysses) {
      const std::int64_t block = impl->site_bytes(LedgerSite::kHeldThroughBlock, units);
      EXPECT_EQ(held_bytes_of(w_with, "a2a_out", Phase::kRecompute), block) << impl->name();
      const std::int64_t backward = impl->site_bytes(LedgerSite::kHeldThroughBackward, units);
      EXPECT_EQ(held_bytes_of(w_with, "a2a_dq", Phase::kBackward), backward) << impl->name();
    }
    // Kept per completed ring step: the merge after the last of the 4 steps holds 3 steps' worth.
    const std::int64_t held = impl->site_bytes(LedgerSite::kRingForwardHeld, units);
    if (method == CpMethod::kRing) {
      EXPECT_EQ(workspace_of(w_with, "ring_out_cast", Phase::kRecompute), 3 * held) << impl->name();
    }
    const std::int64_t finish = impl->site_bytes(LedgerSite::kGradFinish, units);
    const std::int64_t finish_op = workspace_of(w_with, "grad_finish", Phase::kBackward);
    EXPECT_EQ(finish_op, finish > 0 && method != CpMethod::kRing ? finish : -1) << impl->name();
  }
}

/// Duration of rank 0's first op named `name` in `phase` of block 5; -1 when there is none.
SimTime duration_of(const Workload& w, const std::string& name, Phase phase) {
  for (const Op& op : w.ops) {
    if (op.rank == 0 && op.layer == 5 && op.phase == phase &&
        w.names[static_cast<std::size_t>(op.name)] == name) {
      return op.duration_ns;
    }
  }
  return -1;
}

// The time of the rows' kernels, by hand: yunchang-usp, Ulysses, llama3-8b on 8 H100s, 64K
// (s = 8192, H = 32, Hkv = 8, d = 128; s·H·d = 33,554,432). The H100 profile's memory-bound rate
// is 3.35e12 B/s × 0.85 = 2.8475e12 B/s.
//   attn_fwd (core_forward, F9+F14: block_out.to(float32), 2 + 4 bytes per element):
//     6 × 33,554,432 B / 2.8475e12 B/s = 70,702.9 ns more than the scheme's attn_fwd.
//   copy.a2a_q (q_exchange, F1: all_to_all_4D's .contiguous() copy of q, 2 + 2 bytes):
//     1 µs launch + 4 × 33,554,432 B / 2.8475e12 B/s = 48,135.3 ns; the scheme has no such op.
//   copy.a2a_kv (kv_exchange, F3+F5: copies of k and v, 2 × (2 + 2) bytes per s·Hkv·d):
//     1 µs + 8 × 8,388,608 B / 2.8475e12 B/s = 24,567.6 ns.
TEST(Ledger, TrafficTimesTheSiteByHand) {
  ScheduleInputs none = inputs(CpMethod::kUlysses, "llama3-8b", 8, 64 * 1024);
  none.parallel.implementation = "none";
  ScheduleInputs with = none;
  with.parallel.implementation = "yunchang-usp";
  const Workload w_none = build_step(none);
  const Workload w_with = build_step(with);
  const SimTime base = duration_of(w_none, "attn_fwd", Phase::kForward);
  ASSERT_GT(base, 0);
  EXPECT_NEAR(static_cast<double>(duration_of(w_with, "attn_fwd", Phase::kForward) - base), 70702.9,
              1.0);
  EXPECT_EQ(duration_of(w_none, "copy.a2a_q", Phase::kForward), -1);
  EXPECT_NEAR(static_cast<double>(duration_of(w_with, "copy.a2a_q", Phase::kForward)), 48135.3,
              1.0);
  EXPECT_NEAR(static_cast<double>(duration_of(w_with, "copy.a2a_kv", Phase::kForward)), 24567.6,
              1.0);
  // The all-to-all itself is unchanged (its time is the collective's).
  EXPECT_EQ(duration_of(w_with, "a2a_q", Phase::kForward),
            duration_of(w_none, "a2a_q", Phase::kForward));
}

// Every implementation: each site's op takes the traffic of the rows there on top of the scheme's
// op (ulysses single call; ring steps of the representative rank).
TEST(Ledger, OpsTakeTheTrafficOfTheirSites) {
  for (const Implementation* impl : implementations()) {
    for (const CpMethod m : {CpMethod::kUlysses, CpMethod::kRing}) {
      if (!impl->runs(m)) {
        continue;
      }
      ScheduleInputs none = inputs(m, "qwen3-4b", 4, 64 * 1024);
      if (m == CpMethod::kRing) {
        none.parallel.ring_degree = none.parallel.cp_degree;
      }
      none.parallel.implementation = "none";
      ScheduleInputs with = none;
      with.parallel.implementation = std::string(impl->name());
      const HeadLayout layout = derive_head_layout(with);
      none.model.kv_heads = layout.kv_heads_eff;  // repeat_kv: the scheme at that shape
      const LedgerUnits units = ledger_units(with, layout);
      const double rate = with.hardware.hbm_bandwidth_bytes_per_s *
                          with.hardware.memory_bound_efficiency / 1e9;  // bytes per ns
      const Workload w_none = build_step(none);
      const Workload w_with = build_step(with);
      const std::string fwd = m == CpMethod::kRing ? "ring_attn_fwd0" : "attn_fwd";
      const std::string bwd = m == CpMethod::kRing ? "ring_attn_bwd0" : "attn_bwd";
      const LedgerSite fwd_site =
          m == CpMethod::kRing ? LedgerSite::kRingForwardStep : LedgerSite::kCoreForward;
      const LedgerSite bwd_site =
          m == CpMethod::kRing ? LedgerSite::kRingBackwardStep : LedgerSite::kCoreBackward;
      EXPECT_NEAR(static_cast<double>(duration_of(w_with, fwd, Phase::kForward) -
                                      duration_of(w_none, fwd, Phase::kForward)),
                  static_cast<double>(impl->site_traffic_bytes(fwd_site, units)) / rate, 1.0)
          << impl->name();
      EXPECT_NEAR(static_cast<double>(duration_of(w_with, bwd, Phase::kBackward) -
                                      duration_of(w_none, bwd, Phase::kBackward)),
                  static_cast<double>(impl->site_traffic_bytes(bwd_site, units)) / rate, 1.0)
          << impl->name();
    }
  }
}

// torch-native-cp: TorchTitan's backend priority puts cuDNN first, and PyTorch's
// can_use_cudnn_attention passes for bf16 with head_dim 128 (sdp_utils.cpp): the recipe's sdpa
// is timed with the profile's cudnn curves; fp32 or head_dim 256 fall back to the recipe's.
TEST(Ledger, TorchNativeSdpaRunsCudnn) {
  const Implementation* impl = find_implementation("torch-native-cp");
  ASSERT_NE(impl, nullptr);
  ScheduleInputs in = inputs(CpMethod::kRing, "llama3-8b", 8, 64 * 1024);
  in.parallel.ring_degree = in.parallel.cp_degree;
  in.parallel.implementation = "torch-native-cp";
  in.recipe.attention_kernel = "sdpa";
  EXPECT_EQ(impl->attention_kernel(in), "cudnn");
  ScheduleInputs as_cudnn = in;
  as_cudnn.recipe.attention_kernel = "cudnn";
  const Workload w_sdpa = build_step(in);
  const Workload w_cudnn = build_step(as_cudnn);
  EXPECT_EQ(duration_of(w_sdpa, "ring_attn_fwd0", Phase::kForward),
            duration_of(w_cudnn, "ring_attn_fwd0", Phase::kForward));
  EXPECT_EQ(duration_of(w_sdpa, "ring_attn_bwd0", Phase::kBackward),
            duration_of(w_cudnn, "ring_attn_bwd0", Phase::kBackward));
  ScheduleInputs fp32 = in;
  fp32.recipe.activation_bytes = 4;
  EXPECT_EQ(impl->attention_kernel(fp32), "sdpa");
  ScheduleInputs wide = in;
  wide.model.head_dim = 256;
  EXPECT_EQ(impl->attention_kernel(wide), "sdpa");
  ScheduleInputs no_curves = in;
  no_curves.hardware.attention_kernels.erase("cudnn");
  EXPECT_EQ(impl->attention_kernel(no_curves), "sdpa");
  ScheduleInputs flash = in;
  flash.recipe.attention_kernel = "fa3";
  EXPECT_EQ(impl->attention_kernel(flash), "fa3");
}

/// Peak of the attention category for the documents' worked example.
std::int64_t attention_peak_of_example(const std::string& impl) {
  ScheduleInputs in = inputs(CpMethod::kUlysses, "llama3-8b", 8, 256 * 1024);
  in.parallel.implementation = impl;
  in.recipe.attention_kernel = "fa2";
  in.recipe.checkpoint_offload = false;
  in.recipe.tiled_mlp = false;
  const test::Evaluation e = test::evaluate(in);
  return e.report.category_peak[static_cast<std::size_t>(MemCategory::kAttention)];
}

// docs/implementations/*.md, "Worked example": the backward peaks derived by hand from the
// upstream ledgers (yunchang: 14·sHd + 28·sHkv·d + 6·sH bytes; DeepSpeed: the FlashAttention-2
// kernel call, 2·(6Q + 4Kg) + dq_accum + LSE + softmax_d).
TEST(Ledger, WorkedExamplesOfTheDocuments) {
  EXPECT_EQ(attention_peak_of_example("yunchang-usp"), 2824863744LL);
  EXPECT_EQ(attention_peak_of_example("deepspeed-ulysses"), 2424307712LL);
  EXPECT_EQ(attention_peak_of_example("none"), 2424307712LL);
}

// torch-native-cp (docs/implementations/torch-native-cp.md): the ring rotation with repeat_kv,
// llama3-8b, 8 GPUs, 256K, recipe torch-native. The ledger's backward peak is 33X with X = s·H·d
// bf16 = 256 MiB (31X as read, and the second send buffer its traces show, B6), plus the LSE
// terms it leaves out: the saved LSE (4 MiB), softmax_d (4 MiB) and the LSE half (2 MiB).
TEST(Ledger, TorchNativeRingWorkedExample) {
  ScheduleInputs in = inputs(CpMethod::kRing, "llama3-8b", 8, 256 * 1024);
  in.recipe = models::load_recipe("torch-native", testing::data());
  in.recipe.checkpoint_offload = false;
  in.parallel.ring_degree = 8;
  in.parallel.implementation.clear();  // the recipe's default
  const test::Evaluation e = test::evaluate(in);
  constexpr std::int64_t kMiB = 1 << 20;
  EXPECT_EQ(e.report.implementation, find_implementation("torch-native-cp"));
  EXPECT_EQ(e.report.category_peak[static_cast<std::size_t>(MemCategory::kAttention)],
            33 * 256 * kMiB + 10 * kMiB);
}

// megatron-core-cp (docs/implementations/megatron-core-cp.md, section 3): p2p forward peak of the
// worst rank 3364 MiB plus the caller's q, k, v (384 MiB); a2a backward peak 2692 MiB
// (644 saved + dout + dout' + 4·(Q + 2K)).
TEST(Ledger, MegatronWorkedExamples) {
  constexpr std::int64_t kMiB = 1 << 20;
  for (const auto& [method, mib] :
       {std::pair{CpMethod::kRing, 3364 + 384}, std::pair{CpMethod::kUlysses, 2692}}) {
    ScheduleInputs in = inputs(method, "llama3-8b", 8, 256 * 1024);
    if (method == CpMethod::kRing) {
      in.parallel.ring_degree = 8;
    }
    in.parallel.implementation = "megatron-core-cp";
    in.recipe.attention_kernel = "cudnn";
    in.recipe.checkpoint_offload = false;
    in.recipe.tiled_mlp = false;
    const test::Evaluation e = test::evaluate(in);
    EXPECT_EQ(e.report.category_peak[static_cast<std::size_t>(MemCategory::kAttention)], mib * kMiB)
        << models::to_string(method);
  }
}

TEST(Implementation, RecipeDefaults) {
  ScheduleInputs in = inputs(CpMethod::kUlysses, "llama3-8b", 8, 64 * 1024);
  in.parallel.implementation.clear();
  EXPECT_EQ(checked_layout(in).implementation, find_implementation("yunchang-usp"));
  in.recipe = models::load_recipe("alst-deepspeed", testing::data());
  EXPECT_EQ(checked_layout(in).implementation, find_implementation("deepspeed-ulysses"));
  in.parallel.method = CpMethod::kFpdt;
  in.recipe = models::load_recipe("deepspeed-fpdt", testing::data());
  EXPECT_EQ(checked_layout(in).implementation, find_implementation("deepspeed-fpdt"));
  in.recipe = models::load_recipe("alst", testing::data());
  EXPECT_EQ(checked_layout(in).implementation, nullptr);  // no default for fpdt in alst
  in = inputs(CpMethod::kUlysses, "llama3-8b", 8, 64 * 1024);
  in.parallel.implementation = "none";
  EXPECT_EQ(checked_layout(in).implementation, nullptr);
}

TEST(Implementation, Refusals) {
  ScheduleInputs in = inputs(CpMethod::kFpdt, "llama3-8b", 8, 64 * 1024);
  in.parallel.implementation = "yunchang-usp";
  try {
    (void)derive_head_layout(in);
    FAIL() << "yunchang-usp ran fpdt";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.quantity(), Quantity::kImplementation);
    EXPECT_EQ(std::string(e.what()),
              "yunchang-usp does not run --method fpdt (it runs usp, ulysses, ring)");
  }
  in.parallel.implementation = "megatron";
  try {
    (void)derive_head_layout(in);
    FAIL() << "unknown implementation accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.quantity(), Quantity::kImplementation);
  }
  // yunchang does not replicate KV heads: Ulysses 16 over 8 KV heads is refused, also as the
  // recipe's default (with the way out).
  in = inputs(CpMethod::kUlysses, "llama3-8b", 16, 64 * 1024);
  in.parallel.implementation.clear();
  try {
    (void)derive_head_layout(in);
    FAIL() << "yunchang ran Ulysses 16 with 8 KV heads";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.quantity(), Quantity::kModelHeads);
    EXPECT_NE(std::string(e.what()).find("--impl none"), std::string::npos) << e.what();
  }
  in.parallel.implementation = "none";
  EXPECT_EQ(derive_head_layout(in).kv_heads_eff, 16);  // the scheme replicates
}

// The implementation is resolved by name once: --impl's, the recipe's default, none, or an issue
// naming --impl.
TEST(Implementations, ResolvedOnceByName) {
  ScheduleInputs in = testing::inputs(models::CpMethod::kUlysses, "llama3-8b", 8, 64 * 1024);
  EXPECT_EQ(resolve_implementation(in).implementation, nullptr);  // "none"
  EXPECT_FALSE(resolve_implementation(in).issue);
  in.parallel.implementation.clear();  // the recipe's default: alst runs Ulysses through yunchang
  EXPECT_EQ(resolve_implementation(in).implementation, find_implementation("yunchang-usp"));
  EXPECT_EQ(requested_implementation(in), find_implementation("yunchang-usp"));
  in.parallel.implementation = "deepspeed-ulysses";
  EXPECT_EQ(resolve_implementation(in).implementation, find_implementation("deepspeed-ulysses"));
  in.parallel.implementation = "no-such-code";
  ResolvedImplementation unknown = resolve_implementation(in);
  EXPECT_EQ(unknown.implementation, nullptr);
  ASSERT_TRUE(unknown.issue);
  EXPECT_EQ(unknown.issue->quantity, Quantity::kImplementation);
  EXPECT_THAT(unknown.issue->message,
              ::testing::HasSubstr("unknown implementation 'no-such-code'"));
  in.parallel.implementation = "deepspeed-fpdt";  // runs FPDT only
  ResolvedImplementation wrong = resolve_implementation(in);
  EXPECT_EQ(wrong.implementation, nullptr);
  ASSERT_TRUE(wrong.issue);
  EXPECT_THAT(wrong.issue->message, ::testing::HasSubstr("does not run --method ulysses"));
  // check_head_layout reports the same issue.
  EXPECT_EQ(check_head_layout(in).issue->message, wrong.issue->message);
}

}  // namespace
}  // namespace cpsim::sim
