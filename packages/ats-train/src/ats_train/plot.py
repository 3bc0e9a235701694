"""`ats-train plot RUN_DIR`: PNGs from metrics.jsonl (loss curves, expert-utilization heatmap)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed (and none on a server)
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ats_train.metrics import METRICS_FILE, read_metrics  # noqa: E402

PLOTS_DIR = "plots"


def plot_losses(train: list[dict], val: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot([r["step"] for r in train], [r["loss"] for r in train], label="train", lw=1)
    if val:
        ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", label="val")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_expert_utilization(train: list[dict], path: Path) -> None:
    """One heatmap per MoE layer: share of routed tokens per expert (rows) over steps (columns)."""
    steps = [r["step"] for r in train]
    fractions = np.array([r["moe/expert_fraction"] for r in train])  # (steps, n_moe_layers, E)
    n_layers, n_experts = fractions.shape[1], fractions.shape[2]
    fig, axes = plt.subplots(n_layers, 1, figsize=(8, 1.2 + 1.6 * n_layers), squeeze=False)
    for i, ax in enumerate(axes[:, 0]):
        image = ax.imshow(
            fractions[:, i, :].T,  # (E, steps)
            aspect="auto",
            origin="lower",
            cmap="viridis",
            extent=(steps[0], steps[-1], -0.5, n_experts - 0.5),
            vmin=0.0,
        )
        ax.set_ylabel(f"layer {i}\nexpert")
        fig.colorbar(image, ax=ax, label="token share")
    axes[-1, 0].set_xlabel("step")
    axes[0, 0].set_title(f"expert utilization (balanced = {1 / n_experts:.3f})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_run(run_dir: Path) -> list[Path]:
    """Write run_dir/plots/*.png; returns the files written."""
    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    train = [r for r in records if r["kind"] == "train"]
    if not train:
        raise FileNotFoundError(f"{run_dir / METRICS_FILE}: no training records to plot")
    val = [r for r in records if r["kind"] == "val"]
    out = run_dir / PLOTS_DIR
    out.mkdir(exist_ok=True)
    written = [out / "loss.png"]
    plot_losses(train, val, written[0])
    if "moe/expert_fraction" in train[0]:
        written.append(out / "expert_utilization.png")
        plot_expert_utilization(train, written[-1])
    return written
