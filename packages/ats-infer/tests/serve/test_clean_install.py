"""`pip install 'ats-infer[native,serve]'` into a fresh venv (the workspace's ats-native and
ats-tokenizer beside it, everything else from PyPI, no torch and no ats-data): the installed
`ats-infer serve` answers a request and exits 0 on SIGTERM, and eval-ppl names the missing extra."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from .conftest import free_port

ROOT = Path(__file__).resolve().parents[4]


@pytest.mark.install
@pytest.mark.slow
def test_clean_venv_serves_without_torch(chat_model_dir: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    packages = [str(ROOT / "native"), str(ROOT / "packages" / "ats-tokenizer"),
                f"{ROOT / 'packages' / 'ats-infer'}[native,serve]"]  # fmt: skip
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *packages], check=True,
                   timeout=1800)  # fmt: skip
    no_torch = subprocess.run([str(python), "-c", "import torch"], capture_output=True)
    assert no_torch.returncode == 1  # ModuleNotFoundError: torch was never installed
    no_data = subprocess.run([str(python), "-c", "import ats_data"], capture_output=True)
    assert no_data.returncode == 1, "ats-data came with ats-infer's base install"
    ppl = subprocess.run([str(venv / "bin" / "ats-infer"), "eval-ppl", str(chat_model_dir),
                          "--data", "stdlib"], capture_output=True, text=True)  # fmt: skip
    assert ppl.returncode == 1 and "pip install 'ats-infer[eval]'" in ppl.stderr, ppl.stderr
    port = free_port()
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(venv / "bin" / "ats-infer"), "serve", str(chat_model_dir), "--port", str(port),
             "--threads", "1"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(600):
                try:
                    if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
            body = {"model": chat_model_dir.name, "prompt": "def f(", "max_tokens": 4}
            r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
            assert r.status_code == 200, log.read_text()
            assert r.json()["usage"]["completion_tokens"] >= 1
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0, log.read_text()
