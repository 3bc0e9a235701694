"""DeepSpeed's checkpoint files load weights-only: the data classes its ZeRO files pickle come back
as saved, anything else is refused without being run. The whole save/resume through DeepSpeed:
distributed/test_deepspeed.py (its sharded-checkpoint test loads through this engine)."""

import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from ats_train.checkpoint import CheckpointError

pytest.importorskip("deepspeed")

from ats_train.backends.deepspeed_load import (  # noqa: E402
    WeightsOnlyCheckpointEngine,
    weights_only_loads,
)
from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler  # noqa: E402
from deepspeed.runtime.zero.config import ZeroStageEnum  # noqa: E402
from deepspeed.utils.tensor_fragment import fragment_address  # noqa: E402


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (open, (str(self.marker), "w"))


def test_what_zero_files_hold_loads_back(tmp_path: Path) -> None:
    """The shape of a zero_pp_rank_*_optim_states.pt (DeepSpeed 0.19, ZeRO-2, fp16 scaler)."""
    scaler = DynamicLossScaler(
        init_scale=2.0**16,
        scale_window=1000,
        min_scale=1.0,
        delayed_shift=2,
        consecutive_hysteresis=False,
    )
    state = {
        "optimizer_state_dict": {
            "loss_scaler": scaler,
            "static": LossScaler(scale=128.0),
            "zero_stage": ZeroStageEnum.gradients,
            "single_partition_of_fp32_groups": [torch.arange(6.0)],
            "param_slice_mappings": [{"w": fragment_address(numel=6, start=0)}],
            "base_optimizer_state": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": []},
        },
        "ds_config": {"zero_optimization": {"stage": 2}},
        "ds_version": "0.19.8",
    }
    torch.save(state, tmp_path / "optim.pt")
    loaded = WeightsOnlyCheckpointEngine().load(str(tmp_path / "optim.pt"), map_location="cpu")
    sd = loaded["optimizer_state_dict"]
    assert isinstance(sd["loss_scaler"], DynamicLossScaler)
    assert vars(sd["loss_scaler"]) == vars(scaler)  # dtype (torch.half) included
    assert sd["static"].cur_scale == 128.0
    assert sd["zero_stage"] is ZeroStageEnum.gradients
    assert torch.equal(sd["single_partition_of_fp32_groups"][0], torch.arange(6.0))
    assert sd["param_slice_mappings"][0]["w"] == fragment_address(numel=6, start=0)
    assert loaded["ds_config"] == state["ds_config"]


def test_a_payload_is_refused_and_never_runs(tmp_path: Path) -> None:
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(_Payload(control)))
    assert control.exists()  # the payload is live
    marker = tmp_path / "marker"
    torch.save({"module": {"w": torch.ones(2)}, "extra": _Payload(marker)}, tmp_path / "m.pt")
    with pytest.raises(CheckpointError, match=r"m\.pt: refused to load: .*GLOBAL io\.open"):
        WeightsOnlyCheckpointEngine().load(str(tmp_path / "m.pt"))
    assert not marker.exists()


def test_the_engine_is_swapped_only_inside_the_block() -> None:
    own = object()
    engine = SimpleNamespace(checkpoint_engine=own)
    with pytest.raises(RuntimeError), weights_only_loads(engine):
        assert isinstance(engine.checkpoint_engine, WeightsOnlyCheckpointEngine)
        raise RuntimeError
    assert engine.checkpoint_engine is own
