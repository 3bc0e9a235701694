"""import_hf: an export comes back bit for bit; models made and saved by transformers itself
(classic and fused Mixtral expert layouts) import with matching logits; HF features ATS lacks and
inconsistent checkpoints are refused with the key named."""

import json

import pytest
import torch
import transformers
from ats_model.serialization import export_hf, import_hf
from safetensors.torch import load_file, save_file

PARITY_ATOL = 1e-4


def assert_bitwise_equal(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for key, t in sa.items():
        assert t.dtype == sb[key].dtype and torch.equal(t, sb[key]), key


@pytest.mark.parametrize(
    "overrides", [{}, {"n_kv_head": 4, "tie_embeddings": True}], ids=["gqa", "tied"]
)
def test_dense_export_import_is_bitwise(tmp_path, make_model, dense_config, overrides):
    model = make_model(dense_config(**overrides))
    export_hf(model, tmp_path)
    imported = import_hf(tmp_path)
    assert imported.config == model.config
    assert_bitwise_equal(model, imported)


def test_moe_export_import_is_bitwise(tmp_path, make_model, moe_config, random_ids):
    model = make_model(moe_config())
    export_hf(model, tmp_path, max_shard_bytes=10_000)  # sharded on the way
    imported = import_hf(tmp_path)
    assert imported.config == model.config
    assert_bitwise_equal(model, imported)
    ids = random_ids(97)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, imported.eval()(ids).logits)


def test_bf16_export_imports_as_bf16(tmp_path, make_model, moe_config):
    model = make_model(moe_config(), dtype=torch.bfloat16)
    export_hf(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    imported = import_hf(tmp_path)
    assert imported.tok_embeddings.weight.dtype == torch.bfloat16
    assert_bitwise_equal(model, imported)


def _hf_llama(tmp_path) -> transformers.PreTrainedModel:
    config = transformers.LlamaConfig(
        vocab_size=61, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=32,
        rms_norm_eps=1e-5, rope_theta=20000.0, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def _hf_mixtral() -> transformers.PreTrainedModel:
    config = transformers.MixtralConfig(
        vocab_size=61, hidden_size=24, intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        num_local_experts=3, num_experts_per_tok=2, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # HF inits norms to 1; move them so a swap would show
            p.add_(0.05 * torch.randn_like(p))
    return model


def _assert_logits_match(ats, hf, vocab_size) -> None:
    ids = torch.randint(0, vocab_size, (2, 19), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        diff = (ats.eval()(ids).logits - hf(ids).logits).abs().max().item()
    assert diff < PARITY_ATOL


@pytest.mark.parametrize("make_hf", [_hf_llama, lambda _: _hf_mixtral()], ids=["llama", "mixtral"])
def test_transformers_saved_models_import_with_matching_logits(tmp_path, make_hf):
    hf = make_hf(tmp_path)
    hf.save_pretrained(tmp_path)
    ats = import_hf(tmp_path)
    assert ats.config.family == ("moe" if hf.config.model_type == "mixtral" else "dense")
    _assert_logits_match(ats, hf, hf.config.vocab_size)


def test_fused_mixtral_expert_layout_imports(tmp_path):
    """transformers 5.x keeps experts fused in memory (gate_up_proj, down_proj); a raw state dict
    written in that layout imports too."""
    hf = _hf_mixtral()
    state = {k: v.contiguous() for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    hf.config.save_pretrained(tmp_path)
    _assert_logits_match(import_hf(tmp_path), hf, hf.config.vocab_size)


def test_missing_expert_is_named(tmp_path, make_model, moe_config):
    export_hf(make_model(moe_config()), tmp_path)
    path = tmp_path / "model.safetensors"
    state = load_file(str(path))
    del state["model.layers.1.block_sparse_moe.experts.2.w3.weight"]
    save_file(state, str(path), metadata={"format": "pt"})
    with pytest.raises(
        ValueError, match="missing tensor model.layers.1.block_sparse_moe.experts.2.w3"
    ):
        import_hf(tmp_path)


def _edit_config(directory, **changes) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            del config[key]
        else:
            config[key] = value
    path.write_text(json.dumps(config))


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"model_type": "gpt2"}, "config.json: model_type = 'gpt2' cannot be imported"),
        ({"hidden_act": "gelu"}, "config.json: hidden_act = 'gelu' cannot be imported"),
        ({"sliding_window": 16}, "config.json: sliding_window = 16 cannot be imported"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "rope type 'yarn' cannot be"),
        ({"num_attention_heads": None}, "config.json: missing key 'num_attention_heads'"),
        ({"num_key_value_heads": 3}, "n_kv_head = 3 is invalid: expected a divisor of n_head"),
        ({"intermediate_size": 30}, "block_sparse_moe.experts.0.w1.weight has shape"),
        ({"num_local_experts": 5}, r"gate.weight has shape \(4, 32\), expected \(5, 32\)"),
    ],
)
def test_bad_configs_are_refused(tmp_path, make_model, moe_config, changes, message):
    export_hf(make_model(moe_config()), tmp_path)
    _edit_config(tmp_path, **changes)
    with pytest.raises(ValueError, match=message):
        import_hf(tmp_path)


@pytest.mark.parametrize(
    "edit,message",
    [
        (
            lambda s: s.pop("model.norm.weight"),
            "model.safetensors: missing tensor model.norm.weight",
        ),
        (
            lambda s: s.update({"model.layers.0.self_attn.q_proj.bias": torch.zeros(32)}),
            "model.safetensors: unexpected tensor model.layers.0.self_attn.q_proj.bias",
        ),
        (
            lambda s: s.update({"model.layers.1.mlp.up_proj.weight": torch.zeros(48, 30)}),
            r"model.layers.1.mlp.up_proj.weight has shape \(48, 30\), expected \(48, 32\)",
        ),
        (
            lambda s: s.update({"lm_head.weight": s["lm_head.weight"].half()}),
            r"tensors have dtypes \['float16', 'float32'\]; expected one",
        ),
    ],
    ids=["missing", "unexpected", "shape", "dtype"],
)
def test_bad_tensors_are_refused(tmp_path, make_model, dense_config, edit, message):
    export_hf(make_model(dense_config()), tmp_path)
    path = tmp_path / "model.safetensors"
    state = load_file(str(path))
    edit(state)
    save_file(state, str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=message):
        import_hf(tmp_path)


def test_a_huge_layer_count_is_refused_before_a_model_is_built(tmp_path, make_model, dense_config):
    """Issue 22: the import built every layer config.json asks for before checking tensors."""
    export_hf(make_model(dense_config()), tmp_path)
    _edit_config(tmp_path, num_hidden_layers=100_000)
    with pytest.raises(ValueError, match="n_layer = 100000 does not match the tensors"):
        import_hf(tmp_path)
