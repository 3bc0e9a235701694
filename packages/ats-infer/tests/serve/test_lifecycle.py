"""The server's life: /health is 503 while the model loads and 200 once it is ready; a client
that goes away frees its slot; SIGTERM lets an in-flight stream finish and exits 0; a public bind
needs a key; the server process runs without torch."""

import os
import signal
import subprocess
import sys
import threading

import httpx
import pytest
from ats_infer.serve.app import build_app
from ats_infer.serve.auth import KeyChecker, check_bind
from ats_infer.serve.metrics import Metrics
from ats_infer.serve.server import load_model
from ats_infer.serve.state import ServerState, Settings
from fastapi.testclient import TestClient

from .conftest import API_KEY, start_server

AUTH = {"Authorization": f"Bearer {API_KEY}"}
# a stream that runs its whole budget, 16 choices x 240 tokens (token 0 and <|endoftext|>, id 509,
# never drawn): seconds of work for a tiny model
LONG = {"prompt": "x", "max_tokens": 240, "temperature": 0, "stream": True, "n": 16,
        "logit_bias": {"0": -100, "509": -100}}  # fmt: skip


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", headers=AUTH).text
    return float(next(x for x in text.splitlines() if x.startswith(name + "{")).split()[-1])


def test_health_is_503_while_loading(chat_model_dir) -> None:
    release = threading.Event()

    def slow_load(state: ServerState) -> None:
        release.wait(30)
        load_model(state)

    settings = Settings(model_dir=str(chat_model_dir), model_name="m", threads=1, slots=2)
    state = ServerState(settings, KeyChecker([API_KEY]), None, Metrics("m"))
    app = build_app(state, slow_load, on_load_error=lambda err: pytest.fail(str(err)))
    with TestClient(app) as client:
        assert client.get("/health").status_code == 503
        assert client.get("/health").json() == {"status": "loading"}
        r = client.get("/v1/models", headers=AUTH)
        assert r.status_code == 503 and r.json()["error"]["message"] == "the server is loading"
        release.set()
        for _ in range(300):
            if client.get("/health").status_code == 200:
                break
            threading.Event().wait(0.1)
        assert client.get("/health").json() == {"status": "ok"}
        body = {"model": "m", "prompt": "x", "max_tokens": 2}
        assert client.post("/v1/completions", json=body, headers=AUTH).status_code == 200


def test_disconnect_frees_the_slot(server) -> None:
    before = metric(server.url, "ats:generation_tokens_total")
    with httpx.stream("POST", f"{server.url}/v1/completions", json={"model": server.model, **LONG},
                      headers=AUTH, timeout=60) as r:  # fmt: skip
        next(r.iter_lines())  # generating; then the client goes away
    for _ in range(200):
        if metric(server.url, "ats:num_requests_running") == 0:
            break
        threading.Event().wait(0.01)
    assert metric(server.url, "ats:num_requests_running") == 0
    assert metric(server.url, "ats:generation_tokens_total") - before < 16 * 240


def test_sigterm_finishes_in_flight_and_exits_zero(chat_model_dir, no_torch_path, tmp_path) -> None:
    srv = start_server(chat_model_dir, tmp_path / "server.log", no_torch_path, "--slots", "2")
    with httpx.stream("POST", f"{srv.url}/v1/completions", json={"model": srv.model, **LONG},
                      headers=AUTH, timeout=60) as r:  # fmt: skip
        lines = r.iter_lines()
        next(lines)
        srv.proc.send_signal(signal.SIGTERM)
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"
    assert sum('"finish_reason":"length"' in line for line in rest) == 16  # none cut short
    assert srv.proc.wait(timeout=60) == 0
    with pytest.raises(httpx.TransportError):  # no longer accepting
        httpx.get(f"{srv.url}/health")


def test_public_bind_needs_a_key(chat_model_dir) -> None:
    with pytest.raises(ValueError, match="--host 0.0.0.0 is not a loopback address"):
        check_bind("0.0.0.0", [], insecure_no_auth=False)
    check_bind("0.0.0.0", ["k"], insecure_no_auth=False)
    check_bind("0.0.0.0", [], insecure_no_auth=True)
    check_bind("::1", [], insecure_no_auth=False)
    env = {k: v for k, v in os.environ.items() if k != "ATS_API_KEY"}
    cmd = [sys.executable, "-m", "ats_infer.cli", "serve", str(chat_model_dir), "--host", "0.0.0.0"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1
    assert "not a loopback address and no API key is set" in done.stderr


def test_server_process_has_no_torch(server, no_torch_path) -> None:
    env = dict(os.environ, PYTHONPATH=str(no_torch_path))
    done = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 1 and "torch is blocked in this process" in done.stderr
    body = {"model": server.model, "prompt": "x", "max_tokens": 2}
    r = httpx.post(f"{server.url}/v1/completions", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200  # served by a process started with that environment
