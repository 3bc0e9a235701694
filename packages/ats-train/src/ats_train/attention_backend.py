"""Which scaled_dot_product_attention backend runs the model's attention (issue 5).

torch tries its SDPA backends in a fixed order (flash, memory-efficient, math, cuDNN last), while
on the H200 cuDNN attention measured about 1.7x flash. So the trainer measures instead of guessing:

- train.sdpa_backend = "auto": on CUDA, one forward + backward of the run's attention call (its
  micro-batch, heads, kv heads, seq_len, head_dim, dropout and autocast dtype, causal) is timed
  under each of cuDNN, flash and memory-efficient alone, in round-robin rounds (time_backends);
  a backend that cannot run it is skipped.
  The timings are averaged over ranks, so every rank makes the same choice. On the CPU: torch's
  own order (its flash kernel runs what these models ask; nothing to choose between).
- "default": torch's own order, nothing measured.
- a backend name: that one, which must be able to run the run's attention (else a ConfigError).

The chosen backend goes first and the others follow in torch's order, so the calls it cannot run
(MoD blocks and padded evaluation pass explicit masks, which flash and cuDNN may refuse) still find
a kernel. The backends draw dropout masks differently, so the choice is part of the run: the
trainer saves it in every checkpoint and a resumed "auto" run keeps it instead of measuring again
(bitwise resume). Two fresh "auto" runs can choose differently where two backends time within noise
of each other: name the backend for bitwise-reproducible fresh runs on the GPU.

Masked runs (sft, dpo and grpo: every forward passes a padding or document mask) never enable
cuDNN: its backward with an explicit attn_mask returns NaN in grad_q when a query row's
logsumexp falls below -ln(FLT_MAX) ~ -88.7 and the key length is 64 mod 128 (pytorch#196678,
trl#7181). On the H200 that NaN'd every DPO step of benchmarks/post_training.py, so the optimizer
skipped them all and the "trained" policy stayed the reference. Their order is torch's without
cuDNN (flash refuses masks; memory-efficient runs them), or a named backend's other than cudnn.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from ats_model import ModelConfig
from torch.nn.attention import SDPBackend, sdpa_kernel

from ats_train.config import ConfigError

BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
MEASURED = ("cudnn", "flash", "efficient")  # "auto" on CUDA; math is never the fastest there
# torch's default priority (torch._C._get_sdp_priority_order): the fallbacks after the choice
TORCH_ORDER = (
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
    SDPBackend.CUDNN_ATTENTION,
)


@dataclass(frozen=True)
class AttentionShape:
    """One training attention call: q (batch, n_head, seq_len, head_dim), k/v with n_kv_head."""

    batch: int
    n_head: int
    n_kv_head: int
    seq_len: int
    head_dim: int
    dropout: float
    dtype: torch.dtype

    @classmethod
    def of_run(
        cls, model: ModelConfig, micro_batch: int, seq_len: int, dtype: torch.dtype
    ) -> AttentionShape:
        return cls(
            micro_batch,
            model.n_head,
            model.n_kv_head,
            seq_len,
            model.head_dim,
            model.dropout,
            dtype,
        )


@dataclass(frozen=True)
class AttentionBackend:
    """The run's SDPA priority (None: torch's own) and what was measured to choose it."""

    order: tuple[SDPBackend, ...] | None
    timings_ms: dict[str, float | None]  # backend -> ms per forward + backward; None = cannot run
    resumed: bool = False  # the choice came from the checkpoint, not from a measurement now

    @property
    def name(self) -> str:
        """The train.sdpa_backend value that reproduces this choice: a backend name or "default"."""
        if self.order is None:
            return "default"
        return next(name for name, backend in BACKENDS.items() if backend == self.order[0])

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        if self.order is None:
            yield
            return
        with sdpa_kernel(list(self.order), set_priority=True):
            yield

    def describe(self) -> str:
        if self.order == MASKED_ORDER and not self.timings_ms:
            return "attention: torch's order without cuDNN (masked run: pytorch#196678)"
        first = "torch's default order" if self.order is None else self.order[0].name
        measured = ", ".join(
            f"{name} {'cannot run' if ms is None else f'{ms:.3f} ms'}"
            for name, ms in self.timings_ms.items()
        )
        if self.resumed:
            return f"attention: {first} (the run's choice, from its checkpoint)"
        return f"attention: {first}" + (f" (fwd+bwd measured: {measured})" if measured else "")


MASKED_ORDER = tuple(b for b in TORCH_ORDER if b != SDPBackend.CUDNN_ATTENTION)


def priority(name: str, masked: bool = False) -> tuple[SDPBackend, ...]:
    first = BACKENDS[name]
    rest = MASKED_ORDER if masked else TORCH_ORDER
    return (first, *(b for b in rest if b != first))


def time_backends(
    names: tuple[str, ...],
    shape: AttentionShape,
    device: torch.device,
    reps: int = 10,
    rounds: int = 3,
    warmup: int = 3,
) -> dict[str, float | None]:
    """Milliseconds per forward + backward of the run's attention call under each backend of
    `names` alone, or None for one that cannot run it here. Each runnable backend is warmed up
    (`warmup` calls: cuDNN builds its plans in the first ones), then the rounds go round-robin
    over the backends, `reps` calls each, and each backend's figure is its best round: a GPU
    still raising its clocks in the first rounds slows every backend alike instead of whichever
    was timed first (on an idle H200 that made flash read 0.58 ms against 0.34-0.38 warm)."""
    generator = torch.Generator(device).manual_seed(0)  # the run's RNG streams are not touched

    def randn(heads: int) -> torch.Tensor:
        size = (shape.batch, heads, shape.seq_len, shape.head_dim)
        t = torch.randn(size, generator=generator, device=device, dtype=shape.dtype)
        return t.requires_grad_()

    q, k, v = randn(shape.n_head), randn(shape.n_kv_head), randn(shape.n_kv_head)
    grad = torch.randn_like(q)

    def step() -> None:
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            is_causal=True,
            dropout_p=shape.dropout,
            enable_gqa=shape.n_head != shape.n_kv_head,
        )
        y.backward(grad)

    @contextlib.contextmanager
    def alone(name: str) -> Iterator[None]:
        # the dispatcher warns why each disabled backend was passed over: expected here, not news
        with sdpa_kernel([BACKENDS[name]]), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            yield

    best: dict[str, float | None] = {}
    for name in names:
        with alone(name):
            try:
                step()  # the first warm-up call: where an unsupported shape, dtype or device raises
            except torch.OutOfMemoryError:
                raise
            except RuntimeError:
                # "No available kernel" (CUDA) / "No viable backend" (CPU): with one backend
                # enabled, the dispatcher's refusal is the answer to "can it run this call"
                best[name] = None
                continue
            for _ in range(warmup - 1):
                step()
        best[name] = float("inf")
    runnable = [name for name in names if best[name] is not None]
    for _ in range(rounds):
        for name in runnable:
            with alone(name):
                _sync(device)
                start = time.perf_counter()
                for _ in range(reps):
                    step()
                _sync(device)
            best[name] = min(best[name], (time.perf_counter() - start) / reps * 1e3)
    return best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def choose_attention_backend(
    setting: str,
    shape: AttentionShape,
    device: torch.device,
    mean_over_ranks: Callable[[torch.Tensor], torch.Tensor],
    saved: str | None = None,
    masked: bool = False,
) -> AttentionBackend:
    """train.sdpa_backend -> the run's AttentionBackend (module docstring).

    mean_over_ranks (values (n,) float64 -> their mean over ranks) makes "auto" agree across
    ranks; a backend that cannot run on some rank is inf there, so it cannot win. saved: the
    choice recorded in the checkpoint a run resumes from, which "auto" keeps. masked: the run's
    forwards pass attention masks, so cuDNN is never enabled (module docstring)."""
    if setting == "auto" and saved is not None:
        chosen = choose_attention_backend(saved, shape, device, mean_over_ranks, masked=masked)
        return dataclasses.replace(chosen, resumed=True)
    if masked and setting == "cudnn":
        raise ConfigError(
            "train.sdpa_backend = 'cudnn' cannot run a masked (sft, dpo, grpo) run: cuDNN's "
            "backward with an attention mask can return NaN gradients (pytorch#196678); choose "
            "'auto', 'default', 'flash', 'efficient' or 'math'"
        )
    if masked and setting in ("auto", "default") and device.type == "cuda":
        return AttentionBackend(MASKED_ORDER, {})
    if setting == "default" or (setting == "auto" and device.type != "cuda"):
        return AttentionBackend(None, {})
    if setting != "auto":
        ms = time_backends((setting,), shape, device, reps=1, rounds=1, warmup=1)[setting]
        if ms is None:
            raise ConfigError(
                f"train.sdpa_backend = {setting!r} cannot run this run's attention on {device} "
                f"({shape.dtype}, head_dim {shape.head_dim}, dropout {shape.dropout}): choose "
                f"another of {', '.join(BACKENDS)}, 'auto' or 'default'"
            )
        return AttentionBackend(priority(setting, masked), {})
    return fastest(time_backends(MEASURED, shape, device), mean_over_ranks)


def fastest(
    local_ms: dict[str, float | None], mean_over_ranks: Callable[[torch.Tensor], torch.Tensor]
) -> AttentionBackend:
    """This rank's timings -> the order every rank agrees on: each backend's mean over ranks,
    inf (so never chosen) where any rank cannot run it; None of them runnable: torch's order."""
    names = list(local_ms)
    values = [float("inf") if local_ms[n] is None else local_ms[n] for n in names]
    mean = mean_over_ranks(torch.tensor(values, dtype=torch.float64)).tolist()
    timings = {n: (None if ms == float("inf") else ms) for n, ms in zip(names, mean, strict=True)}
    runnable = {n: ms for n, ms in timings.items() if ms is not None}
    if not runnable:
        return AttentionBackend(None, timings)
    return AttentionBackend(priority(min(runnable, key=runnable.get)), timings)
