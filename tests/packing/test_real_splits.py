"""cpsim's per-rank attention work under a document mask against the code that splits a packed
sequence in practice, run here on the CPU from the pinned packages:

- ring-flash-attn's llama3 varlen (`llama3_flash_attn_prepare_cu_seqlens`: each rank's local
  cu_seqlens and the K slice it attends; flash-attn's stand-in from the allocation tracer lets the
  package import without CUDA), against `simulate --method allgather --balancer contiguous`;
- PyTorch's `_HeadTailLoadBalancer` (the token order TorchTitan's headtail balancer gives
  `context_parallel`), against `simulate --method ring --balancer head-tail`;
- PyTorch's `_PTRRLoadBalancer` over a FlexAttention `BlockMask` of the document mask (TorchTitan's
  ptrr balancer), against `simulate --method allgather --balancer ptrr`.

Each rank's work is counted from what the upstream code hands that rank, the imbalance (busiest
rank over the mean) compared with the one cpsim reports for the same batch.

Environment: CPSIM_BIN (the cpsim executable; default build/cpsim).
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPSIM = os.path.abspath(os.environ.get("CPSIM_BIN", os.path.join(ROOT, "build", "cpsim")))
sys.path.insert(0, os.path.join(ROOT, "calibrate", "tracer"))

SEQ = 64 * 1024
RANKS = 4
DOC = 5000  # every document 5000 tokens: concat packing cuts one at each sequence's end
BATCHES = 3


def concat_sequences(count, seq=SEQ, doc=DOC):
    """The documents of `count` sequences of `seq` tokens cut from a stream of `doc`-token
    documents (cpsim's concat packing, as Megatron-LM and TorchTitan cut rows)."""
    out, carry = [], 0
    for _ in range(count):
        docs, free = [], seq
        if carry:
            take = min(carry, free)
            docs.append(take)
            free -= take
            carry -= take
        while free > 0:
            take = min(doc, free)
            docs.append(take)
            free -= take
            carry = doc - take
        out.append(docs)
    return out


def imbalance(work):
    return max(work) / (sum(work) / len(work))


def cpsim_imbalance(tmp_path, method, balancer, seq=SEQ, doc=DOC):
    lengths = tmp_path / "lengths.txt"
    lengths.write_text(f"{doc}\n")
    args = [CPSIM, "simulate", "--model", "llama3-8b", "--gpus", str(RANKS), "--method", method]
    args += ["--impl", "none", "--lengths", str(lengths), "--pack", str(seq), "--batches"]
    args += [str(BATCHES), "--balancer", balancer, "--json"]
    run = subprocess.run(args, capture_output=True, text=True, check=True)
    answer = json.loads(run.stdout)
    (study,) = answer["balancers"]
    assert study["balancer"] == balancer
    return study["imbalance_per_batch"]


def llama3_work(docs):
    """Per rank: the area each flash varlen call of llama3 varlen covers (a causal call of q
    queries over k keys, bottom-right aligned: q·(k − q) + q²/2, the cost model's count)."""
    import torch
    from cpsim_tracer import flash_stand_in

    flash_stand_in.install(None)
    from ring_flash_attn import llama3_flash_attn_prepare_cu_seqlens

    cu = torch.tensor([0] + [sum(docs[: i + 1]) for i in range(len(docs))], dtype=torch.int32)
    work = []
    for rank in range(RANKS):
        cu_q, cu_k, _, _, _ = llama3_flash_attn_prepare_cu_seqlens(cu, True, rank, RANKS)
        q = (cu_q[1:] - cu_q[:-1]).tolist()
        k = (cu_k[1:] - cu_k[:-1]).tolist()
        work.append(
            sum(qi * (ki - qi) + qi * qi / 2 for qi, ki in zip(q, k, strict=True) if qi > 0)
        )
    return work


def shard_work(order, docs, own):
    """Per rank, a contiguous shard of the tokens in `order`: Σ over its tokens of their position
    in their document plus `own` (1: the pairs with key ≤ query; 1/2: the area)."""
    position_in_doc = []
    for n in docs:
        position_in_doc.extend(range(n))
    shard = len(order) // RANKS
    return [
        sum(position_in_doc[t] + own for t in order[r * shard : (r + 1) * shard])
        for r in range(RANKS)
    ]


def head_tail_work(docs):
    """Per rank: the (query, key) pairs of one document with key ≤ query that its tokens see, for
    the tokens PyTorch's head-tail order gives it (contiguous shards of the reordered sequence)."""
    from torch.distributed.tensor.experimental._context_parallel import _load_balancer as lb

    order = lb._HeadTailLoadBalancer(SEQ, RANKS, "cpu")._generate_indices()[0].tolist()
    return shard_work(order, docs, 1)


def test_contiguous_matches_llama3_varlen(tmp_path):
    expected = [imbalance(llama3_work(d)) for d in concat_sequences(BATCHES)]
    got = cpsim_imbalance(tmp_path, "allgather", "contiguous")
    assert got == pytest.approx(expected, rel=1e-9)
    assert max(expected) > 1.05  # the batches are imbalanced: the check can fail


def test_head_tail_matches_torch_load_balancer(tmp_path):
    expected = [imbalance(head_tail_work(d)) for d in concat_sequences(BATCHES)]
    got = cpsim_imbalance(tmp_path, "ring", "head-tail")
    # PyTorch's order counts tokens (n(n+1)/2 pairs for n tokens), cpsim areas (n²/2): chunks of
    # 8K tokens differ by under 1e-3.
    assert got == pytest.approx(expected, rel=1e-3)
    assert max(expected) > 1.05


PTRR_SEQ = 8192  # the BlockMask is built from a dense SEQ x SEQ mask on the CPU: kept small
PTRR_DOC = 1500


def ptrr_work(docs):
    """Per rank: the visible area of the tokens PyTorch's PTRR order gives it (a query at
    position p of its document sees an area of p + 1/2 in cpsim's continuous coordinates)."""
    import torch
    from torch.distributed.tensor.experimental._context_parallel import _load_balancer as lb
    from torch.nn.attention.flex_attention import create_block_mask

    document = torch.repeat_interleave(torch.arange(len(docs)), torch.tensor(docs))

    def document_causal(b, h, q, kv):
        return (document[q] == document[kv]) & (q >= kv)

    mask = create_block_mask(document_causal, 1, 1, PTRR_SEQ, PTRR_SEQ, device="cpu")
    order = lb._PTRRLoadBalancer(mask, RANKS)._generate_indices()[0].tolist()
    return shard_work(order, docs, 0.5)


def test_ptrr_matches_torch_load_balancer(tmp_path):
    expected = [imbalance(ptrr_work(d)) for d in concat_sequences(BATCHES, PTRR_SEQ, PTRR_DOC)]
    got = cpsim_imbalance(tmp_path, "allgather", "ptrr", PTRR_SEQ, PTRR_DOC)
    assert got == pytest.approx(expected, rel=1e-9)
    # PTRR is not a perfect balance on these batches: the check could tell another dealing.
    assert max(expected) > 1.001
