"""A model whose tokenizer has no chat tokens and fewer ids than the model's (padded) vocabulary:
chat is refused with a clear 400, and sampling never draws an id the tokenizer cannot decode."""

import httpx
import pytest

from .conftest import API_KEY, start_server

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def plain(make_model_dir, no_torch_path, tmp_path_factory):
    # 512 tokenizer ids, 1024 model rows: random weights put mass on the padding rows too
    model_dir = make_model_dir("tiny-dense", vocab_size=1024, init_std=0.2)
    srv = start_server(model_dir, tmp_path_factory.mktemp("plain") / "server.log", no_torch_path)
    yield srv
    assert srv.stop() == 0


def test_chat_needs_the_chat_tokens(plain) -> None:
    body = {"model": plain.model, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{plain.url}/v1/chat/completions", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 400
    error = r.json()["error"]
    assert "no chat special tokens ['<|im_start|>', '<|im_end|>']" in error["message"]
    assert error["param"] == "messages" and error["code"] == "chat_template_missing"


def test_padding_rows_are_never_drawn(plain) -> None:
    body = {"model": plain.model, "prompt": "def f(", "max_tokens": 200, "temperature": 2.0,
            "n": 4, "seed": 1, "logprobs": 1}  # fmt: skip
    r = httpx.post(f"{plain.url}/v1/completions", json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] > 100
    bias = {**body, "logit_bias": {"700": 5}}
    r = httpx.post(f"{plain.url}/v1/completions", json=bias, headers=AUTH, timeout=120)
    assert (
        r.status_code == 400 and "tokenizer's vocabulary (512 ids)" in r.json()["error"]["message"]
    )
