#include "cost.hpp"

#include <charconv>
#include <cmath>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/units.hpp"

namespace cpsim::cli {

namespace {

// A positive finite number with an optional decimal suffix (K 10^3, M 10^6, B 10^9, T 10^12, as
// training budgets are stated); 0 when the text is not one.
double positive_number(std::string_view text, bool with_suffix) {
  double scale = 1;
  if (with_suffix && !text.empty()) {
    switch (text.back()) {
      case 'K':
        scale = 1e3;
        break;
      case 'M':
        scale = 1e6;
        break;
      case 'B':
        scale = 1e9;
        break;
      case 'T':
        scale = 1e12;
        break;
      default:
        break;
    }
    if (scale != 1) {
      text.remove_suffix(1);
    }
  }
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value) ||
      value <= 0) {
    return 0;
  }
  return value * scale;
}

// Money with two decimals below a million, else in a compact exponent-free form.
std::string money(double amount) {
  return amount < 1e6 ? fmt::format("{:.2f}", amount) : fmt::format("{:.4g}", amount);
}

// A token count with a decimal suffix: 10B, 1.5T, 500M.
std::string token_count(std::int64_t tokens) {
  static constexpr std::pair<double, const char*> kScales[] = {
      {1e12, "T"}, {1e9, "B"}, {1e6, "M"}, {1e3, "K"}};
  const auto value = static_cast<double>(tokens);
  for (const auto& [scale, suffix] : kScales) {
    if (value >= scale) {
      return fmt::format("{:.4g}{}", value / scale, suffix);
    }
  }
  return std::to_string(tokens);
}

}  // namespace

void add_cost_options(CLI::App* c, std::string& gpu_hour_cost, std::string& train_tokens) {
  c->add_option("--gpu-hour-cost", gpu_hour_cost,
                "price of one GPU-hour (your currency): adds the cost per step and per billion "
                "tokens");
  c->add_option("--train-tokens", train_tokens,
                "with --gpu-hour-cost: also the cost and wall time of training this many tokens "
                "(decimal suffixes K, M, B, T: 100B)");
}

std::optional<CostRate> parse_cost_rate(const std::string& gpu_hour_cost,
                                        const std::string& train_tokens) {
  if (gpu_hour_cost.empty()) {
    if (!train_tokens.empty()) {
      throw InputError("--train-tokens", "needs --gpu-hour-cost (the price of one GPU-hour)");
    }
    return std::nullopt;
  }
  CostRate rate;
  rate.per_gpu_hour = positive_number(gpu_hour_cost, /*with_suffix=*/false);
  if (rate.per_gpu_hour <= 0) {
    throw InputError("--gpu-hour-cost",
                     fmt::format("'{}' is not a positive price per GPU-hour", gpu_hour_cost));
  }
  if (!train_tokens.empty()) {
    const double tokens = positive_number(train_tokens, /*with_suffix=*/true);
    if (tokens < 1 || tokens > 1e18) {
      throw InputError(
          "--train-tokens",
          fmt::format("'{}' is not a token count from 1 to 10^18 (100B, 2T, 5e9)", train_tokens));
    }
    rate.train_tokens = static_cast<std::int64_t>(std::llround(tokens));
  }
  return rate;
}

StepCost step_cost(const CostRate& rate,
                   double step_time_s,
                   std::int64_t tokens_per_step,
                   int gpus) {
  StepCost c;
  if (tokens_per_step <= 0 || step_time_s <= 0) {
    return c;  // no step (nothing fits): no cost
  }
  c.gpu_hours_per_step = static_cast<double>(gpus) * step_time_s / 3600.0;
  c.per_step = c.gpu_hours_per_step * rate.per_gpu_hour;
  c.per_billion_tokens = c.per_step * 1e9 / static_cast<double>(tokens_per_step);
  if (rate.train_tokens > 0) {
    c.training_steps = (rate.train_tokens + tokens_per_step - 1) / tokens_per_step;
    c.training = static_cast<double>(c.training_steps) * c.per_step;
    c.training_wall_s = static_cast<double>(c.training_steps) * step_time_s;
  }
  return c;
}

nlohmann::json cost_json(const CostRate& rate, const StepCost& cost) {
  nlohmann::json j = {{"gpu_hour_cost", rate.per_gpu_hour},
                      {"gpu_hours_per_step", cost.gpu_hours_per_step},
                      {"per_step", cost.per_step},
                      {"per_billion_tokens", cost.per_billion_tokens}};
  if (rate.train_tokens > 0) {
    j["training"] = {{"tokens", rate.train_tokens},
                     {"steps", cost.training_steps},
                     {"cost", cost.training},
                     {"wall_s", cost.training_wall_s}};
  }
  return j;
}

std::string cost_lines(const CostRate& rate, const StepCost& cost, const std::string& indent) {
  if (cost.gpu_hours_per_step <= 0) {
    return fmt::format("{}cost                 - (no step to price)\n", indent);
  }
  std::string o = fmt::format(
      "{}cost                 {} per step ({:.3g} GPU-hours at {} each), {} per billion tokens\n",
      indent, money(cost.per_step), cost.gpu_hours_per_step, money(rate.per_gpu_hour),
      money(cost.per_billion_tokens));
  if (rate.train_tokens > 0) {
    o += fmt::format("{}training run         {} tokens: {} steps, {}, {} wall\n", indent,
                     token_count(rate.train_tokens), cost.training_steps, money(cost.training),
                     format_seconds(cost.training_wall_s));
  }
  return o;
}

}  // namespace cpsim::cli
