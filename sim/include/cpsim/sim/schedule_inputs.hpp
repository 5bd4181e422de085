#pragma once
/// @file What one training step is built from: model, recipe, parallel layout, hardware.

#include "cpsim/models/hardware.hpp"
#include "cpsim/models/parallel.hpp"
#include "cpsim/models/recipe.hpp"
#include "cpsim/models/transformer.hpp"

namespace cpsim::sim {

struct ScheduleInputs {
  models::TransformerSpec model;
  models::TrainingRecipe recipe;
  models::ParallelConfig parallel;
  models::HardwareProfile hardware;
  /// Set by tensor_parallel_rank(): `model` is already one tensor-parallel rank's share (heads,
  /// KV heads, FFN width and vocabulary divided by parallel.tp_degree).
  bool tp_rank_model = false;
};

}  // namespace cpsim::sim
