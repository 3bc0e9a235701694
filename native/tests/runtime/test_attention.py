"""Prefill attention on every kernel set against ats-model (the oracle): runs of prompt rows take
the transposed-key path (the set's vecmat over keys and over head dimensions, its softmax;
attention.cpp), single rows the per-key dots; prompts long enough for several runs of rows, MoD
layers with skipped key slots, and head dimensions below, at and past one 64-wide vecmat block
(and not a whole number of the 16 x 16 tiles the AVX-512 set transposes keys in)."""

import ats_native
import numpy as np
import pytest
import torch
from kernel_sets import kernel_params

REL_TOL = 1e-4  # as test_parity.py


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def reference_logits(model: torch.nn.Module, ids: torch.Tensor) -> np.ndarray:
    with torch.no_grad():  # MoD layers decide with the causal predictor, as the runtime does
        return model(ids, causal_routing=True).logits.float().numpy()


# head_dim given explicitly: a preset's resolved head_dim (dim // n_head) survives
# dataclasses.replace, so changing dim and n_head alone keeps the preset's 16
SHAPES = {
    "hd16": ("tiny-dense", {}),  # head_dim 16, GQA group 2
    # 16 + 8: a partial tile of the transpose
    "hd24": ("tiny-dense", {"dim": 48, "n_head": 2, "n_kv_head": 1, "head_dim": 24}),
    # group 2, 64 + 16 tail
    "hd80": ("tiny-dense", {"dim": 160, "n_head": 2, "n_kv_head": 1, "head_dim": 80}),
    # skipped key slots
    "hd64-mod": ("tiny-mod", {"dim": 128, "n_head": 2, "n_kv_head": 2, "head_dim": 64}),
}


@pytest.mark.parametrize("kernels", kernel_params())
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_prefill_attention_matches_ats_model(saved_model, kernels: str, shape: str) -> None:
    preset, changes = SHAPES[shape]
    model, directory = saved_model(preset, **changes)
    native = ats_native.Model(str(directory), threads=2, kernels=kernels)
    # 140 rows: runs of 64, 64 and 12 rows per sequence (keys transposed in 16-key tiles, the
    # last one partial); 3 rows: the single-row path
    for length in (140, 3):
        ids = torch.randint(
            0, model.config.vocab_size, (2, length), generator=torch.Generator().manual_seed(3)
        )
        ref = reference_logits(model, ids)
        got = native.logits(ids.numpy())
        assert rel_err(got, ref) < REL_TOL, (kernels, shape, length)
