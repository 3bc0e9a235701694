"""export_hf against the outside oracle: HF transformers loads the export with no extra code and
no missing/unexpected weights, and its Llama/Mixtral logits match ATS's within 1e-4 (fp32, CPU),
and the Llama loss and every parameter's gradient match in float64 to 1e-10 relative.
Configurations HF cannot express are refused naming the field and value."""

import json

import ats_model
import pytest
import torch
import transformers
from ats_model.config import RopeScaling
from ats_model.serialization import export_hf, hf_llama
from safetensors import safe_open
from torch.nn import functional as F
from transformers.models.llama.modeling_llama import LlamaRMSNorm

PARITY_ATOL = 1e-4


def load_hf(directory) -> torch.nn.Module:
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        directory, output_loading_info=True
    )
    assert {k: v for k, v in info.items() if v} == {}, f"transformers load reported {info}"
    return model.eval()


def assert_parity(ats, hf, ids) -> None:
    with torch.no_grad():
        ours = ats(ids).logits
        theirs = hf(ids).logits
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().max().item() < PARITY_ATOL


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # GQA: 4 query heads share 2 kv heads
        {"n_kv_head": 4, "tie_embeddings": True},
        {"n_kv_head": 1, "head_dim": 12},  # MQA, head_dim != dim / n_head
        {"rope_scaling": RopeScaling(factor=4.0, original_max_seq_len=8)},
    ],
    ids=["gqa", "tied", "mqa-head-dim", "rope-llama3"],
)
def test_dense_export_matches_hf_llama(tmp_path, make_model, dense_config, random_ids, overrides):
    config = dense_config(**overrides)
    model = make_model(config)
    export_hf(model, tmp_path)
    hf_config = json.loads((tmp_path / "config.json").read_text())
    assert hf_config["architectures"] == ["LlamaForCausalLM"]
    hf = load_hf(tmp_path)
    assert type(hf).__name__ == "LlamaForCausalLM"
    assert hf.config.tie_word_embeddings == config.tie_embeddings
    assert_parity(model, hf, random_ids(config.vocab_size, shape=(2, 40)))


GRAD_RTOL = 1e-10


@pytest.mark.parametrize("overrides", [{}, {"tie_embeddings": True}], ids=["gqa", "tied"])
def test_dense_gradients_match_hf_llama(
    tmp_path, monkeypatch, make_model, dense_config, random_ids, overrides
):
    """Training, not only inference, matches the reference: the same weights in float64, the same
    batch, ATS's next-token loss (model(ids, targets)) against the cross-entropy of HF
    LlamaForCausalLM's logits, and every parameter's gradient, to ~1e-10 relative. HF computes
    a few things in float32 whatever the model's dtype (each ~1e-9 from float64 here): its
    `labels=` loss (not used), RoPE angles (ATS is given HF's tables below), eager attention's
    softmax (SDPA is used) and LlamaRMSNorm, run here by the same formula without the cast."""

    def rms_norm_in_input_dtype(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))

    monkeypatch.setattr(LlamaRMSNorm, "forward", rms_norm_in_input_dtype)
    config = dense_config(**overrides)
    model = make_model(config, dtype=torch.float64).train()
    export_hf(model, tmp_path)
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, output_loading_info=True, dtype=torch.float64, attn_implementation="sdpa"
    )
    assert {k: v for k, v in info.items() if v} == {}, f"transformers load reported {info}"
    hf.train()
    assert next(hf.parameters()).dtype == torch.float64
    # HF computes its RoPE angles in float32 whatever the model's dtype (~1e-8 from ours); the
    # tables are constants, not weights, so ATS gets HF's, and the rest must agree in float64
    positions = torch.arange(config.max_seq_len)[None]
    cos, sin = hf.model.rotary_emb(torch.zeros(1, dtype=torch.float64), positions)
    with torch.no_grad():
        model.rope_cos.copy_(cos[0])
        model.rope_sin.copy_(sin[0])
    seq = random_ids(config.vocab_size, shape=(3, 25))
    ours = model(seq[:, :-1], targets=seq[:, 1:]).loss
    logits = hf(input_ids=seq[:, :-1]).logits
    assert logits.dtype == torch.float64
    theirs = F.cross_entropy(logits.flatten(0, 1), seq[:, 1:].flatten())
    ours.backward()
    theirs.backward()
    assert abs(ours.item() - theirs.item()) <= GRAD_RTOL * abs(theirs.item())
    hf_params = dict(hf.named_parameters())
    table = {**hf_llama.HF_LAYER, **hf_llama.HF_DENSE_FFN}
    checked = set()
    for name, p in model.named_parameters():
        hf_name = hf_llama.rename_to_hf(name, table)
        theirs_grad = hf_params[hf_name].grad
        assert p.grad is not None and theirs_grad is not None, name
        scale = theirs_grad.abs().max().item()
        assert scale > 0, f"{hf_name}: zero gradient tests nothing"
        err = (p.grad - theirs_grad).abs().max().item()
        assert err <= GRAD_RTOL * scale, f"{name}: max |diff| {err:.3e}, max |grad| {scale:.3e}"
        checked.add(hf_name)
    assert checked == set(hf_params), (
        f"HF parameters without an ATS twin: {set(hf_params) - checked}"
    )


