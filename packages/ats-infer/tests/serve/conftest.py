"""Fixtures of the server tests: a tiny model with a ChatML tokenizer, built once, and live
`ats-infer serve` processes on 127.0.0.1 (a free port each) in an environment where `import torch`
fails, so that every test also shows the native serving path needs no torch."""

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

NO_TORCH = '''"""sitecustomize of the server tests: torch cannot be imported in this process."""
import sys


class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"torch is blocked in this process (import of {name})")
        return None


sys.meta_path.insert(0, NoTorch())
'''
API_KEY = "sk-test-0123456789"
VOCAB = 512


def stdlib_text(first: int, last: int) -> str:
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[first:last]
    return "\n".join(p.read_text(encoding="utf-8") for p in files)


@pytest.fixture(scope="session")
def no_torch_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("no_torch")
    (directory / "sitecustomize.py").write_text(NO_TORCH, encoding="utf-8")
    return directory


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random-init tiny dense model (init_std 0.2: greedy text does not collapse onto one token)
    with a tokenizer that has the ChatML special tokens."""
    import torch
    from ats_model import build_model, presets, save_pretrained
    from ats_tokenizer import CHAT_SPECIAL_TOKENS, Tokenizer

    out = tmp_path_factory.mktemp("chat_model")
    tokenizer_json = out.parent / f"{out.name}_tokenizer.json"
    Tokenizer.train([stdlib_text(0, 40)], VOCAB, special_tokens=CHAT_SPECIAL_TOKENS).save(
        tokenizer_json
    )
    torch.manual_seed(0)
    config = dataclasses.replace(presets.get("tiny-dense"), init_std=0.2)
    return save_pretrained(build_model(config), out, tokenizer_json=tokenizer_json)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log: Path
    model: str

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


def start_server(
    model_dir: Path, log: Path, no_torch: Path, *args: str, key: str | None = API_KEY
) -> Server:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(no_torch))
    env.pop("ATS_API_KEY", None)
    if key is not None:
        env["ATS_API_KEY"] = key
    cmd = [sys.executable, "-m", "ats_infer.cli", "serve", str(model_dir), "--port", str(port)]
    cmd += ["--threads", "1", *args]
    handle = open(log, "wb")  # noqa: SIM115 - the server writes to it until it ends
    proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return Server(url, proc, log, model_dir.name)
        except httpx.TransportError:
            pass  # not listening yet
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the server did not become ready in 300 s:\n{log.read_text()}")


@pytest.fixture(scope="session")
def server(chat_model_dir: Path, no_torch_path: Path, tmp_path_factory) -> Server:
    log = tmp_path_factory.mktemp("server") / "server.log"
    srv = start_server(chat_model_dir, log, no_torch_path, "--slots", "4")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def client(server: Server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
