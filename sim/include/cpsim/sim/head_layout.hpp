#pragma once
/// @file The head layout of one configuration and the per-rank attention buffer sizes it implies:
/// derived once (check_head_layout) and carried by the workload and the report.

#include <cstdint>

namespace cpsim::sim {

/// Head layout of one Ulysses/UPipe rank after the all-to-all (derived, validated).
///   kv_heads_eff = H_kv if H_kv % C == 0, else C when C % H_kv == 0 (KV heads replicated).
///   UPipe: U query heads per stage (all ranks), stages = H / U, U/C query heads per rank per
///   stage, kv_per_stage = min(U, kv_heads_eff) KV heads fetched per KV cycle, cycle length g = H /
///   kv_heads_eff stages when U <= kv_heads_eff (one KV fetch per cycle, reused by g stages), else
///   one KV fetch for all stages.
struct HeadLayout {
  std::int64_t cp = 0;                   ///< C
  std::int64_t ulysses = 0;              ///< Ulysses (all-to-all) degree u
  std::int64_t ring = 1;                 ///< ring degree r; C = u·r
  std::int64_t fpdt_chunks = 0;          ///< FPDT: chunks of the global sequence
  std::int64_t heads = 0;                ///< H
  std::int64_t kv_heads_eff = 0;         ///< KV heads after replication
  std::int64_t heads_per_stage = 0;      ///< U (== H for Ulysses)
  std::int64_t stages = 0;               ///< H / U
  std::int64_t kv_heads_per_fetch = 0;   ///< KV heads projected and sent per fetch (all ranks)
  std::int64_t stages_per_kv_fetch = 0;  ///< stages that reuse one KV fetch
  std::int64_t kv_replication = 1;       ///< kv_heads_eff / H_kv
};

/// Per-rank bytes of the attention buffers of one layer (hand-checkable; used by tests and
/// `--explain`).
struct AttentionBuffers {
  std::int64_t qkv_local_bytes =
      0;  ///< Q,K,V of the local sequence before the all-to-all (one stage)
  std::int64_t qkv_headsharded_bytes =
      0;  ///< Q,K,V after the all-to-all: full sequence, heads/C (one stage)
  std::int64_t out_headsharded_bytes = 0;  ///< attention output, full sequence, heads/C (one stage)
  std::int64_t out_local_bytes = 0;        ///< output after the reverse all-to-all (one stage)
  std::int64_t lse_bytes = 0;              ///< fp32 log-sum-exp (one stage)
  std::int64_t final_out_bytes = 0;        ///< UPipe: full [N/C, H, d] output kept for backward
  std::int64_t a2a_send_bytes_per_layer_fwd =
      0;                                ///< per rank, all all-to-alls of one forward layer
  std::int64_t ring_block_bytes = 0;    ///< K/V block sent per ring step (ring, usp, upipe + ring)
  std::int64_t allgather_kv_bytes = 0;  ///< K/V of the whole sequence gathered (allgather)
};

}  // namespace cpsim::sim
