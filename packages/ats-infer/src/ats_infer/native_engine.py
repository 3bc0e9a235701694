"""The native engine: ats_native.Model (the C++ runtime, no torch) over a float or int8/int4 model
directory; text in and out through ats_tokenizer, streamed without splitting a UTF-8 character."""

from collections.abc import Iterator
from pathlib import Path

import ats_native
from ats_tokenizer import Tokenizer

from ats_infer.tensor_files import TOKENIZER_FILE


class NativeEngine:
    def __init__(self, model_dir: Path, threads: int = 0) -> None:
        tokenizer_path = model_dir / TOKENIZER_FILE
        if not tokenizer_path.is_file():
            raise FileNotFoundError(f"{model_dir}: no {TOKENIZER_FILE} beside the weights")
        if threads < 0:
            raise ValueError(f"threads = {threads} must be >= 0 (0 = all cores)")
        self.tokenizer = Tokenizer.load(tokenizer_path)
        self.model = ats_native.Model(str(model_dir), threads=threads)

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
        ids = self.tokenizer.encode(prompt)
        if not ids:
            raise ValueError("the prompt is empty after tokenization")
        vocab = self.model.vocab_size
        if max(ids) >= vocab:
            raise ValueError(f"prompt token id {max(ids)} is out of the model's vocab ({vocab})")
        eos = self.tokenizer.eos_id
        tokens = self.model.generate(
            ids,
            max_new_tokens,
            temperature=temperature,
            top_k=0 if top_k is None else top_k,  # the runtime's "off" values
            top_p=1.0 if top_p is None else top_p,
            seed=0 if seed is None else seed,
            stop_tokens=(eos,),
        )
        decoder = self.tokenizer.stream_decoder()
        text = ""
        for token in tokens:
            if token == eos:
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
