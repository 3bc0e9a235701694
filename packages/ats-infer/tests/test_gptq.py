"""GPTQ (gptq.py, gptq_model.py): the lazy-batch Cholesky algorithm against a direct
transcription of the paper's column-by-column OBS update on a small layer, RTN as its identity
Hessian case, lower layer error than RTN, and whole directories: quality on a trained model, MoE,
hybrid, refusals."""

import copy
import dataclasses
import json
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch
from ats_infer.gptq import SHRINK, gptq_quantize
from ats_infer.gptq_model import BATCH, gptq_model, gptq_model_dir
from ats_infer.quantize import dequantize_tensors, quantize_int4, quantize_int8, quantize_model_dir
from ats_infer.tensor_files import load_tensors
from ats_model import build_model, presets

QMAX, QMIN = {8: 127, 4: 7}, {8: -127, 4: -8}


def searched_scale(w, h_diag, bits, shrink):
    """Row by row, factor by factor: the scale f * max|row| / qmax whose round-to-nearest codes
    leave the least sum_j h_diag_j (w_j - q_j s)^2 (the first such factor)."""
    out = torch.zeros(w.shape[0], dtype=torch.float64)
    for r in range(w.shape[0]):
        errors = []
        for f in shrink:
            s = f * w[r].abs().max() / QMAX[bits]
            q = torch.clamp(torch.round(w[r] / s), QMIN[bits], QMAX[bits])
            errors.append(float((h_diag * (w[r] - q * s) ** 2).sum()))
        out[r] = shrink[errors.index(min(errors))] * w[r].abs().max() / QMAX[bits]
    return out


