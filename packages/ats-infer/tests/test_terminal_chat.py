"""`ats-infer chat`, driven through its standard input (cli.main in this process: conftest's
`ats_infer`; test_cli.py's test_entry_point runs the real process): every reply is the greedy
continuation of the ChatML history (built here by hand from the messages, decoded with ats-model's
generate), /reset forgets it, /exit quits; a tokenizer without the ChatML tokens is refused in one
line."""

import dataclasses
import sysconfig
from pathlib import Path

import pytest
import torch
from ats_model import build_model, generate, presets, save_pretrained
from ats_tokenizer import Tokenizer
from ats_tokenizer.chat import CHAT_SPECIAL_TOKENS, IM_END, IM_START

MAX_NEW = 10


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("chat")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(stdlib.glob("*.py"))[:10])
    tokenizer = Tokenizer.train([text], 400, special_tokens=CHAT_SPECIAL_TOKENS)
    tokenizer.save(root / "tokenizer.json")
    torch.manual_seed(0)
    # a wide init, so that greedy replies differ from prompt to prompt (not one repeated token)
    config = dataclasses.replace(presets.get("tiny-dense"), vocab_size=400, init_std=0.5)
    model = build_model(config)
    return save_pretrained(model, root / "model", tokenizer_json=root / "tokenizer.json")


def _greedy_reply(model_dir: Path, messages: list[dict]) -> str:
    """The oracle: ChatML written out by hand, greedy decode up to <|im_end|>/<|endoftext|>."""
    from ats_model import load_pretrained

    tok = Tokenizer.load(model_dir / "tokenizer.json")
    start, end = tok.special_tokens[IM_START], tok.special_tokens[IM_END]
    ids: list[int] = []
    for m in messages:
        ids += [start, *tok.encode_ordinary(m["role"] + "\n"), *tok.encode_ordinary(m["content"])]
        ids += [end, *tok.encode_ordinary("\n")]
    ids += [start, *tok.encode_ordinary("assistant\n")]
    model = load_pretrained(model_dir).eval()
    stops = [tok.eos_id, end]
    with torch.no_grad():
        out = generate(model, torch.tensor(ids), MAX_NEW, temperature=0.0, stop_tokens=stops)
    new = out[len(ids) :].tolist()
    new = new[: next((i for i, t in enumerate(new) if t in stops), len(new))]
    return tok.decode(new)


def _chat(ats_infer, model_dir: Path, stdin: str, *extra: str):  # noqa: ANN001, ANN202
    """`ats-infer chat MODEL_DIR` at temperature 0 with `stdin` typed in."""
    args = ["chat", model_dir, "--temperature", "0", "--max-new-tokens", MAX_NEW, *extra]
    return ats_infer(*args, stdin=stdin)


def _replies(stdout: str) -> list[str]:
    """Each turn prints "you> ", then "assistant> " + reply + a newline (replies may hold any
    character, newlines included)."""
    turns = stdout.split("you> ")
    return [t.removeprefix("assistant> ")[:-1] for t in turns if t.startswith("assistant> ")]


def test_chat_keeps_history_resets_and_exits(chat_dir: Path, ats_infer) -> None:
    run = _chat(ats_infer, chat_dir, "hello there\nwhat is def\n/reset\nwhat is def\n/exit\nnever read\n",
                "--engine", "torch")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "(history cleared)" in run.stdout
    r1, r2, r3 = _replies(run.stdout)
    u1, u2 = {"role": "user", "content": "hello there"}, {"role": "user", "content": "what is def"}
    assert r1 == _greedy_reply(chat_dir, [u1])
    assert r2 == _greedy_reply(chat_dir, [u1, {"role": "assistant", "content": r1}, u2])
    assert r3 == _greedy_reply(chat_dir, [u2])
    assert len({r1, r2, r3}) == 3, (r1, r2, r3)  # the history changes what comes next
    assert run.stdout.count("you> ") == 5  # the line after /exit is never read


def test_chat_with_a_system_prompt_on_the_native_engine(chat_dir: Path, ats_infer) -> None:
    run = _chat(ats_infer, chat_dir, "hi\n", "--engine", "native", "--system", "be brief")
    assert run.returncode == 0, run.stderr
    (reply,) = _replies(run.stdout)
    system = {"role": "system", "content": "be brief"}
    assert reply == _greedy_reply(chat_dir, [system, {"role": "user", "content": "hi"}])


def test_a_tokenizer_without_chatml_is_refused(moe_dir: Path, ats_infer) -> None:
    run = _chat(ats_infer, moe_dir, "hi\n", "--engine", "torch")
    assert run.returncode == 1
    assert run.stderr.count("\n") == 1
    assert "has no chat special tokens ['<|im_start|>', '<|im_end|>']" in run.stderr
