"""`ats-train`: train from a config and overrides, or plot a run dir. Thin: the work is elsewhere.

    ats-train [--config run.toml] [--run-dir DIR] [key=value ...]
    ats-train sft | dpo | grpo --config x.toml --run-dir DIR [key=value ...]
    ats-train plot RUN_DIR
    ats-train plan --flops 1e20 [--law approach1|parametric] [--preset NAME]
    ats-train merge-adapter --model DIR --adapter DIR --out DIR
    ats-train canary add --model DIR --pairs FILE --out DIR     (opt-in ownership canary)
    ats-train drill [--run-dir DIR] [--only nan_grad,oom,...] [key=value ...]

Bad input (config typo, missing data, unwritable run dir, a checkpoint of another model, a run
dir another ats-train holds) exits with status 2 and one line on stderr; nothing already in the
run dir is touched before the checks.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from ats_data.errors import DataError
from ats_tokenizer.canary_pairs import CanaryPairsError
from ats_tokenizer.hf_json import TokenizerFileError

from ats_train.checkpoint import CheckpointError
from ats_train.config import ConfigError, load_config
from ats_train.errors import DivergedError, InputError, RewardError
from ats_train.run_lock import RunDirInUse

# what bad input, or a run that cannot go on, raises (one line, exit 2); anything else is a bug
# and keeps its traceback
USER_ERRORS = (
    ConfigError,
    CheckpointError,
    DataError,
    TokenizerFileError,
    RunDirInUse,
    OSError,
    RewardError,
    InputError,
    CanaryPairsError,
    DivergedError,
)


def _train_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ats-train",
        description="Train an ATS model. With no arguments: a tokenizer and a small MoE+MoD model "
        "on the Python standard library, on CPU, in a few minutes. `ats-train plot RUN_DIR` draws "
        "a run's metrics.",
    )
    parser.add_argument("--config", type=Path, help="TOML file (a run dir's config.toml works)")
    parser.add_argument("--run-dir", type=Path, help="default: runs/<UTC timestamp>")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. train.steps=100")
    return parser


def _plot_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ats-train plot", description="write run_dir/plots/*.png")
    parser.add_argument("run_dir", type=Path)
    return parser


def _drill_parser() -> argparse.ArgumentParser:
    from ats_train.drill import DRILLS

    parser = argparse.ArgumentParser(
        prog="ats-train drill",
        description="Inject every fault into a tiny run (orchestrator in its default mode) and "
        "print what was detected, what was done and whether the run recovered; exit 1 if any "
        "did not.",
    )
    parser.add_argument("--run-dir", type=Path, help="default: runs/drill-<UTC timestamp>")
    parser.add_argument(
        "--only", help=f"comma-separated drills (default all: {', '.join(d.name for d in DRILLS)})"
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. train.device=cuda")
    return parser


def drill(args: argparse.Namespace) -> int:
    from ats_train.config import parse_override
    from ats_train.drill import BY_NAME, TINY, run_drills

    names = list(BY_NAME) if args.only is None else args.only.split(",")
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise ConfigError(f"--only: unknown drill {unknown[0]!r}; one of {', '.join(BY_NAME)}")
    base = {**TINY, **dict(parse_override(o) for o in args.overrides)}
    load_config(None, [f"{k}={v}" for k, v in base.items()])  # bad input: before any training
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    out = writable_run_dir(args.run_dir or Path("runs") / f"drill-{stamp}")
    results = run_drills(names, base, out)
    failed = [r.drill.name for r in results if not r.recovered]
    missed = f"; not recovered: {', '.join(failed)}" if failed else ""
    print(f"{len(results) - len(failed)} of {len(results)} recovered{missed}")
    return 1 if failed else 0


def writable_run_dir(path: Path) -> Path:
    """Create the run dir and prove we can write to it before any work starts."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        # a unique, self-deleting probe: the ranks of one torchrun job check the same dir at once
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise OSError(f"run dir {path} is not writable: {e.strerror or e}") from e
    return path


POST_TRAINING = ("sft", "dpo", "grpo")  # `ats-train sft ...` = train.objective=sft


def train(args: argparse.Namespace, objective: str | None = None) -> None:
    from ats_train.build import build_trainer  # torch and the model only once input is valid

    overrides = list(args.overrides)
    if objective is not None:
        overrides.append(f"train.objective={objective}")
    config = load_config(args.config, overrides)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    run_dir = writable_run_dir(args.run_dir or Path("runs") / stamp)
    t0 = time.perf_counter()
    # the run dir stays locked, and the metrics sinks open, until the block ends, however it ends
    with build_trainer(config, run_dir) as trainer:
        trainer.train()
        model_dir = trainer.export()
        # every rank samples (an fsdp2 forward is a collective); rank 0 prints
        sample = trainer.sample() if config.train.sample_tokens else None
    trainer.backend.close()
    if not trainer.backend.is_main:
        return
    console = trainer.metrics.console
    if sample is not None:
        console.print(f"[bold]sample[/bold] (prompt {config.train.sample_prompt!r}):")
        console.print(sample, markup=False)
    console.print(f"model directory: {model_dir}")
    console.print(f"run dir: {run_dir} ({time.perf_counter() - t0:.0f} s)")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    subcommands = ("plot", "plan", "merge-adapter", "canary", "drill", *POST_TRAINING)
    command = argv[0] if argv[:1] and argv[0] in subcommands else "train"
    try:
        if command == "drill":
            return drill(_drill_parser().parse_args(argv[1:]))
        if command == "plot":
            from ats_train.plot import plot_run

            for path in plot_run(_plot_parser().parse_args(argv[1:]).run_dir):
                print(f"wrote {path}")
        elif command == "plan":
            from ats_train.planning.plan_cli import plan_parser, plan_report

            print("\n".join(plan_report(plan_parser().parse_args(argv[1:]))))
        elif command in POST_TRAINING:
            parser = _train_parser()
            parser.prog = f"ats-train {command}"
            train(parser.parse_args(argv[1:]), command)
        elif command == "merge-adapter":
            from ats_train.adapters.merge_cli import merge_adapter, merge_parser

            args = merge_parser().parse_args(argv[1:])
            print(f"wrote {merge_adapter(args.model, args.adapter, args.out)}")
        elif command == "canary":
            from ats_train.canary import add_canary, canary_parser

            args = canary_parser().parse_args(argv[1:])
            record = add_canary(args)
            print(f"wrote {args.out}: {record['n_pairs']} canary pairs, greedy match 100% after "
                  f"{record['steps']} steps (recorded in canary.json)")  # fmt: skip
        else:
            train(_train_parser().parse_args(argv))
    except USER_ERRORS as e:
        print(f"ats-train {command}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    code = main()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # a torchrun / deepspeed-launcher rank
        from ats_train.backends.process_group import exit_rank

        exit_rank(code)
    sys.exit(code)
