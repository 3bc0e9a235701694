"""Type stubs of ats_native (hand-written to match bindings/module.cpp and bindings/tokenizer.cpp)."""

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

def version() -> str:
    """Version of the native core."""

def pretokenize(text: str, pattern: str) -> list[str]:
    """Split text like regex.findall(PATTERN, text) for the named pattern 'gpt4' or 'gpt2'."""

class BpeEncoder:
    """Byte-level BPE over (byte_ids, merges in rank order as (left, right, merged)) and a pattern."""

    def __init__(
        self, byte_ids: list[int], merges: list[tuple[int, int, int]], pattern: str
    ) -> None: ...
    def encode(self, text: str) -> list[int]: ...
    def encode_batch(self, texts: list[str], threads: int = 0) -> list[list[int]]: ...

class WordCounter:
    """Pre-token counts (UTF-8 bytes -> count) for training, filled on several threads."""

    def __init__(self, pattern: str) -> None: ...
    def add(self, texts: list[str], threads: int = 0) -> None: ...
    def prune(self, max_words: int) -> None: ...
    def counts(self) -> dict[bytes, int]: ...
    def __len__(self) -> int: ...
    def train(self, n_merges: int, min_frequency: int) -> list[tuple[int, int]]: ...

def train_bpe(counts: dict[bytes, int], n_merges: int, min_frequency: int) -> list[tuple[int, int]]:
    """Learn BPE merges from word counts (byte b has id b; merge i creates id 256 + i)."""

# ---- model runtime (bindings/model.cpp, bindings/tokenizer_json.cpp) ----------------------------

def cpu_features() -> dict[str, str | bool]:
    """CPU SIMD features and the kernel set chosen for them ("kernels": avx512 / avx2 / neon / scalar)."""

def cuda_built() -> bool:
    """True when this build holds the CUDA backend (Model(..., device="cuda"))."""

def threads_max() -> int:
    """The most threads one call (Model, encode_batch, WordCounter.add, quantized_matmul,
    cpu_peak) may use: 4 x the hardware threads; more is a ValueError."""

def cpu_peak(kind: str, threads: int = 2, seconds: float = 0.5) -> float:
    """Measured peak multiply-adds per second of this CPU on `threads` threads: kind "int8" (int8
    dot products: AVX-512 VNNI vpdpbusd, else AVX2) or "fp32" (FMA), register-only loops running
    `seconds` each."""

def quantized_matmul(
    codes: npt.NDArray[np.int8] | npt.NDArray[np.uint8],
    scale: npt.NDArray[np.float32],
    x: npt.NDArray[np.float32],
    bits: int,
    group: int = 32,
    kernels: str = "auto",
    threads: int = 1,
) -> npt.NDArray[np.float32]:
    """x (n, cols) @ W.T for int8 weights (bits 8: codes int8 (rows, cols), scale (rows,)) or int4
    weights (bits 4: codes uint8 (rows, cols / 2), low nibble = even column, scale
    (rows, cols / group)), through the model runtime's own matmul path: load-time repacking,
    Q8_0 activation rounding when cols % 32 == 0, the named kernel set (kernel tests)."""

def half_round(x: npt.NDArray[np.float32], kernels: str = "auto") -> npt.NDArray[np.float32]:
    """x (float32, 1-D) rounded to half precision and back by the kernel set's conversions, as
    keys and values pass through the f16 KV cache (kernel tests)."""

class Generation:
    """Iterator over generated token ids (Model.generate): prefill on the first next(), then one
    decode step with the KV cache per id."""

    def __iter__(self) -> Generation: ...
    def __next__(self) -> int: ...

