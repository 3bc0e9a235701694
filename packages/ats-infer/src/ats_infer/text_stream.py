"""Prompt in, text out: what every engine does around its token generator.

The prompt is checked against the model's vocabulary before any compute; generated ids are
decoded with the tokenizer's stream decoder, so a piece never splits a UTF-8 character.
"""

from collections.abc import Iterable, Iterator

from ats_tokenizer import Tokenizer


def encode_prompt(tokenizer: Tokenizer, prompt: str, model_vocab_size: int) -> list[int]:
    ids = tokenizer.encode(prompt)
    if not ids:
        raise ValueError("the prompt is empty after tokenization")
    if max(ids) >= model_vocab_size:
        raise ValueError(
            f"prompt token id {max(ids)} is out of the model's vocab ({model_vocab_size})"
        )
    return ids


def stream_text(tokenizer: Tokenizer, tokens: Iterable[int], stop: Iterable[str]) -> Iterator[str]:
    """Yield text pieces for `tokens`; end at <|endoftext|> or once a stop string appeared."""
    stop = list(stop)
    decoder = tokenizer.stream_decoder()
    text = ""
    for token in tokens:
        if token == tokenizer.eos_id:
            break
        if token >= tokenizer.vocab_size:  # a padding row of the model's vocabulary
            raise ValueError(
                f"the model generated token id {token}, which tokenizer.json "
                f"({tokenizer.vocab_size} ids) does not have"
            )
        piece = decoder.push(token)
        text += piece
        yield piece
        if any(s in text for s in stop):
            return
    yield decoder.finish()
