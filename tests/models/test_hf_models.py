"""cpsim's reading of a config.json against the model code of the pinned transformers (4.57.6),
run here on the CPU.

Windows: for each config, a tiny model of its type is built by transformers from the same keys and
run once with an attention function that records the `sliding_window` each layer's attention call
hands to the kernel (what flash_attention_2 turns into window_size). cpsim reads the file with
`cpsim models PATH --json`; its `layer_types` and `sliding_window` must be what the code does.
Parameters: cpsim's count must be the number of parameters of the model transformers builds.
Experts: transformers' mixture-of-experts block (Mixtral, Qwen3-MoE) runs forward on the CPU with
a hook on every tensor autograd saves; their bytes must be what cpsim's block keeps for the Hugging
Face implementations (sim/src/step_experts.cpp; tests/sim/moe_test.cpp holds the simulated block
to the same sum). Its framework calls, forward and backward, counted as the allocation tracer
counts them (every non-view aten op), must be the ones deepspeed-ulysses and yunchang-usp state
(`cpsim implementations NAME --json`, "experts").

Environment: CPSIM_BIN (the cpsim executable; default build/cpsim).
"""

import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPSIM = os.path.abspath(os.environ.get("CPSIM_BIN", os.path.join(ROOT, "build", "cpsim")))

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 128,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "pad_token_id": 0,
}
SLIDE, FULL = "sliding_attention", "full_attention"

