"""`colossalai`: ColossalAI's Booster with its LowLevelZero plugin (ZeRO-2: optimizer state and
gradients sharded over ranks). CUDA only, and only inside the isolated env envs/colossalai
(torch 2.5.1, colossalai 0.5.0; ColossalAI pins torch <= 2.5.1, the workspace has torch >= 2.11):
see envs/colossalai/README.md for what runs where. Checkpoints are gathered into the single
backend's full, unsharded format, so they resume on any backend and world size.
"""

from __future__ import annotations

import importlib.util
import math
import typing
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from ats_train.backends.process_group import (
    all_reduce_mean,
    all_reduce_mean_tensor,
    average_expert_biases,
    join_process_group,
    leave_process_group,
)
from ats_train.checkpoint import CheckpointError
from ats_train.config import ConfigError
from ats_train.config.choices import ColossalAIPlugin
from ats_train.model_state import read_model_state
from ats_train.precision import Precision

if importlib.util.find_spec("colossalai") is None:
    raise ConfigError(
        "parallel.backend = 'colossalai' needs ColossalAI, which is not installed in this "
        f"environment (torch {torch.__version__}). ColossalAI 0.5.0 pins torch <= 2.5.1, so it "
        "lives in its own environment: run envs/colossalai/setup.sh, then launch with "
        "envs/colossalai/.venv/bin/torchrun (see envs/colossalai/README.md)"
    )

from colossalai.booster import Booster  # noqa: E402  (only after the check above)
from colossalai.booster.plugin import LowLevelZeroPlugin  # noqa: E402
from colossalai.zero.low_level import LowLevelZeroOptimizer  # noqa: E402

ZERO_STAGE = 2  # LowLevelZero: 1 shards optimizer state, 2 also gradients


