"""End-to-end training throughput and MFU on one device: kernels="auto" vs "reference".

The model, torch.compile, optimizer, precision and backend come from ats_train's own build functions
(build_model_config, build_model, apply_training_wrappers, build_optimizer (fused AdamW), build_precision,
build_backend), and one step is the trainer's forward_backward + backend.step with one micro-batch,
so the number is what `ats train` users get; --read-loss adds the trainer's per-step host read of
the loss before the update. Batches are random tokens (throughput does not depend on the data; no
tokenizer or shards are built). N warmup steps (compile) then timed steps between
torch.cuda.synchronize calls. MFU = tokens/s x ats_model.flops_per_token (6 x active matmul params
+ attention) / the dense bf16 peak (989 TFLOP/s on the H200, ats_train.mfu.peak_flops).

GPU: PYTHONPATH=$(ls -d $PWD/packages/*/src | tr '\\n' ':') python3 benchmarks/mfu.py
CPU smoke: uv run --no-sync python benchmarks/mfu.py --device cpu --preset tiny-dense --steps 3
--cuda-graphs replays forward + backward from CUDA graphs (train.cuda_graphs, compiled blocks
included unless --no-compile: the lever for host-bound steps such as the MoE's).
--profile DIR traces 3 more steps per run (ats_train.profiling: DIR/<run>/summary.txt, trace).
--ceiling measures the device's bf16 matmul ceiling first (an 8192^3 product, the mean of 10
after 3 warm-ups) and adds it to every row with the MFU against it (issue #30: 1B utilisation
with the ceiling measured in the same run):
  python3 benchmarks/mfu.py --preset 1b-dense,1b-moe --kernels auto --seq-len 2048 --batch 8 --ceiling
--precision fp8 runs train.precision = fp8 (torchao float8 Linear, --fp8-recipe).
Prints one JSON line per (preset, kernels) run, then one comparison line per preset:
  {"name", "ours", "baseline", "ratio", "hardware", "mfu", ...} (ours = auto, baseline = reference).
"""

import argparse
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from ats_model import build_model, count_params, flops_per_token, presets
from ats_train.attention_backend import AttentionShape, choose_attention_backend
from ats_train.backends import build_backend
from ats_train.batch_geometry import BatchGeometry
from ats_train.config import build_config
from ats_train.cuda_graphs import GraphedLoss, check_cuda_graphs
from ats_train.mfu import peak_flops
from ats_train.model_config import build_model_config
from ats_train.optim import build_optimizer
from ats_train.precision import build_precision
from ats_train.profiling import StepProfiler
from ats_train.training_wrappers import apply_training_wrappers
from torch._dynamo.utils import counters

LOSS_WEIGHTS = ("moe_lb", "moe_z", "mod_predictor")


