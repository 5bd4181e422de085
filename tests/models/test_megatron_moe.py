"""What Megatron-Core's mixture-of-experts layer keeps for its backward, against the bytes cpsim's
megatron-core-cp states (`cpsim implementations megatron-core-cp --json`, "experts").

megatron-core 0.16.1's MoELayer with the all-to-all token dispatcher runs forward on the CPU, on a
one-rank group, with a hook on every tensor autograd saves. Two pieces stand in for what has no CPU
path, named here: CUDA streams and events (the dispatcher's device-to-host stream; they order work
and allocate nothing) and TransformerEngine's router GEMM (absent: moe_utils then runs its own
torch.mm path, as it does without TE). The experts run as SequentialMLP, one MLP per expert, where
the emitted runs use TE's grouped GEMM: both keep each expert's input and fc1 output and the
weighted SwiGLU's output.

Environment: CPSIM_BIN (the cpsim executable; default build/cpsim).
"""

import contextlib
import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPSIM = os.path.abspath(os.environ.get("CPSIM_BIN", os.path.join(ROOT, "build", "cpsim")))

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")


class _StandInStream:
    """torch.cuda.Stream / Event on the CPU: ordering only, no memory."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, *args):
        pass

    def wait_event(self, *args):
        pass

    def synchronize(self):
        pass

    def record(self, *args, **kwargs):
        pass

    def record_event(self, *args, **kwargs):
        return _StandInStream()

    def wait(self, *args, **kwargs):
        pass

    def query(self):
        return True


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    patched = {
        "Stream": torch.cuda.Stream,
        "Event": torch.cuda.Event,
        "stream": torch.cuda.stream,
        "current_stream": torch.cuda.current_stream,
        "current_device": torch.cuda.current_device,
    }
    torch.cuda.Stream = _StandInStream
    torch.cuda.Event = _StandInStream
    torch.cuda.stream = lambda s: contextlib.nullcontext()
    torch.cuda.current_stream = lambda *a, **k: _StandInStream()
    torch.cuda.current_device = lambda: "cpu"
    store = tmp_path_factory.mktemp("store") / "file"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    ps.initialize_model_parallel(1, 1, create_gloo_process_groups=False)
    yield
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    for name, value in patched.items():
        setattr(torch.cuda, name, value)


def megatron_saved_bytes(experts, top_k, hidden, ffn, tokens, shared=0, gate=False):
    import megatron.core.transformer.moe.moe_utils as moe_utils
    import torch.nn.functional as F
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.mlp import MLPSubmodules
    from megatron.core.transformer.moe.experts import SequentialMLP
    from megatron.core.transformer.moe.moe_layer import MoELayer, MoESubmodules
    from megatron.core.transformer.moe.shared_experts import SharedExpertMLP
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_config import TransformerConfig

    if getattr(moe_utils, "te_general_gemm", None) is None:
        moe_utils.te_general_gemm = None  # TE absent: the name is unbound in 0.16.1's module
    config = TransformerConfig(
        num_layers=1,
        hidden_size=hidden,
        num_attention_heads=4,
        ffn_hidden_size=ffn,
        num_moe_experts=experts,
        moe_router_topk=top_k,
        moe_ffn_hidden_size=ffn,
        moe_token_dispatcher_type="alltoall",
        moe_router_load_balancing_type="none",
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        bias_activation_fusion=True,
        use_cpu_initialization=True,
        params_dtype=torch.bfloat16,
        bf16=True,
        moe_grouped_gemm=False,
        gradient_accumulation_fusion=False,
        moe_shared_expert_intermediate_size=shared or None,
        moe_shared_expert_gate=gate,
    )
    linears = MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)
    spec = ModuleSpec(module=SequentialMLP, submodules=linears)
    shared_spec = ModuleSpec(module=SharedExpertMLP, submodules=linears) if shared else None
    torch.manual_seed(0)
    layer = MoELayer(config, MoESubmodules(experts=spec, shared_experts=shared_spec))
    x = torch.randn(tokens, 1, hidden, dtype=torch.bfloat16, requires_grad=True)
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out, _ = layer(x)
    out.float().sum().backward()  # the saved tensors are the ones its backward reads
    excluded = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    excluded.add(x.untyped_storage().data_ptr())
    return sum(b for ptr, b in storages.items() if ptr not in excluded)


@pytest.mark.parametrize("experts,top_k,hidden,ffn", [(8, 2, 64, 48), (16, 4, 64, 80)])
def test_cpsim_keeps_what_megatron_core_moe_saves(one_rank, experts, top_k, hidden, ffn):
    r = subprocess.run(
        [CPSIM, "implementations", "megatron-core-cp", "--json"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    e = json.loads(r.stdout)["experts"]["ulysses"]
    assert e["weights_inside_experts"] and not e["eager_expert_activation"]
    assert not e["keeps_renormalisation"] and not e["keeps_weighted_outputs"]
    assert e["router_input_bytes"] == 0 and e["routing_bytes_per_token"] == 0
    tokens, a = 512, 2
    copies = tokens * top_k
    expected = (
        tokens * experts * e["routing_bytes_per_token_expert"]  # probabilities, routing map
        + copies * e["routing_bytes_per_copy"]  # indices and weights
        + copies * hidden * a  # the experts' input
        + copies * 3 * ffn * a  # fc1's output [R, 2f] and the weighted SwiGLU's [R, f]
    )
    assert megatron_saved_bytes(experts, top_k, hidden, ffn, tokens) == expected


@pytest.mark.parametrize("gate", [False, True])
def test_cpsim_keeps_what_megatron_core_shared_experts_save(one_rank, gate):
    """A shared expert (SharedExpertMLP) beside the routed ones keeps its gated MLP's gate/up and
    product over every token; with its sigmoid gate, also its output [s, h] and the score [s, 1]
    that the gate's product reads (step_experts.cpp shared_expert_forward)."""
    experts, top_k, hidden, ffn, shared, tokens, a = 8, 2, 64, 48, 80, 512, 2
    routed = megatron_saved_bytes(experts, top_k, hidden, ffn, tokens)
    both = megatron_saved_bytes(experts, top_k, hidden, ffn, tokens, shared=shared, gate=gate)
    expected = tokens * 3 * shared * a + (tokens * (hidden + 1) * a if gate else 0)
    assert both - routed == expected


