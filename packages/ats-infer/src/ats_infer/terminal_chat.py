"""`ats-infer chat MODEL_DIR`: an interactive chat in the terminal, in ats-tokenizer's ChatML template.

Each line read is a user turn; the whole history is re-encoded with the template (generation prompt
added) and the reply is printed as it decodes, ending at <|im_end|> or <|endoftext|>, then kept in
the history. `/reset` forgets the history (the system prompt stays), `/exit` or end of input quits.
The native engine prints tokens as the runtime yields them; the torch engine after its generate.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TextIO

from ats_tokenizer.chat import IM_END, IM_START

from ats_infer.engine import Engine

PROMPT = "you> "
REPLY = "assistant> "


def require_chat_tokens(engine: Engine, model_dir: str) -> None:
    missing = [t for t in (IM_START, IM_END) if t not in engine.tokenizer.special_tokens]
    if missing:
        raise ValueError(
            f"{model_dir}/tokenizer.json has no chat special tokens {missing}: this model cannot "
            "chat; fine-tune one whose tokenizer reserves the ChatML tokens (ats-train trains "
            "them), or use `ats-infer generate` with a plain prompt"
        )


class ChatSession:
    """The conversation so far and how each reply is sampled."""

    def __init__(self, engine: Engine, system: str | None, sampling: dict) -> None:
        self.engine = engine
        self.system = system
        self.sampling = sampling  # temperature, top_k, top_p, seed, max_new_tokens
        self.messages: list[dict[str, str]] = []
        self.reset()

    def reset(self) -> None:
        self.messages = [] if self.system is None else [{"role": "system", "content": self.system}]

    def prompt_ids(self) -> list[int]:
        ids, _ = self.engine.tokenizer.apply_chat_template(
            self.messages, add_generation_prompt=True
        )
        return ids

    def reply(self, text: str) -> Iterator[str]:
        """Add the user turn, yield the reply's text pieces, then add the reply to the history.
        A conversation that no longer fits the context is refused before anything changes."""
        self.messages.append({"role": "user", "content": text})
        ids = self.prompt_ids()
        room = self.engine.max_seq_len - len(ids)
        if room < 1:
            self.messages.pop()
            raise ValueError(
                f"the conversation is {len(ids)} tokens, the model's context is "
                f"{self.engine.max_seq_len}: /reset to start over"
            )
        tokenizer = self.engine.tokenizer
        stops = (tokenizer.eos_id, tokenizer.special_tokens[IM_END])
        sampling = dict(self.sampling)
        budget = min(sampling.pop("max_new_tokens"), room)
        decoder = tokenizer.stream_decoder()
        content = ""
        for token in self.engine.generate_tokens(ids, budget, stops, **sampling):
            if token in stops:
                break
            piece = decoder.push(token)
            content += piece
            yield piece
        tail = decoder.finish()
        content += tail
        yield tail
        self.messages.append({"role": "assistant", "content": content})


def run_chat(session: ChatSession, stdin: TextIO, stdout: TextIO) -> None:
    """Read turns from stdin until /exit or end of input; print each reply as it comes."""
    while True:
        stdout.write(PROMPT)
        stdout.flush()
        line = stdin.readline()
        if not line:  # end of input
            stdout.write("\n")
            return
        text = line.rstrip("\n")
        if text.strip() == "/exit":
            return
        if text.strip() == "/reset":
            session.reset()
            stdout.write("(history cleared)\n")
            continue
        if not text.strip():
            continue
        stdout.write(REPLY)
        for piece in session.reply(text):
            stdout.write(piece)
            stdout.flush()
        stdout.write("\n")