def hardware(device: torch.device) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return f"{name}; torch {torch.__version__}"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_ceiling(device: torch.device, n: int = 8192, reps: int = 10) -> float:
    """Measured bf16 matmul FLOP/s of `device`: an n x n x n product, mean of `reps` after 3."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def run(preset: str, kernels: str, sdpa: str, args: argparse.Namespace) -> dict:
    """Build through ats_train, train args.warmup + args.steps steps, return the measurement."""
    config = build_config({
        "model.preset": preset, "kernels": kernels, "train.device": args.device,
        "train.precision": args.precision, "train.fp8_recipe": args.fp8_recipe,
        "train.residual_stream": args.residual_stream,
        "train.compile": args.compile,
        "train.cuda_graphs": args.cuda_graphs, "train.fused_loss": args.fused_loss == "on",
        "train.fused_loss_rows": args.fused_loss_rows,
        "train.batch_size": args.batch, "train.seq_len": args.seq_len, "train.sdpa_backend": sdpa,
    })  # fmt: skip
    train = config.train
    device = torch.device(args.device)
    torch._dynamo.reset()  # each run compiles its own model; graph-break counts are per run
    counters.clear()
    precision = build_precision(train.precision, device)
    backend = build_backend(config.parallel, device, precision)
    # no tokenizer here: the preset's own vocabulary (124m: GPT-2's, padded to 50304)
    model_config = build_model_config(config.model, presets.get(preset).vocab_size, train.seq_len)
    shape = AttentionShape.of_run(
        model_config, train.batch_size, train.seq_len, precision.autocast_dtype or torch.float32
    )
    attention = choose_attention_backend(train.sdpa_backend, shape, device, lambda t: t)
    check_cuda_graphs(config, model_config, device, BatchGeometry.of(train.batch_size, 1, None))
    torch.manual_seed(train.seed)
    raw_model = build_model(model_config, device=device, kernels=config.kernels)
    model = apply_training_wrappers(raw_model, train)
    optimizer = build_optimizer(raw_model, config.optim, device)
    model, optimizer = backend.wrap(model, optimizer)
    loss_weights = dict(zip(LOSS_WEIGHTS, (config.loss.moe_lb_weight, config.loss.moe_z_weight,
                                           config.loss.mod_predictor_weight), strict=True))  # fmt: skip
    g = torch.Generator(device=device).manual_seed(0)
    shape = (train.batch_size, train.seq_len)
    tokens = torch.randint(0, model_config.vocab_size, shape, device=device, generator=g)
    targets = torch.randint(0, model_config.vocab_size, shape, device=device, generator=g)

    @contextlib.contextmanager
    def forward_context(cache: bool = True) -> Iterator[None]:  # Trainer.forward_context
        with precision.autocast(cache=cache), attention.context():
            yield

    graphed = (
        GraphedLoss(model, lambda: forward_context(cache=False)) if train.cuda_graphs else None
    )

    def step() -> torch.Tensor:
        # Trainer.forward_backward with one micro-batch, then backend.step (clip + AdamW)
        if graphed is not None:
            main_loss, aux, _ = graphed(tokens, targets)
        else:
            with forward_context():
                output = model(tokens, targets=targets)
            main_loss, aux = output.loss, output.aux
        loss = main_loss + sum(loss_weights[k] * v for k, v in aux.items())
        backend.backward(loss, last_micro_batch=True)
        if args.read_loss:  # the trainer's host read before the update (Trainer.train_step)
            float(main_loss.detach())
        backend.step(optimizer, config.optim.grad_clip)
        optimizer.zero_grad(set_to_none=True)
        return main_loss.detach()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    for _ in range(args.warmup):
        step()
    sync(device)
    warmup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    sync(device)
    step_s = (time.perf_counter() - t0) / args.steps
    if args.profile:  # after the timing, so the profiler's overhead stays out of it
        profiler = StepProfiler(0, 3, args.profile / f"{preset}_{kernels}_sdpa_{sdpa}", device)
        profiler.before_step(0)
        for _ in range(3):
            step()
        profiler.after_step(3)
    tokens_per_s = train.batch_size * train.seq_len / step_s
    fpt = flops_per_token(model_config, train.seq_len)
    peak = peak_flops(device, train.precision)
    return {
        "name": f"train_{preset}_{kernels}_sdpa_{sdpa}", "preset": preset, "kernels": kernels,
        "kernel_set": raw_model.kernels.name, "sdpa": attention.describe(),
        "tokens_per_s": round(tokens_per_s, 1), "step_ms": round(step_s * 1e3, 3),
        "mfu": None if peak is None else round(tokens_per_s * fpt / peak, 4),
        "flops_per_token": fpt, "active_params": count_params(model_config)[1],
        "batch": train.batch_size, "seq_len": train.seq_len, "precision": train.precision,
        "residual_stream": train.residual_stream, "fused_loss": train.fused_loss,
        "fused_loss_rows": train.fused_loss_rows,
        "read_loss": args.read_loss, "compile": train.compile, "cuda_graphs": train.cuda_graphs, "warmup_steps": args.warmup, "timed_steps": args.steps,
        "warmup_s": round(warmup_s, 1), "final_loss": round(float(loss), 4),
        "graph_breaks": sum(counters["graph_break"].values()),
        "graph_break_reasons": [r[:160] for r, _ in counters["graph_break"].most_common(5)],
        "peak_mem_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        if device.type == "cuda" else None,
        "hardware": hardware(device),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--preset", default="124m-dense,124m-moe", help="comma-separated presets")
    parser.add_argument("--kernels", default="auto,reference", help="ours first, then baseline")
    parser.add_argument("--batch", type=int, default=None, help="sequences per step (cuda: 32)")
    parser.add_argument("--seq-len", type=int, default=None, help="cuda: 1024, cpu: 64")
    parser.add_argument(
        "--warmup", type=int, default=None, help="untimed steps, compile included (cuda: 3)"
    )
    parser.add_argument("--steps", type=int, default=None, help="timed steps (cuda: 10)")
    parser.add_argument(
        "--sdpa", default="auto", help="train.sdpa_backend, comma list: one row per value (ours)"
    )
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp32", "fp8"))
    parser.add_argument("--fp8-recipe", default="tensorwise", choices=("tensorwise", "rowwise"))
    parser.add_argument(
        "--ceiling", action="store_true", help="measure the bf16 matmul ceiling first (module doc)"
    )
    parser.add_argument(
        "--residual-stream",
        default="fp32",
        choices=("fp32", "autocast"),
        help="train.residual_stream",
    )
    parser.add_argument(
        "--fused-loss", default="on", choices=("on", "off"), help="train.fused_loss (head + loss)"
    )
    parser.add_argument(
        "--fused-loss-rows", type=int, default=0, help="train.fused_loss_rows (0 = the batch)"
    )
    parser.add_argument(
        "--read-loss",
        action="store_true",
        help="wait for the loss on the host before each update, as ats-train does (its "
        "orchestrator reads it before deciding on the update); without it the step waits once, "
        "in backend.step, for the gradient norm",
    )
    parser.add_argument(
        "--profile", type=Path, default=None, help="also trace 3 steps per run into this dir"
    )
    parser.add_argument("--no-compile", dest="compile", action="store_false", default=None)
    parser.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="train.cuda_graphs (forward + backward replayed from CUDA graphs, compiled or not)",
    )
    args = parser.parse_args()
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("benchmarks/mfu.py: no CUDA device (use --device cpu for a smoke run)")
    defaults = {"batch": 32 if cuda else 2, "seq_len": 1024 if cuda else 64,
                "warmup": 3 if cuda else 1, "steps": 10 if cuda else 3, "compile": cuda}  # fmt: skip
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.steps < 1 or args.batch < 1:
        raise SystemExit(
            f"benchmarks/mfu.py: --steps {args.steps} and --batch {args.batch} must be >= 1"
        )
    kernel_runs = args.kernels.split(",")
    ceiling = None
    if args.ceiling:
        ceiling = matmul_ceiling(
            torch.device(args.device), 8192 if cuda else 256, 10 if cuda else 2
        )
        print(json.dumps({"name": "matmul_ceiling_bf16", "tflops": round(ceiling / 1e12, 1),
                          "hardware": hardware(torch.device(args.device))}), flush=True)  # fmt: skip
    for preset in args.preset.split(","):
        rows = {}
        for kernels in kernel_runs:
            # each train.sdpa_backend value with our kernels; the baseline with the first
            for sdpa in (
                args.sdpa.split(",") if kernels == kernel_runs[0] else args.sdpa.split(",")[:1]
            ):
                row = run(preset, kernels, sdpa, args)
                if ceiling is not None:
                    row["matmul_ceiling_tflops"] = round(ceiling / 1e12, 1)
                    achieved = row["tokens_per_s"] * row["flops_per_token"]
                    row["mfu_of_ceiling"] = round(achieved / ceiling, 4)
                rows.setdefault(kernels, row)
                print(json.dumps(row), flush=True)
                if cuda:
                    torch.cuda.empty_cache()
        if len(kernel_runs) == 2:
            ours, base = (rows[k] for k in kernel_runs)
            print(json.dumps({
                "name": f"train_{preset}_tokens_per_s_{kernel_runs[0]}_vs_{kernel_runs[1]}",
                "ours": ours["tokens_per_s"], "baseline": base["tokens_per_s"],
                "ratio": round(ours["tokens_per_s"] / base["tokens_per_s"], 4),
                "ratio_is": "speedup", "unit": "tokens/s", "mfu": ours["mfu"],
                "baseline_mfu": base["mfu"], "hardware": ours["hardware"],
            }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
