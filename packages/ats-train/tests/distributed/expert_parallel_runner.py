"""expert_parallel_check.py (ddp) and fsdp2_expert_parallel_check.py on 4 gloo ranks
(test_expert_parallel.py's `four_ranks`): EP groups {0, 1} {2, 3}, so the experts also have
replicas {0, 2} {1, 3} whose gradients reduce_expert_grads sums, which the 2-rank launch
(world = N) never has. Rank 0 writes OUT_JSON: {"ddp": result, "fsdp2": result}.
argv: OUT_JSON
"""

import json
import sys

import torch.distributed as dist
from ats_train.backends.process_group import exit_rank, leave_process_group
from expert_parallel_check import check
from fsdp2_expert_parallel_check import check as fsdp2_check


def main(out_json: str) -> None:
    dist.init_process_group("gloo")
    result = {"ddp": check(capacity_factor=1.0), "fsdp2": fsdp2_check(capacity_factor=1.0)}
    is_main = dist.get_rank() == 0
    leave_process_group()
    if is_main:
        with open(out_json, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
    exit_rank(0)  # no interpreter finalization: see process_group.exit_rank
