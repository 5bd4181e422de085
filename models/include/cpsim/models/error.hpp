#pragma once
/// @file The error type for bad input: it names the offending flag or field in one line.

#include <stdexcept>
#include <string>

namespace cpsim {

/// Raised at input boundaries (files, flags, configurations). `field()` is the flag or JSON path at
/// fault, e.g. `--seq` or `model.num_attention_heads`; `what()` is one line that includes it.
class InputError : public std::runtime_error {
 public:
  InputError(std::string field, const std::string& message)
      : std::runtime_error(field + ": " + message), field_(std::move(field)) {}
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

}  // namespace cpsim
