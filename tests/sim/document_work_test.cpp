// Attention work under a document mask (sim/document_work.hpp), by hand, and the step built with
// one document equal to the step built without documents.
#include "cpsim/sim/document_work.hpp"

#include <stdexcept>

#include <gtest/gtest.h>

#include "cpsim/sim/schedule.hpp"

#include "helpers.hpp"

namespace cpsim::sim {
namespace {

using models::PackedSequence;
using models::RingLayout;

double cell(const std::vector<double>& m, int ring, int i, int j) {
  return m[static_cast<std::size_t>(i * ring + j)];
}

TEST(DocumentWork, TwoDocumentsOnTwoContiguousRanks) {
  // S = 8, R = 2, contiguous: rank 0 holds [0, 4) = document 0, rank 1 holds [4, 8) = document 1.
  const DocumentWork w = document_work(PackedSequence{{4, 4}, 1}, 8, 2, RingLayout::kContiguous,
                                       DocumentSplit::kSequence);
  EXPECT_EQ(cell(w.visible, 2, 0, 0), 8.0);  // 4²/2
  EXPECT_EQ(cell(w.visible, 2, 1, 1), 8.0);
  EXPECT_EQ(cell(w.visible, 2, 1, 0), 0.0);  // another document
  EXPECT_EQ(cell(w.visible, 2, 0, 1), 0.0);
  // One document of 8: rank 1 sees all of rank 0's keys (16).
  EXPECT_EQ(cell(w.reference, 2, 1, 0), 16.0);
  EXPECT_EQ(w.step_factor(1, 1), 0.0);
  EXPECT_EQ(w.step_factor(0, 1), 0.0);  // nothing in the reference either
  EXPECT_EQ(w.step_factor(1, 0), 1.0);
  EXPECT_EQ(w.total_factor(), 16.0 / 32.0);
  EXPECT_EQ(w.imbalance(), 1.0);
}

TEST(DocumentWork, PtrrDealsBlocksByTheirMaskedCounts) {
  // S = 512 (4 blocks of 128), R = 2, documents [0, 128) and [128, 512). Key blocks each query
  // block touches: 1, 1, 2, 3. Sorted (stable): b3, b2, b0, b1; row 0 left to right (b3 → 0,
  // b2 → 1), row 1 right to left (b0 → 1, b1 → 0): position 0 holds b1, b3; position 1 b0, b2.
  const DocumentWork w = document_work(PackedSequence{{128, 384}, 1}, 512, 2, RingLayout::kZigzag,
                                       DocumentSplit::kPtrrBlocks);
  const double full = 128.0 * 128.0, half = full / 2.0;
  // Position 0: b1 sees itself (half); b3 sees b1 (full, position 0), b2 (full, position 1) and
  // itself (half).
  EXPECT_EQ(cell(w.visible, 2, 0, 0), half + full + half);
  EXPECT_EQ(cell(w.visible, 2, 0, 1), full);
  // Position 1: b0 sees itself (half); b2 sees b1 (full, position 0) and itself.
  EXPECT_EQ(cell(w.visible, 2, 1, 0), full);
  EXPECT_EQ(cell(w.visible, 2, 1, 1), half + half);
  EXPECT_DOUBLE_EQ(w.imbalance(), 3.0 * full / (2.5 * full));
  // Not whole blocks on every position: refused.
  EXPECT_THROW(document_work(PackedSequence{{128, 256}, 1}, 384, 2, RingLayout::kZigzag,
                             DocumentSplit::kPtrrBlocks),
               std::invalid_argument);
}

TEST(DocumentWork, HeadTailOverThePackedSequence) {
  // S = 8, R = 2, chunks of 2: [0,2) and [6,8) on position 0, [2,4) and [4,6) on position 1.
  // Documents [0, 6) and [6, 8).
  const DocumentWork w =
      document_work(PackedSequence{{6, 2}, 1}, 8, 2, RingLayout::kZigzag, DocumentSplit::kSequence);
  EXPECT_EQ(cell(w.visible, 2, 0, 0), 4.0);  // [0,2)² causal 2, [6,8)² causal 2
  EXPECT_EQ(cell(w.visible, 2, 0, 1), 0.0);
  EXPECT_EQ(cell(w.visible, 2, 1, 0), 8.0);  // [2,6) × [0,2) in full
  EXPECT_EQ(cell(w.visible, 2, 1, 1), 8.0);  // 2 + 4 + 2
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      EXPECT_EQ(cell(w.reference, 2, i, j), 8.0) << i << j;  // head-tail of one document: even
    }
  }
  EXPECT_EQ(w.imbalance(), 16.0 / 10.0);
  EXPECT_EQ(w.position_factor(0), 4.0 / 16.0);
  EXPECT_EQ(w.total_factor(), 20.0 / 32.0);
}

