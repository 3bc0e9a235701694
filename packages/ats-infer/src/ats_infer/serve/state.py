"""What a running server holds: its settings (from the command line), and once the model has
loaded, the tokenizer, the scheduler over the engine's batch, and the model's limits."""

from dataclasses import dataclass
from typing import Any

from ats_tokenizer import Tokenizer

from ats_infer.serve.auth import KeyChecker
from ats_infer.serve.limits import RateLimiter
from ats_infer.serve.metrics import Metrics
from ats_infer.serve.scheduler import Scheduler


@dataclass
class Settings:
    model_dir: str
    model_name: str
    engine: str = "native"
    device: str = "cpu"
    threads: int = 0
    kv_cache: str = "f32"  # the native engine's KV cache type (ats_infer.engine.KV_CACHES)
    slots: int = 8
    max_queue: int = 256
    prefill_chunk: int = 256  # prompt tokens per scheduler step, over all slots
    request_timeout: float = 600.0  # seconds
    max_body_bytes: int = 1 << 20
    shutdown_timeout: float = 30.0
    adapter: str | None = None  # adapter directory applied by the torch engine


@dataclass
class ServerState:
    settings: Settings
    keys: KeyChecker
    limiter: RateLimiter | None
    metrics: Metrics
    status: str = "loading"  # loading | ok | stopping
    tokenizer: Tokenizer | None = None
    scheduler: Scheduler | None = None
    engine: Any = None
    vocab_size: int = 0
    max_seq_len: int = 0
    created: int = 0
    # ids below it are drawn (EngineBatch.start's vocab_limit): the model's rows past the
    # tokenizer's ids (a vocabulary padded for speed) never are
    vocab_limit: int = 0

    @property
    def model_name(self) -> str:
        return self.settings.model_name
