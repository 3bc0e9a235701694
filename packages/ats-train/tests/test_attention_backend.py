"""train.sdpa_backend: what each backend can run, the cross-rank choice, and that the trainer's
forwards really run under the chosen order (CPU); the measured choice on CUDA (GPU)."""

from pathlib import Path

import pytest
import torch
from ats_train.attention_backend import (
    MASKED_ORDER,
    AttentionBackend,
    AttentionShape,
    choose_attention_backend,
    fastest,
    time_backends,
)
from ats_train.build import build_trainer
from ats_train.config import ConfigError, build_config
from torch.nn.attention import SDPBackend

CPU = torch.device("cpu")
SHAPE = AttentionShape(2, 4, 2, 32, 16, 0.0, torch.float32)  # GQA: 4 query heads, 2 kv heads


def _same_everywhere(values: torch.Tensor) -> torch.Tensor:
    return values


def test_cpu_runs_math_and_flash_but_not_cudnn() -> None:
    ms = time_backends(("math", "flash", "cudnn"), SHAPE, CPU, reps=1)
    assert ms["math"] > 0 and ms["flash"] > 0
    assert ms["cudnn"] is None
    # torch's CPU flash kernel has no dropout: with dropout only math can run the call
    dropout = AttentionShape(2, 4, 2, 32, 16, 0.1, torch.float32)
    assert time_backends(("flash",), dropout, CPU, reps=1) == {"flash": None}


def test_timed_rounds_go_round_robin_over_the_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each backend is warmed up alone, then every round times each runnable backend in turn:
    a clock ramp in the first rounds cannot favour whichever backend came last."""
    enabled = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(*args, **kwargs):
        flags = torch.backends.cuda
        (alone,) = [n for n in ("math", "flash", "cudnn") if getattr(flags, f"{n}_sdp_enabled")()]
        enabled.append(alone)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    time_backends(("math", "cudnn", "flash"), SHAPE, CPU, reps=2, rounds=3, warmup=2)
    warm = ["math"] * 2 + ["cudnn"] + ["flash"] * 2  # cudnn: refused on its first call
    assert enabled == warm + (["math"] * 2 + ["flash"] * 2) * 3


def test_fastest_puts_the_winner_first_then_torchs_order() -> None:
    choice = fastest({"cudnn": 0.4, "flash": 0.7, "efficient": None}, _same_everywhere)
    assert choice.order == (
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.MATH,
    )
    assert choice.timings_ms == {"cudnn": 0.4, "flash": 0.7, "efficient": None}


def test_fastest_agrees_across_ranks() -> None:
    """A backend another rank cannot run arrives as inf in the mean and cannot win here either."""

    def other_rank_lacks_cudnn(values: torch.Tensor) -> torch.Tensor:
        other = torch.tensor([float("inf"), 0.9, 1.0], dtype=torch.float64)
        return (values + other) / 2

    choice = fastest({"cudnn": 0.4, "flash": 0.7, "efficient": 1.0}, other_rank_lacks_cudnn)
    assert choice.order[0] == SDPBackend.FLASH_ATTENTION
    assert choice.timings_ms["cudnn"] is None
    assert choice.timings_ms["flash"] == pytest.approx(0.8)
    assert fastest({"cudnn": None, "flash": None}, _same_everywhere).order is None


def test_settings_on_cpu() -> None:
    assert choose_attention_backend("auto", SHAPE, CPU, _same_everywhere).order is None
    assert choose_attention_backend("default", SHAPE, CPU, _same_everywhere).order is None
    math = choose_attention_backend("math", SHAPE, CPU, _same_everywhere)
    assert math.order[0] == SDPBackend.MATH and len(set(math.order)) == 4
    with pytest.raises(ConfigError, match="train.sdpa_backend = 'cudnn' cannot run"):
        choose_attention_backend("cudnn", SHAPE, CPU, _same_everywhere)


def test_masked_runs_never_enable_cudnn() -> None:
    """sft / dpo / grpo pass attention masks; cuDNN's masked backward can NaN (pytorch#196678)."""
    cuda = torch.device("cuda")  # "auto" and "default" choose without touching the device
    for setting in ("auto", "default"):
        chosen = choose_attention_backend(setting, SHAPE, cuda, _same_everywhere, masked=True)
        assert chosen.order == (
            SDPBackend.FLASH_ATTENTION,
            SDPBackend.EFFICIENT_ATTENTION,
            SDPBackend.MATH,
        )
    math = choose_attention_backend("math", SHAPE, CPU, _same_everywhere, masked=True)
    assert math.order == (
        SDPBackend.MATH,
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
    )
    with pytest.raises(ConfigError, match="cannot run a masked"):
        choose_attention_backend("cudnn", SHAPE, cuda, _same_everywhere, masked=True)
    # a resumed masked run whose checkpoint named cudnn gets the same refusal
    with pytest.raises(ConfigError, match="cannot run a masked"):
        choose_attention_backend("auto", SHAPE, cuda, _same_everywhere, saved="cudnn", masked=True)


