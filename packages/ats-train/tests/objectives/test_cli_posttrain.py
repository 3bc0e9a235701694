"""`ats-train sft | dpo | grpo` end to end on CPU: TRL's metric names in metrics.jsonl, exact
resume, the model directory, and one-line errors with nothing written on bad input."""

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from ats_train.cli import main
from ats_train.metrics import read_metrics
from safetensors.torch import load_file

from conftest import make_model_dir, post_overrides, write_jsonl, write_rows

KEYS = {
    "sft": ("loss", "completion_tokens"),
    "dpo": ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"),
    "grpo": ("reward", "reward_std", "rewards/exact_match/mean", "rewards/exact_match/std",
             "completions/mean_length", "clip_ratio/region_mean", "kl"),
}  # fmt: skip


def _train(records: list[dict]) -> dict[int, dict]:
    return {r["step"]: r for r in records if r["kind"] == "train"}


# two rewards and a KL term: the GRPO run test_runs_and_logs_trl_names checks and
# test_grpo_resume_draws_the_same_completions resumes
GRPO_EXTRA = {"grpo.rewards": '["exact_match","answer_format"]', "grpo.beta": 0.05}


@pytest.fixture(scope="module")
def runs(base_model, tmp_path_factory) -> Callable[[str, str, dict], Path]:
    """runs(command, kind, extra) -> the run dir of `ats-train COMMAND` on write_rows(kind) rows
    with post_overrides(**extra), trained once per module for each (command, kind, extra)."""
    done: dict[str, Path] = {}

    def run(command: str, kind: str, extra: dict) -> Path:
        key = json.dumps([command, kind, extra], sort_keys=True)
        if key not in done:
            root = tmp_path_factory.mktemp(command)
            args = [command, "--run-dir", str(root / "run")]
            assert main([*args, *post_overrides(base_model, write_rows(root, kind), **extra)]) == 0
            done[key] = root / "run"
        return done[key]

    return run


@pytest.mark.parametrize(
    ("command", "kind", "extra"),
    [
        ("sft", "sft-messages", {}),
        ("sft", "sft-prompt", {"sft.packing": "false"}),
        ("dpo", "dpo", {"dpo.loss": "ipo", "dpo.reference": "precomputed"}),
        ("grpo", "grpo", GRPO_EXTRA),
    ],
)
def test_runs_and_logs_trl_names(runs, command, kind, extra) -> None:
    run = runs(command, kind, extra)
    train = _train(read_metrics(run))
    assert sorted(train) == [1, 2, 3, 4]
    for key in KEYS[command]:
        assert all(isinstance(r[key], float) for r in train.values()), key
    assert (run / "model" / "tokenizer.json").is_file()
    config = (run / "config.toml").read_text()
    assert f'objective = "{command}"' in config


