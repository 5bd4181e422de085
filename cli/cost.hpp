#pragma once
// What a step and a training run cost at a GPU-hour price (--gpu-hour-cost, --train-tokens), for
// simulate, maxlen and plan. The price is in the user's currency; nothing here converts it.

#include <cstdint>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace cpsim::cli {

struct CostRate {
  double per_gpu_hour = 0;        ///< price of one GPU for one hour
  std::int64_t train_tokens = 0;  ///< tokens of the whole run; 0: per step and per token only
};

/// Registers --gpu-hour-cost and --train-tokens on `command`, stored as given.
void add_cost_options(CLI::App* command, std::string& gpu_hour_cost, std::string& train_tokens);

/// The rate the two flags give; nullopt without --gpu-hour-cost.
/// @throws InputError naming the flag: a price that is not a positive number, token counts that
/// are not positive, --train-tokens without --gpu-hour-cost.
std::optional<CostRate> parse_cost_rate(const std::string& gpu_hour_cost,
                                        const std::string& train_tokens);

/// Derivation: a step holds every GPU of the run for the step time, so it costs
///   gpus × step_time_s / 3600 GPU-hours × the price,
/// a billion tokens cost that × 10^9 / tokens_per_step (the tokens of every data-parallel group
/// and micro-batch of the step), and a run of T tokens takes ceil(T / tokens_per_step) steps,
/// each at that price and step time (no warm-up, evaluation, checkpoint or restart time).
struct StepCost {
  double gpu_hours_per_step = 0;
  double per_step = 0;
  double per_billion_tokens = 0;
  std::int64_t training_steps = 0;  ///< 0 without --train-tokens
  double training = 0;
  double training_wall_s = 0;
};
StepCost step_cost(const CostRate& rate,
                   double step_time_s,
                   std::int64_t tokens_per_step,
                   int gpus);

nlohmann::json cost_json(const CostRate& rate, const StepCost& cost);
/// One or two lines, each starting with `indent`.
std::string cost_lines(const CostRate& rate, const StepCost& cost, const std::string& indent);

}  // namespace cpsim::cli
