"""train.trainable = lora | routers: only the adapter's parameters change, resume is bitwise exact,
run_dir/adapter holds the adapter alone and run_dir/model is the base architecture with it merged."""

import shutil
from pathlib import Path

import pytest
import torch
from ats_model import build_model, load_pretrained, presets
from ats_model.adapters import load_adapter, read_adapter_config
from ats_model.adapters.files import ADAPTER_TENSORS
from ats_train.adapters.trainable import apply_trainable
from ats_train.checkpoint import LATEST, checkpoints_dir
from ats_train.cli import main
from ats_train.config import load_config
from safetensors.torch import load_file

LORA = {"train__trainable": "lora", "lora__rank": 2, "lora__alpha": 4.0,
        "lora__targets": '["wq","wv","w1","w2","router"]'}  # fmt: skip


def _checkpoint(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(checkpoints_dir(run_dir) / f"step-{step:06d}" / "model.safetensors"))


def test_lora_run_trains_only_the_adapter_and_resumes_exactly(
    overrides, tmp_path: Path, assert_same_run
) -> None:
    args = overrides(**LORA)
    ref = tmp_path / "ref"
    assert main(["--run-dir", str(ref), *args]) == 0
    early, late = _checkpoint(ref, 4), _checkpoint(ref, 6)  # keep_last = 2
    assert any("lora" in k for k in late)
    for name in late:
        changed = not torch.equal(early[name], late[name])
        assert changed == ("lora" in name), name
    # the adapter alone, and the model directory is the base architecture with it merged
    adapter = ref / "adapter"
    assert read_adapter_config(adapter)["lora"]["targets"] == ["wq", "wv", "w1", "w2", "router"]
    held = load_file(str(adapter / ADAPTER_TENSORS))
    assert set(held) == {k for k in late if "lora" in k}
    merged = load_pretrained(ref / "model", dtype=torch.float64)
    base = load_pretrained(ref / "model", dtype=torch.float64)
    base.load_state_dict({k: v for k, v in late.items() if "lora" not in k})
    load_adapter(base, adapter)
    idx = torch.randint(0, 64, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(merged(idx).logits, base(idx).logits, rtol=1e-5, atol=1e-5)
    # killed after step 4: the resumed run ends bitwise where the uninterrupted one did
    resumed = tmp_path / "resumed"
    shutil.copytree(ref, resumed)
    shutil.rmtree(resumed / "model")
    shutil.rmtree(resumed / "adapter")
    shutil.rmtree(checkpoints_dir(resumed) / "step-000006")
    (checkpoints_dir(resumed) / LATEST).write_text("step-000004\n")
    assert main(["--run-dir", str(resumed), *args]) == 0
    assert_same_run(ref, resumed)
    again = load_file(str(resumed / "adapter" / ADAPTER_TENSORS))
    assert all(torch.equal(held[k], again[k]) for k in held)


def test_router_run_trains_only_the_routers(overrides, tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main(["--run-dir", str(run), *overrides(train__trainable="routers")]) == 0
    early, late = _checkpoint(run, 4), _checkpoint(run, 6)
    for name in late:
        changed = not torch.equal(early[name], late[name])
        assert changed == name.endswith(".router.weight"), name
    held = load_file(str(run / "adapter" / ADAPTER_TENSORS))
    assert set(held) == {k for k in late if k.endswith(".router.weight")}
    assert all(torch.equal(held[k], late[k]) for k in held)


def test_trainable_counts_are_the_adapters(overrides) -> None:
    config = load_config(None, overrides(**LORA))
    model = build_model(presets.get("tiny-hybrid"))
    line = apply_trainable(model, config)
    trainable = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora" in n for n in trainable)
    total = sum(p.numel() for p in model.parameters())
    assert line == (
        f"trainable: lora, {sum(trainable.values()):,} of {total:,} parameters "
        f"({sum(trainable.values()) / total:.2%})"
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"lora__rank": 4}, "lora.* is set but train.trainable = 'all'"),
        ({"train__trainable": "routers", "model__preset": "tiny-dense"}, "needs an MoE model"),
        ({"train__trainable": "lora", "lora__targets": '["q_proj"]'}, "lora.targets"),
        ({"train__trainable": "lora", "lora__dropout": 0.1, "lora__targets": '["w1"]'},
         "weight form"),
    ],
)  # fmt: skip
def test_bad_settings_exit_2_before_the_run_dir_changes(
    overrides, tmp_path: Path, capsys, extra: dict, message: str
) -> None:
    run = tmp_path / "run"
    assert main(["--run-dir", str(run), *overrides(**extra)]) == 2
    assert message in capsys.readouterr().err
    assert not run.exists() or not any(run.iterdir())
