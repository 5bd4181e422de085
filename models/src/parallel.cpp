#include "cpsim/models/parallel.hpp"

#include <array>
#include <string>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"

namespace cpsim::models {
namespace {

constexpr std::array kCpMethods = {CpMethod::kUlysses, CpMethod::kUPipe};

}  // namespace

const char* to_string(CpMethod m) {
  switch (m) {
    case CpMethod::kUlysses:
      return "ulysses";
    case CpMethod::kUPipe:
      return "upipe";
  }
  return "unknown";
}

CpMethod parse_cp_method(const std::string& text, const std::string& field) {
  std::string known;
  for (const CpMethod m : kCpMethods) {
    if (text == to_string(m)) {
      return m;
    }
    known += known.empty() ? to_string(m) : fmt::format(", {}", to_string(m));
  }
  throw InputError(field,
                   fmt::format("unknown context-parallel method '{}'; known: {}", text, known));
}

}  // namespace cpsim::models
