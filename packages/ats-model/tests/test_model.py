"""The Transformer forward: loss with ignore_index, aux/stats per family, causality, finite-difference
gradients in float64 (router included), state_dict names of the contract, bad input."""

import math
import re

import pytest
import torch
from ats_model import ForwardOptions, MoEConfig, build_model

FAMILIES = ["dense", "moe", "mod", "hybrid"]


def test_loss_is_mean_ce_over_non_ignored(make_config) -> None:
    model = build_model(make_config("moe"), dtype=torch.float64)
    idx = torch.randint(0, 23, (2, 7))
    targets = idx.roll(-1, 1)
    targets[0, 3] = targets[1, -1] = -100
    out = model(idx, targets=targets)
    total, count = 0.0, 0
    for b in range(2):
        for t in range(7):
            if targets[b, t] != -100:
                row = out.logits[b, t]
                total -= (row[targets[b, t]] - torch.logsumexp(row, 0)).item()
                count += 1
    assert out.loss.item() == pytest.approx(total / count, rel=1e-12)
    assert model(idx).loss is None


@pytest.mark.parametrize("family", FAMILIES)
def test_aux_and_stats_per_family(make_config, family: str) -> None:
    cfg = make_config(family)
    out = build_model(cfg)(torch.randint(0, 23, (3, 10)))
    has_moe, has_mod = family in ("moe", "hybrid"), family in ("mod", "hybrid")
    assert set(out.aux) == ({"moe_lb", "moe_z"} if has_moe else set()) | (
        {"mod_predictor"} if has_mod else set()
    )
    n_moe, n_mod = (2 if has_moe else 0), (2 if has_mod else 0)
    if has_moe:
        assert out.stats["moe/tokens_per_expert"].shape == (n_moe, 4)
        for key in ("entropy", "dropped_fraction", "max_violation", "router_z"):
            assert out.stats[f"moe/{key}"].shape == (n_moe,)
    if has_mod:
        assert out.stats["mod/selected_fraction"].shape == (n_mod,)
        assert out.stats["mod/predictor_accuracy"].shape == (n_mod,)
        assert out.stats["mod/selected_fraction"].tolist() == [0.5, 0.5]
    for v in out.stats.values():
        assert not v.requires_grad
    for v in out.aux.values():
        assert v.dim() == 0 and v.requires_grad


def test_moe_slots_counted(make_config) -> None:
    out = build_model(make_config("moe"))(torch.randint(0, 23, (3, 10)))
    assert out.stats["moe/tokens_per_expert"].sum(1).tolist() == [60.0, 60.0]  # 30 tokens * top-2


@pytest.mark.parametrize("family", FAMILIES)
def test_changing_a_later_token_never_changes_earlier_logits(make_config, family: str) -> None:
    torch.manual_seed(0)
    model = build_model(make_config(family), dtype=torch.float64).eval()
    idx = torch.randint(0, 23, (2, 12))
    base = model(idx, causal_routing=True).logits
    for t in (3, 7, 11):
        changed = idx.clone()
        changed[:, t] = (changed[:, t] + 5) % 23
        after = model(changed, causal_routing=True).logits
        torch.testing.assert_close(after[:, :t], base[:, :t], rtol=0, atol=1e-12)


def test_mod_topk_routing_is_not_causal_but_predictor_routing_is(make_config) -> None:
    """Top-k over the sequence sees the future (why generation uses the predictor)."""
    torch.manual_seed(0)
    model = build_model(make_config("mod"), dtype=torch.float64)
    idx = torch.randint(0, 23, (4, 12))
    differs = False
    for t in range(4, 12):
        changed = idx.clone()
        changed[:, t] = (changed[:, t] + 7) % 23
        differs |= not torch.allclose(model(changed).logits[:, :4], model(idx).logits[:, :4])
    assert differs


