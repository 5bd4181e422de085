#pragma once
/// @file Parallel layout of one run: CP method, degrees, GPUs and method knobs.

#include <cstdint>
#include <string>

namespace cpsim::models {

enum class CpMethod { kUlysses, kUPipe };
const char* to_string(CpMethod m);
/// @throws InputError (field `field`) for unknown names, listing the known ones.
CpMethod parse_cp_method(const std::string& text, const std::string& field);

struct ParallelConfig {
  CpMethod method = CpMethod::kUlysses;
  int gpus = 8;
  int gpus_per_node = 8;
  int cp_degree = 8;                 ///< Ulysses degree C (the CP group size)
  std::int64_t seq_len = 0;          ///< global tokens in the sequence N
  std::int64_t heads_per_stage = 0;  ///< UPipe U (query heads per stage, all ranks); 0 = C
  int micro_batch = 1;

  int data_parallel() const { return gpus / cp_degree; }
  std::int64_t local_seq() const { return seq_len / cp_degree; }
};

}  // namespace cpsim::models
