#include "cpsim/models/parallel.hpp"

#include <array>
#include <string>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"

namespace cpsim::models {
namespace {

constexpr std::array kCpMethods = {CpMethod::kUlysses,   CpMethod::kUPipe, CpMethod::kRing,
                                   CpMethod::kAllGather, CpMethod::kFpdt,  CpMethod::kUsp};
constexpr std::array kRingLayouts = {RingLayout::kContiguous, RingLayout::kZigzag};
constexpr std::array kPipelineSchedules = {PipelineSchedule::k1F1B, PipelineSchedule::kInterleaved};

template <typename T, std::size_t N>
T parse_named(const std::array<T, N>& values,
              const std::string& text,
              const std::string& field,
              const char* what) {
  std::string known;
  for (const T v : values) {
    if (text == to_string(v)) {
      return v;
    }
    known += known.empty() ? to_string(v) : fmt::format(", {}", to_string(v));
  }
  throw InputError(field, fmt::format("unknown {} '{}'; known: {}", what, text, known));
}

}  // namespace

const char* to_string(CpMethod m) {
  switch (m) {
    case CpMethod::kUlysses:
      return "ulysses";
    case CpMethod::kUPipe:
      return "upipe";
    case CpMethod::kRing:
      return "ring";
    case CpMethod::kAllGather:
      return "allgather";
    case CpMethod::kFpdt:
      return "fpdt";
    case CpMethod::kUsp:
      return "usp";
  }
  return "unknown";
}

CpMethod parse_cp_method(const std::string& text, const std::string& field) {
  return parse_named(kCpMethods, text, field, "context-parallel method");
}

const char* to_string(RingLayout l) {
  switch (l) {
    case RingLayout::kContiguous:
      return "contiguous";
    case RingLayout::kZigzag:
      return "zigzag";
  }
  return "unknown";
}

RingLayout parse_ring_layout(const std::string& text, const std::string& field) {
  return parse_named(kRingLayouts, text, field, "ring layout");
}

const char* to_string(PipelineSchedule s) {
  switch (s) {
    case PipelineSchedule::k1F1B:
      return "1f1b";
    case PipelineSchedule::kInterleaved:
      return "interleaved";
  }
  return "unknown";
}

PipelineSchedule parse_pipeline_schedule(const std::string& text, const std::string& field) {
  return parse_named(kPipelineSchedules, text, field, "pipeline schedule");
}

}  // namespace cpsim::models