def _loss_of(model, names: list[str], idx: torch.Tensor):
    params = dict(model.named_parameters())

    def f(*values: torch.Tensor) -> torch.Tensor:
        state = {**params, **dict(zip(names, values, strict=True))}
        out = torch.func.functional_call(model, state, (idx,), {"targets": idx})
        return out.loss + sum(out.aux.values())

    return f, tuple(params[n].detach().clone().requires_grad_() for n in names)


@pytest.mark.parametrize(
    "family,names",
    [
        ("dense", ["layers.0.attn.wq.weight", "layers.1.ffn.w2.weight", "norm.weight"]),
        (
            "moe",
            [
                "layers.0.ffn.router.weight",
                "layers.1.ffn.router.weight",
                "layers.1.ffn_norm.weight",
            ],
        ),
        (
            "mod",
            [
                "layers.0.mod_router.weight",
                "layers.1.mod_predictor.w_in.weight",
                "layers.1.attn.wk.weight",
            ],
        ),
        ("hybrid", ["layers.1.mod_router.weight", "layers.1.ffn.router.weight"]),
    ],
)
def test_finite_difference_gradients(make_config, family: str, names: list[str]) -> None:
    torch.manual_seed(0)
    cfg = make_config(family, max_seq_len=8)
    model = build_model(cfg, dtype=torch.float64)
    model.train()
    for m in model.moe_layers():
        m.bias_update_rate = 0.0
    f, inputs = _loss_of(model, names, torch.randint(0, 23, (2, 6)))
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6, fast_mode=True)


def test_state_dict_names_follow_contract(make_config) -> None:
    moe = MoEConfig(n_experts=4, top_k=2, n_shared_experts=1)
    cfg = make_config("hybrid", moe=moe, tie_embeddings=True)
    keys = set(build_model(cfg).state_dict())
    layer = {
        "attn_norm.weight",
        "attn.wq.weight",
        "attn.wk.weight",
        "attn.wv.weight",
        "attn.wo.weight",
        "ffn_norm.weight",
        "ffn.router.weight",
        "ffn.experts.w1",
        "ffn.experts.w3",
        "ffn.experts.w2",
        "ffn.expert_bias",
        "ffn.shared.w1.weight",
        "ffn.shared.w3.weight",
        "ffn.shared.w2.weight",
        "mod_router.weight",
        "mod_predictor.w_in.weight",
        "mod_predictor.w_out.weight",
    }
    expect = {"tok_embeddings.weight", "norm.weight"} | {
        f"layers.{i}.{k}" for i in range(2) for k in layer
    }
    assert keys == expect  # tied: no output.weight; rope tables are not state
    untied = set(build_model(make_config("dense", tie_embeddings=False)).state_dict())
    assert "output.weight" in untied
    shapes = {k: tuple(v.shape) for k, v in build_model(cfg).state_dict().items()}
    assert shapes["layers.0.attn.wk.weight"] == (4, 8) and shapes["layers.0.ffn.experts.w2"] == (
        4,
        8,
        12,
    )
    assert shapes["layers.0.mod_router.weight"] == (1, 8) and shapes[
        "layers.0.mod_predictor.w_in.weight"
    ] == (4, 8)


def test_tied_embeddings_share_the_matrix(make_config) -> None:
    model = build_model(make_config("dense", tie_embeddings=True))
    idx = torch.randint(0, 23, (1, 5))
    out = model(idx, targets=idx)
    out.loss.backward()
    assert model.output is None
    h = model.norm(model.tok_embeddings(idx))
    assert model.tok_embeddings.weight.grad is not None and h.shape[-1] == 8


def test_residual_init_is_scaled() -> None:
    from ats_model import presets

    cfg = presets.get("20m-dense")
    torch.manual_seed(0)
    model = build_model(cfg)
    std = cfg.init_std
    assert model.layers[0].attn.wq.weight.std().item() == pytest.approx(std, rel=0.02)
    assert model.layers[0].attn.wo.weight.std().item() == pytest.approx(
        std / math.sqrt(2 * cfg.n_layer), rel=0.02
    )
    assert model.layers[0].ffn.w2.weight.std().item() == pytest.approx(
        std / math.sqrt(2 * cfg.n_layer), rel=0.02
    )
    assert torch.equal(model.norm.weight, torch.ones(cfg.dim))


