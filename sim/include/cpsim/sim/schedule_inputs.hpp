#pragma once
/// @file What one training step is built from: model, recipe, parallel layout, hardware.

#include <cstdint>

#include "cpsim/models/hardware.hpp"
#include "cpsim/models/parallel.hpp"
#include "cpsim/models/recipe.hpp"
#include "cpsim/models/transformer.hpp"
#include "cpsim/sim/document_work.hpp"

namespace cpsim::sim {

/// Memory a step must leave free to count as fitting: on every GPU (against the reserved memory
/// when the caching allocator is modelled, else the allocated peak) and on every node's host
/// memory. A policy of the caller; 0 here (the front end picks a default, docs/MODEL.md).
struct MemoryMargin {
  std::int64_t gpu_bytes = 0;
  std::int64_t host_bytes = 0;
};

struct ScheduleInputs {
  models::TransformerSpec model;
  models::TrainingRecipe recipe;
  models::ParallelConfig parallel;
  models::HardwareProfile hardware;
  MemoryMargin margin;
  /// Set by tensor_parallel_rank(): `model` is already one tensor-parallel rank's share (heads,
  /// KV heads, FFN width and vocabulary divided by parallel.tp_degree).
  bool tp_rank_model = false;
  /// Set by make_pipeline_stage: the step is one of `stages` pipeline stages and exchanges
  /// activations and gradients with its neighbours over `span` (NCCL's connections to them).
  struct PipelineNeighbours {
    int stages = 1;
    models::Span span = models::Span::kIntraNode;
  };
  PipelineNeighbours pipeline;
  /// A packed sequence's attention work per ring position (empty: one document fills the
  /// sequence). Its ring is the configuration's ring degree (1 without a ring part).
  DocumentWork documents;
};

}  // namespace cpsim::sim
