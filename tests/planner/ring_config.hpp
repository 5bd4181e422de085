#pragma once
// Llama-3-8B on H100s with ring CP under megatron-core-cp, 128K tokens a sequence: the
// configuration the hybrid and dynamic CP tests time.

#include "cpsim/models/io.hpp"
#include "cpsim/sim/schedule_inputs.hpp"

namespace cpsim::planner::test_configs {

inline sim::ScheduleInputs megatron_ring_config(int gpus, int cp) {
  const models::DataDir data{CPSIM_TEST_DATA_DIR};
  sim::ScheduleInputs in;
  in.model = models::load_model("llama3-8b", data);
  in.hardware = models::load_hardware("h100-sxm-80g", data);
  in.recipe = models::load_recipe("alst", data);
  in.parallel.method = models::CpMethod::kRing;
  in.parallel.gpus = gpus;
  in.parallel.cp_degree = cp;
  in.parallel.ring_degree = cp;
  in.parallel.seq_len = 128 * 1024;
  in.parallel.implementation = "megatron-core-cp";
  return in;
}

}  // namespace cpsim::planner::test_configs
