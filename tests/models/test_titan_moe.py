"""What TorchTitan's mixture-of-experts layer keeps for its backward, against the bytes cpsim's
torch-native-cp states (`cpsim implementations torch-native-cp --json`, "experts").

torchtitan 0.3.0's MoE of its Qwen3 MoE flavors (debugmodel_moe: 64 experts, top 8, softmax
scores renormalised, grouped experts through torch._grouped_mm) runs forward on the CPU in bf16
with a hook on every tensor autograd saves. Its module for MinimalAsyncEP's Triton kernels, which
only run with EP on CUDA, stands in as tests/launchers/torchtitan_launcher.py does.

One difference from the GPU is stated, not hidden: the router's gate runs under
torch.autocast(dtype=float32) (TokenChoiceTopKRouter.forward), which CUDA honours and the CPU
disables. On the GPU the gate keeps an fp32 copy of its input [s, h] and the scores, top-k scores,
per-row scores and renormalisation sums are fp32; on the CPU they are bf16 and no copy is made.
cpsim states the GPU's bytes; the test converts them to the CPU's dtypes before comparing.

Environment: CPSIM_BIN (the cpsim executable; default build/cpsim).
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPSIM = os.path.abspath(os.environ.get("CPSIM_BIN", os.path.join(ROOT, "build", "cpsim")))

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan")


def titan_moe_saved_bytes(tokens):
    sys.path.insert(0, os.path.join(ROOT, "tests", "launchers"))
    import torchtitan_launcher

    torchtitan_launcher._import_torchtitan([])
    from torchtitan.models.qwen3 import model_registry

    config = model_registry("debugmodel_moe").model
    moe_config = config.layers[0].moe
    moe = moe_config.build().to(torch.bfloat16)
    torch.manual_seed(0)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.02)
    experts = moe_config.num_experts
    top_k = moe_config.router.top_k
    hidden = config.dim
    ffn = moe.routed_experts.inner_experts.w1_EFD.shape[1]
    x = torch.randn(1, tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = moe(x)
    out.float().sum().backward()
    excluded = {p.untyped_storage().data_ptr() for p in moe.parameters()}
    excluded.add(x.untyped_storage().data_ptr())
    saved = sum(b for ptr, b in storages.items() if ptr not in excluded)
    return saved, experts, top_k, hidden, ffn


def test_cpsim_keeps_what_torchtitan_moe_saves():
    r = subprocess.run(
        [CPSIM, "implementations", "torch-native-cp", "--json"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    e = json.loads(r.stdout)["experts"]["ring"]
    tokens, a = 512, 2
    saved, experts, top_k, hidden, ffn = titan_moe_saved_bytes(tokens)
    copies = tokens * top_k
    assert e["eager_expert_activation"] and not e["weights_inside_experts"]
    assert not e["keeps_renormalisation"] and not e["keeps_weighted_outputs"]
    stated = (  # the GPU's, as cpsim states them
        tokens * experts * e["routing_bytes_per_token_expert"]
        + copies * e["routing_bytes_per_copy"]
        + tokens * e["routing_bytes_per_token"]
        + tokens * hidden * e["router_input_bytes"]
        + copies * hidden * a  # the experts' input
        + copies * 4 * ffn * a  # gate, up, silu(gate), the product
        + copies * hidden * e["combined_bytes"]  # the routed outputs weighted in fp32
    )
    on_cpu = (
        stated
        - tokens * hidden * e["router_input_bytes"]  # no fp32 copy of the gate's input
        - tokens * experts * (4 - a)  # scores in bf16
        - copies * 2 * (4 - a)  # top-k and per-row scores in bf16
        - tokens * (4 - a)  # renormalisation sums in bf16
        + experts * 4  # the per-expert token counts (int32): not per token, not modelled
    )
    assert saved == on_cpu
