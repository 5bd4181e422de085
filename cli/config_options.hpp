#pragma once
// The flags that describe one configuration (model, hardware, method, degrees, recipe knobs),
// shared by simulate, maxlen, plan, sweep, report and validate (config_options.cpp).

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cpsim/sim/schedule.hpp"

namespace cpsim::cli {

struct SimulateArgs {
  std::string model = "llama3-8b";
  int gpus = 8;
  int gpus_per_node = 0;  // 0 = from the hardware profile
  std::string hardware = "h100-sxm-80g";
  std::string method = "upipe";
  bool method_given = false;  ///< --method was on the command line (else --impl may choose)
  std::string impl;           ///< --impl: empty = the recipe's default for the method
  std::string seq = "1M";
  std::string recipe = "alst";
  bool recipe_given = false;  ///< --recipe was on the command line (else --impl's recipe applies)
  long long heads_per_stage = 0;
  int cp_degree = 0;                 // 0 = all GPUs (or ulysses × ring when both are given)
  int ulysses_degree = 0;            // 0 = derived
  int ring_degree = 0;               // 0 = derived
  int tp = 1;                        // tensor-parallel degree
  bool tp_given = false;             ///< --tp was on the command line (plan: else searched)
  int micro_batches = 1;             // gradient-accumulation micro-batches per step
  int ep = 1;                        // expert-parallel degree
  bool ep_given = false;             ///< --ep was on the command line (plan: else searched)
  std::string expert_imbalance;      // empty = 1 (balanced routing)
  int pp = 1;                        // pipeline-parallel degree
  bool pp_given = false;             ///< --pp was on the command line (plan: else searched)
  std::string pp_schedule;           // empty = 1f1b
  int virtual_stages = 0;            // 0 = 1 (interleaved: required)
  int pp_first_stage_layers = 0;     // 0 = even split
  int pp_last_stage_layers = 0;      // 0 = even split
  bool micro_batches_given = false;  ///< --micro-batches was given (plan: else searched with PP)
  std::string ring_layout;
  std::string fpdt_chunk;
  std::string fpdt_offload;
  int zero = -1;  // -1 = recipe
  std::string optimizer_offload;
  std::string param_offload;
  std::string comm_dtype;
  std::string ac;  // empty = recipe
  std::string ac_offload;
  std::string tiled_mlp;
  std::string fused_loss;
  std::string norm_kernel;
  std::string rope_kernel;
  std::string mlp_kernel;
  std::string int32_indexing;
  std::string fp8;  ///< --fp8 on|off; empty = recipe
  std::string attention_kernel;
  std::string memory_margin;       ///< --memory-margin (set to the default by the flag)
  std::string host_memory_margin;  ///< --host-memory-margin
  std::string trace;
  std::string trace_ranks;      // empty: the representative rank (0)
  std::string trace_layers;     // empty: all
  std::string trace_max_bytes;  // empty: 1 GiB
  bool trace_force = false;
  bool seq_given = false;  ///< --seq was on the command line
  // Packed batches (simulate --lengths; cmd_simulate_batches.cpp).
  std::string lengths;             ///< --lengths: a file of lengths, a histogram or lognormal:...
  std::string pack;                ///< --pack S: the packed sequence's tokens (the --seq of it)
  std::string packing = "concat";  ///< --packing
  int batches = 100;               ///< --batches
  std::uint64_t seed = 0;          ///< --seed
  std::string balancer = "all";    ///< --balancer
  std::string objective = "p50";   ///< --objective: p50 | p95
  std::string batch_flag;          ///< a packed-batch flag given (each needs --lengths), else empty
  std::string progress;            ///< --progress (empty: $CPSIM_PROGRESS, else auto)
  std::string gpu_hour_cost;       ///< --gpu-hour-cost (simulate, maxlen, plan; cost.hpp)
  std::string train_tokens;        ///< --train-tokens
  bool json = false;
};
/// The flags that describe one configuration (model, hardware, method, degrees, recipe knobs),
/// shared by simulate, maxlen and plan.
void add_config_options(CLI::App* command, SimulateArgs& args, bool with_seq);
/// Loads the model, profile and recipe and applies the flags. @throws InputError naming the flag.
sim::ScheduleInputs resolve_inputs(const SimulateArgs& args);
/// The recipe a configuration runs: --recipe, else the one --impl's implementation is the
/// default of, else alst.
std::string recipe_for(const SimulateArgs& args);
/// The arguments for one method of a comparison: knobs of other methods are dropped.
SimulateArgs config_for_method(const SimulateArgs& args, const std::string& method);
/// A method name, a comma-separated list or `all`.
std::vector<std::string> split_methods(const std::string& text, const char* field);

}  // namespace cpsim::cli