def test_bad_inputs(make_config) -> None:
    model = build_model(make_config("dense"))
    with pytest.raises(ValueError, match=r"sequence end 40 exceeds ModelConfig.max_seq_len = 32"):
        model(torch.zeros(1, 40, dtype=torch.long))
    with pytest.raises(ValueError, match=r"attention_mask has shape \(1, 4\), expected \(1, 5\)"):
        model(torch.zeros(1, 5, dtype=torch.long), attention_mask=torch.ones(1, 4))
    with pytest.raises(ValueError, match=r"positions has shape"):
        model(torch.zeros(1, 5, dtype=torch.long), positions=torch.zeros(5, dtype=torch.long))
    with pytest.raises(TypeError, match="ModelConfig"):
        build_model({"dim": 8})
    with pytest.raises(RuntimeError, match="'cuda' requested"):
        build_model(make_config("dense"), kernels="cuda")


def test_model_package_imports_no_distributed() -> None:
    import pathlib

    import ats_model

    root = pathlib.Path(ats_model.__file__).parent
    for path in root.rglob("*.py"):
        assert not re.search(r"torch\.distributed|import torch\.distributed", path.read_text()), (
            path
        )


@pytest.mark.parametrize("family", FAMILIES)
def test_left_padding_leaves_real_tokens_unchanged(make_config, family: str) -> None:
    torch.manual_seed(0)
    model = build_model(make_config(family), dtype=torch.float64)
    seq = torch.randint(0, 23, (1, 6))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), seq], 1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
    plain = model(seq, causal_routing=True).logits
    got = model(padded, attention_mask=mask, causal_routing=True).logits[:, 3:]
    torch.testing.assert_close(got, plain, rtol=0, atol=1e-12)


@pytest.mark.parametrize("knob", ["dropout", "ffn_dropout"])
@pytest.mark.parametrize("family", ["dense", "hybrid"])
def test_dropout_is_training_only(make_config, family: str, knob: str) -> None:
    torch.manual_seed(0)
    plain = build_model(make_config(family))
    dropped = build_model(make_config(family, **{knob: 0.3}))
    dropped.load_state_dict(plain.state_dict())
    idx = torch.randint(0, plain.config.vocab_size, (2, 12))
    plain.eval()
    dropped.eval()
    # in eval the regularizer is gone: same weights, same logits as the dropout-free model
    torch.testing.assert_close(dropped(idx).logits, plain(idx).logits, rtol=0, atol=0)
    dropped.train()
    a, b = dropped(idx).logits, dropped(idx).logits
    assert not torch.equal(a, b), "two training forwards drew the same dropout masks"
    with pytest.raises(ValueError, match=rf"{knob} = 1.0 is invalid"):
        make_config(family, **{knob: 1.0})


@pytest.mark.parametrize("family", ["dense", "hybrid"])
def test_autocast_residual_carries_the_stream_in_bf16(make_config, family: str) -> None:
    """Under autocast the flag puts every block's input in bf16 (off: the embedding's fp32); the
    loss stays within bf16 rounding of the fp32-stream loss, the fp32 embedding still gets its
    gradient, and without autocast the flag changes nothing."""
    torch.manual_seed(0)
    model = build_model(make_config(family))
    idx = torch.randint(0, model.config.vocab_size, (2, 12))
    seen: list[torch.dtype] = []
    hooks = [
        block.register_forward_pre_hook(lambda m, args: seen.append(args[0].dtype))
        for block in model.layers
    ]
    losses = {}
    for flag in (False, True):
        model.set_forward_options(ForwardOptions(autocast_residual=flag))
        seen.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            losses[flag] = model(idx, targets=idx).loss
        want = torch.bfloat16 if flag else torch.float32
        assert seen == [want] * len(model.layers), (flag, seen)
    torch.testing.assert_close(losses[True].float(), losses[False].float(), rtol=2e-2, atol=0)
    losses[True].backward()
    grad = model.tok_embeddings.weight.grad
    assert grad is not None and grad.dtype == torch.float32 and grad.abs().sum() > 0
    for hook in hooks:
        hook.remove()
    model.set_forward_options(ForwardOptions(autocast_residual=True))
    with_flag = model(idx).logits
    model.set_forward_options(ForwardOptions())
    torch.testing.assert_close(with_flag, model(idx).logits, rtol=0, atol=0)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tie", [False, True])
