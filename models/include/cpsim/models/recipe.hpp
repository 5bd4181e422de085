#pragma once
/// @file Training recipe: precision, optimizer, sharding, activation checkpointing, offload,
/// tiling.

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cpsim::models {

enum class CheckpointMode { kNone, kSelective, kFull };
const char* to_string(CheckpointMode m);
/// @throws InputError naming `field` for anything but none|selective|full.
CheckpointMode parse_checkpoint_mode(const std::string& text, const std::string& field);

/// How RMSNorm runs, which decides what it keeps (per element of its [s, h] input):
///   upcast  an fp32 copy of the input and the fp32 result exist while the kernel runs (8 bytes,
///           transient); only the output is kept (torch.nn.RMSNorm as cpsim's TorchTitan recipes
///           use it).
///   fused   one kernel reads the input and writes the output; it keeps its input and one fp32
///           rstd per row (Liger, Apex): nothing beyond tensors that exist anyway.
///   eager   Hugging Face's eager LlamaRMSNorm: `x.to(fp32)`, `pow`, `mean`, `rsqrt`, `mul`,
///           `.to(bf16)`, `weight *`. Autograd keeps the fp32 input (4 bytes, read by pow and mul)
///           and the bf16 normalised tensor (2 bytes, read by the weight product) until backward,
///           and the forward holds the fp32 result (4 bytes) transiently.
enum class NormKernel { kUpcast, kFused, kEager };

/// How an untiled SwiGLU MLP keeps its intermediates (f = FFN width, per token):
///   unfused  gate/up (2f) and the product (f) kept; the backward holds 3f of gradients (default).
///   fused    Liger's SwiGLU: gate, up and the product kept (3f); the backward writes dgate and
///            dup over gate and up in place, so it adds only the product's gradient (f).
///   eager    Hugging Face eager `down(act(gate(x)) * up(x))`: gate, up, silu(gate) and the
///            product kept (4f); the backward holds 3f of gradients.
enum class MlpKernel { kUnfused, kFused, kEager };
/// How RoPE runs on the query and key, which decides its kernels and HBM traffic (per element of
/// q and k, a = 2 bytes; docs/MODEL.md "RoPE"):
///   fused    one kernel over q and k reads and writes each element once, 2a forward and backward
///            (Liger's Triton kernel in place, TransformerEngine's fused RoPE).
///   eager    `(x * cos) + (rotate_half(x) * sin)` per tensor, rotate_half a `neg` of one half and
///            a `cat` (Hugging Face, DeepSpeed's reference path): 5 kernels and 10a forward; the
///            autograd backward 9 kernels and 15a (DeepSpeed FPDT's own backward: 5 and 10a).
///   complex  TorchTitan's `view_as_complex(x.float())` product with `freqs_cis`, `type_as` back:
///            3 kernels and 10a forward and backward (an fp32 copy in between).
enum class RopeKernel { kFused, kEager, kComplex };
const char* to_string(RopeKernel k);
/// @throws InputError naming `field` for anything but fused|eager|complex.
RopeKernel parse_rope_kernel(const std::string& text, const std::string& field);
const char* to_string(MlpKernel k);
/// @throws InputError naming `field` for anything but unfused|fused|eager.
MlpKernel parse_mlp_kernel(const std::string& text, const std::string& field);
const char* to_string(NormKernel k);
/// @throws InputError naming `field` for anything but upcast|fused|eager.
NormKernel parse_norm_kernel(const std::string& text, const std::string& field);

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
  /// FP8 compute as TransformerEngine runs it with `recipe.DelayedScaling` (per-tensor scales from
  /// an amax history): the Linear layers' GEMMs (Q/K/V, output projection, gate/up, down) take FP8
  /// inputs (E4M3 forward, E5M2 or hybrid gradients); attention core, embedding and LM head stay
  /// in bf16. Needs the untiled MLP (TE's Linear modules) and unsharded compute weights
  /// (zero_stage <= 2: TE caches each weight's FP8 copy across micro-batches).
  bool fp8 = false;
  std::string optimizer = "adamw";
  // Sharding
  int zero_stage = 3;              ///< FSDP full shard = ZeRO-3 over all GPUs
  int fsdp_prefetch_layers = 1;    ///< layers gathered ahead of use
  bool optimizer_offload = false;  ///< fp32 master + optimizer states on host, CPU Adam
  /// ZeRO-3 `offload_param`: the compute-dtype parameter shards live in host memory and are copied
  /// to the GPU (then all-gathered) block by block. Requires zero_stage 3.
  bool param_offload = false;
  /// DeepSpeed ZeRO-3 `reduce_bucket_size` with `contiguous_gradients` (both on by default): one
  /// flat GPU buffer of this many elements in the gradient-reduce dtype, allocated when the
  /// optimizer is built and kept for the whole run (stage3.py, "IPG"). 0 = no such buffer (FSDP).
  std::int64_t reduce_bucket_elements = 0;
  /// DeepSpeed ZeRO-3 keeps the rank's reduced gradient partitions in one flat buffer of the
  /// gradient dtype (`grad_bytes`) on the optimizer's device: with optimizer offload that is host
  /// memory, besides the fp32 gradient copy CPU Adam reads (stage3.py grad_partitions_flat_buffer).
  bool host_grad_partition_buffer = false;
  // Activation checkpointing
  CheckpointMode checkpointing = CheckpointMode::kFull;
  bool checkpoint_offload = true;       ///< block inputs offloaded to pinned host memory
  bool offload_keep_first_last = true;  ///< first and last layer keep their checkpoint on GPU
  /// Reentrant checkpointing (torch.utils.checkpoint use_reentrant=True: the Hugging Face default,
  /// DeepSpeed's and Megatron's CheckpointFunction, ArcticTraining's offload patch). Its backward
  /// holds the recomputed block output and the incoming gradient until the block's backward ends.
  bool checkpoint_reentrant = false;
  // Tiling and loss
  bool tiled_mlp = true;
  std::int64_t tiled_mlp_shards = 0;           ///< 0 = ceil(local_seq / hidden)
  MlpKernel mlp_kernel = MlpKernel::kUnfused;  ///< untiled MLP only
  bool tiled_norm = true;
  NormKernel norm_kernel = NormKernel::kUpcast;
  RopeKernel rope_kernel = RopeKernel::kComplex;
  /// Where the framework runs another RoPE for some model types (TorchTitan: the complex product
  /// for Llama, rotate_half for Qwen3): {model_type, kernel}. Read through rope_kernel_for.
  std::vector<std::pair<std::string, RopeKernel>> rope_kernel_by_model_type;
  bool fused_loss = true;  ///< fused linear cross-entropy: logits never materialised
  /// A RoPE table the framework keeps on the GPU for every position up to the training length:
  /// bytes = bytes_per_head_dim · d · seq_len, once per model or once per block. TorchTitan
  /// builds it at the model's construction, resized to training.seq_len by update_from_config:
  /// complex64 [S, d/2] for Llama (4 bytes per d), cos‖sin fp32 [S, 2d] for Qwen3 (8). v0.2.2
  /// registers one buffer on the model; 0.3.0 and main one per block (models/common/rope.py,
  /// RoPE.__init__). 0: none (Hugging Face, DeepSpeed and Megatron size theirs to the sequence
  /// of each step, inside the activations).
  std::int64_t rope_cache_bytes_per_head_dim = 0;
  bool rope_cache_per_layer = false;
  // Allocator
  bool expandable_segments = true;
  // Attention kernel name in the hardware profile
  std::string attention_kernel = "fa3";
  /// The norm, RoPE and FlashAttention-2 kernels of the set-up compute element offsets in 32-bit
  /// integers, so a tensor of 2^31 elements or more crashes them ("illegal memory access"):
  /// Liger-Kernel's RMSNorm before its int64 fix (Liger issue #803, PR #804) and FlashAttention-2
  /// 2.7 (the same issue: "FA2 as well, but FA3 solves it"). A configuration whose norm input
  /// [s, h], Q [s, H·d] or head-sharded attention tensors [n_r, H/u·d] reach 2^31 elements does
  /// not run, whatever its memory.
  bool int32_kernel_indexing = false;

  /// @throws InputError naming the field for values out of range.
  void validate() const;

  /// The RoPE kernel this recipe runs for a model of this `model_type` (HF config).
  RopeKernel rope_kernel_for(std::string_view model_type) const;
  bool operator==(const TrainingRecipe&) const = default;
};

}  // namespace cpsim::models