TEST(DocumentWork, PerDocumentSplitIsBalanced) {
  // Two documents of 4 on R = 2, each cut into 4 chunks of 1: 0.5 + 1 + 1 + 1 + 0.5 = 4 on each
  // position per document.
  const DocumentWork w = document_work(PackedSequence{{4, 4}, 4}, 8, 2, RingLayout::kZigzag,
                                       DocumentSplit::kPerDocument);
  EXPECT_EQ(cell(w.visible, 2, 0, 0) + cell(w.visible, 2, 0, 1), 8.0);
  EXPECT_EQ(cell(w.visible, 2, 1, 0) + cell(w.visible, 2, 1, 1), 8.0);
  EXPECT_EQ(w.imbalance(), 1.0);
  // Padding attends nothing: documents of 3 in spans of 4 see 3²/2 each.
  const DocumentWork padded = document_work(PackedSequence{{3, 3}, 4}, 8, 2, RingLayout::kZigzag,
                                            DocumentSplit::kPerDocument);
  EXPECT_EQ(padded.total_factor(), 9.0 / 32.0);
}

TEST(DocumentWork, OneDocumentIsTheReferenceExactly) {
  for (const int ring : {1, 2, 3, 4, 8}) {
    const std::int64_t S = 2 * ring * 1000;
    for (const auto& [layout, split] :
         {std::pair{RingLayout::kZigzag, DocumentSplit::kSequence},
          std::pair{RingLayout::kContiguous, DocumentSplit::kSequence},
          std::pair{RingLayout::kZigzag, DocumentSplit::kPerDocument}}) {
      const DocumentWork w = document_work(PackedSequence{{S}, 2 * ring}, S, ring, layout, split);
      EXPECT_EQ(w.visible, w.reference) << ring;
      EXPECT_EQ(w.total_factor(), 1.0);
    }
  }
}

TEST(DocumentWork, RefusesWhatItCannotSplit) {
  EXPECT_THROW((void)document_work(PackedSequence{{8}, 4}, 8, 2, RingLayout::kContiguous,
                                   DocumentSplit::kPerDocument),
               std::invalid_argument);
  EXPECT_THROW((void)document_work(PackedSequence{{6}, 2}, 8, 2, RingLayout::kZigzag,
                                   DocumentSplit::kPerDocument),
               std::invalid_argument);
  EXPECT_THROW((void)document_work(PackedSequence{{6, 6}, 1}, 8, 2, RingLayout::kZigzag,
                                   DocumentSplit::kSequence),
               std::invalid_argument);
}

// The attention ops' durations of a built step, in program order.
std::vector<SimTime> attention_durations(const Workload& w) {
  std::vector<SimTime> out;
  for (const Op& op : w.ops) {
    if (op.kind == OpKind::kAttentionFwd || op.kind == OpKind::kAttentionBwd) {
      out.push_back(op.duration_ns);
    }
  }
  return out;
}

