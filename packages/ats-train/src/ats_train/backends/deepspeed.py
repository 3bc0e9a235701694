"""`deepspeed`: DeepSpeed ZeRO stages 1-3 (Rajbhandari et al. 2020), optimizer / parameter offload
to CPU (ZeRO-Offload, Ren et al. 2021) or NVMe (ZeRO-Infinity, Rajbhandari et al. 2021).

The engine wraps ATS's own model and AdamW (its two parameter groups, so norms and embeddings stay
undecayed); with optimizer offload the same groups and hyper-parameters go to DeepSpeedCPUAdam.
The trainer's per-step LR reaches DeepSpeed because the ZeRO optimizer's param_groups are the
wrapped optimizer's. Gradient accumulation: the trainer already divides each micro-batch loss by
n_micro, so backward runs with scale_wrt_gas=False and the last micro-batch is marked as the
accumulation boundary explicitly (set_gradient_accumulation_boundary), then step() updates once.

Checkpoints, checkpoint.format = "full" (the default): not DeepSpeed's sharded format. A ZeRO
checkpoint (mp_rank_*/zero_pp_rank_*) reloads only on the same world size, and resuming elsewhere
needs an offline conversion (ds_to_universal, zero_to_fp32) whose output is not torch.optim's layout
either. Instead every rank takes part in gathering the full fp32 master weights and Adam moments
through DeepSpeed's full-state API
(deepspeed.utils.safe_get_full_fp32_param / safe_get_full_optimizer_state, a collective for every
stage and offload) and rank 0 writes them in the single backend's format, as fsdp2 does: a
checkpoint saved by ZeRO-3 on 2 ranks resumes with `single` on 1 rank, with any ZeRO stage on any
world size, and its model directory is a plain ATS model directory. Loading scatters the full
tensors back with safe_set_full_fp32_param / safe_set_full_optimizer_state.
checkpoint.format = "sharded": DeepSpeed's own engine.save_checkpoint, every rank its ZeRO
partition of the fp32 masters and Adam moments, nothing gathered (rank 0 still writes the model
directory); it resumes only under deepspeed with the same world size and ZeRO stage
(checkpoint_sharded.check_resumable).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
from ats_model.layers.attention import Attention
from ats_model.layers.ffn import SwiGLUFFN
from torch import nn

from ats_train.backends.deepspeed_config import (
    build_ds_config,
    check_nvme_paths,
    check_param_swap,
    check_param_swap_ranks,
    check_partial_offload,
    fit_param_swap_buffers,
    offload_device,
    offload_ratio,
)
from ats_train.backends.deepspeed_load import weights_only_loads
from ats_train.backends.process_group import (
    all_reduce_mean,
    all_reduce_mean_tensor,
    average_expert_biases,
    join_process_group,
    leave_process_group,
)
from ats_train.checkpoint import CheckpointError
from ats_train.checkpoint_sharded import DEEPSPEED_DIR, DEEPSPEED_TAG
from ats_train.config import ConfigError, TrainConfig
from ats_train.model_state import read_model_state
from ats_train.precision import Precision

ADAM_MOMENTS = ("exp_avg", "exp_avg_sq")
INSTALL_HINT = (
    "`uv sync --extra deepspeed` (`uv sync --package ats-train --extra deepspeed` from the "
    "workspace root) or `pip install 'ats-train[deepspeed]'`"
)


def import_deepspeed() -> ModuleType:
    """DeepSpeed, or a ConfigError naming the extra that installs it."""
    try:
        import deepspeed
    except ModuleNotFoundError as e:
        if e.name != "deepspeed":
            raise
        raise ConfigError(
            "parallel.backend = 'deepspeed' needs DeepSpeed, an optional extra of ats-train; "
            f"install it with {INSTALL_HINT}"
        ) from e
    return deepspeed


def external_parameters(model: nn.Module) -> list[tuple[nn.Module, nn.Parameter]]:
    """(module, parameter) pairs where a module's forward reads a parameter its child owns without
    calling the child: the head's weight in the root (the tied head and the fused loss), wq / wk /
    wv in every attention (the wqkv GEMM) and w1 / w3 in every SwiGLU FFN (the w13 GEMM) when
    fused. ZeRO-3 gathers a parameter only in its owner's forward, so these are registered with
    the reader too (harmless when not fused)."""
    head = model.tok_embeddings if model.output is None else model.output
    pairs: list[tuple[nn.Module, nn.Parameter]] = [(model, head.weight)]
    for module in model.modules():
        if isinstance(module, Attention):
            pairs += [(module, lin.weight) for lin in (module.wq, module.wk, module.wv)]
        elif isinstance(module, SwiGLUFFN):
            pairs += [(module, lin.weight) for lin in (module.w1, module.w3)]
    return pairs


class DeepSpeedBackend:
    name = "deepspeed"

    def __init__(self, config: TrainConfig, device: torch.device, precision: Precision) -> None:
        check_nvme_paths(config.parallel.deepspeed)  # before any rank joins or allocates anything
        check_partial_offload(config)
        self._ds = import_deepspeed()
        from deepspeed.accelerator import get_accelerator

        accelerator = get_accelerator().device_name()
        info = join_process_group(self.name, device)
        if accelerator != info.device.type:
            raise ConfigError(
                f"DeepSpeed's accelerator is {accelerator!r} but train.device is "
                f"{info.device.type!r}; set DS_ACCELERATOR={info.device.type}"
            )
        self.device, self.precision = info.device, precision
        self.rank, self.world_size = info.rank, info.world_size
        self.ds_config = build_ds_config(config, info.world_size, info.device.type)
        check_param_swap_ranks(self.ds_config, info.device.type, info.world_size)
        user_json = config.parallel.deepspeed.config
        self._user_json = Path(user_json).expanduser() if user_json else None
        # DeepSpeed scales fp16 losses itself (its dynamic loss scaler, configured like
        # GradScaler); the trainer's GradScaler would scale a second time.
        precision.scaler = None
        self._engine: Any = None  # deepspeed.DeepSpeedEngine
        self._zero: Any = None  # its ZeRO optimizer (stage 1/2, 3, or bf16 stage 1)
        self._base: torch.optim.Optimizer | None = None  # AdamW or DeepSpeedCPUAdam inside it
        self._model: nn.Module | None = None
        self._group_names: list[list[str]] = []  # parameter names in optimizer order, per group
        self._group_options: list[dict[str, Any]] = []  # torch AdamW's group keys, for saving

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard_experts(self, model: nn.Module) -> None:
        return None  # no expert parallelism here (config refuses it)

    def wrap(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        if optimizer.state:
            raise RuntimeError("deepspeed wrap() needs an optimizer that has not stepped yet")
        names = {id(p): n for n, p in model.named_parameters()}
        self._group_names = [[names[id(p)] for p in g["params"]] for g in optimizer.param_groups]
        self._group_options = [
            {k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups
        ]
        if offload_device(self.ds_config, "param") == "nvme":
            if self._user_json:
                check_param_swap(self.ds_config, self._user_json, model, self.world_size)
            else:
                fit_param_swap_buffers(self.ds_config, model, self.world_size)
        if offload_device(self.ds_config, "optimizer") != "none":
            optimizer = self._cpu_adam(optimizer)
        engine, zero, _, _ = self._ds.initialize(
            model=model, optimizer=optimizer, config=self.ds_config, dist_init_required=False
        )
        if self.ds_config["zero_optimization"]["stage"] == 3:
            for reader, param in external_parameters(model):
                self._ds.zero.register_external_parameter(reader, param)
        self._engine, self._zero, self._base, self._model = engine, zero, optimizer, model
        if offload_ratio(self.ds_config) < 1.0:
            self._join_partial_offload()
        return engine, zero

    def _join_partial_offload(self) -> None:
        """DeepSpeed's partial offload (ZeRO-3, offload_optimizer.ratio < 1) steps the GPU's
        sub-groups with a second optimizer, a torch AdamW that shares the CPU AdamW's group dicts
        except the first, which it copies at construction, and keeps its own state. The trainer
        sets the LR on the CPU AdamW's groups every step, and the full-state checkpoint API reads
        the CPU AdamW's state only: so the GPU sub-groups of group 0 would keep the first LR for
        the whole run, and no checkpoint could gather their moments. Both optimizers get the
        same group 0 and the same state dict (keyed by distinct flat fp32 partitions)."""
        backup = getattr(self._zero, "backup_optimizer", None)
        if backup is None:
            raise RuntimeError(
                "DeepSpeed's ZeRO-3 optimizer has no backup_optimizer although "
                "offload_optimizer.ratio < 1; this DeepSpeed version splits the optimizer "
                "differently (tested with 0.19.8)"
            )
        first = self._base.param_groups[0]
        for key, default in backup.defaults.items():  # as torch's add_param_group does
            first.setdefault(key, default)
        backup.param_groups[0] = first
        backup.state = self._base.state

    def _cpu_adam(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The same groups and hyper-parameters on DeepSpeed's vectorized CPU AdamW (JIT-built
        on first use): ZeRO-Offload steps the optimizer on the host."""
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        groups = [
            {"params": g["params"], "weight_decay": g["weight_decay"]}
            for g in optimizer.param_groups
        ]
        first = optimizer.param_groups[0]
        return DeepSpeedCPUAdam(
            groups, lr=first["lr"], betas=first["betas"], eps=first["eps"], adamw_mode=True
        )

    def backward(self, loss: torch.Tensor, *, last_micro_batch: bool) -> None:
        self._engine.set_gradient_accumulation_boundary(last_micro_batch)
        self._engine.backward(loss, scale_wrt_gas=False)  # the trainer divided by n_micro

    def step(self, optimizer: torch.optim.Optimizer, grad_clip: float) -> tuple[float, bool]:
        # optim.grad_clip may change during a run (the orchestrator's grad_clip kind)
        self._zero.clip_grad = grad_clip
        self._engine.step()
        norm = self._engine.get_global_grad_norm()  # before clipping
        if norm is None:
            raise RuntimeError(
                "DeepSpeed computed no gradient norm (zero_optimization.compute_grad_norm = "
                "false in parallel.deepspeed.config?); ats-train logs it every step"
            )
        average_expert_biases(self._model)
        return float(norm), self._engine.was_step_applied()  # not applied: fp16 overflow

    # ---- state ---------------------------------------------------------------------------------
    def state(self) -> dict[str, object]:
        scaler = None
        if self.precision.name == "fp16":
            s = self._zero.loss_scaler
            scaler = {
                "cur_scale": float(s.cur_scale),
                "cur_iter": s.cur_iter,
                "last_overflow_iter": s.last_overflow_iter,
                "cur_hysteresis": s.cur_hysteresis,
            }
        # "scaler" (the GradScaler of single/ddp) stays None: DeepSpeed keeps its own
        return {"scaler": None, "deepspeed_loss_scaler": scaler}

    def load_state(self, state: dict[str, object]) -> None:
        if state["scaler"] is not None:
            raise CheckpointError(
                "checkpoint was written with a torch GradScaler (fp16 on single/ddp); "
                "deepspeed keeps its own loss scaler"
            )
        saved = state.get("deepspeed_loss_scaler")  # absent in other backends' checkpoints
        if saved is None:
            return
        if self.precision.name != "fp16":
            raise CheckpointError(
                f"checkpoint has an fp16 loss scaler; this run is {self.precision.name}"
            )
        scaler = self._zero.loss_scaler  # DynamicLossScaler: plain attributes
        for key, value in saved.items():
            setattr(scaler, key, value)

    def _full_shape(self, p: nn.Parameter) -> torch.Size:
        return p.ds_shape if hasattr(p, "ds_shape") else p.shape  # ZeRO-3 keeps the full shape

    def model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """fp32 master weights gathered from the ZeRO partitions (a collective on every rank;
        complete everywhere), buffers as they are, every float in fp32 like the single backend."""
        from deepspeed.utils import safe_get_full_fp32_param

        out: dict[str, torch.Tensor] = {}
        gathered: dict[int, torch.Tensor] = {}  # tied parameters are gathered once
        for key, value in model.state_dict(keep_vars=True).items():
            if isinstance(value, nn.Parameter):
                if id(value) not in gathered:
                    full = safe_get_full_fp32_param(value)
                    if full is None:
                        raise RuntimeError(f"DeepSpeed holds no fp32 master weight for {key}")
                    gathered[id(value)] = full.detach().reshape(self._full_shape(value)).cpu()
                out[key] = gathered[id(value)]
            else:
                tensor = value.detach().cpu()
                out[key] = tensor.float() if tensor.is_floating_point() else tensor
        return out

    def load_model(self, model: nn.Module, directory: Path) -> None:
        """Every rank reads the full tensors and writes its own partition of the fp32 masters and
        of the (possibly bf16, possibly ZeRO-3-partitioned) parameters the forward uses."""
        from deepspeed.utils import safe_set_full_fp32_param

        current = model.state_dict(keep_vars=True)
        expected = {
            key: torch.empty(self._full_shape(v), dtype=torch.float32, device="meta")
            if isinstance(v, nn.Parameter) or v.is_floating_point()
            else v
            for key, v in current.items()
        }
        state = read_model_state(expected, directory)
        for key, value in current.items():
            if isinstance(value, nn.Parameter):
                full = state[key].to(self.device)
                with self._ds.zero.GatheredParameters([value], modifier_rank=0):
                    value.data.copy_(full.to(value.dtype))
                safe_set_full_fp32_param(value, full)
            else:
                value.copy_(state[key].to(value.dtype))

    def _ordered_params(self) -> list[nn.Parameter]:
        params = dict(self._model.named_parameters())
        return [params[n] for names in self._group_names for n in names]

    def _adam_step(self) -> int:
        """The AdamW step count (steps skipped on fp16 overflow not counted), 0 before the first."""
        steps = {int(s["step"]) for s in self._base.state.values() if "step" in s}
        if len(steps) > 1:
            raise RuntimeError(f"DeepSpeed's optimizer groups disagree on the step: {steps}")
        return steps.pop() if steps else 0

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, object]:
        """torch.optim AdamW's state_dict layout (integer ids in optimizer order), full and fp32,
        gathered by every rank; complete on rank 0, empty elsewhere."""
        from deepspeed.utils import safe_get_full_optimizer_state

        step = self._adam_step()
        state: dict[int, dict[str, torch.Tensor]] = {}
        if step:
            self._link_optimizer_state()
            for i, p in enumerate(self._ordered_params()):
                entry: dict[str, torch.Tensor] = {"step": torch.tensor(float(step))}
                for key in ADAM_MOMENTS:
                    full = safe_get_full_optimizer_state(p, key)
                    entry[key] = full.detach().reshape(self._full_shape(p)).float().cpu()
                state[i] = entry
        if not self.is_main:
            return {}
        groups, start = [], 0
        for options, names, live in zip(
            self._group_options, self._group_names, self._zero.param_groups, strict=True
        ):
            live_options = {k: live[k] for k in ("lr", "betas", "eps", "weight_decay")}
            groups.append(
                {**options, **live_options, "params": list(range(start, start + len(names)))}
            )
            start += len(names)
        return {"state": state, "param_groups": groups}

    def load_optimizer_state(
        self, optimizer: torch.optim.Optimizer, state: dict[str, object]
    ) -> None:
        from deepspeed.utils import safe_set_full_optimizer_state

        saved_groups = state["param_groups"]
        if len(saved_groups) != len(self._group_names):
            raise CheckpointError(
                f"optimizer state has {len(saved_groups)} parameter groups, this run has "
                f"{len(self._group_names)}"
            )
        for live, saved, names in zip(
            self._zero.param_groups, saved_groups, self._group_names, strict=True
        ):
            if len(saved["params"]) != len(names):
                raise CheckpointError(
                    f"optimizer state group has {len(saved['params'])} parameters, this run "
                    f"{len(names)}"
                )
            for key in ("lr", "betas", "eps", "weight_decay"):
                live[key] = saved[key]
        if not state["state"]:
            return  # saved before the first step
        steps = {int(entry["step"]) for entry in state["state"].values()}
        if len(steps) != 1:
            raise CheckpointError(f"optimizer state holds different step counts {sorted(steps)}")
        self._materialize_adam_state(steps.pop())
        for i, p in enumerate(self._ordered_params()):
            for key in ADAM_MOMENTS:
                safe_set_full_optimizer_state(p, state["state"][i][key].to(self.device), key)

    def _materialize_adam_state(self, step: int) -> None:
        """Adam state exists only after a first step; a resumed run creates it (zeros, the saved
        step count) in the wrapped optimizer's own format, then fills it partition by partition."""
        if offload_device(self.ds_config, "optimizer") == "nvme":
            raise ConfigError(
                "resuming optimizer state with parallel.deepspeed.offload_optimizer = 'nvme' is "
                "not supported (the state lives in swap files); resume with offload 'cpu' or 'none'"
            )
        base = self._base
        entries = [e for e in base.state.values() if "exp_avg" in e]
        if entries:  # already stepped in this process: the moments exist and are linked
            for entry in entries:
                if isinstance(entry["step"], int):
                    entry["step"] = step
                else:
                    entry["step"].fill_(float(step))
            return
        on_device = self._group_options[0]["fused"] or self._group_options[0]["capturable"]
        for flat in self._flat_masters():
            if isinstance(base, torch.optim.AdamW):
                # as torch.optim.adamw._init_group: a device tensor for fused/capturable
                step_value: Any = torch.tensor(
                    float(step), device=flat.device if on_device else "cpu"
                )
            elif flat.device.type != "cpu":
                # partial offload: DeepSpeed's plain torch AdamW steps the GPU's sub-groups
                step_value = torch.tensor(float(step))
            else:  # DeepSpeedCPUAdam counts in a Python int
                step_value = step
            base.state[flat] = {
                "step": step_value,
                **{k: torch.zeros_like(flat, dtype=torch.float32) for k in ADAM_MOMENTS},
            }
        self._link_optimizer_state()

    def _flat_masters(self) -> list[torch.Tensor]:
        """This rank's flat fp32 master partitions: the tensors the wrapped optimizer steps."""
        from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
        from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
        from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

        if isinstance(self._zero, DeepSpeedZeroOptimizer_Stage3):
            return list(self._zero.fp32_partitioned_groups_flat)
        if isinstance(self._zero, DeepSpeedZeroOptimizer):
            return list(self._zero.single_partition_of_fp32_groups)
        if isinstance(self._zero, BF16_Optimizer):
            return list(self._zero.fp32_groups_flat_partition)
        raise TypeError(f"unexpected DeepSpeed optimizer {type(self._zero).__name__}")

    def _link_optimizer_state(self) -> None:
        """ZeRO-1/2 (and bf16 ZeRO-1) link each parameter to its slice of the Adam state once,
        after the first optimizer step, but steps one group at a time and links all groups after
        the first one (DeepSpeed 0.19 stage_1_and_2._optimizer_step): the second group, ATS's
        undecayed norms and embeddings, would stay unlinked. Relinking once every group's state
        exists is idempotent (views of the same tensors). ZeRO-3 looks the state up by partition
        each time and keeps no links."""
        from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

        if isinstance(self._zero, DeepSpeedZeroOptimizer_Stage3):
            return
        self._zero._hp_optimizer_states_linked = False
        self._zero._lazy_init_hp_params_optimizer_state()

    # ---- checkpoint.format = "sharded": DeepSpeed's own per-rank files ----------------------
    def sharded_layout(self) -> dict[str, object]:
        return {
            "writer": "deepspeed",
            "backend": self.name,
            "world_size": self.world_size,
            "zero_stage": self.ds_config["zero_optimization"]["stage"],
        }

    def save_optimizer_shards(self, optimizer: torch.optim.Optimizer, directory: Path) -> None:
        # save_latest=False: ATS's own `latest` names the step; the tag is fixed, the step dir
        # already says which step it is. DeepSpeed also writes the module's weights (rank 0, in
        # the training dtype; not with ZeRO-3) besides each rank's zero_pp_rank_* partition.
        self._engine.save_checkpoint(
            str(directory / DEEPSPEED_DIR), tag=DEEPSPEED_TAG, client_state={}, save_latest=False
        )

    def load_optimizer_shards(self, optimizer: torch.optim.Optimizer, directory: Path) -> None:
        # load_module_strict: the module is this run's model, every name must match;
        # load_optimizer_states: the point (fp32 masters and Adam moments, this rank's partition);
        # load_lr_scheduler_states=False: ATS passes no scheduler, it sets the LR every step.
        # DeepSpeed's files are torch.save pickles: read weights-only (deepspeed_load.py).
        with weights_only_loads(self._engine):
            path, _ = self._engine.load_checkpoint(
                str(directory / DEEPSPEED_DIR),
                tag=DEEPSPEED_TAG,
                load_module_strict=True,
                load_optimizer_states=True,
                load_lr_scheduler_states=False,
                load_module_only=False,
            )
        if path is None:
            raise CheckpointError(
                f"DeepSpeed found no checkpoint under {directory / DEEPSPEED_DIR}"
            )

    def all_reduce_mean(self, value: float) -> float:
        return all_reduce_mean(value, self.device)

    def all_reduce_mean_tensor(self, values: torch.Tensor) -> torch.Tensor:
        return all_reduce_mean_tensor(values, self.device)

    def barrier(self) -> None:
        dist.barrier()

    def close(self) -> None:
        leave_process_group()
