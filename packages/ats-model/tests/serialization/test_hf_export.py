"""export_hf against the outside oracle: HF transformers loads the export with no extra code and
no missing/unexpected weights, and its Llama/Mixtral logits match ATS's within 1e-4 (fp32, CPU).
Configurations HF cannot express are refused naming the field and value."""

import json

import ats_model
import pytest
import torch
import transformers
from ats_model.config import RopeScaling
from ats_model.serialization import export_hf
from safetensors import safe_open

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
