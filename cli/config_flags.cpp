#include "config_flags.hpp"

namespace cpsim::cli {

std::string flag_for(sim::Quantity q, const models::ParallelConfig& p) {
  switch (q) {
    case sim::Quantity::kGpus:
      return "--gpus";
    case sim::Quantity::kGpusPerNode:
      return "--gpus-per-node";
    case sim::Quantity::kCpDegree:
      return p.cp_degree == p.gpus ? "--gpus" : "--cp-degree";
    case sim::Quantity::kRingDegree:
      return "--ring-degree";
    case sim::Quantity::kSeqLen:
    case sim::Quantity::kSeqLenMultiple:
      return "--seq";
    case sim::Quantity::kModelHeads:
      return "--model";
    case sim::Quantity::kHeadsPerStage:
      return "--heads-per-stage";
    case sim::Quantity::kFpdtChunk:
      return "--fpdt-chunk";
    case sim::Quantity::kImplementation:
      return "--impl";
    case sim::Quantity::kTpDegree:
      return "--tp";
    case sim::Quantity::kMicroBatches:
      return "--micro-batches";
    case sim::Quantity::kPpDegree:
      return "--pp";
    case sim::Quantity::kDocuments:
      return "--lengths";
    case sim::Quantity::kAttentionWindow:
    case sim::Quantity::kAttentionSinks:
    case sim::Quantity::kAttentionChunks:
    case sim::Quantity::kLatentAttention:
    case sim::Quantity::kExperts:
      return "--model";
    case sim::Quantity::kExpertParallel:
      return "--ep";
    case sim::Quantity::kExpertImbalance:
      return "--expert-imbalance";
  }
  return sim::to_string(q);
}

InputError flag_error(const sim::ConfigError& e) {
  return InputError(flag_for(e.quantity(), e.config()), e.what());
}

std::string refusal_text(const sim::ConfigError& e) {
  return flag_error(e).what();
}

bool refuses_every_method(const sim::ConfigError& e) {
  return e.quantity() == sim::Quantity::kSeqLen;
}

}  // namespace cpsim::cli
