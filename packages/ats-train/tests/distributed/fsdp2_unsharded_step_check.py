"""One of rank_checks_runner.py's checks (test_fsdp2_records.py reads it): an optimizer step on
FSDP2 parameters that are still unsharded (a forward without its backward leaves the root's unit
gathered) must raise, not update nothing. `reshard` is parallel.fsdp2.reshard_after_forward. The
result: {"error": message or null, "unsharded_after_forward": the names of the parameters that are
plain tensors (gathered) after that forward}.
"""

import torch
from fsdp2_cpu_setup import cpu_fsdp2
from torch.distributed.tensor import DTensor


def check(reshard: bool) -> dict:
    backend, config, raw = cpu_fsdp2("tiny-dense", reshard_after_forward=reshard)
    model, optimizer = backend.wrap(raw, torch.optim.SGD(raw.parameters(), lr=0.1))
    x = torch.randint(0, config.vocab_size, (2, 16))
    model(x, targets=x)  # no backward: the root unit (reshard_after_forward=False) stays gathered
    gathered = [n for n, p in model.named_parameters() if not isinstance(p, DTensor)]
    error = None
    try:
        backend.step(optimizer, grad_clip=1.0)
    except RuntimeError as e:
        error = str(e)
    return {"error": error, "unsharded_after_forward": gathered}
