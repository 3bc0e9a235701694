"""`ats-train merge-adapter`: the merged directory gives the adapted model's logits, in the base
model's dtype, and the command never writes over or into an input."""

import hashlib
from pathlib import Path

import pytest
import torch
from ats_model import ModelConfig, MoEConfig, build_model, load_pretrained, save_pretrained
from ats_model.adapters import LoRAConfig, apply_lora, save_adapter
from ats_train.cli import main


def _tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path, torch.Tensor, torch.Tensor]:
    """(model dir, adapter dir, token ids, the adapted model's logits on them)."""
    torch.manual_seed(0)
    config = ModelConfig(
        family="moe", vocab_size=31, dim=16, n_layer=2, n_head=2, n_kv_head=1, ffn_dim=24,
        max_seq_len=32, moe=MoEConfig(n_experts=4, top_k=2),
    )  # fmt: skip
    model = build_model(config)
    save_pretrained(model, tmp_path / "base")
    lora = LoRAConfig(rank=2, alpha=2.0, targets=("wq", "wo", "w1", "w2", "router"))
    apply_lora(model, lora)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora" in name:
                p.normal_(0, 0.2)
    save_adapter(model, tmp_path / "adapter", "lora", lora)
    idx = torch.randint(0, 31, (2, 9))
    with torch.no_grad():
        logits = model(idx).logits
    return tmp_path / "base", tmp_path / "adapter", idx, logits


def test_merged_directory_gives_the_adapted_logits(dirs, tmp_path: Path, capsys) -> None:
    base, adapter, idx, expected = dirs
    before = {**_tree_digest(base), **_tree_digest(adapter)}
    out = tmp_path / "merged"
    assert main(["merge-adapter", "--model", str(base), "--adapter", str(adapter),
                 "--out", str(out)]) == 0  # fmt: skip
    assert f"wrote {out}" in capsys.readouterr().out
    merged = load_pretrained(out)
    assert {p.dtype for p in merged.parameters()} == {torch.float32}
    with torch.no_grad():
        torch.testing.assert_close(merged(idx).logits, expected, rtol=1e-5, atol=1e-5)
    assert {**_tree_digest(base), **_tree_digest(adapter)} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "base", "merged"]


@pytest.mark.parametrize("target", ["base", "adapter", "base/sub", "existing"])
def test_never_writes_over_or_into_an_input(dirs, tmp_path: Path, capsys, target: str) -> None:
    base, adapter, _, _ = dirs
    (tmp_path / "existing").mkdir()
    before = _tree_digest(tmp_path)
    code = main(["merge-adapter", "--model", str(base), "--adapter", str(adapter),
                 "--out", str(tmp_path / target)])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("ats-train merge-adapter: error: --out") and err.count("\n") == 1
    assert _tree_digest(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "base", "existing"]


def test_adapter_for_another_model_exits_2_naming_the_field(dirs, tmp_path: Path, capsys) -> None:
    _, adapter, _, _ = dirs
    other = build_model(
        ModelConfig(
            family="dense",
            vocab_size=31,
            dim=8,
            n_layer=2,
            n_head=2,
            n_kv_head=1,
            ffn_dim=12,
            max_seq_len=32,
        )  # fmt: skip
    )
    save_pretrained(other, tmp_path / "other")
    code = main(["merge-adapter", "--model", str(tmp_path / "other"), "--adapter", str(adapter),
                 "--out", str(tmp_path / "merged")])  # fmt: skip
    assert code == 2
    assert "adapter made for family = 'moe', this model has family = 'dense'" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "merged").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
