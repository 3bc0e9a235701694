"""The torch engine: ats-model's own forward and generate() over a model directory."""

from collections.abc import Iterator
from pathlib import Path

import torch
from ats_model import generate, load_pretrained
from ats_tokenizer import Tokenizer


class TorchEngine:
    def __init__(self, model_dir: Path, device: str = "cpu", threads: int = 0) -> None:
        tokenizer_path = model_dir / "tokenizer.json"
        if not tokenizer_path.is_file():
            raise FileNotFoundError(f"{model_dir}: no tokenizer.json beside the weights")
        if threads < 0:
            raise ValueError(f"threads = {threads} must be >= 0 (0 = torch's default)")
        if threads > 0:
            torch.set_num_threads(threads)
        self.tokenizer = Tokenizer.load(tokenizer_path)
        self.model = load_pretrained(model_dir, device=device)
        self.model.eval()
        self.device = device

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
        ids = self.tokenizer.encode(prompt)
        if not ids:
            raise ValueError("the prompt is empty after tokenization")
        vocab = self.model.config.vocab_size
        if max(ids) >= vocab:
            raise ValueError(f"prompt token id {max(ids)} is out of the model's vocab ({vocab})")
        idx = torch.tensor([ids], dtype=torch.long, device=self.device)
        out = generate(
            self.model,
            idx,
            max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            stop_tokens=[self.tokenizer.eos_id],
        )
        decoder = self.tokenizer.stream_decoder()
        text = ""
        for token in out[0, len(ids) :].tolist():
            if token == self.tokenizer.eos_id:
                break
            if token >= self.tokenizer.vocab_size:  # a padding row of the model's vocabulary
                raise ValueError(
                    f"the model generated token id {token}, which tokenizer.json "
                    f"({self.tokenizer.vocab_size} ids) does not have"
                )
            piece = decoder.push(token)
            text += piece
            yield piece
            if any(s in text for s in stop):
                return
        yield decoder.finish()
