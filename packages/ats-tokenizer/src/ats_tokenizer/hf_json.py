"""Read and write HF `tokenizers` tokenizer.json for byte-level BPE.

Written layout (what HF loads for a GPT-4-style tokenizer): model BPE with ByteLevel vocab strings
and [left, right] merges; pre_tokenizer Sequence[Split(Regex, Isolated), ByteLevel(use_regex=false)];
decoder ByteLevel; specials in added_tokens (special=true). Read: ours, and HF ByteLevel BPE files
(ByteLevel(use_regex=true) means the GPT-2 pattern; merges as "a b" or [a, b]). Anything that would
change encoding and that we do not implement is refused with the field named.
"""

import json
from dataclasses import dataclass
from typing import Any

from ats_tokenizer.bytelevel import BYTE_TO_UNICODE, bytes_to_unicode_str
from ats_tokenizer.pretokenize import GPT2_PATTERN


@dataclass(frozen=True)
class LoadedBpe:
    byte_ids: list[int]
    merges: list[tuple[int, int, int]]
    special_tokens: dict[str, int]
    pattern: str


def to_hf_dict(
    token_bytes: dict[int, bytes],
    merges: list[tuple[int, int, int]],
    special_tokens: dict[str, int],
    pattern: str,
) -> dict[str, Any]:
    vocab = {bytes_to_unicode_str(token_bytes[i]): i for i in sorted(token_bytes)}
    hf_merges = [
        [bytes_to_unicode_str(token_bytes[left]), bytes_to_unicode_str(token_bytes[right])]
        for left, right, _ in merges
    ]
    added = [
        {
            "id": tid,
            "content": content,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for content, tid in sorted(special_tokens.items(), key=lambda kv: kv[1])
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": pattern},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {
                    "type": "ByteLevel",
                    "add_prefix_space": False,
                    "trim_offsets": True,
                    "use_regex": False,
                },
            ],
        },
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": hf_merges,
        },
    }


def dumps(obj: dict[str, Any]) -> str:
    """Canonical text of a tokenizer.json (what save() writes and sha256() hashes)."""
    return json.dumps(obj, ensure_ascii=False, indent=2) + "\n"


class TokenizerFileError(ValueError):
    """A tokenizer.json that is malformed or uses a feature ATS does not implement."""


def _fail(source: str, field: str, problem: str) -> TokenizerFileError:
    return TokenizerFileError(f"{source}: field '{field}': {problem}")


def _object(node: Any, source: str, field: str) -> dict[str, Any]:
    if not isinstance(node, dict):
        raise _fail(
            source, field, f"expected a JSON object, got {type(node).__name__} {node!r:.60}"
        )
    return node


def _byte_level(node: dict[str, Any], source: str, field: str, use_regex: bool) -> None:
    if node.get("add_prefix_space", False):
        raise _fail(source, f"{field}.add_prefix_space", "true is not supported (must be false)")
    if node.get("use_regex", True) != use_regex:
        raise _fail(source, f"{field}.use_regex", f"expected {str(use_regex).lower()} here")


def _pattern(pre: Any, source: str) -> str:
    if not isinstance(pre, dict):
        raise _fail(source, "pre_tokenizer", f"expected a ByteLevel pre-tokenizer, got {pre!r}")
    kind = pre.get("type")
    if kind == "ByteLevel":
        _byte_level(pre, source, "pre_tokenizer", use_regex=True)
        return GPT2_PATTERN
    if kind == "Sequence":
        steps = pre.get("pretokenizers")
        if not (isinstance(steps, list) and len(steps) == 2):
            raise _fail(source, "pre_tokenizer.pretokenizers", "expected [Split, ByteLevel]")
        split = _object(steps[0], source, "pre_tokenizer.pretokenizers[0]")
        byte_level = _object(steps[1], source, "pre_tokenizer.pretokenizers[1]")
        if split.get("type") != "Split" or byte_level.get("type") != "ByteLevel":
            raise _fail(source, "pre_tokenizer.pretokenizers", "expected [Split, ByteLevel]")
        pattern = split.get("pattern")
        regex_pattern = pattern.get("Regex") if isinstance(pattern, dict) else None
        if not isinstance(regex_pattern, str):
            raise _fail(source, "pre_tokenizer.pretokenizers[0].pattern", "expected {'Regex': str}")
        if split.get("behavior") != "Isolated" or split.get("invert", False):
            raise _fail(
                source, "pre_tokenizer.pretokenizers[0]", "only behavior Isolated, invert false"
            )
        _byte_level(byte_level, source, "pre_tokenizer.pretokenizers[1]", use_regex=False)
        return regex_pattern
    raise _fail(source, "pre_tokenizer.type", f"{kind!r} is not supported")


