"""ats_tokenizer: byte-level BPE (GPT-2/GPT-4 style) with a pure-Python reference and an optional
C++ fast path (ats_native). Public entry point: Tokenizer."""

from ats_tokenizer.chat import CHAT_SPECIAL_TOKENS
from ats_tokenizer.pretokenize import GPT2_PATTERN, GPT4_PATTERN
from ats_tokenizer.tokenizer import Tokenizer

__all__ = ["CHAT_SPECIAL_TOKENS", "GPT2_PATTERN", "GPT4_PATTERN", "Tokenizer"]
