"""The torch engine: ats-model's own forward and generate() over a float or optimum-quanto model
directory, optionally with an adapter directory applied (LoRA or router weights, not merged)."""

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from ats_model import generate, load_pretrained
from ats_model.adapters import load_adapter
from ats_tokenizer import Tokenizer

from ats_infer.engine_args import check_sampling, check_seed, check_threads
from ats_infer.quant_spec import QUANTO_FILE
from ats_infer.tensor_files import path_kind
from ats_infer.text_stream import encode_prompt, stream_text
from ats_infer.torch_batch import TorchBatch


class TorchEngine:
    def __init__(
        self, model_dir: Path, device: str = "cpu", threads: int = 0, adapter: Path | None = None
    ) -> None:
        check_threads(threads)
        tokenizer_path = model_dir / "tokenizer.json"
        if not tokenizer_path.is_file():
            raise FileNotFoundError(f"{model_dir}: no tokenizer.json beside the weights")
        if threads > 0:  # 0: torch's default
            torch.set_num_threads(threads)
        self.tokenizer = Tokenizer.load(tokenizer_path)
        if path_kind(model_dir / QUANTO_FILE) != "missing":
            from ats_infer.quanto_dir import load_quanto  # optimum-quanto: imported when needed

            self.model = load_quanto(model_dir, device=device)
        else:
            self.model = load_pretrained(model_dir, device=device)
        if adapter is not None:  # applied, not merged: the base weights stay as saved
            load_adapter(self.model, adapter)
        self.model.eval()
        self.device = device
        self.vocab_size: int = self.model.config.vocab_size
        self.max_seq_len: int = self.model.config.max_seq_len

    def batch(self, n_slots: int) -> TorchBatch:
        """n_slots sequences of up to max_seq_len tokens for continuous batching (the server)."""
        return TorchBatch(self.model, n_slots, self.max_seq_len, self.device)

    def logits(self, ids: np.ndarray) -> np.ndarray:
        """Float32 logits (B, T, V) of fresh sequences ids (B, T)."""
        with torch.no_grad():
            idx = torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)).to(self.device)
            return self.model(idx).logits.float().cpu().numpy()

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
        """Yield text pieces as tokens come; never splits a UTF-8 character."""
        check_seed(seed)
        check_sampling(max_new_tokens, temperature, top_k, top_p)
        ids = encode_prompt(self.tokenizer, prompt, self.model.config.vocab_size)
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
    ) -> list[int]:
        """The new token ids after prompt `ids`, up to and including the first stop token."""
        check_seed(seed)
        check_sampling(max_new_tokens, temperature, top_k, top_p)
        idx = torch.tensor([ids], dtype=torch.long, device=self.device)
        out = generate(
            self.model,
            idx,
            max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            stop_tokens=list(stop_tokens),
        )[0, len(ids) :].tolist()
        ends = [i for i, t in enumerate(out) if t in stop_tokens]
        return out[: ends[0] + 1] if ends else out
