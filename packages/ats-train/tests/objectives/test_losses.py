"""Each loss against a hand computation (float64, 1e-6) and against TRL's own code where TRL has
it (trl_oracle.py): DPO sigmoid / ipo / hinge with its reward metrics, GRPO advantages (group,
batch, none), the clipped GRPO and Dr. GRPO losses with KL and clip ratio, the label log-probs
against TRL's selective_log_softmax, and SFT's masked cross-entropy."""

import math

import pytest
import torch
from ats_train.objectives.batching import labels_of
from ats_train.objectives.dpo_loss import dpo_loss
from ats_train.objectives.examples import Sequence
from ats_train.objectives.grpo_loss import group_advantages, grpo_loss
from ats_train.objectives.logprobs import label_logprobs
from trl.trainer.utils import selective_log_softmax
from trl_oracle import trl_dpo_loss, trl_grpo_loss

F64 = torch.float64
PC = [-1.0, -2.0, -0.5]  # policy log p(chosen), 3 pairs
PR = [-1.5, -1.0, -2.5]
RC = [-1.2, -1.8, -0.9]  # reference
RR = [-1.4, -1.1, -2.0]
NC, NR = [2, 3, 1], [4, 1, 2]  # completion tokens per sequence (ipo averages over them)
BETA = 0.1


def _sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def _hand_dpo(loss_type: str) -> float:
    out = []
    for pc, pr, rc, rr, nc, nr in zip(PC, PR, RC, RR, NC, NR, strict=True):
        if loss_type == "ipo":
            h = (pc - rc) / nc - (pr - rr) / nr
            out.append((h - 1 / (2 * BETA)) ** 2)
        else:
            h = (pc - pr) - (rc - rr)
            out.append(
                -math.log(_sig(BETA * h)) if loss_type == "sigmoid" else max(0, 1 - BETA * h)
            )
    return sum(out) / len(out)