TEST(DocumentWork, StepOfOneDocumentIsTheStepWithoutDocuments) {
  for (const models::CpMethod method :
       {models::CpMethod::kUlysses, models::CpMethod::kRing, models::CpMethod::kAllGather,
        models::CpMethod::kFpdt, models::CpMethod::kUPipe}) {
    ScheduleInputs in = testing::inputs(method, "llama3-8b", 8, 128 * 1024);
    in.parallel.fpdt_chunk = 32 * 1024;
    if (method == models::CpMethod::kRing || method == models::CpMethod::kAllGather) {
      in.parallel.ring_degree = 8;
    }
    const int ring = static_cast<int>(derive_head_layout(in).ring);
    const Workload plain = build_step(in, BuildOptions{.merge_ring_steps = false});
    in.documents = document_work(PackedSequence{{in.parallel.seq_len}, 1}, in.parallel.seq_len,
                                 ring, in.parallel.ring_layout, DocumentSplit::kSequence);
    const Workload one = build_step(in);
    EXPECT_EQ(attention_durations(plain), attention_durations(one));
    EXPECT_FALSE(attention_durations(one).empty());
  }
}

TEST(DocumentWork, UlyssesAttentionScalesByTheVisibleShare) {
  ScheduleInputs in = testing::inputs(models::CpMethod::kUlysses, "llama3-8b", 8, 128 * 1024);
  const Workload plain = build_step(in);
  const std::int64_t half = in.parallel.seq_len / 2;
  in.documents = document_work(PackedSequence{{half, half}, 1}, in.parallel.seq_len, 1,
                               in.parallel.ring_layout, DocumentSplit::kSequence);
  ASSERT_EQ(in.documents.total_factor(), 0.5);
  const Workload two = build_step(in);
  const std::vector<SimTime> a = attention_durations(plain), b = attention_durations(two);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(static_cast<double>(b[i]), 0.5 * static_cast<double>(a[i]), 1.0) << i;
  }
}

// The durations of the ops whose name starts with `prefix`, in program order.
std::vector<SimTime> durations_of(const Workload& w, const std::string& prefix) {
  std::vector<SimTime> out;
  for (const Op& op : w.ops) {
    if (w.names[static_cast<std::size_t>(op.name)].starts_with(prefix)) {
      out.push_back(op.duration_ns);
    }
  }
  return out;
}

TEST(DocumentWork, FpdtBlocksOfTwoDocumentsInTwoChunks) {
  // Two documents of S/2 and chunks of S/2: each chunk is one document, so the diagonal blocks
  // are as for one document and chunk 1's block against chunk 0 sees nothing (its merge stays).
  ScheduleInputs in = testing::inputs(models::CpMethod::kFpdt, "llama3-8b", 8, 128 * 1024);
  const std::int64_t half = in.parallel.seq_len / 2;
  in.parallel.fpdt_chunk = half;
  const Workload plain = build_step(in);
  in.documents = document_work(PackedSequence{{half, half}, 1}, in.parallel.seq_len, 1,
                               in.parallel.ring_layout, DocumentSplit::kSequence);
  const Workload two = build_step(in);
  EXPECT_EQ(durations_of(two, "attn_fwd[diag]"), durations_of(plain, "attn_fwd[diag]"));
  const std::vector<SimTime> earlier_plain = durations_of(plain, "attn_fwd[k0");
  const std::vector<SimTime> earlier_two = durations_of(two, "attn_fwd[k0");
  ASSERT_EQ(earlier_plain.size(), earlier_two.size());
  ASSERT_FALSE(earlier_two.empty());
  for (std::size_t i = 0; i < earlier_two.size(); ++i) {
    EXPECT_LT(earlier_two[i], earlier_plain[i] / 3) << i;  // the merge alone
  }
}

TEST(DocumentWork, AMismatchedRingIsRefused) {
  ScheduleInputs in = testing::inputs(models::CpMethod::kRing, "llama3-8b", 8, 128 * 1024);
  in.parallel.ring_degree = 8;
  in.documents = document_work(PackedSequence{{in.parallel.seq_len}, 1}, in.parallel.seq_len, 4,
                               in.parallel.ring_layout, DocumentSplit::kSequence);
  const LayoutCheck c = check_head_layout(in);
  ASSERT_TRUE(c.issue.has_value());
  EXPECT_EQ(c.issue->quantity, Quantity::kDocuments);
}

}  // namespace
}  // namespace cpsim::sim
