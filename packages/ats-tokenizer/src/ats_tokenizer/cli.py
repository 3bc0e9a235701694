"""`ats-tokenizer` command: train a tokenizer.json from files, encode text to ids, decode ids.

Bad input exits with status 2 and one line on stderr, no traceback.
"""

import argparse
import json
import logging
import sys
from collections.abc import Sequence

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

    encode = sub.add_parser("encode", help="print the ids of text (stdin or --text) as JSON")
    encode.add_argument("--tokenizer", required=True, help="tokenizer.json")
    encode.add_argument("--text", help="text to encode (default: read stdin)")
    encode.add_argument(
        "--allow-special", action="store_true", help="turn special-token strings into their ids"
    )

    decode = sub.add_parser("decode", help="print the text of a JSON list of ids")
    decode.add_argument("--tokenizer", required=True, help="tokenizer.json")
    decode.add_argument("--ids", help="JSON list of ids (default: read stdin)")
    return parser


def _run(args: argparse.Namespace) -> None:
    if args.command == "train":
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
        tok = Tokenizer.load(args.tokenizer)
        text = args.text if args.text is not None else sys.stdin.read()
        print(json.dumps(tok.encode(text, allowed_special="all" if args.allow_special else ())))
    else:
        tok = Tokenizer.load(args.tokenizer)
        raw = args.ids if args.ids is not None else sys.stdin.read()
        try:
            ids = json.loads(raw)
        except json.JSONDecodeError as err:
            raise ValueError(f"--ids is not valid JSON ({err})") from None
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
