"""`ats-infer serve --engine torch`: the same API over ats-model's forward (one KVCache per slot):
greedy text and logprobs equal the native server's on the same float model, chat streams, and
seeds reproduce."""

import openai
import pytest

from .conftest import API_KEY, start_server

PROMPT = "def read_file(path):\n    "


@pytest.fixture(scope="module")
def torch_client(chat_model_dir, tmp_path_factory):
    directory = tmp_path_factory.mktemp("torch_server")
    # torch must be importable here: the environment's own site-packages, no blocker
    srv = start_server(chat_model_dir, directory / "server.log", directory, "--engine", "torch",
                       "--slots", "3")  # fmt: skip
    yield srv, openai.OpenAI(base_url=f"{srv.url}/v1", api_key=API_KEY, max_retries=0)
    assert srv.stop() == 0


def test_torch_engine_matches_native(torch_client, client, server) -> None:
    srv, torch_api = torch_client
    kwargs = {"prompt": [PROMPT, "class A:"], "max_tokens": 12, "temperature": 0, "logprobs": 1}
    native = client.completions.create(model=server.model, **kwargs)
    torch_out = torch_api.completions.create(model=srv.model, **kwargs)
    for a, b in zip(native.choices, torch_out.choices, strict=True):
        assert a.text == b.text
        assert a.logprobs.token_logprobs == pytest.approx(b.logprobs.token_logprobs, abs=1e-3)


def test_torch_engine_chat_stream_and_seed(torch_client) -> None:
    srv, api = torch_client
    messages = [{"role": "user", "content": "import os"}]
    chunks = list(api.chat.completions.create(model=srv.model, messages=messages, max_tokens=8,
                                              stream=True, temperature=0))  # fmt: skip
    whole = api.chat.completions.create(model=srv.model, messages=messages, max_tokens=8,
                                        temperature=0)  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content

    def sample(seed: int) -> str:
        r = api.completions.create(model=srv.model, prompt=PROMPT, max_tokens=16, temperature=1,
                                   seed=seed)  # fmt: skip
        return r.choices[0].text

    assert sample(5) == sample(5) and sample(5) != sample(6)
