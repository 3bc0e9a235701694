"""What a post-training run starts from: model.init_from's config, weights and tokenizer (with
the ChatML tokens added when model.add_chat_tokens asks), checked before anything is written."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from ats_model import ModelConfig
from ats_model.serialization.model_dir import TOKENIZER_FILE, load_pretrained, read_config
from ats_tokenizer import Tokenizer

from ats_train.config import ConfigError, TrainConfig
from ats_train.objectives.chat_tokens import (
    missing_chat_tokens,
    resize_embeddings,
    resized_config,
    with_chat_tokens,
)


@dataclass
class PostData:
    """What the Trainer reads of a run's data when the objective is not pretraining."""

    tokenizer: Tokenizer
    tokenizer_path: Path  # copied into every checkpoint and the final model directory
    note: str
    added_tokens: bool  # the tokenizer differs from init_from's: written to tokenizer_path

    def write_tokenizer(self) -> None:
        """The extended tokenizer into the run dir (after every check passed)."""
        if self.added_tokens:
            self.tokenizer.save(self.tokenizer_path)


@dataclass
class Start:
    model_config: ModelConfig
    data: PostData
    init_dir: Path
    message: str  # what was resized, or ""

    def initial_state(self) -> dict[str, torch.Tensor]:
        """init_from's tensors in float32, grown to model_config's vocabulary."""
        model = load_pretrained(self.init_dir, device="cpu", dtype=torch.float32)
        return resize_embeddings(dict(model.state_dict()), self.model_config.vocab_size)


def build_start(config: TrainConfig, run_dir: Path) -> Start:
    init_dir = Path(config.model.init_from or "")
    if not (init_dir / "config.json").is_file():
        raise ConfigError(
            f"model.init_from = {str(init_dir)!r} is not a model directory (no config.json)"
        )
    tokenizer_file = init_dir / TOKENIZER_FILE
    if not tokenizer_file.is_file():
        raise ConfigError(f"model.init_from = {str(init_dir)!r} has no {TOKENIZER_FILE}")
    try:
        model_config = read_config(init_dir)
    except ValueError as e:
        raise ConfigError(f"model.init_from = {str(init_dir)!r}: {e}") from e
    tokenizer = Tokenizer.load(tokenizer_file)
    missing = missing_chat_tokens(tokenizer)
    message = ""
    tokenizer_path = tokenizer_file
    if missing:
        if not config.model.add_chat_tokens:
            raise ConfigError(
                f"the tokenizer of {init_dir} lacks the chat tokens {missing}; set "
                "model.add_chat_tokens = true to add them (the embeddings grow by as many rows)"
            )
        tokenizer = with_chat_tokens(tokenizer)
        old = model_config.vocab_size
        model_config = resized_config(model_config, tokenizer.vocab_size)
        head = "" if model_config.tie_embeddings else " and the untied output head"
        message = (
            f"added special tokens {missing} (ids {tokenizer.vocab_size - len(missing)}.."
            f"{tokenizer.vocab_size - 1}); resized the embeddings{head} from {old} to "
            f"{model_config.vocab_size} rows (new rows: the mean of the old ones)"
        )
        tokenizer_path = run_dir / TOKENIZER_FILE
    if config.train.seq_len > model_config.max_seq_len:
        raise ConfigError(
            f"train.seq_len = {config.train.seq_len} exceeds the max_seq_len = "
            f"{model_config.max_seq_len} of {init_dir}"
        )
    note = f"data: {config.data.source}; starting from {init_dir} ({os.fspath(tokenizer_path)})"
    data = PostData(tokenizer, tokenizer_path, note, tokenizer_path != tokenizer_file)
    return Start(model_config, data, init_dir, message)
