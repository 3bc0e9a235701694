"""Each objective's gradient through a tiny float64 model against central finite differences:
SFT on a packed row, DPO against a frozen reference, GRPO's clipped loss with KL."""

from collections.abc import Callable

import pytest
import torch
from ats_model.serialization.model_dir import load_pretrained
from ats_train.objectives.batching import pack, packed_batch, pair_batch
from ats_train.objectives.dpo import DPOObjective
from ats_train.objectives.examples import Pair, Sequence
from ats_train.objectives.grpo_loss import grpo_loss
from ats_train.objectives.logprobs import forward_logprobs, shifted_labels
from ats_train.objectives.reference import FrozenReference

H = 1e-6
PARAMS = (
    "layers.0.attn.wq.weight",
    "layers.1.ffn.w2.weight",
    "norm.weight",
    "tok_embeddings.weight",
)


def _check(model: torch.nn.Module, loss_fn: Callable[[], torch.Tensor]) -> None:
    model.zero_grad()
    loss_fn().backward()
    params = dict(model.named_parameters())
    g = torch.Generator().manual_seed(0)
    for name in PARAMS:
        p = params[name]
        for flat in torch.randint(0, p.numel(), (3,), generator=g).tolist():
            with torch.no_grad():
                old = p.view(-1)[flat].item()
                p.view(-1)[flat] = old + H
                up = loss_fn().item()
                p.view(-1)[flat] = old - H
                down = loss_fn().item()
                p.view(-1)[flat] = old
            numeric = (up - down) / (2 * H)
            assert p.grad.view(-1)[flat].item() == pytest.approx(numeric, rel=1e-5, abs=1e-8), name


@pytest.fixture
def model(base_model):
    m = load_pretrained(base_model, dtype=torch.float64)
    names = dict(m.named_parameters())
    missing = [n for n in PARAMS if n not in names]
    assert not missing, f"{missing} not in {sorted(names)[:8]}"
    return m


def test_sft_packed_gradient(model) -> None:
    seqs = [Sequence([3, 8, 9, 4], [0, 1, 1, 1], "a"), Sequence([7, 5, 6], [0, 0, 1], "b")]
    x, y = packed_batch(pack(seqs, 9, 0))
    _check(model, lambda: model(x["ids"], targets=y["labels"], document_ids=x["document_ids"]).loss)


# one loss type in the quick tier: the loss types differ only in the function of the reward margin
# (test_losses.py checks each by hand and against TRL); the full suite checks each one's gradient
@pytest.mark.parametrize(
    "loss_type",
    [
        "sigmoid",
        pytest.param("ipo", marks=pytest.mark.slow),
        pytest.param("hinge", marks=pytest.mark.slow),
    ],
)
def test_dpo_gradient(model, base_model, loss_type: str) -> None:
    reference = FrozenReference(load_pretrained(base_model, dtype=torch.float64))
    with torch.no_grad():  # a reference that differs from the policy
        for p in reference.model.parameters():
            p.mul_(0.9)
    pairs = [
        Pair(Sequence([3, 8, 9], [0, 1, 1], "a"), Sequence([3, 8, 2, 5], [0, 1, 1, 1], "a"), "a"),
        Pair(Sequence([4, 6], [0, 1], "b"), Sequence([4, 7, 7], [0, 1, 1], "b"), "b"),
    ]
    x, y = pair_batch(pairs, 0, None)
    objective = DPOObjective(0.5, loss_type, reference, [])
    _check(model, lambda: objective.losses(model, x, y, 0)[0])


def test_grpo_gradient(model, base_model) -> None:
    reference = FrozenReference(load_pretrained(base_model, dtype=torch.float64))
    ids = torch.tensor([[0, 3, 8, 9, 4, 2], [5, 6, 7, 1, 1, 9]])  # (S, Tp=3 + Tc=3)
    attention = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])
    completion = attention[:, 3:]
    labels = shifted_labels(ids, torch.cat([torch.zeros_like(completion), completion], 1))
    with torch.no_grad():  # the old policy: fixed, so the ratio moves away from 1 and clips
        old = forward_logprobs(model, ids, attention, labels)[0][:, 2:5] + 0.15
        ref = reference.token_logprobs(ids, attention, labels)[:, 2:5] - 0.1

    def loss() -> torch.Tensor:
        logp = forward_logprobs(model, ids, attention, labels)[0][:, 2:5]
        return grpo_loss(logp, old, torch.tensor([1.2, -0.8], dtype=torch.float64), completion,
                         epsilon=0.2, epsilon_high=0.3, beta=0.1, ref_logp=ref).loss  # fmt: skip

    _check(model, loss)
