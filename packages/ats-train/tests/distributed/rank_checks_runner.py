"""Run once per test session under torchrun (2 gloo ranks) by conftest.py's `rank_checks`: every
backend check that needs real ranks but not the CLI, one after another in one process group (a
launch costs more than the checks). Rank 0 writes OUT_JSON: {check name: its result}.
argv: OUT_JSON
"""

import json
import sys

import torch.distributed as dist
from ats_train.backends.process_group import exit_rank, leave_process_group
from expert_bias_check import check as expert_bias
from expert_parallel_check import check as expert_parallel
from fsdp2_expert_parallel_check import check as fsdp2_expert_parallel
from fsdp2_local_step_check import check as fsdp2_local_step
from fsdp2_records_check import check as fsdp2_records
from fsdp2_unsharded_step_check import check as fsdp2_unsharded_step

CHECKS = {
    "expert_bias/ddp": lambda: expert_bias("ddp"),
    "expert_bias/fsdp2": lambda: expert_bias("fsdp2"),
    "expert_parallel/dropless": lambda: expert_parallel(capacity_factor=None),
    "expert_parallel/capacity": lambda: expert_parallel(capacity_factor=1.0),
    "fsdp2_expert_parallel/dropless": lambda: fsdp2_expert_parallel(capacity_factor=None),
    "fsdp2_expert_parallel/capacity": lambda: fsdp2_expert_parallel(capacity_factor=1.0),
    "fsdp2_records/plain": lambda: fsdp2_records(checkpointing=False),
    "fsdp2_records/checkpointing": lambda: fsdp2_records(checkpointing=True),
    "fsdp2_local_step": fsdp2_local_step,
    # last: these leave a model with a forward and no backward behind
    "fsdp2_unsharded_step/reshard": lambda: fsdp2_unsharded_step(reshard=True),
    "fsdp2_unsharded_step/no_reshard": lambda: fsdp2_unsharded_step(reshard=False),
}


def main(out_json: str) -> None:
    results = {name: check() for name, check in CHECKS.items()}
    is_main = dist.get_rank() == 0
    leave_process_group()
    if is_main:
        with open(out_json, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1])
    exit_rank(0)  # no interpreter finalization: see process_group.exit_rank