def test_fused_loss_matches_logits_then_cross_entropy(make_config, family: str, tie: bool) -> None:
    """ForwardOptions.fused_loss (the head and the loss as kernels.linear_cross_entropy, all rows at
    once or in chunks of 5 of the 24, one target ignored) gives the plain path's loss and every
    gradient in float64 and returns no logits; under no_grad (evaluation) the same loss."""
    torch.manual_seed(0)
    model = build_model(make_config(family, tie_embeddings=tie), dtype=torch.float64)
    idx = torch.randint(0, 23, (2, 12))
    targets = idx.roll(-1, 1)
    targets[0, 2] = -100

    def run(fused: bool, rows: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        model.set_forward_options(ForwardOptions(fused_loss=fused, fused_loss_rows=rows))
        out = model(idx, targets=targets)
        assert (out.logits is None) == fused
        (out.loss + sum(out.aux.values())).backward()
        return out.loss.detach(), {n: p.grad for n, p in model.named_parameters()}

    plain_loss, plain_grads = run(False, 0)
    for rows in (0, 5):
        loss, grads = run(True, rows)
        torch.testing.assert_close(loss, plain_loss, rtol=1e-12, atol=0)
        for name, grad in plain_grads.items():
            torch.testing.assert_close(grads[name], grad, rtol=1e-9, atol=1e-12, msg=name)
        with torch.no_grad():
            torch.testing.assert_close(
                model(idx, targets=targets).loss, plain_loss, rtol=1e-12, atol=0
            )


@pytest.mark.parametrize("family", FAMILIES)
def test_fused_projections_match_the_separate_ones(make_config, family: str) -> None:
    """fuse_projections: with gradients on, q|k|v and gate|up run as concatenated GEMMs, and the
    loss and every gradient are the separate projections' in float64; without gradients the
    separate ones run (no per-call copy of every weight), giving the same logits."""
    torch.manual_seed(0)
    model = build_model(make_config(family), dtype=torch.float64)
    idx = torch.randint(0, 23, (2, 12))

    def run(fused: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        model.fuse_projections(fused)
        out = model(idx, targets=idx.roll(-1, 1))
        (out.loss + sum(out.aux.values())).backward()
        return out.logits.detach(), {n: p.grad for n, p in model.named_parameters()}

    plain_logits, plain_grads = run(False)
    fused_logits, fused_grads = run(True)
    torch.testing.assert_close(fused_logits, plain_logits, rtol=1e-12, atol=1e-12)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=1e-9, atol=1e-12, msg=name)
    with torch.no_grad():
        torch.testing.assert_close(model(idx).logits, plain_logits, rtol=1e-12, atol=1e-12)


def test_forward_options_are_set_as_one_object(make_config) -> None:
    """The model's forward options change only through set_forward_options, with a whole
    ForwardOptions (frozen: no field is changed in place); a negative row count is refused."""
    with pytest.raises(ValueError, match="fused_loss_rows = -1 must be >= 0"):
        ForwardOptions(fused_loss_rows=-1)
    model = build_model(make_config("dense"))
    assert model.options == ForwardOptions()
    with pytest.raises(TypeError, match="expected ForwardOptions"):
        model.set_forward_options({"fused_loss": True})
    options = ForwardOptions(fused_loss=True, fused_loss_rows=4)
    model.set_forward_options(options)
    assert model.options is options
    with pytest.raises(AttributeError):
        options.fused_loss = False