def test_sft_resume_is_exact(base_model, rows_file, tmp_path) -> None:
    data = rows_file("sft-text")
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main(["sft", "--run-dir", str(full), *post_overrides(base_model, data)]) == 0
    assert (
        main(["sft", "--run-dir", str(cut), *post_overrides(base_model, data, train__steps=2)]) == 0
    )
    assert main(["sft", "--run-dir", str(cut), *post_overrides(base_model, data)]) == 0
    want, got = _train(read_metrics(full)), _train(read_metrics(cut))
    assert [got[s]["loss"] for s in (3, 4)] == [want[s]["loss"] for s in (3, 4)]
    a = load_file(full / "model" / "model.safetensors")
    b = load_file(cut / "model" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_grpo_resume_draws_the_same_completions(base_model, runs, tmp_path) -> None:
    """The run stopped after step 2 and resumed draws the completions (and gets the rewards and
    losses) of the uninterrupted GRPO run that test_runs_and_logs_trl_names checks."""
    full = runs("grpo", "grpo", GRPO_EXTRA)
    data, cut = write_rows(tmp_path, "grpo"), tmp_path / "cut"
    stop_at_2 = post_overrides(base_model, data, train__steps=2, **GRPO_EXTRA)
    assert main(["grpo", "--run-dir", str(cut), *stop_at_2]) == 0
    assert main(["grpo", "--run-dir", str(cut), *post_overrides(base_model, data, **GRPO_EXTRA)]) == 0
    want, got = _train(read_metrics(full)), _train(read_metrics(cut))
    for step in (3, 4):
        for key in ("loss", "reward", "completions/mean_length"):
            assert got[step][key] == want[step][key], (step, key)


def _fails(capsys, args: list[str], run: Path, *needles: str) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    assert not run.exists() or not any(run.iterdir()), sorted(run.iterdir())


def test_bad_rows_fail_in_one_line_and_write_nothing(base_model, tmp_path, capsys) -> None:
    run = tmp_path / "run"
    bad = tmp_path / "bad.jsonl"
    good = '{"text": "What is 1 plus 2? answer: 3"}\n'
    bad.write_text(good * 3 + '{"text": "unterminated\n' + good)
    _fails(capsys, ["sft", "--run-dir", str(run), *post_overrides(base_model, bad)], run,
           f"{bad}: not valid JSON at line 4")  # fmt: skip
    same = write_jsonl(tmp_path / "same.jsonl", [{"prompt": "q", "chosen": "a", "rejected": "b"}] * 3
                       + [{"prompt": "q", "chosen": "a", "rejected": "a"}])  # fmt: skip
    _fails(capsys, ["dpo", "--run-dir", str(run), *post_overrides(base_model, same)], run,
           f"{same}:4: 'chosen' and 'rejected' are identical")  # fmt: skip
    long = write_jsonl(tmp_path / "long.jsonl", [{"prompt": "What is 1 plus 2?", "answer": "3"}] * 3
                       + [{"prompt": "What is 1 plus 2? " * 40, "answer": "3"}])  # fmt: skip
    _fails(capsys, ["grpo", "--run-dir", str(run), *post_overrides(base_model, long)], run,
           f"{long}:4:", "longer than the context: 64")  # fmt: skip
    missing = write_jsonl(tmp_path / "m.jsonl", [{"question": "q"}] * 4)
    _fails(capsys, ["sft", "--run-dir", str(run), *post_overrides(base_model, missing)], run,
           "m.jsonl:1: an SFT row needs 'messages'")  # fmt: skip
    short = write_jsonl(
        tmp_path / "short.jsonl", [{"prompt": "What is 1 plus 2?", "answer": "3"}] * 4
    )
    _fails(capsys, ["grpo", "--run-dir", str(run),
                    *post_overrides(base_model, short, grpo__rewards='["no_such"]')], run,
           "grpo.rewards entry 'no_such'")  # fmt: skip


def broken_reward(prompts, completions, **_):
    return [float("nan")] * len(completions)


def raising_reward(prompts, completions, **_):
    raise RuntimeError("scorer offline")


@pytest.mark.parametrize(
    ("name", "needle"),
    [("broken_reward", "returned nan for completion 0"),
     ("raising_reward", "raised RuntimeError: scorer offline")],
)  # fmt: skip
def test_a_bad_reward_function_stops_the_run_naming_it(
    base_model, rows_file, tmp_path, capsys, monkeypatch, name, needle
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    rewards = json.dumps([f"test_cli_posttrain:{name}"])
    run = tmp_path / "run"
    args = [
        "grpo",
        "--run-dir",
        str(run),
        *post_overrides(base_model, rows_file("grpo"), grpo__rewards=rewards),
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and name in err, err
    assert not (run / "checkpoints").exists()  # it failed in step 1: nothing was saved


def test_chat_tokens_are_added_explicitly(tmp_path, rows_file, capsys) -> None:
    plain = make_model_dir(tmp_path / "plain", specials=("<|endoftext|>",))
    data = rows_file("sft-messages")
    run = tmp_path / "run"
    _fails(capsys, ["sft", "--run-dir", str(run), *post_overrides(plain, data)], run,
           "lacks the chat tokens ['<|im_start|>', '<|im_end|>']", "model.add_chat_tokens = true")  # fmt: skip
    args = [
        "sft",
        "--run-dir",
        str(run),
        *post_overrides(plain, data, model__add_chat_tokens="true"),
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "added special tokens ['<|im_start|>', '<|im_end|>']" in out
    old = load_file(plain / "model.safetensors")["tok_embeddings.weight"]
    new = load_file(run / "model" / "model.safetensors")["tok_embeddings.weight"]
    assert new.shape[0] == old.shape[0] + 2
    saved = json.loads((run / "model" / "tokenizer.json").read_text())
    added = {t["content"]: t["id"] for t in saved["added_tokens"]}
    assert added["<|im_start|>"] == old.shape[0] and added["<|im_end|>"] == old.shape[0] + 1


def test_dpo_under_lora_scores_the_reference_with_the_adapter_off(
    base_model, rows_file, tmp_path
) -> None:
    """train.trainable = lora: the reference is the training model with its adapters disabled
    (no second model); before the first update the policy is that reference, so every reward is
    exactly 0, and after updates the rewards move."""
    run = tmp_path / "run"
    overrides = post_overrides(base_model, rows_file("dpo"), train__trainable="lora")
    assert main(["dpo", "--run-dir", str(run), *overrides, "optim.lr=0.05"]) == 0
    train = _train(read_metrics(run))
    assert train[1]["rewards/chosen"] == 0.0 and train[1]["rewards/rejected"] == 0.0
    assert any(r["rewards/margins"] != 0.0 for r in train.values())
    assert (run / "adapter" / "adapter_config.json").is_file()