def obs_transcription(W, H, bits, group, damp, order, shrink):
    """Frantar et al. 2022 eq. 2-3 as written: quantize column q, spread its error over the
    columns not yet quantized through H^-1, then drop q from H^-1 (Gaussian elimination), one
    column at a time in `order`; int4 group scales from the group's current weights when its
    first column comes (static: from the original weights when `order` is not natural), each
    searched over `shrink` with the undamped Hessian's diagonal as the weights."""
    W, n = W.clone().double(), W.shape[1]
    H = H.clone().double()
    d = torch.diag(H).clone()
    H += damp * torch.mean(torch.diag(H)) * torch.eye(n, dtype=torch.float64)
    Hinv = torch.linalg.inv(H)
    natural = list(order) == list(range(n))
    codes = torch.zeros_like(W)
    scales = {}
    if bits == 8:
        row = W.abs().amax(1) / QMAX[8]
    elif not natural:
        for g in range(n // group):
            cols = slice(g * group, (g + 1) * group)
            scales[g] = searched_scale(W[:, cols], d[cols], 4, shrink)
    left = list(order)
    for q in order:
        if bits == 8:
            s = row
        else:
            if natural and q % group == 0:
                cols = slice(q, q + group)
                scales[q // group] = searched_scale(W[:, cols], d[cols], 4, shrink)
            s = scales[q // group]
        safe = torch.where(s == 0, torch.ones_like(s), s)
        c = torch.clamp(torch.round(W[:, q] / safe), QMIN[bits], QMAX[bits])
        codes[:, q] = c
        err = (W[:, q] - c * s) / Hinv[q, q]
        left.remove(q)
        W[:, left] -= err[:, None] * Hinv[q, left][None, :]
        Hinv = Hinv - Hinv[:, q : q + 1] @ Hinv[q : q + 1, :] / Hinv[q, q]
    return codes, (row if bits == 8 else torch.stack([scales[g] for g in range(n // group)], 1))


def layer(n_out=12, n_in=128, n=512, seed=0):
    gen = torch.Generator().manual_seed(seed)
    W = torch.randn(n_out, n_in, generator=gen, dtype=torch.float64)
    mix = torch.randn(n_in, n_in, generator=gen, dtype=torch.float64) / n_in**0.5
    X = torch.randn(n, n_in, generator=gen, dtype=torch.float64) @ (torch.eye(n_in) + mix)
    X[:, 5] *= 10  # an outlier input channel
    return W, X, 2 * X.T @ X / n


@pytest.mark.parametrize("shrink", [SHRINK, (1.0,)], ids=["searched", "max"])
@pytest.mark.parametrize(
    ("bits", "group", "act_order"),
    [(4, 32, False), (4, 64, False), (8, None, False), (4, 32, True)],
)
def test_matches_the_transcribed_algorithm(bits, group, act_order, shrink) -> None:
    W, _, H = layer()
    codes, scale = gptq_quantize(
        W, H, bits, group, block_size=64, act_order=act_order, shrink=shrink
    )
    order = torch.argsort(torch.diag(H), descending=True).tolist() if act_order else range(128)
    ref_codes, ref_scale = obs_transcription(W, H, bits, group, 0.01, list(order), shrink)
    mismatch = (codes.double() != ref_codes).double().mean().item()
    assert mismatch <= 2e-3, mismatch  # a code may flip where w / s lands on .5 within 1e-12
    np.testing.assert_allclose(scale.numpy(), ref_scale.float().numpy(), rtol=1e-5)


@pytest.mark.parametrize(("bits", "group"), [(8, None), (4, 32), (4, 128)])
def test_identity_hessian_is_round_to_nearest(bits, group) -> None:
    W, _, _ = layer(seed=1)
    codes, scale = gptq_quantize(W.float(), torch.eye(128), bits, group, shrink=(1.0,))
    if bits == 8:
        q, s = quantize_int8(W.float().numpy())
        np.testing.assert_array_equal(codes.numpy(), q)
    else:
        q, s = quantize_int4(W.float().numpy(), group)
        packed = np.stack([q & 0x0F, q >> 4], -1).reshape(codes.shape).astype(np.int16) - 8
        np.testing.assert_array_equal(codes.numpy(), packed)
    np.testing.assert_allclose(scale.numpy(), s, rtol=1e-6)


@pytest.mark.parametrize(("bits", "group"), [(4, 32), (8, None)])
def test_lower_output_error_than_rtn(bits, group) -> None:
    W, X, H = layer(seed=2)
    codes, scale = gptq_quantize(W, H, bits, group)
    if bits == 8:
        gptq_w = codes.double() * scale.double()[:, None]
        q, s = quantize_int8(W.float().numpy())
        rtn_w = torch.from_numpy(q).double() * torch.from_numpy(s).double()[:, None]
    else:
        gptq_w = (codes.double().view(12, -1, group) * scale.double()[..., None]).view(12, -1)
        q, s = quantize_int4(W.float().numpy(), group)
        c = np.stack([q & 0x0F, q >> 4], -1).reshape(12, 128).astype(np.float64) - 8
        rtn_w = torch.from_numpy((c.reshape(12, -1, group) * s[..., None]).reshape(12, 128))
    gptq_err = ((W - gptq_w) @ X.T).norm()
    rtn_err = ((W - rtn_w) @ X.T).norm()
    assert gptq_err < 0.8 * rtn_err, (gptq_err, rtn_err)


@pytest.mark.parametrize("group", [32, 128])
def test_scale_search_lowers_layer_error(group) -> None:
    """int4: on layers with heavy-tailed weights the searched scales leave less output error, in
    sum, than the max scale; with the identity Hessian (no error feedback) every row's squared
    error can only go down, and int8 keeps the max scale."""
    gen = torch.Generator().manual_seed(0)
    searched = top = 0.0
    for seed in range(4):
        W, X, H = layer(seed=10 + seed)
        W = W * torch.rand(W.shape, generator=gen, dtype=torch.float64).log().neg().sqrt()
        errors, rows = {}, {}
        for shrink in (SHRINK, (1.0,)):
            for hessian, where in ((H, errors), (torch.eye(128), rows)):
                codes, scale = gptq_quantize(W, hessian, 4, group, shrink=shrink)
                deq = (codes.double().view(12, -1, group) * scale.double()[..., None]).view(12, 128)
                where[shrink] = ((W - deq) @ X.T).norm() if where is errors else (W - deq).pow(2)
        searched, top = searched + errors[SHRINK], top + errors[(1.0,)]
        assert torch.all(rows[SHRINK].sum(1) <= rows[(1.0,)].sum(1) * (1 + 1e-12))
        assert not torch.equal(rows[SHRINK], rows[(1.0,)])  # the search chose some other scale
    assert searched < 0.95 * top, (searched, top)
    codes, scale = gptq_quantize(W, H, 8, None)
    np.testing.assert_allclose(scale.double().numpy(), (W.abs().amax(1) / 127).numpy(), rtol=1e-6)


@pytest.fixture(scope="module")
def calib_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("calib")
    for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[40:60]:
        (folder / (p.stem + ".txt")).write_text(p.read_text(encoding="utf-8"))
    return folder


def test_trained_model_quality(trained_dense_dir, held_out_ids, oracle, calib_dir, tmp_path):
    """int4 g32: perplexity within 5% of float (RTN's bar) and no worse than RTN's + 1%."""
    ids = held_out_ids[:, :-1]
    ref = oracle.perplexity(
        oracle.torch_logits(trained_dense_dir, load_tensors(trained_dense_dir), ids), held_out_ids
    )
    out = gptq_model_dir(
        trained_dense_dir, tmp_path / "g", 4, 32, str(calib_dir), n_samples=16, seq_len=64
    )
    spec = json.loads((out / "quantization.json").read_text())
    assert spec["method"] == "gptq" and spec["calibration"]["samples"] == 16
    gptq = oracle.perplexity(
        oracle.torch_logits(trained_dense_dir, dequantize_tensors(out), ids), held_out_ids
    )
    rtn_dir = quantize_model_dir(trained_dense_dir, tmp_path / "r", 4, 32)
    rtn = oracle.perplexity(
        oracle.torch_logits(trained_dense_dir, dequantize_tensors(rtn_dir), ids), held_out_ids
    )
    assert gptq <= ref * 1.05 and gptq <= rtn * 1.01, (ref, rtn, gptq)


@pytest.mark.parametrize("preset", ["tiny-moe", "tiny-hybrid"])
def test_moe_and_hybrid_every_expert_quantized(make_model_dir, calib_dir, oracle, tmp_path, preset):
    src = make_model_dir(preset, tie_embeddings=False)
    out = gptq_model_dir(src, tmp_path / "g", 8, None, str(calib_dir), n_samples=4, seq_len=32)
    spec = json.loads((out / "quantization.json").read_text())
    written = load_tensors(out)
    for name in [n for n in load_tensors(src) if ".experts.w" in n]:
        assert name in spec["quantized"] and written[name + ".q"].dtype == np.int8
    for name in [n for n in written if "router" in n or "mod_" in n]:
        assert written[name].dtype == np.float32 and name not in spec["quantized"]
    ids = np.random.default_rng(0).integers(0, 512, (2, 24))
    ref = oracle.torch_logits(src, load_tensors(src), ids)
    got = oracle.torch_logits(src, dequantize_tensors(out), ids)
    assert np.abs(got - ref).max() <= 2e-2 * np.abs(ref).max()  # int8: a small fraction


def test_bad_input_leaves_nothing(dense_dir, calib_dir, tmp_path) -> None:
    cases = [
        (dict(calib=str(tmp_path / "nope.txt")), "nope.txt"),
        (dict(calib=str(calib_dir), n_samples=100000), "100000 needed"),
        (dict(calib=str(calib_dir), n_samples=4, max_samples=3), "max samples = 3 must be >= "),
        (dict(calib=str(calib_dir), bits=4, group_size=128), "not divisible by group_size 128"),
        (dict(calib=str(calib_dir), bits=4, group_size=16), "group_size = 16"),
        (dict(calib=str(calib_dir), bits=8, group_size=32), "int8 is per output channel"),
    ]
    for changes, message in cases:
        args = {"bits": 8, "group_size": None, "n_samples": 2, "seq_len": 32, **changes}
        with pytest.raises((ValueError, FileNotFoundError), match=message):
            gptq_model_dir(dense_dir, tmp_path / "out", **args)
        assert not (tmp_path / "out").exists()
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []
    q8 = quantize_model_dir(dense_dir, tmp_path / "q8", 8)
    with pytest.raises(ValueError, match="already quantized"):
        gptq_model_dir(q8, tmp_path / "out", 8, None, str(calib_dir), n_samples=2, seq_len=32)


def test_cli(dense_dir, calib_dir, tmp_path) -> None:
    import subprocess
    import sys

    def run(*args):
        cmd = [sys.executable, "-m", "ats_infer.cli", "quantize", str(dense_dir), *map(str, args)]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300)

    ok = run(
        "--method",
        "gptq",
        "--bits",
        "4",
        "--group-size",
        "32",
        "--calib",
        calib_dir,
        "--calib-samples",
        "4",
        "--out",
        tmp_path / "g",
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads((tmp_path / "g" / "quantization.json").read_text())["method"] == "gptq"
    for args, message in [
        (["--method", "gptq", "--bits", "8"], "--method gptq needs --calib"),
        (["--bits", "8", "--calib", calib_dir], "--calib-max-samples and --act-order are for"),
        (["--bits", "8", "--calib-max-samples", "8"], "are for --method gptq, not rtn"),
        (
            ["--method", "gptq", "--bits", "8", "--calib", calib_dir, "--calib-max-samples", "2"],
            "calibration max samples = 2 must be >= calibration samples = 128",
        ),
    ]:
        bad = run(*args, "--out", tmp_path / "x")
        assert bad.returncode == 1 and message in bad.stderr and "Traceback" not in bad.stderr
        assert not (tmp_path / "x").exists()
    usage = run("--help")
    assert "{rtn,gptq,quanto}" in usage.stdout


def one_block_moe(expert_bias: list[float]) -> tuple[torch.nn.Module, set[str]]:
    """A 1-block tiny-moe model whose router is steered by hand through expert_bias (it shifts
    the top-k choice only: +10 always chosen, -10 never) and its GPTQ-able matrices."""
    torch.manual_seed(0)
    config = dataclasses.replace(presets.get("tiny-moe"), n_layer=1)
    model = build_model(config, kernels="reference").eval()
    model.layers[0].ffn.expert_bias.copy_(torch.tensor(expert_bias))
    matrices = {
        n
        for n, p in model.named_parameters()
        if p.dim() >= 2 and "emb" not in n and "router" not in n
    }
    return model, matrices


def routed_inputs(model: torch.nn.Module, ids: torch.Tensor) -> tuple[list, list]:
    """Per forward of BATCH windows: the MoE FFN's input rows (N, C) and the experts' (x_sorted,
    per_expert), as the float model routes them."""
    ffn, layer_in, routed = model.layers[0].ffn, [], []
    handles = [
        ffn.register_forward_pre_hook(
            lambda m, a: layer_in.append(a[0].reshape(-1, a[0].shape[-1]))
        ),
        ffn.experts.register_forward_pre_hook(lambda m, a: routed.append((a[0], a[1]))),
    ]
    with torch.no_grad():
        for b in range(0, ids.shape[0], BATCH):
            model(ids[b : b + BATCH])
    for h in handles:
        h.remove()
    return layer_in, routed


def test_moe_block_reads_windows_until_every_expert_has_its_rows() -> None:
    model, matrices = one_block_moe([10.0] + [0.0] * 7)  # expert 0 takes every first choice
    ids = torch.randint(0, 512, (5 * BATCH, 16), generator=torch.Generator().manual_seed(1))
    _, routed = routed_inputs(model, ids)
    cum = torch.stack([per_expert for _, per_expert in routed]).cumsum(0)  # (forwards, E)
    fewest = cum.min(1).values.tolist()  # fewest tokens routed to one expert, per forward
    rows = fewest[2]  # reached after 3 forwards of BATCH windows
    assert rows > fewest[0] and cum[-1, 0] == ids.numel()  # the router does as steered
    for expert_rows in [0, rows, fewest[-1] + 1]:
        reached = [n for n in range(1, 6) if fewest[n - 1] >= expert_rows]
        expected = BATCH * (reached[0] if reached else 5)
        _, used = gptq_model(
            copy.deepcopy(model), matrices, ids, 8, None, n_samples=BATCH, expert_rows=expert_rows
        )
        assert used == {"layers.0.": expected}, (expert_rows, fewest)


def test_expert_hessian_from_its_routed_tokens_or_its_layers() -> None:
    """Expert 0's Hessian comes from the tokens routed to it; expert 7, never chosen, stands in
    with every token entering the layer."""
    model, matrices = one_block_moe([0.0] * 7 + [-10.0])
    ids = torch.randint(0, 512, (4 * BATCH, 16), generator=torch.Generator().manual_seed(2))
    layer_in, routed = routed_inputs(model, ids)
    h_all = torch.zeros(64, 64, dtype=torch.float64)
    h_0, rows_0 = torch.zeros_like(h_all), 0
    for x, (x_sorted, per_expert) in zip(layer_in, routed, strict=True):
        h_all += x.double().T @ x.double()
        x_0 = x_sorted[: per_expert[0]].double()
        h_0, rows_0 = h_0 + x_0.T @ x_0, rows_0 + x_0.shape[0]
    assert all(per_expert[7] == 0 for _, per_expert in routed) and rows_0 >= 64
    out, _ = gptq_model(copy.deepcopy(model), matrices, ids, 8, None)
    w1 = model.layers[0].ffn.experts.w1
    for e, hessian in [(0, h_0 * (2.0 / rows_0)), (7, h_all * (2.0 / ids.numel()))]:
        codes, scale = gptq_quantize(w1[e], hessian, 8, None)
        assert np.array_equal(out["layers.0.ffn.experts.w1"][0][e], codes.numpy()), e
        assert np.array_equal(out["layers.0.ffn.experts.w1"][1][e], scale.numpy()), e
