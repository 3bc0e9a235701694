"""Run under torchrun by test_fsdp2_records.py: an optimizer step on FSDP2 parameters that are still
unsharded (a forward without its backward leaves the root's unit gathered) must raise, not update
nothing. Rank 0 writes OUT_JSON: {"error": message or null, "unsharded_after_forward": the names
of the parameters that are plain tensors (gathered) after that forward}.
argv: OUT_JSON RESHARD (parallel.fsdp2.reshard_after_forward: true or false)
"""

import json
import sys

import torch
from ats_train.backends.process_group import exit_rank
from fsdp2_cpu_setup import cpu_fsdp2
from torch.distributed.tensor import DTensor


def main(out_json: str, reshard: str) -> None:
    backend, config, raw = cpu_fsdp2("tiny-dense", reshard_after_forward=reshard == "true")
    model, optimizer = backend.wrap(raw, torch.optim.SGD(raw.parameters(), lr=0.1))
    x = torch.randint(0, config.vocab_size, (2, 16))
    model(x, targets=x)  # no backward: the root unit (reshard_after_forward=False) stays gathered
    gathered = [n for n, p in model.named_parameters() if not isinstance(p, DTensor)]
    error = None
    try:
        backend.step(optimizer, grad_clip=1.0)
    except RuntimeError as e:
        error = str(e)
    if backend.is_main:
        with open(out_json, "w") as f:
            json.dump({"error": error, "unsharded_after_forward": gathered}, f)
    backend.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    exit_rank(0)  # no interpreter finalization: see process_group.exit_rank