def saved_storages(fn):
    """The storages autograd saves while `fn` runs forward: {data_ptr: bytes}."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    out.float().sum().backward()
    return storages


def test_gpt_oss_glu_keeps_the_copies_cpsim_states(one_rank):
    """gpt-oss's experts under Megatron-Core (the flags cpsim emits: --quick-geglu, offset 1,
    clamp 7, biases on every linear) run TEGroupedMLP, which needs TransformerEngine; its two
    pieces that differ from the SwiGLU experts run here on their own. The clamped quick-GEGLU
    (weighted_bias_quick_geglu_impl) keeps gate/up (the clamps' input) and the concatenated
    clamped halves: `clamped_glu_copies` more [R, 2f] than the weighted SwiGLU, which keeps gate/up
    only (and a scalar offset, 2 bytes). The expert output bias (TEGroupedMLP._apply_bias) keeps
    nothing beyond its inputs."""
    from megatron.core.fusions.fused_bias_geglu import weighted_bias_quick_geglu_impl
    from megatron.core.fusions.fused_bias_swiglu import weighted_bias_swiglu_impl
    from megatron.core.transformer.moe.experts import TEGroupedMLP

    r = subprocess.run(
        [CPSIM, "implementations", "megatron-core-cp", "--json"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    copies = json.loads(r.stdout)["experts"]["ulysses"]["clamped_glu_copies"]
    rows, ffn, hidden, a = 96, 40, 24, 2
    leaf = torch.randn(rows, 2 * ffn, dtype=torch.bfloat16, requires_grad=True)
    bias = torch.randn(2 * ffn, dtype=torch.bfloat16, requires_grad=True)
    probs = torch.rand(rows, 1, dtype=torch.bfloat16, requires_grad=True)
    inputs = {t.untyped_storage().data_ptr() for t in (leaf, bias, probs)}

    def kept(fn):
        return sum(b for p, b in saved_storages(fn).items() if p not in inputs)

    gate_up = rows * 2 * ffn * a  # fc1's output, made inside each run as TE's GEMM makes it
    glu = kept(lambda: weighted_bias_quick_geglu_impl(leaf * 1, bias, probs, False, 1.0, 7.0))
    swiglu = kept(lambda: weighted_bias_swiglu_impl(leaf * 1, None, probs, False))
    assert swiglu == gate_up
    assert glu == (1 + copies) * gate_up + a

    out = torch.randn(rows, hidden, dtype=torch.bfloat16, requires_grad=True)
    biases = [torch.randn(hidden, dtype=torch.bfloat16, requires_grad=True) for _ in range(4)]
    inputs = {t.untyped_storage().data_ptr() for t in (out, probs, *biases)}
    assert kept(lambda: TEGroupedMLP._apply_bias(out, biases, [rows // 4] * 4, probs)) == 0
