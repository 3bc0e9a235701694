"""Adapter directories: a round trip gives the same logits, the files hold only the adapter, and
an adapter for another model shape, or a tampered one, is refused before the model changes."""

import json

import pytest
import torch
from ats_model import build_model
from ats_model.adapters import (
    LoRAConfig,
    apply_lora,
    load_adapter,
    merge_adapter_into,
    save_adapter,
)
from ats_model.adapters.files import ADAPTER_CONFIG, ADAPTER_TENSORS, router_state_dict
from safetensors import safe_open


def _model(make_config, family: str = "moe", seed: int = 0, **kw):
    torch.manual_seed(seed)
    return build_model(make_config(family, **kw), dtype=torch.float64)


def _adapted(make_config, targets=("wq", "wo", "w1", "w2", "router")):
    model = _model(make_config)
    lora = LoRAConfig(rank=2, alpha=3.0, targets=targets)
    apply_lora(model, lora)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora" in name:
                p.normal_(0, 0.3)
    return model, lora


def test_round_trip_gives_the_same_logits_and_holds_only_the_adapter(make_config, tmp_path):
    model, lora = _adapted(make_config)
    idx = torch.randint(0, 23, (2, 6))
    with torch.no_grad():
        expected = model(idx).logits
    out = save_adapter(model, tmp_path / "adapter", "lora", lora)
    assert sorted(p.name for p in out.iterdir()) == [ADAPTER_CONFIG, ADAPTER_TENSORS]
    with safe_open(str(out / ADAPTER_TENSORS), framework="pt") as f:
        names = list(f.keys())
    assert names and all("lora" in n for n in names)
    fresh = _model(make_config)  # the same base weights (seed 0)
    meta = load_adapter(fresh, out)
    assert meta["lora"] == lora.to_dict()
    with torch.no_grad():
        torch.testing.assert_close(fresh(idx).logits, expected, rtol=0, atol=0)
    merged = merge_adapter_into(_model(make_config), out)
    with torch.no_grad():
        torch.testing.assert_close(merged(idx).logits, expected, rtol=1e-10, atol=1e-10)


def test_adapter_for_another_shape_is_refused_naming_the_field(make_config, tmp_path):
    model, lora = _adapted(make_config)
    out = save_adapter(model, tmp_path / "adapter", "lora", lora)
    other = _model(make_config, dim=16, n_head=4, n_kv_head=2)
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(ValueError, match="adapter made for dim = 8, this model has dim = 16"):
        load_adapter(other, out)
    assert all(torch.equal(before[k], v) for k, v in other.state_dict().items())
    assert not any("lora" in k for k in other.state_dict())


def test_tampered_adapter_is_refused_naming_the_tensor(make_config, tmp_path):
    model, lora = _adapted(make_config)
    out = save_adapter(model, tmp_path / "adapter", "lora", lora)
    meta = json.loads((out / ADAPTER_CONFIG).read_text())
    meta["lora"]["rank"] = 4  # the tensors hold rank 2
    (out / ADAPTER_CONFIG).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"lora_A has shape \(2, 8\), this model needs \(4, 8\)"):
        load_adapter(_model(make_config), out)
    (out / ADAPTER_CONFIG).write_text("{not json")
    with pytest.raises(ValueError, match="invalid JSON"):
        load_adapter(_model(make_config), out)
    with pytest.raises(FileNotFoundError, match="no adapter_config.json"):
        load_adapter(_model(make_config), tmp_path)


def test_router_adapter_replaces_only_the_routers(make_config, tmp_path):
    tuned = _model(make_config)
    with torch.no_grad():
        for w in router_state_dict(tuned).values():
            w.normal_(0, 1.0)
    out = save_adapter(tuned, tmp_path / "routers", "routers")
    with safe_open(str(out / ADAPTER_TENSORS), framework="pt") as f:
        assert sorted(f.keys()) == ["layers.0.ffn.router.weight", "layers.1.ffn.router.weight"]
    base = _model(make_config)
    load_adapter(base, out)
    for k, v in tuned.state_dict().items():
        assert torch.equal(base.state_dict()[k], v), k
    with pytest.raises(ValueError, match="no MoE router"):
        save_adapter(_model(make_config, "dense"), tmp_path / "none", "routers")


def test_save_never_replaces_a_directory_that_is_not_an_adapter(make_config, tmp_path):
    model, lora = _adapted(make_config)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="not an adapter directory"):
        save_adapter(model, tmp_path / "taken", "lora", lora)
    assert (tmp_path / "taken" / "notes.txt").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]  # no temp left behind
