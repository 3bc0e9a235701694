"""The official openai client against a live `ats-infer serve` (no torch in the server process):
greedy text equals the native engine's own generate, chat follows the ChatML template, streams
carry OpenAI's framing, stop strings cut where the text has them, seeds reproduce, n=2, logprobs
equal log-softmax of the model's logits; errors arrive as the client's own exception types."""

import json

import ats_native
import httpx
import numpy as np
import openai
import pytest
from ats_infer.native_engine import NativeEngine
from ats_tokenizer.chat import IM_END

from .conftest import API_KEY

PROMPT = "def read_file(path):\n    "
MESSAGES = [
    {"role": "system", "content": "You write Python."},
    {"role": "user", "content": "import os"},
]


@pytest.fixture(scope="module")
def oracle(chat_model_dir) -> NativeEngine:
    return NativeEngine(chat_model_dir, threads=1)


def greedy_chat_reference(oracle: NativeEngine, n: int) -> tuple[list[int], list[int]]:
    """(prompt ids, reply ids without its stop token) by the runtime's own generate."""
    tok = oracle.tokenizer
    ids, _ = tok.apply_chat_template(MESSAGES, add_generation_prompt=True)
    stops = (tok.eos_id, tok.special_tokens[IM_END])
    out = list(oracle.model.generate(ids, n, stop_tokens=stops))
    return ids, out[:-1] if out and out[-1] in stops else out


def test_completion_equals_native_generate(client, server, oracle) -> None:
    got = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=12, temperature=0)
    want = "".join(oracle.generate(PROMPT, max_new_tokens=12, temperature=0))
    assert got.choices[0].text == want
    assert got.object == "text_completion" and got.id.startswith("cmpl-")
    assert got.usage.prompt_tokens == len(oracle.tokenizer.encode(PROMPT))
    assert got.usage.total_tokens == got.usage.prompt_tokens + got.usage.completion_tokens


def test_token_id_and_batched_prompts(client, server, oracle) -> None:
    ids = oracle.tokenizer.encode(PROMPT)
    by_ids = client.completions.create(model=server.model, prompt=ids, max_tokens=8, temperature=0)
    by_text = client.completions.create(
        model=server.model, prompt=[PROMPT, "class A:"], max_tokens=8, temperature=0
    )
    assert [c.index for c in by_text.choices] == [0, 1]
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_text.choices[1].text == "".join(
        oracle.generate("class A:", max_new_tokens=8, temperature=0)
    )


def test_chat_follows_chatml(client, server, oracle) -> None:
    prompt, reply = greedy_chat_reference(oracle, 16)
    got = client.chat.completions.create(
        model=server.model, messages=MESSAGES, max_tokens=16, temperature=0
    )
    assert got.choices[0].message.role == "assistant"
    assert got.choices[0].message.content == oracle.tokenizer.decode(reply)
    assert got.usage.prompt_tokens == len(prompt)
    assert got.usage.completion_tokens == len(reply)
    assert got.choices[0].finish_reason == ("length" if len(reply) == 16 else "stop")