@pytest.mark.gpu
def test_masked_order_gives_finite_grads_where_cudnn_nans() -> None:
    """pytorch#196678's case: key length 64 mod 128, every logit ~ -120 (logsumexp < -88.7), an
    explicit mask. Under the masked order the gradients are finite and match float64 attention
    written out by hand, to 2% of each gradient's largest entry. dq's first column is left out of
    the match: every k[..., 0] is the same -960, so its exact value is 0 (a sum of dS over a row)
    and bf16 rounding of dS, times 120, is all a kernel can return there (bf16 math: 17x dq's
    scale, against 0.3% on the other columns)."""
    import math as m

    torch.manual_seed(0)
    L, D = 704, 64
    q = torch.randn(1, 1, L, D, device="cuda", dtype=torch.bfloat16) * 0.1
    k = torch.randn(1, 1, L, D, device="cuda", dtype=torch.bfloat16) * 0.1
    v = torch.randn(1, 1, L, D, device="cuda", dtype=torch.bfloat16)
    q[..., 0], k[..., 0] = 1.0, -120 * m.sqrt(D)
    mask = torch.ones(L, L, dtype=torch.bool, device="cuda").tril()[None, None]
    grad_out = torch.randn_like(v)

    qkv = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    with AttentionBackend(MASKED_ORDER, {}).context():
        out = torch.nn.functional.scaled_dot_product_attention(*qkv, attn_mask=mask)
    out.backward(grad_out)
    masked = [t.grad.double() for t in qkv]
    assert all(torch.isfinite(g).all() for g in masked)

    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    logits = (ref[0] @ ref[1].transpose(-2, -1) / m.sqrt(D)).masked_fill(~mask, float("-inf"))
    (logits.softmax(-1) @ ref[2]).backward(grad_out.double())
    exact_grads = [ref[0].grad[..., 1:], ref[1].grad, ref[2].grad]
    masked[0] = masked[0][..., 1:]
    for name, ours, exact in zip("qkv", masked, exact_grads, strict=True):
        err = (ours - exact).abs().max().item() / exact.abs().max().item()
        assert err < 2e-2, f"d{name}: max error {err:.3g} of its largest entry"


def test_config_rejects_an_unknown_backend(prepared) -> None:
    with pytest.raises(ConfigError, match="train.sdpa_backend = 'fast' is not one of"):
        build_config({"data.source": str(prepared[0]), "train.sdpa_backend": "fast"})


def _build(prepared, run_dir: Path, backend: str, device: str = "cpu", **extra: object):
    shards, tokenizer = prepared
    flat = {
        "data.source": str(shards),
        "data.tokenizer": str(tokenizer),
        "model.preset": "tiny-dense",
        "model.dropout": 0.0,
        "train.steps": 3,
        "train.batch_size": 2,
        "train.seq_len": 32,
        "train.eval_every": 0,
        "train.sample_tokens": 0,
        "train.device": device,
        "train.sdpa_backend": backend,
        "checkpoint.every": 0,
        **extra,
    }
    run_dir.mkdir(exist_ok=True)
    return build_trainer(build_config(flat), run_dir)


def _losses(trainer) -> list[float]:  # noqa: ANN001
    return [trainer.train_step()["loss"] for _ in range(3)]


def test_the_trainer_runs_its_forwards_under_the_chosen_backend(
    prepared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every attention call of training and evaluation sees the chosen backend first; the results
    match torch's default order closely (math and CPU flash may even agree bitwise here)."""
    seen: list[int] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        seen.append(torch._C._get_sdp_priority_order()[0])
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    trainer = _build(prepared, tmp_path / "math", "math")
    seen.clear()  # building probed the backend alone (torch's order, only math enabled)
    math = _losses(trainer)
    n_train = len(seen)
    trainer.evaluate()
    assert n_train > 0 and len(seen) > n_train
    assert set(seen) == {int(SDPBackend.MATH)}
    seen.clear()
    default = _losses(_build(prepared, tmp_path / "default", "default"))
    assert int(SDPBackend.MATH) not in set(seen)  # torch's own order starts with flash
    assert default == pytest.approx(math, rel=1e-5)


def test_a_resumed_auto_run_keeps_the_choice_in_its_checkpoint(prepared, tmp_path: Path) -> None:
    """The backends draw dropout differently, so "auto" must not re-measure on resume; a backend
    named on the resumed run's command line still wins over the recorded one."""
    first = _build(prepared, tmp_path / "run", "math")
    _losses(first)
    first.save()
    first.close()  # releases the run dir for the next run on it
    resumed = _build(prepared, tmp_path / "run", "auto", **{"train.steps": 6})
    assert resumed.step == 3
    assert (resumed.attention.name, resumed.attention.resumed) == ("math", True)
    assert resumed.attention.order[0] == SDPBackend.MATH
    assert "from its checkpoint" in resumed.attention.describe()
    resumed.close()
    named = _build(prepared, tmp_path / "run", "default", **{"train.steps": 6})
    assert (named.attention.name, named.attention.order) == ("default", None)
    named.close()
    fresh = _build(prepared, tmp_path / "fresh", "auto")
    assert (fresh.attention.name, fresh.attention.resumed) == ("default", False)  # CPU: torch's


@pytest.mark.gpu
def test_auto_on_cuda_measures_and_trains_with_cuda_graphs(prepared, tmp_path: Path) -> None:
    extra = {"train.precision": "bf16", "train.cuda_graphs": True, "model.dropout": 0.1}
    trainer = _build(prepared, tmp_path / "auto", "auto", device="cuda", **extra)
    losses = _losses(trainer)
    timings = trainer.attention.timings_ms
    assert set(timings) == {"cudnn", "flash", "efficient"}
    assert (
        timings["flash"] is not None and timings["flash"] > 0
    )  # bf16, head_dim 64: Hopper runs it
    fastest_name = min((ms, name) for name, ms in timings.items() if ms is not None)[1]
    assert trainer.attention.order[0].name.lower().startswith(fastest_name)
    assert all(torch.isfinite(torch.tensor(losses)))