CASES = [
    ("mistral", {"sliding_window": 512}),
    ("mistral", {"sliding_window": None}),
    # Mistral's code ignores layer_types: every layer slides.
    ("mistral", {"sliding_window": 512, "layer_types": [FULL] * 6}),
    ("phi3", {"sliding_window": 256}),
    ("qwen2", {"sliding_window": 512, "max_window_layers": 4}),
    ("qwen2", {"sliding_window": 512, "max_window_layers": 4, "use_sliding_window": True}),
    ("qwen2", {"sliding_window": 512, "use_sliding_window": True}),
    ("qwen3", {"sliding_window": 512, "max_window_layers": 2, "use_sliding_window": True}),
    (
        "qwen3",
        {
            "sliding_window": 512,
            "use_sliding_window": True,
            "layer_types": [SLIDE, FULL, SLIDE, FULL, SLIDE, FULL],
        },
    ),
    ("ministral", {"sliding_window": 128}),
    ("ministral", {"sliding_window": 128, "layer_types": [FULL, FULL, SLIDE, SLIDE, FULL, SLIDE]}),
    ("qwen2", {"sliding_window": 512, "layer_types": [SLIDE] * 6}),
    # sliding_attention layers without a window attend to the whole sequence.
    ("ministral", {"sliding_window": None, "layer_types": [SLIDE] * 6}),
    # Gemma 3's text model: every 6th layer full by default, its window 4096 by default.
    ("gemma3_text", {"sliding_window": 1024}),
    ("gemma3_text", {}),
    ("gemma3_text", {"sliding_window": 512, "sliding_window_pattern": 3}),
    (
        "gemma3_text",
        {"sliding_window": 512, "layer_types": [FULL, SLIDE, SLIDE, FULL, SLIDE, FULL]},
    ),
    # gpt-oss: a 128-token window on alternate layers by default, or as layer_types says.
    ("gpt_oss", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    (
        "gpt_oss",
        {
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 64,
            "layer_types": [FULL, FULL, SLIDE, SLIDE, FULL, SLIDE],
        },
    ),
]
# Model types whose parameters cpsim counts, against the model transformers builds.
COUNTED = [
    ("llama", {}),
    ("qwen3", {}),
    ("mistral", {"sliding_window": 512}),
    ("gemma3_text", {"hidden_activation": "gelu_pytorch_tanh"}),
    ("gemma3_text", {"tie_word_embeddings": False}),
    ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    ("qwen3_moe", {"num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 48}),
    # Attention biases as each model's code puts them: q, k, v and o with attention_bias (Llama,
    # Qwen3), q, k and v always (Qwen2), none whatever the key says (Mistral).
    ("llama", {"attention_bias": True}),
    ("qwen3", {"attention_bias": True}),
    ("qwen2", {}),
    ("mistral", {"attention_bias": True}),
    # gpt-oss: q/k/v/o biases, a sink per head, a router and experts with biases.
    ("gpt_oss", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    # Qwen2-MoE: a shared expert behind a sigmoid gate, q/k/v biases (qkv_bias, default true).
    (
        "qwen2_moe",
        {
            "num_experts": 6,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 48,
            "shared_expert_intermediate_size": 96,
        },
    ),
    (
        "qwen2_moe",
        {
            "num_experts": 6,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 48,
            "shared_expert_intermediate_size": 96,
            "qkv_bias": False,
        },
    ),
]
# Llama 4's text model: every layer sparse with a shared expert (transformers builds it as
# Llama4ForCausalLM).
LLAMA4 = {"num_local_experts": 4, "num_experts_per_tok": 1, "intermediate_size_mlp": 256}
COUNTED.append(("llama4_text", LLAMA4))
# Dense layers among the sparse ones: Qwen's mlp_only_layers and decoder_sparse_step, Llama 4's
# interleave_moe_layer_step and moe_layers (dense MLPs of intermediate_size / _mlp).
QWEN_MOE = {"num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 48}
COUNTED += [
    ("qwen3_moe", {**QWEN_MOE, "mlp_only_layers": [0, 3]}),
    ("qwen3_moe", {**QWEN_MOE, "decoder_sparse_step": 2}),
    ("qwen2_moe", {**QWEN_MOE, "shared_expert_intermediate_size": 96, "decoder_sparse_step": 3}),
    ("llama4_text", {**LLAMA4, "interleave_moe_layer_step": 2}),
    ("llama4_text", {**LLAMA4, "moe_layers": [1, 2, 5]}),
]
# DeepSeek-V3: multi-head latent attention (q from a latent or from x), routed experts behind the
# grouped sigmoid router with a shared one, the first layers dense. Every head has its own K/V.
DEEPSEEK = {
    "num_key_value_heads": 4,
    "kv_lora_rank": 16,
    "q_lora_rank": 24,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 12,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "n_shared_experts": 1,
    "first_k_dense_replace": 2,
    "n_group": 2,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
}
# deepseek-ai/DeepSeek-V3's main model (its 671 B).
DEEPSEEK_V3_PARAMETERS = 671_026_404_352
COUNTED += [
    ("deepseek_v3", DEEPSEEK),
    ("deepseek_v3", {**DEEPSEEK, "q_lora_rank": None, "n_shared_experts": 2}),
    ("deepseek_v3", {**DEEPSEEK, "first_k_dense_replace": 0, "v_head_dim": 24}),
]
# Llama 4's chunked layers: Llama4TextConfig's own layer_types against cpsim's reading.
CHUNKED = [
    {},
    {"no_rope_layers": [1, 0, 1, 0, 1, 1]},
    {"no_rope_layer_interval": 3},
    {"layer_types": ["full_attention"] * 3 + ["chunked_attention"] * 3},
]
# Mixture-of-experts blocks traced: (model_type, keys, cpsim's MoeSpec::renormalize).
EXPERT_BLOCKS = [
    ("mixtral", {"num_local_experts": 8, "num_experts_per_tok": 2}, True),
    (
        "qwen3_moe",
        {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 48},
        False,
    ),
    (
        "qwen3_moe",
        {
            "num_experts": 16,
            "num_experts_per_tok": 4,
            "moe_intermediate_size": 80,
            "norm_topk_prob": True,
        },
        True,
    ),
]


def traced_windows(model_type, keys):
    """The sliding_window each layer's attention call receives, from transformers' own model."""
    from transformers import AttentionInterface, AutoConfig, AutoModel

    seen = {}

    def record(module, query, key, value, attention_mask, sliding_window=None, **kwargs):
        seen[module.layer_idx] = sliding_window
        batch, heads, tokens, dim = query.shape
        return torch.zeros(batch, tokens, heads, dim, dtype=query.dtype), None

    AttentionInterface.register("cpsim_record", record)
    config = AutoConfig.for_model(model_type, **TINY, **keys)
    config._attn_implementation = "cpsim_record"
    model = AutoModel.from_config(config).eval()
    with torch.no_grad():
        model(input_ids=torch.zeros(1, 8, dtype=torch.long), use_cache=False)  # as in training
    return [seen[i] for i in range(TINY["num_hidden_layers"])]


def cpsim_windows(model_type, keys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": model_type, **TINY, **keys}))
    r = subprocess.run([CPSIM, "models", str(path), "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    model = json.loads(r.stdout)["model"]
    window = model["sliding_window"]
    return [window if t == SLIDE else None for t in model["layer_types"]]


@pytest.mark.parametrize("model_type,keys", CASES)
def test_cpsim_reads_the_windows_the_model_code_runs(model_type, keys, tmp_path):
    assert cpsim_windows(model_type, keys, tmp_path) == traced_windows(model_type, keys)


def test_the_builtin_mistral_slides_every_layer_by_its_code(tmp_path):
    with open(os.path.join(ROOT, "data", "models", "mistral-7b-v0.1.json")) as f:
        config = json.load(f)
    keys = {k: config[k] for k in ("sliding_window",)}
    assert cpsim_windows("mistral", keys, tmp_path) == traced_windows("mistral", keys)
    r = subprocess.run(
        [CPSIM, "models", "mistral-7b-v0.1", "--json"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    model = json.loads(r.stdout)["model"]
    assert model["layer_types"] == [SLIDE] * config["num_hidden_layers"]
    assert model["sliding_window"] == 4096


@pytest.mark.parametrize("model_type,keys", COUNTED)
def test_cpsim_counts_the_parameters_transformers_builds(model_type, keys, tmp_path):
    """Every weight of the block (Gemma 3: four norms and q/k norms per layer) and the tied or
    untied LM head: cpsim's count is the number of parameters of transformers' own model."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **{**TINY, **keys})
    model = AutoModelForCausalLM.from_config(config)
    built = sum(p.numel() for p in model.parameters())  # tied weights are one parameter
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": model_type, **TINY, **keys}))
    r = subprocess.run([CPSIM, "models", str(path), "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["model"]["parameters"] == built


@pytest.mark.parametrize(
    "name,parameters",
    [
        ("gpt-oss-120b", 116_829_156_672),
        ("gpt-oss-20b", 20_914_757_184),
        ("deepseek-v3", DEEPSEEK_V3_PARAMETERS),
    ],
)
def test_the_builtin_moe_models_have_the_parameters_transformers_builds(name, parameters):
    """openai/gpt-oss-120b and -20b and deepseek-ai/DeepSeek-V3 (without its multi-token
    prediction layer, which transformers does not build) as transformers 4.57.6 builds them (on
    the meta device): the parameters cpsim counts in its built-in files."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with open(os.path.join(ROOT, "data", "models", f"{name}.json")) as f:
        keys = {k: v for k, v in json.load(f).items() if k not in ("name", "source")}
    config = AutoConfig.for_model(**keys)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    built = sum(p.numel() for p in model.parameters())
    r = subprocess.run([CPSIM, "models", name, "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["model"]["parameters"] == built == parameters


@pytest.mark.parametrize("keys", CHUNKED)
def test_cpsim_reads_the_chunked_layers_llama4_configures(keys, tmp_path):
    """The layers Llama4TextConfig gives chunked attention (its layer_types, derived from
    no_rope_layers) and the chunk are the ones cpsim reads."""
    from transformers import AutoConfig

    config = AutoConfig.for_model("llama4_text", **TINY, **LLAMA4, **keys)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama4_text", **TINY, **LLAMA4, **keys}))
    r = subprocess.run([CPSIM, "models", str(path), "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    model = json.loads(r.stdout)["model"]
    assert model["layer_types"] == config.layer_types
    assert model["attention_chunk_size"] == config.attention_chunk_size


def test_the_builtin_llama4_scout_has_the_parameters_transformers_builds():
    """Llama-4-Scout's text model as transformers 4.57.6 builds it (Llama4ForCausalLM, on the meta
    device): the parameters cpsim counts in its built-in file."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with open(os.path.join(ROOT, "data", "models", "llama-4-scout.json")) as f:
        text = json.load(f)["text_config"]
    config = AutoConfig.for_model(**text)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    built = sum(p.numel() for p in model.parameters())
    r = subprocess.run([CPSIM, "models", "llama-4-scout", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["model"]["parameters"] == built == 107_769_861_120


def traced_expert_bytes(model_type, keys, tokens):
    """Bytes autograd keeps for the backward of transformers' MoE block over `tokens` tokens in
    bf16: every saved tensor's storage once, without the block's input and its weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **TINY, **keys)
    layer = AutoModelForCausalLM.from_config(config).model.layers[0]
    block = getattr(layer, "block_sparse_moe", None) or layer.mlp  # Mixtral's name, Qwen3-MoE's
    block = block.to(torch.bfloat16)
    x = torch.randn(1, tokens, TINY["hidden_size"], dtype=torch.bfloat16, requires_grad=True)
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x)
    excluded = {p.untyped_storage().data_ptr() for p in block.parameters()}
    excluded.add(x.untyped_storage().data_ptr())
    return sum(b for ptr, b in storages.items() if ptr not in excluded)


def cpsim_expert_bytes(model_type, keys, tokens, tmp_path):
    """What cpsim's block keeps for the Hugging Face implementations (step_experts.cpp): the
    router's fp32 probabilities, per token copy the top-k index (int64), the bf16 weight and two
    int64 indices of the expert loop, with renormalised weights their fp32 values and one fp32 sum
    per token, and per copy the experts' input, output and weighted output [h] and the eager gated
    MLP's 4 · f."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": model_type, **TINY, **keys}))
    r = subprocess.run([CPSIM, "models", str(path), "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    experts = json.loads(r.stdout)["model"]["experts"]
    e, k, f = experts["experts"], experts["experts_per_token"], experts["expert_ffn_hidden"]
    h, a, copies = TINY["hidden_size"], 2, tokens * k
    renormalize = experts["renormalize"]
    return (
        tokens * e * 4
        + copies * (8 + a + 16)
        + ((copies + tokens) * 4 if renormalize else 0)
        + copies * 3 * h * a
        + copies * 4 * f * a
    ), renormalize


@pytest.mark.parametrize("model_type,keys,renormalize", EXPERT_BLOCKS)
def test_cpsim_keeps_what_the_hugging_face_expert_block_saves(
    model_type, keys, renormalize, tmp_path
):
    tokens = 512
    expected, read = cpsim_expert_bytes(model_type, keys, tokens, tmp_path)
    assert read == renormalize
    assert traced_expert_bytes(model_type, keys, tokens) == expected


class _CountCalls(TorchDispatchMode):
    """Every aten op that launches a kernel, as calibrate/tracer's recorder counts them."""

    NO_KERNEL = {"detach", "empty", "empty_like", "empty_strided", "alias", "lift_fresh"}

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not (func.is_view or func.overloadpacket.__name__ in self.NO_KERNEL):
            self.calls += 1
        return out


def traced_expert_calls(model_type, keys, tokens):
    """Calls of transformers' MoE block forward and backward, every expert hit."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **TINY, **keys)
    layer = AutoModelForCausalLM.from_config(config).model.layers[0]
    block = (getattr(layer, "block_sparse_moe", None) or layer.mlp).to(torch.bfloat16)
    x = torch.randn(1, tokens, TINY["hidden_size"], dtype=torch.bfloat16, requires_grad=True)
    forward, backward = _CountCalls(), _CountCalls()
    with forward:
        out, logits = block(x)
    hit = logits.topk(config.num_experts_per_tok).indices.flatten().unique().numel()
    assert hit == logits.shape[-1], "not every expert was hit: the count would not be per expert"
    grad = torch.randn_like(out)
    with backward:
        out.backward(grad)
    return forward.calls, backward.calls


@pytest.mark.parametrize("impl", ["deepspeed-ulysses", "yunchang-usp"])
@pytest.mark.parametrize("model_type,keys,renormalize", EXPERT_BLOCKS)
def test_the_hugging_face_expert_loop_makes_the_calls_cpsim_states(
    impl, model_type, keys, renormalize
):
    r = subprocess.run([CPSIM, "implementations", impl, "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    experts = json.loads(r.stdout)["experts"]["ulysses"]
    assert experts["synchronises_per_expert"]
    n = keys.get("num_experts", keys.get("num_local_experts"))

    def stated(calls):
        return (
            calls["block"] + calls["per_expert"] * n + (calls["renormalize"] if renormalize else 0)
        )

    assert traced_expert_calls(model_type, keys, 512) == (
        stated(experts["forward_calls"]),
        stated(experts["backward_calls"]),
    )