def test_chat_stream_with_usage(client, server) -> None:
    whole = client.chat.completions.create(
        model=server.model, messages=MESSAGES, max_tokens=16, temperature=0
    )
    chunks = list(
        client.chat.completions.create(
            model=server.model,
            messages=MESSAGES,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
    )
    assert len({c.id for c in chunks}) == 1 and len({c.created for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c for c in chunks if c.choices]
    assert (
        "".join(c.choices[0].delta.content or "" for c in content)
        == whole.choices[0].message.content
    )
    assert [c.choices[0].finish_reason for c in content][-1] == whole.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in content[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_raw_sse_framing(server) -> None:
    body = {"model": server.model, "prompt": PROMPT, "max_tokens": 4, "temperature": 0,
            "stream": True}  # fmt: skip
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.stream(
        "POST", f"{server.url}/v1/completions", json=body, headers=headers, timeout=60
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: {") for e in events[:-2])
    assert len({(p["id"], p["created"]) for p in payloads}) == 1
    assert payloads[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_stop_strings_cut_the_text(client, server) -> None:
    free = client.completions.create(
        model=server.model, prompt=PROMPT, max_tokens=24, temperature=0
    )
    text = free.choices[0].text
    stop = text[6:9]
    cut = text[: text.index(stop)]
    got = client.completions.create(
        model=server.model, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop, "\x00never"]
    )
    assert got.choices[0].text == cut and got.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model=server.model, prompt=PROMPT, max_tokens=24, temperature=0, stop=stop, stream=True
    )
    pieces = list(streamed)
    assert "".join(p.choices[0].text for p in pieces) == cut
    assert pieces[-1].choices[0].finish_reason == "stop"


def test_seed_reproduces_and_n_two(client, server) -> None:
    def sample(seed: int, n: int = 1) -> list[str]:
        got = client.completions.create(
            model=server.model, prompt=PROMPT, max_tokens=20, temperature=1.0, seed=seed, n=n
        )
        assert [c.index for c in got.choices] == list(range(n))
        return [c.text for c in got.choices]

    assert sample(42) == sample(42)
    assert sample(42) != sample(43)
    pair = sample(42, n=2)
    assert pair[0] == sample(42)[0] and pair[0] != pair[1]
    greedy = client.chat.completions.create(
        model=server.model, messages=MESSAGES, max_tokens=8, temperature=0, n=2
    )
    assert greedy.choices[0].message.content == greedy.choices[1].message.content


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    return z - (
        np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True))
        + z.max(-1, keepdims=True)
    )


def test_chat_logprobs_are_log_softmax(client, server, oracle, chat_model_dir) -> None:
    prompt, reply = greedy_chat_reference(oracle, 6)
    got = client.chat.completions.create(
        model=server.model, messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True,
        top_logprobs=3,
    )  # fmt: skip
    content = got.choices[0].logprobs.content
    assert len(content) == len(reply)
    model = ats_native.Model(str(chat_model_dir), threads=1)
    ref = log_softmax(model.logits(prompt + reply)[len(prompt) - 1 : -1])  # (n, V)
    for entry, token, row in zip(content, reply, ref, strict=True):
        assert bytes(entry.bytes) == oracle.tokenizer.decode_bytes([token])
        assert entry.logprob == pytest.approx(row[token], abs=1e-4)
        best = np.argsort(-row, kind="stable")[:3]
        assert [bytes(t.bytes) for t in entry.top_logprobs] == [
            oracle.tokenizer.decode_bytes([int(b)]) for b in best
        ]
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(row[best], abs=1e-4)


def test_completion_logprobs(client, server, oracle, chat_model_dir) -> None:
    got = client.completions.create(
        model=server.model, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2
    )
    lp = got.choices[0].logprobs
    prompt = oracle.tokenizer.encode(PROMPT)
    out = list(oracle.model.generate(prompt, 5))
    model = ats_native.Model(str(chat_model_dir), threads=1)
    ref = log_softmax(model.logits(prompt + out)[len(prompt) - 1 : -1])
    assert lp.token_logprobs == pytest.approx([ref[i, t] for i, t in enumerate(out)], abs=1e-4)
    assert "".join(lp.tokens) == got.choices[0].text
    assert lp.text_offset[0] == 0 and all(len(d) == 2 for d in lp.top_logprobs)


def test_errors_are_the_clients_types(client, server) -> None:
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model=server.model, prompt="x", temperature=5)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt="x")
    wrong = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="incorrect API key"):
        wrong.models.list()
    assert [m.id for m in client.models.list().data] == [server.model]


def test_tokenize_round_trip_and_metrics(server, oracle) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    ids = httpx.post(f"{server.url}/tokenize", json={"prompt": PROMPT}, headers=headers).json()
    assert ids["tokens"] == oracle.tokenizer.encode(PROMPT) and ids["count"] == len(ids["tokens"])
    text = httpx.post(f"{server.url}/detokenize", json={"tokens": ids["tokens"]}, headers=headers)
    assert text.json() == {"prompt": PROMPT}
    metrics = httpx.get(f"{server.url}/metrics", headers=headers).text
    for name in ("ats:num_requests_running", "ats:num_requests_waiting",
                 "ats:prompt_tokens_total", "ats:generation_tokens_total",
                 "ats:time_to_first_token_seconds_bucket", "ats:inter_token_latency_seconds_bucket",
                 "ats:e2e_request_latency_seconds_bucket"):  # fmt: skip
        assert name in metrics
    assert httpx.get(f"{server.url}/metrics").status_code == 401
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
