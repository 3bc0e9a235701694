"""Mixture-of-Depths forward + backward time against the dense model it routes through: a 2-layer
model (dim 128, B=2, T=256) dense, and with MoD at capacity 0.125 in every block, on this CPU.
Prints the best of the timed runs per model (the first run is a warm-up), one JSON line.

    uv run python benchmarks/mod_timing.py [--runs 3]
"""

import argparse
import dataclasses
import json
import time

import torch
from ats_model import MoDConfig, build_model, presets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="timed runs per model, after 1 warm-up")
    args = parser.parse_args()
    base = dataclasses.replace(presets.get("tiny-dense"), dim=128, n_layer=2, ffn_dim=384, n_head=4)
    idx = torch.randint(0, base.vocab_size, (2, 256))  # (B, T)
    mod = dataclasses.replace(base, family="mod", mod=MoDConfig(capacity=0.125, placement="all"))
    times = {}
    for name, cfg in (("dense", base), ("mod c=0.125 all blocks", mod)):
        model = build_model(cfg)
        runs = []
        for _ in range(1 + args.runs):
            t0 = time.perf_counter()
            out = model(idx, targets=idx)
            (out.loss + sum(out.aux.values())).backward()
            runs.append(time.perf_counter() - t0)
        times[name] = round(min(runs[1:]) * 1e3, 1)
    print(json.dumps({"what": "fwd+bwd ms, best of runs", "B": 2, "T": 256, "ms": times}))


if __name__ == "__main__":
    main()
