"""`serve --kv-cache f16`: the option reaches the native runtime (the CUDA refusal names it), and a
server over the half-precision cache answers concurrent requests exactly as it answers each one
alone (decode reads several sequences' f16 caches in one step)."""

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from .conftest import API_KEY, start_server
from .test_load import requests, serve_one

N_REQUESTS = 16


def test_f16_cache_answers_together_as_alone(chat_model_dir, no_torch_path, tmp_path) -> None:
    from openai import OpenAI

    srv = start_server(chat_model_dir, tmp_path / "server.log", no_torch_path, "--slots", "4",
                       "--kv-cache", "f16")  # fmt: skip
    try:
        client = OpenAI(base_url=f"{srv.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
        batch = requests(srv.model)[:N_REQUESTS]
        alone = [serve_one(client, r) for r in batch]
        with ThreadPoolExecutor(4) as pool:
            together = list(pool.map(lambda r: serve_one(client, r), batch))
        assert together == alone
        assert sum(tokens for _, _, tokens in alone) > 5 * N_REQUESTS
    finally:
        assert srv.stop() == 0


def test_f16_cache_on_cuda_is_refused(chat_model_dir) -> None:
    cmd = [sys.executable, "-m", "ats_infer.cli", "serve", str(chat_model_dir), "--port", "0",
           "--kv-cache", "f16", "--device", "cuda"]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "kv_cache 'f16' is for the CPU" in result.stderr.strip().splitlines()[-1]
