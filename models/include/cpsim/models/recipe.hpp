#pragma once
/// @file Training recipe: precision, optimizer, sharding, activation checkpointing, offload,
/// tiling.

#include <cstdint>
#include <string>

namespace cpsim::models {

enum class CheckpointMode { kNone, kSelective, kFull };
const char* to_string(CheckpointMode m);
/// @throws InputError naming `field` for anything but none|selective|full.
CheckpointMode parse_checkpoint_mode(const std::string& text, const std::string& field);

/// What a training step keeps and where. Defaults describe recipe `alst`.
struct TrainingRecipe {
  std::string name;
  std::string description;
  // Precision (bytes per element)
  std::int64_t param_bytes = 2;         ///< compute copy of weights (bf16)
  std::int64_t activation_bytes = 2;    ///< activations (bf16)
  std::int64_t master_param_bytes = 4;  ///< fp32 master weights
  std::int64_t grad_bytes = 4;          ///< fp32 sharded gradients
  std::int64_t grad_reduce_bytes =
      4;  ///< dtype of the gradient reduce-scatter (fp32 in TorchTitan)
  std::int64_t optimizer_state_bytes = 8;  ///< AdamW: exp_avg + exp_avg_sq in fp32
  /// dtype of context-parallel communication (all-to-all, ring send/recv): 2 = bf16; DeepSpeed's
  /// `seq_parallel_communication_data_type` defaults to fp32 (4).
  std::int64_t cp_comm_bytes = 2;
  /// A persistent compute-dtype copy of the parameters besides the fp32 master (DeepSpeed,
  /// Megatron). FSDP2 has none: it casts the sharded fp32 parameters when gathering.
  bool persistent_compute_params = false;
  std::string optimizer = "adamw";
  // Sharding
  int zero_stage = 3;              ///< FSDP full shard = ZeRO-3 over all GPUs
  int fsdp_prefetch_layers = 1;    ///< layers gathered ahead of use
  bool optimizer_offload = false;  ///< fp32 master + optimizer states on host, CPU Adam
  // Activation checkpointing
  CheckpointMode checkpointing = CheckpointMode::kFull;
  bool checkpoint_offload = true;       ///< block inputs offloaded to pinned host memory
  bool offload_keep_first_last = true;  ///< first and last layer keep their checkpoint on GPU
  // Tiling and loss
  bool tiled_mlp = true;
  std::int64_t tiled_mlp_shards = 0;  ///< 0 = ceil(local_seq / hidden)
  bool tiled_norm = true;
  bool fused_loss = true;  ///< fused linear cross-entropy: logits never materialised
  // Allocator
  bool expandable_segments = true;
  // Attention kernel name in the hardware profile
  std::string attention_kernel = "fa3";

  /// @throws InputError naming the field for values out of range.
  void validate() const;
};

}  // namespace cpsim::models