def _t(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo", "hinge"])
def test_dpo_loss_by_hand_and_against_trl(loss_type: str) -> None:
    div = (_t(NC), _t(NR)) if loss_type == "ipo" else (1.0, 1.0)
    terms = dpo_loss(
        _t(PC) / div[0], _t(PR) / div[1], _t(RC) / div[0], _t(RR) / div[1], BETA, loss_type
    )
    assert terms.loss.item() == pytest.approx(_hand_dpo(loss_type), abs=1e-6, rel=1e-6)
    # TRL: per-token log-probs whose sums are PC / PR on [chosen; rejected] rows of 6 tokens
    lengths = NC + NR
    T = 6
    mask = torch.zeros(6, T, dtype=torch.long)
    token_logps = torch.zeros(6, T - 1, dtype=F64)
    for row, (n, total) in enumerate(zip(lengths, PC + PR, strict=True)):
        mask[row, T - n :] = 1
        token_logps[row, T - 1 - n :] = total / n
    trl_loss, metrics = trl_dpo_loss(token_logps, mask, _t(RC), _t(RR), BETA, loss_type)
    assert terms.loss.item() == pytest.approx(trl_loss.item(), abs=1e-6, rel=1e-6)
    if loss_type == "sigmoid":  # the implicit rewards are the same for every loss type
        ours = {k: v.item() for k, v in terms.metrics().items()}
        for key in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"):
            assert ours[key] == pytest.approx(metrics[key][0], abs=1e-6), key
        chosen = [BETA * (p - r) for p, r in zip(PC, RC, strict=True)]
        rejected = [BETA * (p - r) for p, r in zip(PR, RR, strict=True)]
        assert ours["rewards/margins"] == pytest.approx(
            sum(c - r for c, r in zip(chosen, rejected, strict=True)) / 3, abs=1e-12
        )
        assert ours["rewards/accuracies"] == pytest.approx(
            sum(c > r for c, r in zip(chosen, rejected, strict=True)) / 3
        )


def test_group_advantages_by_hand() -> None:
    rewards = _t([1.0, 0.0, 1.0, 1.0, 0.0, 3.0])  # groups of 2: [1, 0], [1, 1], [0, 3]
    centred = [0.5, -0.5, 0.0, 0.0, -1.5, 1.5]
    group_std = [math.sqrt(0.5), 0.0, math.sqrt(4.5)]  # unbiased
    mean = sum(rewards.tolist()) / 6
    batch_std = math.sqrt(sum((r - mean) ** 2 for r in rewards.tolist()) / 5)
    got = group_advantages(rewards, 2, "group").tolist()
    want = [c / (group_std[i // 2] + 1e-4) for i, c in enumerate(centred)]
    assert got == pytest.approx(want, abs=1e-6)
    assert group_advantages(rewards, 2, "batch").tolist() == pytest.approx(
        [c / (batch_std + 1e-4) for c in centred], abs=1e-6
    )
    assert group_advantages(rewards, 2, "none").tolist() == pytest.approx(centred, abs=1e-12)


LOGP = [[-1.0, -2.0, -0.5], [-0.3, -1.2, -4.0]]
OLD = [[-1.3, -1.9, -0.5], [-0.1, -1.6, -4.0]]
REF = [[-1.1, -2.2, -0.6], [-0.2, -1.0, -3.0]]
ADV = [1.5, -0.7]
MASK = [[1, 1, 0], [1, 1, 1]]


def _hand_grpo(loss_type: str, eps: float, eps_high: float, beta: float) -> tuple[float, ...]:
    per_seq, total, clipped, kl_sum = [], 0.0, 0, 0.0
    for lp_row, old_row, ref_row, a, m_row in zip(LOGP, OLD, REF, ADV, MASK, strict=True):
        row = []
        for lp, old, ref, m in zip(lp_row, old_row, ref_row, m_row, strict=True):
            ratio = math.exp(lp - old)
            clip = min(max(ratio, 1 - eps), 1 + eps_high)
            kl = math.exp(ref - lp) - (ref - lp) - 1
            loss = -min(ratio * a, clip * a) + beta * kl
            if m:
                row.append(loss)
                kl_sum += kl
                clipped += (ratio < 1 - eps and a < 0) or (ratio > 1 + eps_high and a > 0)
        per_seq.append(sum(row) / len(row))
        total += sum(row)
    tokens = sum(map(sum, MASK))
    loss = sum(per_seq) / 2 if loss_type == "grpo" else total / (2 * 3)
    return loss, clipped / tokens, kl_sum / tokens


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo"])
@pytest.mark.parametrize(("eps", "eps_high", "beta"), [(0.2, 0.2, 0.0), (0.1, 0.28, 0.04)])
def test_grpo_loss_by_hand_and_against_trl(loss_type, eps, eps_high, beta) -> None:
    args = (_t(LOGP), _t(OLD), _t(ADV), torch.tensor(MASK))
    kw = dict(epsilon=eps, epsilon_high=eps_high, loss_type=loss_type, beta=beta,
              ref_logp=_t(REF) if beta else None, max_completion_length=3)  # fmt: skip
    terms = grpo_loss(*args, **kw)
    loss, clip_ratio, kl = _hand_grpo(loss_type, eps, eps_high, beta)
    assert terms.loss.item() == pytest.approx(loss, abs=1e-6, rel=1e-6)
    assert terms.clip_ratio.item() == pytest.approx(clip_ratio, abs=1e-12)
    assert clip_ratio > 0  # the toy batch does clip
    trl_loss, metrics = trl_grpo_loss(*args, **kw)
    assert terms.loss.item() == pytest.approx(trl_loss.item(), abs=1e-6, rel=1e-6)
    assert terms.clip_ratio.item() == pytest.approx(metrics["clip_ratio/region_mean"][0])
    if beta:
        assert terms.kl.item() == pytest.approx(kl, abs=1e-6)
        assert terms.kl.item() == pytest.approx(metrics["kl"][0], abs=1e-6)


def test_label_logprobs_against_trl_selective_log_softmax() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=g, dtype=F64)
    labels = torch.randint(0, 11, (2, 5), generator=g)
    want = selective_log_softmax(logits, labels)
    labels_masked = labels.clone()
    labels_masked[0, :2] = -100
    got = label_logprobs(logits, labels_masked)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=1e-12)
    torch.testing.assert_close(got[0, 2:], want[0, 2:], rtol=0, atol=1e-12)
    assert got[0, :2].tolist() == [0.0, 0.0]


def test_sft_loss_is_cross_entropy_on_completion_tokens_only(base_model) -> None:
    from ats_model.serialization.model_dir import load_pretrained

    model = load_pretrained(base_model, dtype=F64)
    seq = Sequence([5, 9, 12, 7, 3], [0, 0, 1, 1, 1], "x")
    labels = torch.tensor([labels_of(seq)])
    assert labels.tolist() == [[-100, 12, 7, 3, -100]]
    ids = torch.tensor([seq.ids])
    out = model(ids, targets=labels)
    logp = torch.log_softmax(out.logits[0], dim=-1)
    hand = -(logp[1, 12] + logp[2, 7] + logp[3, 3]).item() / 3
    assert out.loss.item() == pytest.approx(hand, abs=1e-9)
