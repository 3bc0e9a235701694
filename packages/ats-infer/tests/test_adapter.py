"""--adapter: the torch engine applies an adapter without merging and then decodes exactly what the
merged model decodes; native, quantized and mismatched models are refused with what to do."""

from pathlib import Path

import pytest
import torch
from ats_infer.cli import main
from ats_infer.engine import load_engine
from ats_model import load_pretrained, save_pretrained
from ats_model.adapters import LoRAConfig, apply_lora, merge_lora, save_adapter


@pytest.fixture(scope="module")
def lora_dirs(moe_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(adapter dir for moe_dir, the merged model dir): a LoRA with random, non-zero B."""
    root = tmp_path_factory.mktemp("adapter")
    model = load_pretrained(moe_dir)
    lora = LoRAConfig(rank=4, alpha=8.0, targets=("wq", "wv", "w1", "w2", "router"))
    apply_lora(model, lora)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    save_adapter(model, root / "adapter", "lora", lora)
    save_pretrained(merge_lora(model), root / "merged", tokenizer_json=moe_dir / "tokenizer.json")
    return root / "adapter", root / "merged"


def _greedy(engine, prompt: str = "def main(") -> str:
    pieces = engine.generate(prompt, max_new_tokens=24, temperature=0.0, seed=0)
    return "".join(pieces)


def test_adapter_decodes_as_the_merged_model(moe_dir: Path, lora_dirs) -> None:
    adapter, merged = lora_dirs
    with_adapter = load_engine(moe_dir, "torch", adapter=adapter)
    ids = torch.randint(0, 500, (2, 16)).numpy()
    merged_engine = load_engine(merged, "torch")
    torch.testing.assert_close(
        torch.from_numpy(with_adapter.logits(ids)),
        torch.from_numpy(merged_engine.logits(ids)),
        rtol=1e-4,
        atol=1e-4,
    )
    base = load_engine(moe_dir, "torch")
    assert not torch.allclose(
        torch.from_numpy(with_adapter.logits(ids)), torch.from_numpy(base.logits(ids)), atol=1e-2
    )
    assert _greedy(with_adapter) == _greedy(merged_engine)


def test_generate_cli_takes_an_adapter(moe_dir: Path, lora_dirs, capsys) -> None:
    adapter, merged = lora_dirs
    common = ["--prompt", "import ", "--temperature", "0", "--max-new-tokens", "12"]
    assert main(["generate", str(moe_dir), "--engine", "torch", "--adapter", str(adapter),
                 *common]) == 0  # fmt: skip
    with_adapter = capsys.readouterr().out
    assert main(["generate", str(merged), "--engine", "torch", *common]) == 0
    assert capsys.readouterr().out == with_adapter


def test_native_engine_refuses_an_adapter_saying_what_to_do(moe_dir: Path, lora_dirs, capsys):
    adapter, _ = lora_dirs
    code = main(["generate", str(moe_dir), "--engine", "native", "--adapter", str(adapter),
                 "--prompt", "x"])  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err
    assert "--adapter runs on the torch engine only" in err and "merge-adapter" in err


def test_adapter_for_another_model_is_refused(dense_dir: Path, lora_dirs, capsys) -> None:
    adapter, _ = lora_dirs
    code = main(["generate", str(dense_dir), "--engine", "torch", "--adapter", str(adapter),
                 "--prompt", "x"])  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err
    assert "adapter made for family = 'moe', this model has family = 'dense'" in err
