"""TRL rows -> ids and loss masks, packing and padding (the same SFT loss either way), the
resumable loader, the shipped rewards, and ChatML tokens in every tokenizer ats-train trains."""

import pytest
import torch
from ats_data.errors import DataError
from ats_data.records import Record
from ats_data.sources import open_source
from ats_model.serialization.model_dir import load_pretrained
from ats_tokenizer import Tokenizer
from ats_tokenizer.chat import CHAT_SPECIAL_TOKENS
from ats_train.data import train_tokenizer
from ats_train.errors import ConfigError
from ats_train.objectives.batching import ExampleLoader, pack, packed_batch, padded_batch
from ats_train.objectives.examples import dpo_pair, grpo_prompt, sft_sequence
from ats_train.objectives.rewards import answer_format, exact_match, resolve_reward
from ats_train.objectives.sft import SFTObjective


@pytest.fixture(scope="module")
def tok(base_model) -> Tokenizer:
    return Tokenizer.load(base_model / "tokenizer.json")


def test_messages_mask_only_assistant_content_and_end(tok) -> None:
    row = {"messages": [{"role": "user", "content": "1+2"}, {"role": "assistant", "content": "3"}]}
    seq = sft_sequence(tok, Record("f:1", row))
    scored = [i for i, m in zip(seq.ids, seq.mask, strict=True) if m]
    assert scored == tok.encode_ordinary("3") + [tok.special_tokens["<|im_end|>"]]


def test_prompt_completion_and_text_rows(tok) -> None:
    seq = sft_sequence(tok, Record("f:1", {"prompt": "What is 1 plus 2?", "completion": " 3"}))
    n = len(tok.encode_ordinary("What is 1 plus 2?"))
    assert seq.mask == [0] * n + [1] * (len(seq.ids) - n)
    assert seq.ids[-1] == tok.eos_id
    text = sft_sequence(tok, Record("f:1", {"text": "abc"}))
    assert all(text.mask) and text.ids[-1] == tok.eos_id
    pair = dpo_pair(tok, Record("f:2", {"prompt": [{"role": "user", "content": "q"}],
                                        "chosen": [{"role": "assistant", "content": "a"}],
                                        "rejected": [{"role": "assistant", "content": "b"}]}))  # fmt: skip
    assert (
        pair.chosen.ids[: pair.chosen.mask.index(1)]
        == pair.rejected.ids[: pair.rejected.mask.index(1)]
    )
    prompt = grpo_prompt(tok, Record("f:3", {"prompt": "q", "answer": "4"}))
    assert prompt.columns == {"answer": "4"}
    with pytest.raises(DataError, match=r"f:4: messages\[0\]\['role'\] is 'robot'"):
        sft_sequence(tok, Record("f:4", {"messages": [{"role": "robot", "content": "x"}]}))


def test_packed_rows_give_the_padded_loss(base_model, tok) -> None:
    """Packing changes only the layout: with document masking the token-weighted loss is the
    one of the same examples padded (this fails without the mask: attention would cross)."""
    model = load_pretrained(base_model, dtype=torch.float64)
    rows = [{"prompt": f"What is {a} plus 3?", "completion": f" {a + 3}"} for a in range(6)]
    seqs = [sft_sequence(tok, Record(f"f:{i}", r)) for i, r in enumerate(rows)]
    packed = pack(seqs, 64, tok.eos_id)
    assert len(packed) < len(seqs)  # several examples share a row
    objective = SFTObjective([])
    loss_packed, _, stats = objective.losses(model, *packed_batch(packed), 0)
    loss_padded, _, stats_padded = objective.losses(model, *padded_batch(seqs, tok.eos_id), 0)
    assert stats["completion_tokens"] == stats_padded["completion_tokens"]
    assert loss_packed.item() == pytest.approx(loss_padded.item(), abs=1e-10)


def test_loader_deals_disjoint_shares_and_resumes() -> None:
    def make(index):
        return index

    a = ExampleLoader(10, make, 2, seed=3, rank=0, world_size=2)
    b = ExampleLoader(10, make, 2, seed=3, rank=1, world_size=2)
    first = [next(a) + next(b) for _ in range(2)]
    assert len({i for step in first for i in step}) == 8  # one epoch: no repeats
    state = a.state_dict()
    rest = [next(a) for _ in range(3)]
    c = ExampleLoader(10, make, 2, seed=3, rank=0, world_size=2)
    c.load_state_dict(state)
    assert [next(c) for _ in range(3)] == rest


def test_shipped_rewards() -> None:
    completions = ["so 12 + 30 = 42", "answer: 41", "no idea", "answer: 1,042"]
    assert exact_match([""] * 4, completions, answer=["42", "42", "42", 1042]) == [1, 0, 0, 1]
    assert answer_format([""] * 4, completions) == [0.0, 1.0, 0.0, 0.0]
    assert resolve_reward("ats_train.objectives.rewards:exact_match") is exact_match
    with pytest.raises(ConfigError, match="neither a shipped reward"):
        resolve_reward("exactmatch")
    with pytest.raises(ConfigError, match="cannot import no_such_pkg"):
        resolve_reward("no_such_pkg.mod:fn")


def test_tokenizers_ats_train_trains_reserve_chatml(tmp_path) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("def f(x):\n    return x + 1\n" * 50)
    tok = Tokenizer.load(train_tokenizer(open_source(str(corpus)), 280, tmp_path / "cache"))
    assert set(CHAT_SPECIAL_TOKENS) <= set(tok.special_tokens)
    assert tok.vocab_size <= 280  # a corpus this small runs out of merges first


def test_with_special_tokens_keeps_every_id() -> None:
    tok = Tokenizer.train(iter(["abc abc abd"] * 20), 262, special_tokens=("<|endoftext|>",))
    grown = tok.with_special_tokens(CHAT_SPECIAL_TOKENS)
    assert grown.special_tokens == {"<|endoftext|>": 261, "<|im_start|>": 262, "<|im_end|>": 263}
    assert grown.encode_ordinary("abc abd") == tok.encode_ordinary("abc abd")
    assert grown.vocab_size == 264
