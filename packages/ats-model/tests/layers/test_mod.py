"""Mixture-of-Depths: the gathered computation against a per-sequence loop through a plain block,
causal (predictor) routing with ragged selections, static / random rules, the predictor loss,
router gradients, and the compute saving (FLOPs counted by torch, timing printed)."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from ats_model import MoDConfig, build_model
from ats_model.layers.block import Block, Context
from ats_model.layers.mod import MoDBlock, position_hash
from torch.utils.flop_counter import FlopCounterMode


def _ctx(model, B: int, T: int, causal: bool = False) -> Context:
    return Context(
        cos=model.rope_cos[:T],
        sin=model.rope_sin[:T],
        positions=torch.arange(T).expand(B, T),
        cos_table=model.rope_cos,
        sin_table=model.rope_sin,
        mask=None,
        key_valid=None,
        cache=None,
        start=0,
        causal_routing=causal,
    )


def _reference(model, block: MoDBlock, x: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:
    """Per sequence: run the plain block on the selected tokens (original positions), add
    sigmoid(router) * delta back at their places."""
    out = x.clone()
    for b in range(x.shape[0]):
        idx = sel[b].nonzero().squeeze(1)
        if idx.numel() == 0:
            continue
        x_sel = x[b : b + 1, idx]  # (1, k, C)
        ctx = Context(
            cos=model.rope_cos[idx][None],
            sin=model.rope_sin[idx][None],
            positions=idx[None],
            cos_table=model.rope_cos,
            sin_table=model.rope_sin,
            mask=None,
            key_valid=None,
            cache=None,
            start=0,
            causal_routing=False,
        )
        delta = Block.forward(block, x_sel, ctx).stream() - x_sel
        w = torch.sigmoid(block.mod_router(x_sel)).squeeze(-1)  # (1, k)
        out[b, idx] += w[0, :, None] * delta[0]
    return out


def test_learned_topk_matches_per_sequence_loop(make_config) -> None:
    torch.manual_seed(0)
    model = build_model(make_config("mod"), dtype=torch.float64)
    block = model.layers[0]
    x = torch.randn(3, 10, 8, dtype=torch.float64)
    got, moe, record, pending = block(x, _ctx(model, 3, 10))
    assert pending is None  # an MoD block returns its stream complete
    assert moe is None  # the mod family's FFN is dense
    logits = block.mod_router(x).squeeze(-1)
    top = torch.topk(logits, 5, dim=1).indices  # ceil(0.5 * 10) = 5 per sequence
    sel = torch.zeros(3, 10, dtype=torch.bool).scatter(1, top, True)
    torch.testing.assert_close(got, _reference(model, block, x, sel))
    assert record.selected_fraction.item() == 0.5


def test_topk_training_forward_reads_no_count_back(make_config, monkeypatch) -> None:
    """Top-k keeps exactly k tokens per row, so the training forward gathers the sorted top-k
    positions directly: gather_selected (which reads the per-row count back to the host, a device
    sync per routed block) is not called, and the result is still the per-sequence loop's."""
    torch.manual_seed(0)
    model = build_model(make_config("mod"), dtype=torch.float64)
    block = model.layers[0]
    x = torch.randn(3, 10, 8, dtype=torch.float64)

    def refuse(sel: torch.Tensor) -> None:
        raise AssertionError("gather_selected called on the top-k training path")

    monkeypatch.setattr("ats_model.layers.mod.gather_selected", refuse)
    got = block(x, _ctx(model, 3, 10)).hidden
    top = torch.topk(block.mod_router(x).squeeze(-1), 5, dim=1).indices
    sel = torch.zeros(3, 10, dtype=torch.bool).scatter(1, top, True)
    torch.testing.assert_close(got, _reference(model, block, x, sel))


def test_causal_routing_uses_predictor_with_ragged_counts(make_config) -> None:
    torch.manual_seed(1)
    model = build_model(make_config("mod"), dtype=torch.float64)
    block = model.layers[0]
    x = torch.randn(4, 9, 8, dtype=torch.float64)
    sel = block.mod_predictor(x) > 0
    counts = sel.sum(1).tolist()
    assert len(set(counts)) > 1, counts  # ragged: exercises the padded gather path
    got = block(x, _ctx(model, 4, 9, causal=True)).stream()
    torch.testing.assert_close(got, _reference(model, block, x, sel))


def test_predictor_loss_is_bce_on_detached_input(make_config) -> None:
    torch.manual_seed(2)
    model = build_model(make_config("mod"), dtype=torch.float64)
    block = model.layers[0]
    x = torch.randn(2, 6, 8, dtype=torch.float64, requires_grad=True)
    rec = block(x, _ctx(model, 2, 6)).mod
    target = torch.zeros(2, 6, dtype=torch.float64).scatter(
        1, torch.topk(block.mod_router(x).squeeze(-1), 3, 1).indices, 1.0
    )
    pred = block.mod_predictor(x)
    torch.testing.assert_close(rec.predictor_loss, F.binary_cross_entropy_with_logits(pred, target))
    acc = ((pred > 0) == (target > 0.5)).double().mean()
    assert rec.predictor_accuracy.item() == pytest.approx(acc.item())
    (g,) = torch.autograd.grad(rec.predictor_loss, x, allow_unused=True)
    assert g is None  # the predictor never pushes gradient into the residual stream