class Model:
    """An ATS model directory (float, bf16, int8 or int4) loaded by the native runtime.

    threads: compute threads (0 = all cores, at most threads_max()); kernels: "auto", "avx512", "avx2", "neon", "scalar".
    device: "cpu" or "cuda" (weights, KV caches and forward passes on the current GPU; needs a
    build with ATS_CUDA=ON, see cuda_built(), and a dense model).
    kv_cache: "f32" or "f16" (CPU only), the element type of the KV caches: f16 halves their
    memory and decode attention's reads; each key and value is rounded to half precision.
    Raises ValueError with a clear message on malformed directories or an unavailable device."""

    def __init__(
        self,
        path: str,
        threads: int = 0,
        kernels: str = "auto",
        device: str = "cpu",
        kv_cache: str = "f32",
    ) -> None: ...
    @property
    def config(self) -> dict[str, Any]: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def kernels(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def weight_format(self) -> str: ...
    @property
    def kv_cache(self) -> str: ...
    def logits(self, ids: Sequence[int] | npt.ArrayLike) -> npt.NDArray[np.float32]:
        """Float32 logits (T, V) for ids (T,), or (B, T, V) for ids (B, T); fresh sequences.
        MoD layers route with the causal predictor, as ats-model does while generating."""
    def generate(
        self,
        ids: Sequence[int] | npt.ArrayLike,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        stop_tokens: Sequence[int] = (),
    ) -> Generation:
        """New token ids as they come; greedy when temperature == 0. Stops after a stop token
        (which is yielded) or max_new_tokens."""
    def generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        stop_tokens: Sequence[int] = (),
    ) -> list[list[int]]:
        """New token ids of each prompt, all generated together (sequence b samples with seed + b, modulo 2**64); seed: 0 to 2**64 - 1."""

FINISH_NONE: int  # the slot keeps generating
FINISH_STOP: int  # the token is a stop token (not part of the text); the slot is free
FINISH_LENGTH: int  # max_new_tokens reached or the slot's cache is full; the slot is free
MAX_TOP_LOGPROBS: int

# (slot, token, finish, logprob, [(token id, logprob), ...] most likely first)
BatchEvent = tuple[int, int, int, float, list[tuple[int, float]]]

class Batch:
    """Continuous batching over one KV cache of n_slots sequences of up to max_len tokens each:
    start requests in free slots, step them all with one forward pass, cancel any. Logprobs are
    log-softmax of the raw logits (before bias, penalties, temperature; over the ids below the
    request's vocab_limit). One thread owns a batch."""

    def __init__(self, model: Model, n_slots: int, max_len: int) -> None: ...
    @property
    def n_slots(self) -> int: ...
    @property
    def max_len(self) -> int: ...
    def busy(self, slot: int) -> bool: ...
    def start(
        self,
        slot: int,
        prompt: Sequence[int] | npt.ArrayLike,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logit_bias: dict[int, float] = ...,
        stop_tokens: Sequence[int] = (),
        logprobs: bool = False,
        top_logprobs: int = 0,
        vocab_limit: int = 0,
    ) -> None:
        """Starts a request in a free slot; ValueError naming the problem otherwise. vocab_limit
        N > 0: only ids below N are drawn, argmaxed and in the logprobs (a model vocabulary
        padded past the tokenizer's N ids); 0 = the whole vocabulary."""
    def step(self, prefill_budget: int = 0, wake_fds: Sequence[int] = ()) -> list[BatchEvent]:
        """One forward pass over every busy slot: a prompt chunk (at most prefill_budget prompt
        tokens in all this step; 0 = no limit) for slots in prefill, the last token for the
        others; one event per slot that sampled a token. First, with the GIL released, one byte
        goes to each of wake_fds (a full pipe counts as woken; ValueError naming the fd and no
        step when one cannot be written): a server's scheduler wakes its event loop for the
        previous step's events there, so that neither thread waits on the other for the GIL."""
    def cancel(self, slot: int) -> None: ...

class Tokenizer:
    """Byte-level BPE tokenizer read from a tokenizer.json (ids equal ats_tokenizer's
    encode_ordinary)."""

    def __init__(self, path: str) -> None: ...
    @property
    def vocab_size(self) -> int: ...
    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> bytes: ...
