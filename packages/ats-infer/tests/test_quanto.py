"""optimum-quanto directories (quanto_dir.py): quantize -> save -> reload through the torch
engine gives logits close to the float model's (bounds per qtype below), every MoE expert is a
quanto layer while routers stay float, the native engine and the other commands refuse them."""

import json
import math

import numpy as np
import pytest
from ats_infer.engine import engine_for, load_engine
from ats_infer.quantize import quantize_model_dir
from ats_infer.tensor_files import load_tensors

pytest.importorskip("optimum.quanto")
from ats_infer.quanto_dir import quanto_model_dir  # noqa: E402

# int4's first use in a fresh environment JIT-builds quanto's C++ unpack extension (~2 min on 2
# loaded cores; then cached beside the installed package): slow, so `-m "not slow"` skips it
INT4 = pytest.param(4, 1.25, None, marks=pytest.mark.slow)


@pytest.mark.parametrize(("bits", "max_ppl_ratio", "min_top1"), [(8, 1.01, 0.99), INT4])
def test_trained_model_round_trip(
    trained_dense_dir, held_out_ids, oracle, tmp_path, bits, max_ppl_ratio, min_top1
) -> None:
    """int8: perplexity within 1% and top-1 >= 99% (RTN int8's bars); int4: within 25% (quanto's
    qint4 falls back to one scale and shift per row on this model's 64-wide rows)."""
    ids = held_out_ids[:, :-1]
    ref = oracle.torch_logits(trained_dense_dir, load_tensors(trained_dense_dir), ids)
    out = quanto_model_dir(trained_dense_dir, tmp_path / "q", bits)
    spec = json.loads((out / "quanto.json").read_text())
    assert spec["weights"] == f"qint{bits}" and "layers.0.attn.wq" in spec["map"]
    engine = load_engine(out, "torch")
    logits = engine.logits(ids)
    ppl, ref_ppl = oracle.perplexity(logits, held_out_ids), oracle.perplexity(ref, held_out_ids)
    assert 0 < ppl <= ref_ppl * max_ppl_ratio, (ppl, ref_ppl)
    assert not np.array_equal(logits, ref)  # the weights really are quantized
    if min_top1 is not None:
        assert oracle.top1_agreement(logits, ref) >= min_top1
    text = "".join(
        engine.generate(
            "def ", max_new_tokens=8, temperature=0.0, top_k=None, top_p=None, seed=0, stop=[]
        )
    )
    assert isinstance(text, str)


@pytest.mark.parametrize("preset", ["tiny-moe", "tiny-hybrid"])
def test_moe_and_hybrid_every_expert_quantized(make_model_dir, oracle, tmp_path, preset) -> None:
    moe_dir = make_model_dir(preset, tie_embeddings=False)
    out = quanto_model_dir(moe_dir, tmp_path / "q", 8)
    qmap = json.loads((out / "quanto.json").read_text())["map"]
    n_experts = json.loads((moe_dir / "config.json").read_text())["moe"]["n_experts"]
    for layer in range(2):
        for key in ("w1", "w2", "w3"):
            for e in range(n_experts):
                assert qmap[f"layers.{layer}.ffn.experts.{key}.{e}"]["weights"] == "qint8"
        assert f"layers.{layer}.ffn.router" not in qmap
    assert not any("mod_" in name for name in qmap)  # MoD routers and predictors stay float
    ids = np.random.default_rng(0).integers(0, 512, (2, 24))
    ref = oracle.torch_logits(moe_dir, load_tensors(moe_dir), ids)
    got = load_engine(out, "torch").logits(ids)
    assert np.abs(got - ref).max() <= 2e-2 * np.abs(ref).max()


def test_refusals(dense_dir, tmp_path) -> None:
    out = quanto_model_dir(dense_dir, tmp_path / "q", 8)
    assert engine_for(out, "auto") == "torch"
    with pytest.raises(ValueError, match="optimum-quanto directory .* torch engine only"):
        load_engine(out, "native")
    for call in (
        lambda: quanto_model_dir(out, tmp_path / "again", 8),
        lambda: quantize_model_dir(out, tmp_path / "again", 8),
    ):
        with pytest.raises(ValueError, match="already quantized"):
            call()
    with pytest.raises(ValueError, match="bits = 3"):
        quanto_model_dir(dense_dir, tmp_path / "b", 3)
    q8 = quantize_model_dir(dense_dir, tmp_path / "q8", 8)
    with pytest.raises(ValueError, match="already quantized"):
        quanto_model_dir(q8, tmp_path / "c", 8)
    assert not any(
        p.name.startswith((".again", ".b", ".c", "again", "b", "c")) for p in tmp_path.iterdir()
    )
    assert math.isfinite(load_engine(out, "auto").logits(np.array([[1, 2, 3]])).sum())
