"""The native engine: ats_native.Model (the C++ runtime, no torch) over a float or int8/int4 model
directory; text in and out through ats_tokenizer, streamed without splitting a UTF-8 character."""

from collections.abc import Iterator
from pathlib import Path

import ats_native
import numpy as np
from ats_tokenizer import Tokenizer

from ats_infer.engine_args import check_sampling, check_seed, check_threads
from ats_infer.tensor_files import TOKENIZER_FILE
from ats_infer.text_stream import encode_prompt, stream_text


class NativeEngine:
    def __init__(
        self, model_dir: Path, threads: int = 0, device: str = "cpu", kv_cache: str = "f32"
    ) -> None:
        check_threads(threads)
        tokenizer_path = model_dir / TOKENIZER_FILE
        if not tokenizer_path.is_file():
            raise FileNotFoundError(f"{model_dir}: no {TOKENIZER_FILE} beside the weights")
        self.tokenizer = Tokenizer.load(tokenizer_path)
        # device "cuda": the native runtime's CUDA backend (a build with ATS_CUDA=ON); kv_cache
        # "f16": keys and values kept in half precision (CPU)
        self.model = ats_native.Model(
            str(model_dir), threads=threads, device=device, kv_cache=kv_cache
        )
        self.vocab_size: int = self.model.vocab_size
        self.max_seq_len: int = self.model.config["max_seq_len"]

    def batch(self, n_slots: int) -> ats_native.Batch:
        """n_slots sequences of up to max_seq_len tokens for continuous batching (the server)."""
        return ats_native.Batch(self.model, n_slots, self.max_seq_len)

    def logits(self, ids: np.ndarray) -> np.ndarray:
        """Float32 logits (B, T, V) of fresh sequences ids (B, T)."""
        return self.model.logits(ids)

    def generate(
        self,
        prompt: str,
        *,
        max_new_tokens: int = 64,
        temperature: float = 0.8,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: list[str] = (),
    ) -> Iterator[str]:
        """Yield text pieces as the runtime yields tokens; stops at <|endoftext|> or a stop string."""
        check_seed(seed)
        check_sampling(max_new_tokens, temperature, top_k, top_p)
        ids = encode_prompt(self.tokenizer, prompt, self.model.vocab_size)
        sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        tokens = self.generate_tokens(ids, max_new_tokens, (self.tokenizer.eos_id,), **sampling)
        yield from stream_text(self.tokenizer, tokens, stop)

    def generate_tokens(
        self,
        ids: list[int],
        max_new_tokens: int,
        stop_tokens: tuple[int, ...],
        *,
        temperature: float,
        top_k: int | None,
        top_p: float | None,
        seed: int | None,
    ) -> Iterator[int]:
        """The new token ids after prompt `ids`, as the runtime yields them, the stop token last."""
        check_seed(seed)
        check_sampling(max_new_tokens, temperature, top_k, top_p)
        return self.model.generate(
            ids,
            max_new_tokens,
            temperature=temperature,
            top_k=0 if top_k is None else top_k,  # the runtime's "off" values
            top_p=1.0 if top_p is None else top_p,
            seed=0 if seed is None else seed,
            stop_tokens=stop_tokens,
        )
