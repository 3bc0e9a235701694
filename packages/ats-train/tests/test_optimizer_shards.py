"""The safetensors optimizer shards in one process: a state saved as chunks of several ranks (split
here along dim 0, as fsdp2 shards) loads back into one rank's plain tensors exactly, the index is
checked (overlap, gap, another model, another dtype) before anything is copied, and a round trip
at one rank is exact. fsdp2 / ddp across world sizes: distributed/test_backends.py."""

import itertools
import json
from pathlib import Path

import pytest
import torch
from ats_train.backends.optimizer_shards import load_optimizer_shards, save_optimizer_shards
from ats_train.checkpoint import CheckpointError
from safetensors.torch import load_file, save_file
from torch import nn


def _model_and_optimizer(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 5), nn.LayerNorm(5), nn.Linear(5, 2))
    groups = [
        {"params": [model[0].weight, model[2].weight], "weight_decay": 0.1},
        {"params": [model[0].bias, model[1].weight, model[1].bias, model[2].bias]},
    ]
    return model, torch.optim.AdamW(groups, lr=1e-2, betas=(0.8, 0.9), weight_decay=0.0)


def _trained(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    model, optimizer = _model_and_optimizer(seed)
    for _ in range(3):
        model(torch.randn(4, 3)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def _assert_same_state(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys()
    for i in sa["state"]:
        for name, value in sa["state"][i].items():
            assert torch.equal(value, sb["state"][i][name]), (i, name)


def _split_into_ranks(directory: Path, cuts: dict[str, list[int]]) -> None:
    """Rewrite rank 0's file as several ranks' chunks: a tensor named in `cuts` is split along
    dim 0 at those rows (the last rank may hold an empty chunk, which is not written)."""
    tensors = load_file(str(directory / "rank-00000.safetensors"))
    index = json.loads((directory / "rank-00000.json").read_text())["chunks"]
    n_ranks = 1 + max(len(c) for c in cuts.values())
    files = [({}, {}) for _ in range(n_ranks)]
    for key, entry in index.items():
        bounds = [0, *cuts.get(key, []), tensors[key].shape[0] if tensors[key].ndim else 1]
        for rank, (lo, hi) in enumerate(itertools.pairwise(bounds)):
            if hi > lo:
                piece = tensors[key] if tensors[key].ndim == 0 else tensors[key][lo:hi]
                offsets = [lo, *entry["offsets"][1:]] if tensors[key].ndim else []
                files[rank][0][key] = piece.contiguous()
                files[rank][1][key] = {**entry, "offsets": offsets}
    for rank, (rank_tensors, rank_index) in enumerate(files):
        save_file(rank_tensors, str(directory / f"rank-{rank:05d}.safetensors"))
        document = {"format_version": 1, "chunks": rank_index}
        (directory / f"rank-{rank:05d}.json").write_text(json.dumps(document))


def test_round_trip_at_one_rank_is_exact(tmp_path: Path) -> None:
    model, optimizer = _trained()
    save_optimizer_shards(model, optimizer, tmp_path, rank=0)
    fresh_model, fresh = _model_and_optimizer(seed=1)
    load_optimizer_shards(fresh_model, fresh, tmp_path, rank=0)
    _assert_same_state(fresh, optimizer)


def test_chunks_of_three_ranks_load_into_one(tmp_path: Path) -> None:
    """The resharding: every (parameter, state) in up to three chunks, uneven, in files of three
    ranks, read back into whole tensors on one rank; equal to the state that was split."""
    model, optimizer = _trained()
    save_optimizer_shards(model, optimizer, tmp_path, rank=0)
    cuts = {
        "0.weight/exp_avg": [2, 4],  # (5, 3): rows 0-1 | 2-3 | 4
        "0.weight/exp_avg_sq": [1, 5],  # rows 0 | 1-4 | none
        "2.weight/exp_avg": [1],  # (2, 5)
        "1.bias/exp_avg_sq": [3, 4],  # (5,)
    }
    _split_into_ranks(tmp_path, cuts)
    assert len(load_file(str(tmp_path / "rank-00002.safetensors"))) == 2
    fresh_model, fresh = _model_and_optimizer(seed=1)
    load_optimizer_shards(fresh_model, fresh, tmp_path, rank=0)
    _assert_same_state(fresh, optimizer)


def _edit_entry(directory: Path, rank: int, key: str, **changes: object) -> None:
    path = directory / f"rank-{rank:05d}.json"
    document = json.loads(path.read_text())
    document["chunks"][key].update(changes)
    path.write_text(json.dumps(document))


@pytest.mark.parametrize(
    ("offsets", "message"),
    [([1, 0], "overlaps another rank's"), ([3, 0], "lies outside the shape"), ([2, 1], "outside")],
)
def test_a_malformed_index_is_refused_before_anything_is_copied(
    tmp_path: Path, offsets: list[int], message: str
) -> None:
    model, optimizer = _trained()
    save_optimizer_shards(model, optimizer, tmp_path, rank=0)
    _split_into_ranks(tmp_path, {"0.weight/exp_avg": [2]})  # rows 0-1 | 2-4
    _edit_entry(tmp_path, 1, "0.weight/exp_avg", offsets=offsets)
    fresh_model, fresh = _model_and_optimizer(seed=1)
    before = {k: v.clone() for k, v in fresh_model.state_dict().items()}
    with pytest.raises(CheckpointError, match=message):
        load_optimizer_shards(fresh_model, fresh, tmp_path, rank=0)
    assert all(torch.equal(v, before[k]) for k, v in fresh_model.state_dict().items())


def test_a_gap_is_refused(tmp_path: Path) -> None:
    model, optimizer = _trained()
    save_optimizer_shards(model, optimizer, tmp_path, rank=0)
    _split_into_ranks(tmp_path, {"0.weight/exp_avg": [2]})
    (tmp_path / "rank-00001.json").unlink()
    (tmp_path / "rank-00001.safetensors").unlink()
    with pytest.raises(CheckpointError, match="chunks of 0.weight/exp_avg do not cover it"):
        load_optimizer_shards(*_model_and_optimizer(seed=1), tmp_path, rank=0)


def test_state_of_another_model_is_refused(tmp_path: Path) -> None:
    model, optimizer = _trained()
    save_optimizer_shards(model, optimizer, tmp_path, rank=0)
    other = nn.Sequential(nn.Linear(3, 6), nn.LayerNorm(6), nn.Linear(6, 2))
    with pytest.raises(CheckpointError, match=r"0.weight/exp_avg\w* has shape \[5, 3\]"):
        load_optimizer_shards(other, torch.optim.AdamW(other.parameters()), tmp_path, rank=0)
    deeper = nn.Sequential(*_model_and_optimizer(0)[0], nn.Linear(2, 2))
    with pytest.raises(CheckpointError, match="does not fit this run's optimizer"):
        load_optimizer_shards(deeper, torch.optim.AdamW(deeper.parameters()), tmp_path, rank=0)


def test_another_dtype_is_refused(tmp_path: Path) -> None:
    model, optimizer = _trained()
    save_optimizer_shards(model, optimizer, tmp_path, rank=0)
    tensors = load_file(str(tmp_path / "rank-00000.safetensors"))
    tensors["0.bias/exp_avg"] = tensors["0.bias/exp_avg"].double()
    save_file(tensors, str(tmp_path / "rank-00000.safetensors"))
    with pytest.raises(CheckpointError, match="0.bias/exp_avg is torch.float64"):
        load_optimizer_shards(*_model_and_optimizer(seed=1), tmp_path, rank=0)
