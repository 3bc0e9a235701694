"""benchmarks/post_training.py: its held-out split and digit tokenizer, and --scale smoke running
the whole pipeline on CPU (pretrain -> SFT -> GRPO, DPO) reporting every number; the accuracy
goals are for its --device cuda scale."""

import importlib.util
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ats_tokenizer import Tokenizer
from ats_tokenizer.chat import CHAT_SPECIAL_TOKENS
from ats_train.objectives.rewards import answer_format, exact_match

ROOT = Path(__file__).resolve().parents[4]


def _benchmark():
    spec = importlib.util.spec_from_file_location(
        "post_training", ROOT / "benchmarks" / "post_training.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["post_training"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _operands(answer: str) -> frozenset[int]:
    a, b = re.match(r"(\d+)[-+](\d+)=", answer).groups()
    return frozenset((int(a), int(b)))


def test_heldout_pairs_never_train_and_cover_every_units_digit_pair() -> None:
    bench = _benchmark()
    train, heldout = bench.make_problems(bench.SCALES["cpu"], seed=0)
    train_pairs = {_operands(a) for _, a, _ in train}
    heldout_pairs = {_operands(a) for _, a, _ in heldout}
    assert not train_pairs & heldout_pairs  # unordered: b + a is the same pair as a + b
    # the rule itself, over all 2-digit pairs: about its share held out, symmetric, and every
    # units-digit combination on both sides (the held-out set tests unseen pairs, not unseen
    # digit facts)
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    held = [p for p in pairs if bench.held_out(*p)]
    assert abs(len(held) / len(pairs) - bench.HELDOUT_SHARE) < 0.02
    assert all(bench.held_out(b, a) for a, b in held)
    units = {(a % 10, b % 10) for a, b in held}
    assert (
        units
        == {(a % 10, b % 10) for a, b in set(pairs) - set(held)}
        == {(i, j) for i in range(10) for j in range(10)}
    )


def test_pretraining_equations_are_distinct_right_and_of_training_pairs_only() -> None:
    bench = _benchmark()
    scale = bench.SCALES["cpu"]
    eqs = bench.equations(scale, seed=0)
    assert len(eqs) == len(set(eqs)) == scale.n_equations
    for eq in eqs:
        a, op, b, rest = re.match(r"(\d+)([-+])(\d+)=(.*)$", eq).groups()
        result = int(a) + int(b) if op == "+" else int(a) - int(b)
        assert eq == bench.worked(f"{a}{op}{b}", result) and result >= 0
        assert not bench.held_out(int(a), int(b))


def test_worked_answers_end_in_the_true_result_and_rejected_ones_in_a_wrong_one() -> None:
    """The worked answer writes the result least significant digit first, then the result that
    exact_match reads; a DPO rejected answer is the same worked form of a nearby wrong result."""
    bench = _benchmark()
    assert bench.worked("347+285", 632) == "347+285=236 reversed. answer: 632"
    assert bench.worked("63-59", 4) == "63-59=4 reversed. answer: 4"
    train, _ = bench.make_problems(bench.SCALES["cpu"], seed=0)
    rng = random.Random(0)
    answers = [a for _, a, _ in train]
    results = [str(r) for _, _, r in train]
    rejected = [bench.wrong(a, r, rng) for _, a, r in train]
    assert exact_match([], answers, answer=results) == [1.0] * len(train)
    assert exact_match([], rejected, answer=results) == [0.0] * len(train)
    assert answer_format([], rejected) == answer_format([], answers) == [1.0] * len(train)
    for (_, a, r), bad in zip(train, rejected, strict=True):
        expression, rest = bad.split("=")
        value = int(rest.rsplit(" ", 1)[1])
        assert expression == a.split("=")[0] and value >= 0 and abs(value - r) in (1, 2, 10)
        assert bad == bench.worked(expression, value)


def test_digit_tokenizer_gives_one_token_per_digit_through_save_and_load(tmp_path: Path) -> None:
    bench = _benchmark()
    train, _ = bench.make_problems(bench.SCALES["smoke"], seed=0)
    text = "\n\n".join(f"{q}\n{a}" for q, a, _ in train)
    tok = Tokenizer.train(iter([text]), 512, special_tokens=CHAT_SPECIAL_TOKENS,
                          pattern=bench.DIGIT_PATTERN)  # fmt: skip
    tok.save(tmp_path / "tokenizer.json")
    loaded = Tokenizer.load(tmp_path / "tokenizer.json")
    assert loaded.pattern == bench.DIGIT_PATTERN
    ids = loaded.encode_ordinary("345+346=196 reversed")
    assert [loaded.decode([i]) for i in ids] == [
        *"345", "+", *"346", "=", *"196", " reversed"
    ]  # fmt: skip
    assert loaded.encode_ordinary(text) == tok.encode_ordinary(text)


@pytest.mark.slow
def test_smoke_pipeline_reports_every_number(tmp_path: Path) -> None:
    work = tmp_path / "bench"
    script = ROOT / "benchmarks" / "post_training.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--scale", "smoke", "--work", str(work)],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((work / "report.json").read_text())
    stages = {"pretrained", "sft", "grpo_start", "sft_continued", "grpo", "dpo"}
    assert set(report["exact_match"]) == stages
    assert all(0.0 <= v <= 1.0 for v in report["exact_match"].values())
    # pass@group counts a question right when any of its samples is; greedy is one sample
    assert 0.0 <= report["sft_pass_at_group"] <= 1.0
    assert 0.0 <= report["sft_exact_match_train_problems"] <= 1.0
    assert 0.0 <= report["dpo_heldout_preference_accuracy"] <= 1.0
    packing = report["sft_packing"]
    assert packing["packed"]["rows"] < packing["padded"]["rows"]  # several examples per row
    assert all(packing[k]["real_tokens_per_s"] > 0 for k in ("packed", "padded"))
    for stage in ("sft", "sft_more", "grpo", "dpo", "sft_lora"):
        assert (work / stage / "model" / "model.safetensors").is_file()
    # GRPO and its control start from the first SFT checkpoint whose pass@group reaches the
    # threshold, checkpoints tried in step order (the last SFT checkpoint when none does)
    start = report["grpo_start"]
    tried, need = start["tried"], start["pass_needed"]
    steps = sorted(int(d.name.split("-")[1]) for d in (work / "sft" / "checkpoints").glob("step-*"))
    assert [t["step"] for t in tried] == steps[: len(tried)] and len(steps) > 1
    assert all(t["pass_at_group"] < need for t in tried[:-1])
    assert tried[-1]["pass_at_group"] >= need or len(tried) == len(steps)
    assert start["reached"] == (tried[-1]["pass_at_group"] >= need)
    assert start["model"] == f"sft/checkpoints/step-{tried[-1]['step']:06d}"
    for stage in ("grpo", "sft_more"):
        config = (work / stage / "config.toml").read_text()
        assert f"{work / start['model']}" in config, stage
    lora, full = report["sft_lora_vs_full"]["lora"], report["sft_lora_vs_full"]["full"]
    assert 0 < lora["trainable_params"] < full["trainable_params"]
    assert lora["grad_and_adamw_mb"] < full["grad_and_adamw_mb"]
    assert 0.0 <= report["sft_lora_vs_full"]["lora_exact_match"] <= 1.0


@pytest.mark.parametrize(
    ("pretrained", "message"),
    [
        ("work", "must name another run's --work"),
        ("empty", "no pretrain/model in it"),
        ("other_seed", "its pretraining corpus differs"),
    ],
)
def test_pretrained_must_be_another_finished_run(tmp_path: Path, pretrained, message) -> None:
    """--pretrained is refused before anything of --work is removed when it names this run's own
    --work (recreated), a directory without a pretrained model or another seed's run."""
    work, empty, other = tmp_path / "work", tmp_path / "empty", tmp_path / "other"
    for d in (work, empty, other / "pretrain" / "model"):
        d.mkdir(parents=True)
    (work / "keep").write_text("x")
    (other / "pretrain.txt").write_text("1+1=2\n")  # another run's corpus
    source = {"work": work, "empty": empty, "other_seed": other}[pretrained]
    script = ROOT / "benchmarks" / "post_training.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--scale", "smoke", "--work", str(work),
         "--pretrained", str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2 and message in proc.stderr
    assert (work / "keep").read_text() == "x"  # nothing of --work removed