def test_router_gets_gradient_from_lm_loss(make_config) -> None:
    model = build_model(make_config("mod"))
    idx = torch.randint(0, 23, (2, 12))
    out = model(idx, targets=idx)
    out.loss.backward()
    for layer in model.mod_layers():
        assert layer.mod_router.weight.grad.abs().sum() > 0
        assert layer.mod_predictor.w_in.weight.grad is None  # only the aux loss trains it
    model.zero_grad()
    out = model(idx, targets=idx)
    out.aux["mod_predictor"].backward()
    assert model.mod_layers()[0].mod_predictor.w_in.weight.grad.abs().sum() > 0


def test_static_and_random_rules(make_config) -> None:
    static = build_model(
        make_config("mod", mod=MoDConfig(capacity=0.5, routing="static", placement="all"))
    )
    assert not hasattr(static.layers[0], "mod_router")
    keep = static.layers[0]._rule(torch.arange(8)[None])
    assert keep[0].tolist() == [False, True] * 4
    quarter = dataclasses.replace(static.config.mod, capacity=0.25)
    q = build_model(make_config("mod", mod=quarter)).layers[0]._rule(torch.arange(8)[None])
    assert q[0].nonzero().squeeze(1).tolist() == [3, 7]
    u = position_hash(torch.arange(20000), seed=5)
    assert 0.49 < (u < 0.5).double().mean().item() < 0.51
    assert torch.equal(u, position_hash(torch.arange(20000), seed=5))
    assert not torch.equal(u, position_hash(torch.arange(20000), seed=6))
    rnd = build_model(make_config("mod", mod=dataclasses.replace(quarter, routing="random")))
    out = rnd(torch.randint(0, 23, (2, 30)))
    assert "mod_predictor" not in out.aux
    assert 0.05 < out.stats["mod/selected_fraction"].mean().item() < 0.5


def _block_flops(model, idx: torch.Tensor, layer: int) -> tuple[int, int]:
    """(matmul FLOPs, SDPA forward FLOPs) of one block over a forward + backward, per torch's
    FlopCounterMode (SDPA is counted only where torch registers a formula for the CPU kernel).

    The block runs alone on a grad-requiring input (as inside the model, where it gets the stream):
    FlopCounterMode's module attribution enters a module in backward only once every output
    tensor has its gradient, which for a block that returns its predictor loss is too late."""
    B, T = idx.shape
    x = torch.randn(B, T, model.config.dim, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        out = model.layers[layer](x, _ctx(model, B, T))
        (out.stream().square().mean() + out.mod.predictor_loss).backward()
    counts = counter.get_flop_counts()["Global"]
    matmul = sum(v for k, v in counts.items() if str(k) in ("aten.mm", "aten.addmm", "aten.bmm"))
    sdpa = sum(v for k, v in counts.items() if "dot_product" in str(k) and "backward" not in str(k))
    return matmul, sdpa


def test_mod_really_saves_compute() -> None:
    """FLOPs of a routed block (counted by torch) fall to c of the full block on its matmuls and
    c^2 on attention; router and predictor still see every token."""
    from ats_model import presets

    tiny = presets.get("tiny-mod")  # predictor_dim 16: routing overhead small next to the block
    base = dataclasses.replace(
        tiny, mod=dataclasses.replace(tiny.mod, capacity=1.0, placement="all")
    )
    B, T = 2, 64
    idx = torch.randint(0, base.vocab_size, (B, T))
    full_mm, full_sdpa = _block_flops(build_model(base), idx, 1)
    C, d_attn, F_ = base.dim, base.n_head * base.head_dim, base.ffn_dim
    matmul = 6 * (2 * C * d_attn + 2 * C * base.n_kv_head * base.head_dim + 3 * C * F_)
    H = base.mod.predictor_dim
    routing = 6 * C + 4 * H * C + 6 * H  # predictor input is detached: no input grad for w_in
    assert full_mm == (matmul + routing) * B * T
    assert full_sdpa in (0, 4 * d_attn * T * B * T)  # QK^T + AV over T keys, if torch counts it
    for c in (0.5, 0.25, 0.125):
        cfg = dataclasses.replace(base, mod=dataclasses.replace(base.mod, capacity=c))
        mm, sdpa = _block_flops(build_model(cfg), idx, 1)
        expect = (c * matmul + routing) / (matmul + routing)
        assert mm / full_mm == pytest.approx(expect, rel=1e-9), (c, mm / full_mm)
        # the block's own matmuls (all but router + predictor) fall to exactly c
        assert mm - routing * B * T == pytest.approx(c * (full_mm - routing * B * T), rel=1e-12)
        assert sdpa == pytest.approx(c * c * full_sdpa, rel=1e-9)  # c*T queries over c*T keys


def test_mod_block_runs_under_cpu_autocast(make_config) -> None:
    # the gathered block computes in bf16 under autocast; the scatter back must keep x's dtype
    model = build_model(make_config("mod"))
    idx = torch.randint(0, model.config.vocab_size, (2, 10))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(idx, targets=idx)
    assert torch.isfinite(out.loss)
    reference = model(idx, targets=idx).loss
    torch.testing.assert_close(out.loss.float(), reference, rtol=0.05, atol=0.05)
