"""Admission limits of a live server with small settings: the bounded queue (503 + Retry-After),
per-key token buckets (429 + Retry-After + x-ratelimit-* headers, openai.RateLimitError), the
request timeout (504)."""

import threading

import httpx
import openai
import pytest
from ats_infer.native_engine import NativeEngine
from ats_infer.serve.errors import APIError
from ats_infer.serve.metrics import Metrics
from ats_infer.serve.scheduler import Job, Scheduler

from .conftest import start_server

KEYS = ("sk-first-key", "sk-second-key")


def strict_server(chat_model_dir, no_torch_path, directory, *args: str):
    key_file = directory / "keys.txt"
    key_file.write_text("# two clients\n" + "\n".join(KEYS) + "\n")
    args = ("--api-key-file", str(key_file), *args)
    return start_server(chat_model_dir, directory / "server.log", no_torch_path, *args, key=None)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_queue_bound_over_http(chat_model_dir, no_torch_path, tmp_path) -> None:
    strict = strict_server(chat_model_dir, no_torch_path, tmp_path, "--max-queue", "1")
    try:
        body = {"model": strict.model, "prompt": "x", "max_tokens": 1}
        r = httpx.post(f"{strict.url}/v1/completions", json={**body, "n": 2}, headers=auth(KEYS[1]))
        assert r.status_code == 503 and r.headers["retry-after"] == "1"  # 2 choices > 1 place
        assert r.json()["error"]["code"] == "queue_full"
        r = httpx.post(f"{strict.url}/v1/completions", json=body, headers=auth(KEYS[1]))
        assert r.status_code == 200
    finally:
        assert strict.stop() == 0


def test_scheduler_queue_bound(chat_model_dir) -> None:
    """Jobs wait while the scheduler thread is not running: the bound holds exactly."""
    engine = NativeEngine(chat_model_dir, threads=1)
    scheduler = Scheduler(engine.batch(1), Metrics("m"), max_queue=2, prefill_budget=64)
    events: list = []

    def job() -> Job:
        return Job(prompt=[1, 2], max_new_tokens=3, sampling={}, deliver=events.append)

    scheduler.submit([job()])
    with pytest.raises(APIError, match="queue is full") as info:
        scheduler.submit([job(), job()])  # all or nothing
    assert info.value.status == 503 and info.value.headers == {"retry-after": "1"}
    scheduler.submit([job()])
    with pytest.raises(APIError, match=r"queue is full \(2 waiting"):
        scheduler.submit([job()])
    scheduler.start()
    for _ in range(500):
        if len(events) == 6:
            break
        threading.Event().wait(0.01)
    scheduler.stop(timeout=10)
    assert [e.finish for e in events] == [0, 0, 2, 0, 0, 2]  # both ran their 3 tokens


def test_rate_limit_per_key(chat_model_dir, no_torch_path, tmp_path) -> None:
    strict = strict_server(chat_model_dir, no_torch_path, tmp_path, "--rate-limit", "4,3000")
    try:
        check_rate_limit(strict)
    finally:
        assert strict.stop() == 0


def check_rate_limit(strict) -> None:
    first = openai.OpenAI(base_url=f"{strict.url}/v1", api_key=KEYS[0], max_retries=0)
    for _ in range(4):
        first.completions.create(model=strict.model, prompt="x", max_tokens=1)
    with pytest.raises(openai.RateLimitError) as info:
        first.completions.create(model=strict.model, prompt="x", max_tokens=1)
    headers = info.value.response.headers
    assert int(headers["retry-after"]) >= 1
    assert headers["x-ratelimit-limit-requests"] == "4"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-limit-tokens"] == "3000"
    # the other key has its own bucket; a request over the whole token budget is refused at once
    r = httpx.post(f"{strict.url}/v1/completions", headers=auth(KEYS[1]),
                   json={"model": strict.model, "prompt": "x", "max_tokens": 200, "n": 16})  # fmt: skip
    assert (
        r.status_code == 429 and "more than the rate limit of 3000" in r.json()["error"]["message"]
    )
    ok = httpx.post(f"{strict.url}/v1/completions", headers=auth(KEYS[1]),
                    json={"model": strict.model, "prompt": "x", "max_tokens": 1})  # fmt: skip
    assert ok.status_code == 200 and ok.headers["x-ratelimit-limit-requests"] == "4"


def test_request_timeout(chat_model_dir, no_torch_path, tmp_path) -> None:
    srv = start_server(chat_model_dir, tmp_path / "server.log", no_torch_path,
                       "--request-timeout", "0.05", "--slots", "1")  # fmt: skip
    try:
        # 16 choices of 240 tokens one after the other: far longer than 0.05 s
        body = {"model": srv.model, "prompt": "x", "max_tokens": 240, "temperature": 0, "n": 16,
                "logit_bias": {"0": -100, "509": -100}}  # fmt: skip
        r = httpx.post(f"{srv.url}/v1/completions", json=body, headers=auth("sk-test-0123456789"),
                       timeout=60)  # fmt: skip
        assert r.status_code == 504 and "--request-timeout" in r.json()["error"]["message"]
    finally:
        assert srv.stop() == 0
