"""`ats-tokenizer` command: train a tokenizer.json from files, encode text to ids, decode ids.

Bad input exits with status 2 and one line on stderr, no traceback.
"""

import argparse
import json
import logging
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from ats_tokenizer.inputs import decode_utf8, parse_json
from ats_tokenizer.special import DisallowedSpecialError, SpecialSpec
from ats_tokenizer.tokenizer import EOS_TOKEN, Tokenizer


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ats-tokenizer", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log the backend choice")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="learn a byte-level BPE from UTF-8 text files")
    train.add_argument("--input", nargs="+", required=True, metavar="PATH", help="text files")
    train.add_argument("--vocab-size", type=int, required=True, help="bytes + merges + specials")
    train.add_argument("--out", required=True, help="tokenizer.json to write")
    train.add_argument("--min-frequency", type=int, default=2, help="stop below this pair count")
    train.add_argument(
        "--special", nargs="*", default=[EOS_TOKEN], metavar="TOKEN", help="special tokens"
    )
    train.add_argument("--backend", choices=["auto", "python", "native"], default="auto")

    train.add_argument("--force", action="store_true", help="replace an existing --out file")

    encode = sub.add_parser(
        "encode",
        help="print the ids of text (stdin or --text) as JSON",
        description="Special-token strings in the text follow tiktoken's allowed_special / "
        "disallowed_special rules: allowed ones become their ids, disallowed ones are an error, "
        "any other is encoded as plain text.",
    )
    encode.add_argument("--tokenizer", required=True, help="tokenizer.json")
    encode.add_argument("--text", help="text to encode (default: read stdin as UTF-8)")
    encode.add_argument(
        "--allowed-special",
        default="none",
        metavar="all|none|TOKEN,...",
        help="special tokens whose strings become their ids (default: none)",
    )
    encode.add_argument(
        "--disallowed-special",
        default="all",
        metavar="all|none|TOKEN,...",
        help="special tokens whose strings are an error; 'all' means every one not allowed "
        "(default); 'none' encodes them all as plain text",
    )

    decode = sub.add_parser("decode", help="print the text of a JSON list of ids")
    decode.add_argument("--tokenizer", required=True, help="tokenizer.json")
    decode.add_argument("--ids", help="JSON list of ids (default: read stdin)")
    return parser


def _special_arg(flag: str, value: str, tok: Tokenizer) -> SpecialSpec:
    """--allowed-special / --disallowed-special: 'all', 'none' or comma-separated token names."""
    if value == "all":
        return "all"
    if value == "none":
        return ()
    names = value.split(",")
    unknown = [n for n in names if n not in tok.special_tokens]
    if unknown:
        raise ValueError(
            f"{flag} names {unknown}, which are not special tokens of this tokenizer; expected "
            f"all, none or a comma-separated list of {sorted(tok.special_tokens)}"
        )
    return names


def _encode(args: argparse.Namespace) -> list[int]:
    tok = Tokenizer.load(args.tokenizer)
    allowed = _special_arg("--allowed-special", args.allowed_special, tok)
    disallowed = _special_arg("--disallowed-special", args.disallowed_special, tok)
    if args.text is not None:
        # argv bytes that are not UTF-8 arrive as surrogate escapes; name them as bytes
        text = decode_utf8(os.fsencode(args.text), "--text")
    else:
        text = decode_utf8(sys.stdin.buffer.read(), "stdin")
    try:
        return tok.encode(text, allowed_special=allowed, disallowed_special=disallowed)
    except DisallowedSpecialError as err:
        token = shlex.quote(err.token)
        raise ValueError(
            f"the text holds the special token {err.token!r} at index {err.index}, which "
            f"--disallowed-special forbids: pass --allowed-special {token} (or all) to encode it "
            "as its id, or --disallowed-special none to encode it as plain text"
        ) from None


def _check_out(out: Path, input_paths: Sequence[str], force: bool) -> None:
    """Refuse, before any training, an --out that would overwrite an input or another file."""
    if out.is_dir():
        raise IsADirectoryError(f"--out {out} is a folder; give the path of the file to write")
    if out.exists():
        for path in input_paths:
            if Path(path).exists() and out.samefile(path):
                raise ValueError(f"--out {out} is also an --input: refusing to write over it")
        if not force:
            raise FileExistsError(f"--out {out} already exists: pass --force to replace it")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"--out {out}: folder {out.parent} does not exist")


def _run(args: argparse.Namespace) -> None:
    if args.command == "train":
        _check_out(Path(args.out), args.input, args.force)
        tok = Tokenizer.train_from_files(
            args.input,
            args.vocab_size,
            min_frequency=args.min_frequency,
            special_tokens=args.special,
            backend=args.backend,
        )
        tok.save(args.out)
        print(f"wrote {args.out}: vocab_size={tok.vocab_size} sha256={tok.sha256()}")
    elif args.command == "encode":
        print(json.dumps(_encode(args)))
    else:
        tok = Tokenizer.load(args.tokenizer)
        if args.ids is not None:
            ids = parse_json(args.ids, "--ids")
        else:
            ids = parse_json(decode_utf8(sys.stdin.buffer.read(), "stdin"), "stdin")
        if not isinstance(ids, list) or not all(type(i) is int for i in ids):
            raise ValueError("--ids must be a JSON list of integers")
        sys.stdout.write(tok.decode(ids))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    level = logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(name)s: %(message)s")
    try:
        _run(args)
    except (ValueError, OSError, TypeError) as err:
        print(f"ats-tokenizer {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