def _check_model(model: Any, source: str) -> None:
    if not isinstance(model, dict) or model.get("type", "BPE") != "BPE":
        kind = model.get("type") if isinstance(model, dict) else model
        raise _fail(source, "model.type", f"{kind!r} is not supported (only BPE)")
    for key, allowed in (
        ("dropout", (None,)),
        ("unk_token", (None,)),
        ("continuing_subword_prefix", (None, "")),
        ("end_of_word_suffix", (None, "")),
        ("byte_fallback", (None, False)),
        ("ignore_merges", (None, False)),
    ):
        if model.get(key) not in allowed:
            raise _fail(source, f"model.{key}", f"{model.get(key)!r} is not supported")
    if not isinstance(model.get("vocab"), dict) or not isinstance(model.get("merges"), list):
        raise _fail(source, "model", "needs a 'vocab' object and a 'merges' list")


def from_hf_dict(data: Any, source: str) -> LoadedBpe:
    if not isinstance(data, dict):
        raise TokenizerFileError(
            f"{source}: the top level is a JSON {type(data).__name__}, expected an object: "
            "this is not a tokenizer.json"
        )
    if "model" not in data:
        raise _fail(source, "model", "missing: this is not a tokenizer.json")
    for key in ("normalizer", "truncation", "padding"):
        if data.get(key) is not None:
            raise _fail(source, key, f"{data[key]!r} is not supported (must be null)")
    post = data.get("post_processor")
    if post is not None and _object(post, source, "post_processor").get("type") != "ByteLevel":
        raise _fail(source, "post_processor", f"type {post.get('type')!r} is not supported")
    decoder = data.get("decoder")
    if not isinstance(decoder, dict) or decoder.get("type") != "ByteLevel":
        raise _fail(source, "decoder", f"expected a ByteLevel decoder, got {decoder!r}")
    pattern = _pattern(data.get("pre_tokenizer"), source)
    model = data["model"]
    _check_model(model, source)
    vocab: dict[str, int] = model["vocab"]
    for token, tid in vocab.items():
        if type(tid) is not int or tid < 0:
            raise _fail(
                source, "model.vocab", f"entry {token!r} has id {tid!r}, expected an int >= 0"
            )

    special_tokens: dict[str, int] = {}
    added_tokens = data.get("added_tokens")
    if added_tokens is None:
        added_tokens = []
    if not isinstance(added_tokens, list):
        raise _fail(source, "added_tokens", f"expected a list, got {type(added_tokens).__name__}")
    for i, tok in enumerate(added_tokens):
        field = f"added_tokens[{i}]"
        _object(tok, source, field)
        if not tok.get("special", False):
            raise _fail(source, f"{field}.special", "non-special added tokens are not supported")
        for flag in ("lstrip", "rstrip", "single_word"):
            if tok.get(flag, False):
                raise _fail(source, f"{field}.{flag}", "true is not supported")
        content, tid = tok.get("content"), tok.get("id")
        if not isinstance(content, str) or not content or type(tid) is not int or tid < 0:
            raise _fail(source, field, "needs a non-empty 'content' and an integer 'id' >= 0")
        if content in vocab and vocab[content] != tid:
            raise _fail(source, field, f"{content!r} has id {tid} but vocab gives {vocab[content]}")
        special_tokens[content] = tid

    def lookup(token: Any, field: str) -> int:
        if not isinstance(token, str) or token not in vocab:
            raise _fail(source, field, f"token {token!r} is not in model.vocab")
        return vocab[token]

    byte_ids = [lookup(BYTE_TO_UNICODE[b], f"model.vocab (byte 0x{b:02X})") for b in range(256)]
    merges: list[tuple[int, int, int]] = []
    for rank, entry in enumerate(model["merges"]):
        field = f"model.merges[{rank}]"
        if isinstance(entry, str):
            parts = entry.split(" ")
        elif isinstance(entry, list):
            parts = entry
        else:
            raise _fail(source, field, f"expected 'a b' or [a, b], got {entry!r}")
        if len(parts) != 2:
            raise _fail(source, field, f"expected two tokens, got {entry!r}")
        left, right = parts
        left_id, right_id = lookup(left, field), lookup(right, field)
        merges.append((left_id, right_id, lookup(left + right, field)))

    produced = set(byte_ids) | {m for _, _, m in merges}
    special_ids = set(special_tokens.values())
    for token, tid in vocab.items():
        if tid not in produced and tid not in special_ids:
            raise _fail(
                source,
                "model.vocab",
                f"entry {token!r} (id {tid}) is neither a byte, a merge result nor a special token",
            )
    return LoadedBpe(byte_ids, merges, special_tokens, pattern)