@pytest.mark.parametrize("overrides", [{}, {"top_k": 1}, {"top_k": 4}], ids=["top2", "top1", "all"])
def test_moe_export_matches_hf_mixtral(tmp_path, make_model, moe_config, random_ids, overrides):
    config = moe_config(**overrides)
    model = make_model(config)
    export_hf(model, tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
    # the classic per-expert Mixtral layout (read by transformers >= 4.36; 5.x fuses it on load)
    assert "model.layers.1.block_sparse_moe.experts.3.w2.weight" in keys
    assert "model.layers.0.block_sparse_moe.gate.weight" in keys
    hf = load_hf(tmp_path)
    assert type(hf).__name__ == "MixtralForCausalLM"
    assert_parity(model, hf, random_ids(config.vocab_size, shape=(3, 17)))


@pytest.mark.parametrize("preset", ["tiny-dense", "tiny-moe"])
def test_tiny_presets_export_matches_hf(tmp_path, make_model, random_ids, preset):
    config = ats_model.presets.get(preset)
    model = make_model(config)
    export_hf(model, tmp_path)
    assert_parity(model, load_hf(tmp_path), random_ids(config.vocab_size, shape=(2, 16)))


def test_tokenizer_and_shards_are_written(tmp_path, make_model, dense_config, random_ids):
    tokenizer = tmp_path / "src.json"
    tokenizer.write_text('{"version": "1.0"}')
    model = make_model(dense_config())
    out = tmp_path / "hf"
    export_hf(model, out, tokenizer_json=tokenizer, max_shard_bytes=20_000)
    assert (out / "tokenizer.json").read_text() == '{"version": "1.0"}'
    assert (out / "model.safetensors.index.json").exists()
    assert_parity(model, load_hf(out), random_ids(97))


REFUSALS = [
    ({"capacity_factor": 1.25}, "MoEConfig.capacity_factor = 1.25 cannot be exported"),
    ({"router_temperature": 0.5}, "MoEConfig.router_temperature = 0.5 cannot be exported"),
    ({"norm_topk": False}, "MoEConfig.norm_topk = False cannot be exported"),
    ({"bias_update_rate": 0.001}, "MoEConfig.bias_update_rate = 0.001 cannot be exported"),
    ({"n_shared_experts": 1}, "MoEConfig.n_shared_experts = 1 cannot be exported"),
]


@pytest.mark.parametrize("moe_fields,message", REFUSALS, ids=[next(iter(f)) for f, _ in REFUSALS])
def test_inexpressible_moe_configs_are_refused(
    tmp_path, make_model, moe_config, moe_fields, message
):
    model = make_model(moe_config(**moe_fields))
    with pytest.raises(ValueError, match=message):
        export_hf(model, tmp_path)
    assert not (tmp_path / "config.json").exists()


@pytest.mark.parametrize("preset", ["tiny-mod", "tiny-hybrid"])
def test_mod_families_are_refused(tmp_path, make_model, preset):
    model = make_model(ats_model.presets.get(preset))
    with pytest.raises(ValueError, match=r"ModelConfig.family = '(mod|hybrid)' cannot be exported"):
        export_hf(model, tmp_path)


@pytest.mark.parametrize(
    "knob,value,message",
    [
        ("capacity_factor", 2.0, r"moe_layers\(\)\[1\].capacity_factor = 2.0 cannot be exported"),
        ("temperature", 0.7, r"moe_layers\(\)\[1\].temperature = 0.7 cannot be exported"),
        ("top_k", 3, r"moe_layers\(\)\[1\].top_k = 3 cannot be exported"),
        ("norm_topk", False, r"moe_layers\(\)\[1\].norm_topk = False cannot be exported"),
        ("bias_update_rate", 0.01, r"moe_layers\(\)\[1\].bias_update_rate = 0.01 cannot"),
    ],
)
def test_runtime_knobs_changed_after_build_are_refused(
    tmp_path, make_model, moe_config, knob, value, message
):
    model = make_model(moe_config())
    assert hasattr(model.moe_layers()[1], knob)  # the contract's name, not a new attribute
    setattr(model.moe_layers()[1], knob, value)
    with pytest.raises(ValueError, match=message):
        export_hf(model, tmp_path)


def test_nonzero_expert_bias_is_refused(tmp_path, make_model, moe_config):
    model = make_model(moe_config())
    with torch.no_grad():
        model.moe_layers()[0].expert_bias[2] = 0.5
    with pytest.raises(ValueError, match=r"moe_layers\(\)\[0\].expert_bias = 'nonzero' cannot"):
        export_hf(model, tmp_path)
