"""Compiled blocks and grad-mode changes: training steps and evaluation (no_grad) each compile once,
and later train / eval cycles reuse those graphs instead of recompiling.

Dynamo keeps one cache per code object (Block.forward), shared by every model in the process and
limited to torch._dynamo.config.recompile_limit (8) entries; past it the blocks run eager without
an error. A model's blocks take one entry per (grad mode, first block or not: the first block gets
no pending residual add): 4. benchmarks/fp8.py trained bf16, tensorwise and rowwise models in one
process, 12 entries, and the third (rowwise) ran eager at 0.31x bf16; the benchmarks now reset
dynamo between models and fail on the limit. These tests pin the per-model count and that a
second train / eval cycle compiles nothing. On the CPU the backend is dynamo's "eager" (what is
guarded and recompiled is decided by dynamo before any backend runs; Inductor on CPU would take
minutes); the gpu test runs float8 with Inductor.
"""

import functools

import pytest
import torch
import torch._dynamo
from ats_model import build_model, presets
from ats_model.layers.attention import Attention
from ats_model.layers.block import Block
from ats_model.layers.ffn import SwiGLUFFN
from ats_model.layers.norm import RMSNorm
from ats_train.build import build_trainer
from ats_train.config import TrainSection, load_config
from ats_train.training_wrappers import apply_training_wrappers
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

# graphs of Block.forward a model may need: 2 grad modes x (first block, the others)
ENTRIES_PER_MODEL = 4


@pytest.fixture
def eager_compile(monkeypatch: pytest.MonkeyPatch):
    """nn.Module.compile with dynamo's eager backend, on a fresh dynamo cache, failing on any
    hit of the recompile limit instead of running eager."""
    monkeypatch.setattr(
        torch.nn.Module,
        "compile",
        functools.partialmethod(torch.nn.Module.compile, backend="eager"),
    )
    torch._dynamo.reset()
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        yield
    torch._dynamo.reset()


def _block_entries() -> int:
    return len(_debug_get_cache_entry_list(Block.forward.__code__))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_trainer_train_and_validate_compile_once_per_grad_mode(
    overrides, tmp_path, eager_compile, precision: str
) -> None:
    """Trainer.train_step (grad on) and Trainer.validate (no_grad) alternate; only the first cycle
    compiles (bf16: under autocast in both, as on the GPU)."""
    config = load_config(
        None,
        overrides(
            model__preset="tiny-dense", train__precision=precision, train__compile=True,
            train__steps=4, checkpoint__every=0, train__eval_every=0,
        ),
    )  # fmt: skip
    with build_trainer(config, tmp_path) as trainer:
        trainer.train_step()
        trainer.validate()
        warm = _block_entries()
        assert 2 <= warm <= ENTRIES_PER_MODEL, f"Block.forward has {warm} compiled entries"
        with torch._dynamo.config.patch(error_on_recompile=True):
            for _ in range(2):
                trainer.train_step()
                trainer.validate()
        assert _block_entries() == warm


def _fp8_train_eval_cycles(recipe: str, device: str) -> None:
    """A training step and a no_grad forward of a compiled float8 tiny model, twice; the second
    cycle must compile nothing."""
    torch.manual_seed(0)
    model = build_model(presets.get("tiny-dense"), device=torch.device(device), kernels="reference")
    apply_training_wrappers(model, TrainSection(precision="fp8", fp8_recipe=recipe, compile=True))
    x = torch.randint(0, model.config.vocab_size, (2, 32), device=device)  # (B, T)

    def cycle() -> None:
        with torch.autocast(device, dtype=torch.bfloat16):
            model(x, targets=x.roll(-1, dims=1)).loss.backward()
            with torch.no_grad():
                model(x, targets=x.roll(-1, dims=1))

    cycle()
    warm = _block_entries()
    assert 2 <= warm <= ENTRIES_PER_MODEL, f"Block.forward has {warm} compiled entries"
    with torch._dynamo.config.patch(error_on_recompile=True):
        cycle()
    assert _block_entries() == warm


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_blocks_compile_once_per_grad_mode(recipe: str, eager_compile) -> None:
    """torchao's Float8Linear (its casts run under no_grad inside the block) in compiled blocks."""
    _fp8_train_eval_cycles(recipe, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_blocks_compile_once_per_grad_mode_with_inductor_on_cuda(recipe: str) -> None:
    """The same with Inductor and torch._scaled_mm on an FP8 GPU (compute capability >= 8.9)."""
    torch._dynamo.reset()
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        _fp8_train_eval_cycles(recipe, "cuda")
    torch._dynamo.reset()


def test_mod_model_compiles_its_plain_blocks_whole(eager_compile) -> None:
    """A MoD model's unrouted blocks are dense blocks: one whole-block graph, shared with nothing
    else; only the routed blocks' attention, norm and FFN compile on their own (4 graphs for a
    training step, where compiling every block in parts took 7)."""
    torch.manual_seed(0)
    model = build_model(presets.get("tiny-mod"), dtype=torch.float32, kernels="reference")
    assert [type(b).__name__ for b in model.layers] == ["Block", "MoDBlock"]
    apply_training_wrappers(model, TrainSection(precision="fp32", compile=True))
    x = torch.randint(0, model.config.vocab_size, (4, 64))  # (B, T)
    out = model(x, targets=x.roll(-1, dims=1))
    (out.loss + sum(out.aux.values())).backward()
    counts = {
        cls.__name__: len(_debug_get_cache_entry_list(cls.forward.__code__))
        for cls in (Block, Attention, RMSNorm, SwiGLUFFN)
    }
    assert counts == {"Block": 1, "Attention": 1, "RMSNorm": 1, "SwiGLUFFN": 1}
