#pragma once
// Shared fixtures for the sim tests: built-in inputs and a tiny hand-made profile.

#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "cpsim/models/io.hpp"
#include "cpsim/sim/schedule.hpp"
#include "cpsim/sim/workload.hpp"

namespace cpsim::sim::testing {

inline const models::DataDir& data() {
  static const models::DataDir d{CPSIM_TEST_DATA_DIR};
  return d;
}

inline ScheduleInputs inputs(models::CpMethod method,
                             const char* model,
                             int gpus,
                             std::int64_t seq,
                             std::int64_t heads_per_stage = 0) {
  ScheduleInputs in;
  in.model = models::load_model(model, data());
  in.hardware = models::load_hardware("h100-sxm-80g", data());
  in.recipe = models::load_recipe("alst", data());
  in.parallel.method = method;
  in.parallel.gpus = gpus;
  in.parallel.cp_degree = gpus;
  in.parallel.gpus_per_node = 8;
  in.parallel.seq_len = seq;
  in.parallel.heads_per_stage = heads_per_stage;
  // The method's scheme alone; implementations (implementation.hpp) have their own tests.
  in.parallel.implementation = "none";
  return in;
}

/// A profile with round numbers for hand-computed engine cases: host links 1 byte/ns each way,
/// duplex total 1 byte/ns, no latencies, no host issue cost.
inline models::HardwareProfile round_profile() {
  models::HardwareProfile p = models::load_hardware("h100-sxm-80g", data());
  p.host_link.alpha_s = 0.0;
  p.host_link.h2d_bytes_per_s = 1e9;
  p.host_link.d2h_bytes_per_s = 1e9;
  p.host_link.duplex_total_bytes_per_s = 1e9;
  p.compute_slowdown_under_comm = 0.0;
  p.host_issue = {};  // no host issue model (host_issue_test.cpp sets its own)
  return p;
}

/// The first op of rank 0 named `name` (nullptr when none).
inline const Op* first_op_named(const Workload& w, const std::string& name) {
  for (const Op& o : w.ops) {
    if (o.rank == 0 && w.names[static_cast<std::size_t>(o.name)] == name) {
      return &o;
    }
  }
  return nullptr;
}

/// How many ops of rank 0 are named `name`.
inline int ops_named(const Workload& w, const std::string& name) {
  int n = 0;
  for (const Op& o : w.ops) {
    n += o.rank == 0 && w.names[static_cast<std::size_t>(o.name)] == name ? 1 : 0;
  }
  return n;
}

/// Bytes of the first tensor of rank 0 named `name` (0 when none).
inline std::int64_t tensor_bytes(const Workload& w, const std::string& name) {
  for (const Tensor& t : w.tensors) {
    if (t.rank == 0 && w.names[static_cast<std::size_t>(t.name)] == name) {
      return t.bytes;
    }
  }
  return 0;
}

/// The quantity at fault when building the step of `in` is refused (a failure when accepted).
inline Quantity refusal(const ScheduleInputs& in) {
  try {
    (void)build_step(in);
  } catch (const ConfigError& e) {
    return e.quantity();
  }
  ADD_FAILURE() << "accepted";
  return Quantity::kGpus;
}

}  // namespace cpsim::sim::testing
