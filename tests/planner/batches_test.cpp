// Step time over packed batches (planner/batches.hpp): one document a sequence is the plain
// step exactly, the same seed gives the same batches, documents shorten a step.
#include "cpsim/planner/batches.hpp"

#include <gtest/gtest.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/io.hpp"
#include "cpsim/planner/evaluate.hpp"
#include "cpsim/sim/cp_method.hpp"

namespace cpsim::planner {
namespace {

sim::ScheduleInputs config(models::CpMethod method, int ring) {
  const models::DataDir data{CPSIM_TEST_DATA_DIR};
  sim::ScheduleInputs in;
  in.model = models::load_model("llama3-8b", data);
  in.hardware = models::load_hardware("h100-sxm-80g", data);
  in.recipe = models::load_recipe("alst", data);
  in.parallel.method = method;
  in.parallel.gpus = 8;
  in.parallel.cp_degree = 8;
  in.parallel.ring_degree = ring;
  in.parallel.seq_len = 128 * 1024;
  in.parallel.implementation = "none";
  return in;
}

models::LengthDistribution constant(std::int64_t tokens) {
  models::LengthDistribution d;
  d.lengths = {tokens};
  d.weights = {1.0};
  d.origin = "test";
  return d;
}

TEST(Batches, OneDocumentASequenceIsThePlainStep) {
  const sim::ScheduleInputs in = config(models::CpMethod::kRing, 8);
  BatchOptions o;
  o.lengths = constant(in.parallel.seq_len);
  o.batches = 3;
  o.balancers = {load_balancer(in, "head-tail", "b"), load_balancer(in, "per-document", "b")};
  const BatchStudy s = study_batches(in, o);
  EXPECT_EQ(s.one_document_step_s, evaluate(in).report.step_time_s);
  for (const BalancerStudy& b : s.balancers) {
    for (const double t : b.step_s) {
      EXPECT_EQ(t, s.one_document_step_s) << b.balancer.name;
    }
    EXPECT_EQ(b.imbalance_max, 1.0);
    EXPECT_EQ(b.padding_share, 0.0);
    EXPECT_EQ(b.memory.peak_bytes, evaluate(in).report.peak_memory_bytes);
    EXPECT_TRUE(b.memory.fits);
  }
}

TEST(Batches, SameSeedSameBatchesAndShortDocumentsAreFaster) {
  const sim::ScheduleInputs in = config(models::CpMethod::kRing, 8);
  BatchOptions o;
  o.lengths = models::parse_length_distribution("lognormal:median=4K,sigma=1", "lengths");
  o.batches = 20;
  o.seed = 5;
  const BatchStudy a = study_batches(in, o), b = study_batches(in, o);
  ASSERT_EQ(a.balancers.size(), 5U);  // head-tail, contiguous, per-document, hybrid, dynamic
  for (std::size_t i = 0; i < a.balancers.size(); ++i) {
    EXPECT_EQ(a.balancers[i].step_s, b.balancers[i].step_s);
    EXPECT_LT(a.balancers[i].p50_s, a.one_document_step_s);
    EXPECT_LE(a.balancers[i].p50_s, a.balancers[i].p95_s);
    EXPECT_LE(a.balancers[i].p95_s, a.balancers[i].max_s);
  }
  // Per-document splitting balances every rank's work up to each document's padding to 2R (its
  // last chunk is short: under 2R of ~4K tokens); head-tail over the packed sequence does not.
  EXPECT_EQ(a.balancers[2].balancer.name, "per-document");
  EXPECT_GE(a.balancers[2].imbalance_max, 1.0);
  EXPECT_LT(a.balancers[2].imbalance_max, 1.01);
  EXPECT_GT(a.balancers[0].imbalance_p50, 1.05);
  o.seed = 6;
  EXPECT_NE(study_batches(in, o).balancers[0].step_s, a.balancers[0].step_s);
}

TEST(Batches, MicroBatchesEachRunTheirOwnSequence) {
  // Gradient accumulation over M = 4 micro-batches: the step is each micro-batch's own sequence,
  // not M times the slowest. With the same seed, M = 1 and 4× the batches see the same sequences
  // in the same order, so a 4-micro-batch step is the sum of four 1-micro-batch steps less three
  // times what a step holds outside its micro-batches: a constant.
  sim::ScheduleInputs in = config(models::CpMethod::kRing, 8);
  BatchOptions o;
  o.lengths = models::parse_length_distribution("lognormal:median=8K,sigma=1.2", "lengths");
  o.balancers = {load_balancer(in, "head-tail", "b")};
  o.batches = 16;
  const BatchStudy single = study_batches(in, o);
  in.parallel.micro_batches = 4;
  o.batches = 4;
  const BatchStudy four = study_batches(in, o);
  const std::vector<double>& s1 = single.balancers[0].step_s;
  const std::vector<double>& s4 = four.balancers[0].step_s;
  const double outside_times_three = s1[0] + s1[1] + s1[2] + s1[3] - s4[0];
  EXPECT_GT(outside_times_three, 0.0);
  for (std::size_t b = 0; b < s4.size(); ++b) {
    EXPECT_NEAR(s1[4 * b] + s1[4 * b + 1] + s1[4 * b + 2] + s1[4 * b + 3] - s4[b],
                outside_times_three, 1e-9);
  }
  // One document a sequence: the plain 4-micro-batch step.
  o.lengths = constant(in.parallel.seq_len);
  const BatchStudy plain = study_batches(in, o);
  EXPECT_NEAR(plain.balancers[0].step_s[0], evaluate(in).report.step_time_s,
              1e-12 * plain.one_document_step_s);
}

TEST(Batches, UlyssesAndFpdtHaveOneBalancer) {
  for (const models::CpMethod m : {models::CpMethod::kUlysses, models::CpMethod::kFpdt}) {
    sim::ScheduleInputs in = config(m, 1);
    in.parallel.fpdt_chunk = 32 * 1024;
    ASSERT_EQ(load_balancers(in).size(), 1U);
    EXPECT_EQ(load_balancers(in)[0].name, "heads");
    EXPECT_THROW((void)load_balancer(in, "per-document", "--balancer"), InputError);
    BatchOptions o;
    o.batches = 2;
    o.lengths = constant(in.parallel.seq_len);
    const BatchStudy one = study_batches(in, o);
    EXPECT_EQ(one.balancers[0].max_s, one.one_document_step_s);
    o.lengths = constant(8 * 1024);
    EXPECT_LT(study_batches(in, o).balancers[0].max_s, one.one_document_step_s);
  }
}

TEST(Batches, RepresentativeRankAgreesWithEveryRankSimulated) {
  // The representative rank: each backward ring step as long as its slowest position, forward
  // steps by the lockstep recurrence (attention_core.cpp). Every rank simulated, each with its own
  // attention work, also lets a rank that ends a layer's ring early start its MLP and the next
  // layer before the others: measured 0.2-1.5 % faster without checkpointing, 2-4 % with full
  // checkpointing (two forward passes), never slower.
  sim::ScheduleInputs in = config(models::CpMethod::kRing, 8);
  const models::LengthDistribution lengths =
      models::parse_length_distribution("lognormal:median=4K,sigma=1.5", "lengths");
  for (const char* name : {"head-tail", "contiguous", "per-document"}) {
    const LoadBalancer b = load_balancer(in, name, "b");
    in.parallel.ring_layout = b.layout;
    models::DocumentSampler sampler(lengths, 11);
    const std::int64_t span = b.split == sim::DocumentSplit::kPerDocument ? 16 : 1;
    for (const models::PackedSequence& seq :
         models::pack_documents(sampler, in.parallel.seq_len, span, models::Packing::kConcat, 3)) {
      in.documents = sim::document_work(seq, in.parallel.seq_len, 8, b.layout, b.split);
      const double one = evaluate(in).report.step_time_s;
      EvaluateOptions every;
      every.all_ranks = true;
      const double all = evaluate(in, every).report.step_time_s;
      EXPECT_GE(one / all, 1.0 - 1e-9) << name;
      EXPECT_LT(one / all, 1.05) << name << " imbalance " << in.documents.imbalance();
    }
  }
}

TEST(Batches, QuantilesInterpolate) {
  EXPECT_EQ(quantile({4.0, 1.0, 3.0, 2.0}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(quantile({1.0, 2.0, 3.0, 4.0, 5.0}, 0.95), 4.8);
  EXPECT_EQ(quantile({7.0}, 0.95), 7.0);
}

}  // namespace
}  // namespace cpsim::planner