class ColossalAIBackend:
    name = "colossalai"

    def __init__(self, device: torch.device, precision: Precision, plugin: str) -> None:
        if plugin not in typing.get_args(ColossalAIPlugin):
            raise ConfigError(
                f"parallel.colossalai.plugin = {plugin!r} is not one of "
                f"{', '.join(typing.get_args(ColossalAIPlugin))}"
            )
        if device.type != "cuda":
            # ColossalAI 0.5.0 refuses the CPU: LowLevelZeroOptimizer._sanity_checks asserts a
            # cuda/npu accelerator (colossalai/zero/low_level/low_level_optim.py:254), and both
            # plugins list only ["cuda", "npu"] as supported_devices.
            raise ConfigError(
                f"parallel.backend = 'colossalai' needs train.device = 'cuda', not "
                f"{device.type!r}: ColossalAI's LowLevelZero and Gemini plugins run on CUDA "
                "(or NPU) only"
            )
        if precision.name not in ("fp32", "bf16"):
            raise ConfigError(
                f"parallel.backend = 'colossalai' with train.precision = {precision.name!r} is not "
                "supported: use fp32 or bf16 (fp16 would need ColossalAI's own loss scaler)"
            )
        info = join_process_group(self.name, device)
        self.device, self.precision, self.plugin = info.device, precision, plugin
        self.rank, self.world_size = info.rank, info.world_size
        self._booster: Booster | None = None
        self._plain: nn.Module | None = None
        self._optimizer: LowLevelZeroOptimizer | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard_experts(self, model: nn.Module) -> None:
        return None  # no expert parallelism here (config refuses it)

    def wrap(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        # fp32: fp32 working parameters; bf16: bf16 working parameters (the module is cast) and
        # fp32 master shards in the optimizer. Clipping is set per step (step()); max_norm 0 here.
        plugin = LowLevelZeroPlugin(stage=ZERO_STAGE, precision=self.precision.name)
        self._booster = Booster(plugin=plugin)
        self._plain = model
        wrapped, boosted, *_ = self._booster.boost(model, optimizer)
        if not isinstance(boosted, LowLevelZeroOptimizer):
            raise TypeError(f"LowLevelZeroPlugin returned {type(boosted).__name__}")
        self._optimizer = boosted
        return wrapped, boosted

    def backward(self, loss: torch.Tensor, *, last_micro_batch: bool) -> None:
        # ZeRO-2 reduce-scatters every micro-batch into its gradient partition and accumulates
        # there; ColossalAI refuses no_sync with partitioned gradients.
        self._booster.backward(loss, self._optimizer)

    def step(self, optimizer: torch.optim.Optimizer, grad_clip: float) -> tuple[float, bool]:
        # The threshold can change during a run (the orchestrator's grad_clip action), but the
        # plugin only takes it when built: LowLevelZeroOptimizer reads _clip_grad_norm in each
        # step (low_level_optim.py:708; 0 = no clipping, the norm is measured either way).
        self._optimizer._clip_grad_norm = grad_clip
        self._optimizer.step()
        grad_norm = float(self._optimizer.get_grad_norm())
        self._optimizer.zero_grad()
        if not math.isfinite(grad_norm):
            # fp32/bf16 LowLevelZero applies the update whatever the norm (only its fp16 mixin
            # skips), so the weights are no longer finite: stop instead of training on NaN.
            raise FloatingPointError(
                f"gradient norm {grad_norm} at a colossalai step: ColossalAI applied the update, "
                "the weights are not finite; resume from the last checkpoint"
            )
        average_expert_biases(self._plain)
        return grad_norm, True

    def state(self) -> dict[str, object]:
        return {"scaler": None}

    def load_state(self, state: dict[str, object]) -> None:
        if state["scaler"] is not None:
            raise ValueError(
                "checkpoint was written with an fp16 loss scaler; colossalai runs fp32 or bf16"
            )

    def model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Every parameter from its fp32 master shards (all-gathered), buffers as fp32."""
        state = _float32(model.state_dict())
        masters = self._optimizer.get_working_to_master_map()
        for name, p in model.named_parameters():
            shard = masters[id(p)]  # (padded numel / world_size,) fp32
            group = self._optimizer.param_to_pg[p]
            numel = shard.numel() * dist.get_world_size(group)
            full = torch.empty(numel, dtype=shard.dtype, device=shard.device)
            dist.all_gather_into_tensor(full, shard, group=group)
            state[name] = full[: p.numel()].view(p.shape).cpu()  # padding dropped
        return state

    def load_model(self, model: nn.Module, directory: Path) -> None:
        state = read_model_state(_float32(model.state_dict()), directory)
        model.load_state_dict(state, strict=True)  # working copies (cast to bf16 under bf16)
        # Master shards from the fp32 file itself, as update_master_params
        # (low_level_optim.py:923) does from the (possibly bf16) working copies.
        masters = self._optimizer.get_working_to_master_map()
        with torch.no_grad():
            for name, p in model.named_parameters():
                shard = masters[id(p)]
                group = self._optimizer.param_to_pg[p]
                flat = state[name].reshape(-1).to(shard.device, shard.dtype)
                world = dist.get_world_size(group)
                flat = nn.functional.pad(flat, [0, shard.numel() * world - flat.numel()])
                shard.copy_(flat.chunk(world)[dist.get_rank(group)])

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, object]:
        """LowLevelZeroOptimizer.state_dict gathers every rank's shard into torch.optim's own
        layout (integer ids in optimizer order); a collective, complete on every rank."""
        return self._optimizer.state_dict()

    def load_optimizer_state(
        self, optimizer: torch.optim.Optimizer, state: dict[str, object]
    ) -> None:
        self._optimizer.load_state_dict(state)  # keeps this rank's slice of each full state

    def sharded_layout(self) -> dict[str, object]:
        # checkpoint.format = "sharded" is refused at config time (TrainConfig); this is reached
        # only when resuming a sharded checkpoint written by another backend
        raise CheckpointError(
            "parallel.backend = 'colossalai' reads only checkpoint.format = 'full' checkpoints; "
            "the latest checkpoint holds sharded optimizer state"
        )

    def all_reduce_mean(self, value: float) -> float:
        return all_reduce_mean(value, self.device)

    def all_reduce_mean_tensor(self, values: torch.Tensor) -> torch.Tensor:
        return all_reduce_mean_tensor(values, self.device)

    def barrier(self) -> None:
        dist.barrier()

    def close(self) -> None:
        leave_process_group()


def _float32(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Floating tensors as fp32: under bf16 the plugin casts the whole module (buffers too), but
    the model directory keeps the single backend's fp32 layout."""
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
