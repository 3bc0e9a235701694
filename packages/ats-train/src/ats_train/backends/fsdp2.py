"""`fsdp2`: torch.distributed.fsdp.fully_shard (FSDP2): parameters, gradients and optimizer state
sharded over ranks, torchtitan's layout: each transformer block is one all-gather / reduce-scatter
unit, then the root (embeddings, final norm, LM head). parallel.fsdp2.unit_blocks = N groups N
consecutive blocks into one unit (0: all blocks in one unit, then the root): each unit costs hooks
and collectives in forward and backward, which on a small model outweigh the memory a smaller unit
saves (124M on 2 H200s, compiled: 83.4% weak-scaling efficiency with one block unit, 52.4% per
block; `benchmarks/distributed.py --compile --only single_per_gpu,fsdp2,fsdp2_one_unit`,
BENCHMARKS.md). The last block unit and the root stay gathered after forward (torchtitan's
choice): backward starts with them. parallel.fsdp2.reshard_after_forward = false keeps every unit
gathered until its backward: one all-gather per unit per step instead of two, for the memory of
the whole unsharded model. A block returns its MoE / MoD records with its
output, so FSDP2 hooks their aux-loss tensors like the hidden state and none is lost.

MoE experts stay inside their block's unit: every expert of a block runs on every micro-batch (the
router spreads tokens over all of them), so a separate expert unit would be all-gathered at the same
moment as the rest of the block and only add collectives. With parallel.expert_parallel = N each
rank keeps its N-th of every MoE layer's experts (expert_parallel.py) as plain parameters outside
FSDP2 (fully_shard's ignored_params): no all-gather or reduce-scatter for them; their gradients are
summed over the ranks holding the same shard (none when the world is N) and the checkpoints gather
them whole, so a run resumes at any N, on single and on ddp.

The gradient clip and the optimizer update run on each rank's local shards as plain tensors
(fsdp2_local_step.py): through DTensor dispatch they held the host while the GPU idled.

Optional MixedPrecisionPolicy (train.precision = bf16: bf16 parameters in compute, fp32 gradient
reduction) and CPUOffloadPolicy (parallel.fsdp2.cpu_offload), the same for every unit. Blocks do not
cast their inputs (cast_forward_inputs=False): the residual stream is already bf16 and the RoPE
tables in the block context stay fp32, as they are in the single-device run.
Checkpoints are gathered with torch.distributed.checkpoint's state-dict API (full_state_dict,
cpu_offload) and written by rank 0 in the single backend's format, so they resume on any world
size and the model directory is a plain ATS model directory. With checkpoint.format = "sharded"
the optimizer state is not gathered: each rank writes its DTensor shards to safetensors
(optimizer_shards.py), resharded on load for any world size and for single or ddp.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from ats_train.backends.expert_parallel import (
    ExpertParallel,
    full_model_shapes,
    gather_expert_state,
    gather_experts,
    local_model_state,
    reduce_expert_grads,
    shard_experts,
    slice_expert_state,
)
from ats_train.backends.fsdp2_local_step import LocalShardStep
from ats_train.backends.optimizer_shards import load_optimizer_shards, save_optimizer_shards
from ats_train.backends.process_group import (
    all_reduce_mean,
    all_reduce_mean_tensor,
    average_expert_biases,
    join_process_group,
    leave_process_group,
)
from ats_train.checkpoint import CheckpointError
from ats_train.checkpoint_sharded import SHARDS_DIR
from ats_train.config import ConfigError, FSDP2Settings
from ats_train.model_state import read_model_state
from ats_train.precision import Precision

GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True)


class FSDP2Backend:
    name = "fsdp2"

    def __init__(
        self,
        device: torch.device,
        precision: Precision,
        settings: FSDP2Settings,
        expert_parallel: int = 1,
    ) -> None:
        if precision.scaler is not None:
            raise ConfigError(
                "parallel.backend = 'fsdp2' with train.precision = 'fp16' is not supported: "
                "use bf16 (MixedPrecisionPolicy) or fp32"
            )
        if settings.cpu_offload and device.type != "cuda":
            raise ConfigError(
                "parallel.fsdp2.cpu_offload = true needs train.device = 'cuda', not "
                f"{device.type!r}: FSDP2 offloads GPU state to pinned CPU memory"
            )
        info = join_process_group(self.name, device)
        self.device, self.precision, self.settings = info.device, precision, settings
        self.rank, self.world_size = info.rank, info.world_size
        self._model: nn.Module | None = None
        self._group_names: list[list[str]] = []  # parameter names in optimizer order, per group
        self._step: LocalShardStep | None = None  # clip + update on the local shards
        self.expert_parallel = expert_parallel  # N; the groups are made by shard_experts
        self._ep: ExpertParallel | None = None
        self._expert_names: list[str] = []  # this rank's expert shards, by state-dict name
        self._experts: list[nn.Parameter] = []

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard_experts(self, model: nn.Module) -> None:
        if self.expert_parallel == 1:
            return
        self._ep, self._expert_names, self._experts = shard_experts(model, self.expert_parallel)

    @property
    def _expert_copies(self) -> int:
        """How many ranks hold each expert shard (world / N); 1 without expert parallelism, where
        the optimizer holds no parameter outside FSDP2."""
        return self.world_size // self.expert_parallel if self._ep is not None else 1

    def wrap(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        names = {id(p): n for n, p in model.named_parameters()}
        self._group_names = [[names[id(p)] for p in g["params"]] for g in optimizer.param_groups]
        root_options: dict[str, object] = {}
        block_options: dict[str, object] = {}
        if self.precision.name == "bf16":
            root_options["mp_policy"] = MixedPrecisionPolicy(
                param_dtype=torch.bfloat16, reduce_dtype=torch.float32
            )
            block_options["mp_policy"] = MixedPrecisionPolicy(
                param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False
            )
        if self.settings.cpu_offload:
            root_options["offload_policy"] = block_options["offload_policy"] = CPUOffloadPolicy()
        if self._experts:  # each rank's own experts: left out of FSDP2, reduced by step()
            root_options["ignored_params"] = block_options["ignored_params"] = set(self._experts)
        # 0: every block in one unit. Not the root alone: on torch 2.11 a root-only FSDP2 model
        # on CUDA kept its unsharded parameters after backward, so the optimizer's sharded ones
        # never got a gradient and nothing trained (the loss sat at ln V for 50 steps on 2 H200s)
        blocks = list(model.layers)
        n = self.settings.unit_blocks or len(blocks)
        units = [blocks[i : i + n] for i in range(0, len(blocks), n)]
        for i, unit in enumerate(units):
            # a list of modules is one unit: one all-gather before the first, one reduce-scatter
            fully_shard(
                unit if len(unit) > 1 else unit[0],
                reshard_after_forward=self.settings.reshard_after_forward and i < len(units) - 1,
                **block_options,
            )
        fully_shard(model, reshard_after_forward=False, **root_options)
        self._model = model
        # fully_shard replaced every parameter by a sharded DTensor parameter of the same name;
        # the optimizer (built before sharding, no state yet) is pointed at those.
        if optimizer.state:
            raise RuntimeError("fsdp2 wrap() needs an optimizer that has not stepped yet")
        params = dict(model.named_parameters())
        for group, group_names in zip(optimizer.param_groups, self._group_names, strict=True):
            group["params"] = [params[n] for n in group_names]
        self._step = self._local_step(optimizer)
        return model, optimizer

    def _local_step(self, optimizer: torch.optim.Optimizer) -> LocalShardStep:
        return LocalShardStep(optimizer, self.device, self._expert_copies)

    def backward(self, loss: torch.Tensor, *, last_micro_batch: bool) -> None:
        # FSDP2 reduce-scatters every micro-batch by default; skipping it until the last one
        # (set_requires_gradient_sync) would keep unsharded gradients, trading memory for traffic.
        loss.backward()

    def step(self, optimizer: torch.optim.Optimizer, grad_clip: float) -> tuple[float, bool]:
        experts = {id(p) for p in self._experts}
        unsharded = [
            n
            for n, p in self._model.named_parameters()
            if not isinstance(p, DTensor) and id(p) not in experts
        ]
        if unsharded:
            # the optimizer holds the sharded DTensors: a step now would update none of these
            raise RuntimeError(
                f"fsdp2: {len(unsharded)} parameters are still unsharded at the optimizer step "
                f"(first: {unsharded[0]}); FSDP2's post-backward did not run for their unit, so "
                "their gradients never reached the optimizer's sharded parameters"
            )
        if self._step is None or self._step.optimizer is not optimizer:
            raise RuntimeError("fsdp2 step() needs the optimizer wrap() returned")
        if self._ep is not None:  # the mean FSDP2's reduce-scatter takes of the other gradients
            reduce_expert_grads(self._experts, self._ep)
        grad_norm, stepped = self._step.step(grad_clip)
        optimizer.zero_grad(set_to_none=True)
        average_expert_biases(self._model)
        return grad_norm, stepped

    def state(self) -> dict[str, object]:
        return {"scaler": None}

    def load_state(self, state: dict[str, object]) -> None:
        if state["scaler"] is not None:
            raise CheckpointError(
                "checkpoint was written with an fp16 loss scaler; fsdp2 runs fp32 or bf16"
            )

    def model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        state = get_model_state_dict(model, options=GATHER)
        if self._ep is None:
            return state
        experts = gather_experts(model, self._expert_names, self._ep)  # a collective
        return {**state, **experts} if self.is_main else state

    def load_model(self, model: nn.Module, directory: Path) -> None:
        expected = dict(model.state_dict())
        if self._ep is not None:
            expected = full_model_shapes(expected, self._expert_names, self._ep)
        state = read_model_state(expected, directory)
        if self._ep is not None:
            state = local_model_state(state, self._expert_names, self._ep)
        set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, object]:
        """Full optimizer state keyed like torch.optim's own state_dict (integer ids in optimizer
        order), i.e. the single and ddp backends' format; complete on rank 0, empty elsewhere."""
        full = get_optimizer_state_dict(self._model, optimizer, options=GATHER)
        experts = {}
        if self._ep is not None:  # a collective; keyed by name as `full` is
            named = dict(zip(self._expert_names, self._experts, strict=True))
            experts = gather_expert_state(optimizer, named, self._ep)
        if not self.is_main:
            return {}
        full["state"] = {**full["state"], **experts}
        ids = {n: i for i, n in enumerate(n for names in self._group_names for n in names)}
        return {
            "state": {ids[n]: v for n, v in full["state"].items()},
            "param_groups": [
                {**g, "params": [ids[n] for n in g["params"]]} for g in full["param_groups"]
            ],
        }

    def load_optimizer_state(
        self, optimizer: torch.optim.Optimizer, state: dict[str, object]
    ) -> None:
        names = [n for group in self._group_names for n in group]
        if self._ep is not None:  # the full expert state (any layout's) cut to this rank's
            ids = {names.index(n) for n in self._expert_names}
            state = {**state, "state": slice_expert_state(state["state"], ids, self._ep)}
        by_name = {
            "state": {names[i]: v for i, v in state["state"].items()},
            "param_groups": [
                {**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]
            ],
        }
        set_optimizer_state_dict(
            self._model, optimizer, by_name, options=StateDictOptions(full_state_dict=True)
        )
        self._step = self._local_step(optimizer)  # the update's state is the loaded one

    def sharded_layout(self) -> dict[str, object]:
        return {"writer": "safetensors", "backend": self.name, "world_size": self.world_size}

    def save_optimizer_shards(self, optimizer: torch.optim.Optimizer, directory: Path) -> None:
        save_optimizer_shards(self._model, optimizer, directory / SHARDS_DIR, self.rank)

    def load_optimizer_shards(self, optimizer: torch.optim.Optimizer, directory: Path) -> None:
        load_optimizer_shards(self._model, optimizer, directory / SHARDS_DIR, self.rank)
        self._step = self._local_step(optimizer)  # the update's state is the loaded one

    def all_reduce_mean(self, value: float) -> float:
        return all_reduce_mean(value, self.device)

    def all_reduce_mean_tensor(self, values: torch.Tensor) -> torch.Tensor:
        return all_reduce_mean_tensor(values, self.device)

    def barrier(self) -> None:
        dist.barrier()

    def close(self) -> None:
        leave_process_group()
