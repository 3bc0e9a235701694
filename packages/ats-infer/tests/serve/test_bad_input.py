"""Bad requests to a live server: each gets a clear 4xx in OpenAI's error shape naming the
problem, and the server keeps serving the others."""

import httpx
import pytest

from .conftest import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def post(server, path: str, **kw) -> httpx.Response:
    kw.setdefault("headers", AUTH)
    return httpx.post(f"{server.url}{path}", timeout=60, **kw)


def assert_error(r: httpx.Response, status: int, *words: str, param: str | None = None) -> None:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    for word in words:
        assert word in error["message"], error
    if param is not None:
        assert error["param"] == param


def completion(server, **fields) -> httpx.Response:
    return post(server, "/v1/completions", json={"model": server.model, **fields})


def test_malformed_and_wrongly_typed_bodies(server) -> None:
    raw = {"headers": {**AUTH, "content-type": "application/json"}}
    assert_error(
        post(server, "/v1/completions", content=b'{"model": ', **raw), 400, "not valid JSON"
    )
    bad_utf8 = b'{"model": "m", "prompt": "\xff\xfe"}'
    assert_error(post(server, "/v1/completions", content=bad_utf8, **raw), 400,
                 "not valid UTF-8", "at byte 26")  # fmt: skip
    assert_error(completion(server, prompt="x", max_tokens="ten"), 400, "max_tokens",
                 param="max_tokens")  # fmt: skip
    assert_error(completion(server, prompt=3.5), 400, "prompt", param="prompt")
    assert_error(completion(server), 400, "prompt", param="prompt")
    assert_error(completion(server, prompt="x", n=99), 400, "n", param="n")
    assert_error(completion(server, prompt="x", stop=""), 400, "stop")
    assert_error(completion(server, prompt="x", logit_bias={"abc": 1}), 400, "logit_bias")


def test_out_of_range_values(server) -> None:
    assert_error(completion(server, prompt="x", max_tokens=0), 400, "max_tokens")
    assert_error(completion(server, prompt="x", max_tokens=10**9), 400,
                 "maximum context length is 256", param="max_tokens")  # fmt: skip
    assert_error(completion(server, prompt=[1] * 300, max_tokens=1), 400,
                 "maximum context length")  # fmt: skip
    assert_error(completion(server, prompt=[1, 512]), 400, "token id 512", param="prompt")
    assert_error(completion(server, prompt="x", logit_bias={"600": 1}), 400, "logit_bias")
    assert_error(completion(server, prompt="x", temperature=-1), 400, "temperature")
    assert_error(completion(server, prompt="x", top_p=0), 400, "top_p")
    assert_error(completion(server, prompt="<|endoftext|>"), 400, "prompt")


def test_chat_bad_messages(server) -> None:
    chat = {"model": server.model}
    assert_error(post(server, "/v1/chat/completions", json={**chat, "messages": []}), 400,
                 "messages", param="messages")  # fmt: skip
    bad_role = {**chat, "messages": [{"role": "robot", "content": "hi"}]}
    assert_error(post(server, "/v1/chat/completions", json=bad_role), 400, "role")
    no_content = {**chat, "messages": [{"role": "user"}]}
    assert_error(post(server, "/v1/chat/completions", json=no_content), 400, "content")
    lonely_top = {**chat, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}
    assert_error(post(server, "/v1/chat/completions", json=lonely_top), 400, "top_logprobs")


def test_unknown_model_keys_and_routes(server) -> None:
    r = post(server, "/v1/completions", json={"model": "gpt-4", "prompt": "x"})
    assert_error(r, 404, "'gpt-4' does not exist", param="model")
    assert r.json()["error"]["code"] == "model_not_found"
    assert_error(post(server, "/v1/completions", json={}, headers={}), 401, "missing API key")
    wrong = {"Authorization": "Bearer sk-nope"}
    assert_error(post(server, "/v1/models", json={}, headers=wrong), 405, "Method Not Allowed")
    assert_error(httpx.get(f"{server.url}/v1/models", headers=wrong), 401, "incorrect API key")
    assert_error(httpx.get(f"{server.url}/v1/nothing", headers=AUTH), 404, "Not Found")


def test_ten_megabyte_body(server) -> None:
    big = b'{"model": "m", "prompt": "' + b"a" * (10 << 20) + b'"}'
    r = post(server, "/v1/completions", content=big,
             headers={**AUTH, "content-type": "application/json"})  # fmt: skip
    assert_error(r, 413, "larger than 1048576 bytes")


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_still_serving_after_bad_input(server, path) -> None:
    post(server, path, content=b"\x00garbage", headers={**AUTH, "content-type": "application/json"})
    body = {"model": server.model, "max_tokens": 3, "temperature": 0}
    body |= (
        {"prompt": "x"}
        if path == "/v1/completions"
        else {"messages": [{"role": "user", "content": "x"}]}
    )
    r = post(server, path, json=body)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
