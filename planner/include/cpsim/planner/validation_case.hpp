#pragma once
/// @file One public validation case (schema "cpsim.validation/1", data/validation/*.json): a
/// published number, the set-up it was measured under and how close cpsim must come to it.
/// `cpsim validate` runs them. nlohmann/json stays inside validation_case.cpp.

#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cpsim::planner {

inline constexpr const char* kValidationSchema = "cpsim.validation/1";

/// The set-up of a case: the flags of `cpsim simulate` without their dashes (`gpus-per-node` →
/// `gpus_per_node`). Only the keys the file gives are set; the others keep the command's defaults.
struct ValidationSetup {
  std::string method = "ulysses";  ///< a case without "method" means Ulysses
  std::optional<std::string> model;
  std::optional<std::string> hardware;
  std::optional<std::string> seq;
  std::optional<std::string> recipe;
  std::optional<std::string> ring_layout;
  std::optional<std::string> fpdt_chunk;
  std::optional<std::string> fpdt_offload;
  std::optional<std::string> ac;
  std::optional<std::string> ac_offload;
  std::optional<std::string> tiled_mlp;
  std::optional<std::string> fused_loss;
  std::optional<std::string> attention_kernel;
  std::optional<std::string> optimizer_offload;
  std::optional<std::string> comm_dtype;
  std::optional<std::string> param_offload;
  std::optional<std::string> norm_kernel;
  std::optional<std::string> rope_kernel;
  std::optional<std::string> mlp_kernel;
  std::optional<std::string> int32_indexing;
  std::optional<std::string> fp8;
  std::optional<std::string> pp_schedule;
  /// The implementation the run used (`--impl`; "none": not one cpsim models). Required.
  std::string impl;
  std::optional<int> gpus;
  std::optional<int> gpus_per_node;
  std::optional<int> heads_per_stage;
  std::optional<int> cp_degree;
  std::optional<int> ulysses_degree;
  std::optional<int> ring_degree;
  std::optional<int> zero;
  std::optional<int> tp;
  std::optional<int> micro_batches;
  std::optional<int> pp;
  std::optional<int> virtual_stages;
  std::optional<int> pp_first_stage_layers;
  std::optional<int> pp_last_stage_layers;
};

struct ValidationCase {
  std::string id;
  std::string title;
  std::string quantity;  ///< max_seq_len, peak_memory_bytes (allocated), reserved_memory_bytes
                         ///< (nvidia-smi reading), tokens_per_s_per_gpu, model_tflops_per_gpu, mfu
  std::string source;
  std::string skip;  ///< non-empty: the case is listed, not run, with this reason
  std::string tolerance_why;
  std::string granularity = "64K";  ///< max_seq_len cases: the search step, unparsed
  /// "two-sided" (default): |predicted / published − 1| ≤ tolerance. "lower": the published value
  /// is a length that ran, a lower bound on the maximum: predicted ≥ published · (1 − tolerance).
  std::string bound = "two-sided";
  std::string setup_note;  ///< why the set-up is what it is, when the source leaves it implicit
  /// A lower bound's justification: the source's own words that the run was not at the limit
  /// (required with bound "lower").
  std::string bound_quote;
  /// Why cpsim does not meet the case yet (printed when it fails); empty: no known gap.
  std::string open_gap;
  /// Findings several cases' gaps share, kept once in data/validation/gaps/<key>.md: the keys
  /// the case lists ("shared_gaps"), with each file's text once load_validation_case read it.
  struct SharedGap {
    std::string key;
    std::string text;
  };
  std::vector<SharedGap> shared_gaps;
  double published = 0.0;
  double tolerance = 0.0;  ///< relative, in (0, 1]
  int row = 0;             ///< row of the validation table in the reference, 0 when none
  ValidationSetup setup;
};

/// Strict parse of one case. Setup values are strings (numbers and booleans are taken as their
/// JSON text); the integer flags must be JSON integers.
/// @throws InputError whose field starts with `origin`, e.g. "case.json:setup.gpus".
/// The quantities a case may check ("max_seq_len", "peak_memory_bytes", ...; see
/// validation_case.cpp for what each means).
std::span<const std::string_view> validation_quantities();

ValidationCase parse_validation_case(const std::string& json_text, const std::string& origin);

/// Reads and parses one case file; the origin in errors is the file name without its folder.
/// @throws InputError (field: the file name when it cannot be read).
/// Reads and parses the case at `path`, with the texts of its shared gaps (gaps/<key>.md beside
/// it). @throws InputError naming the file (and the field) when either cannot be read or parsed.
ValidationCase load_validation_case(const std::filesystem::path& path);

}  // namespace cpsim::planner
