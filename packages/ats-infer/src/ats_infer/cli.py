"""ats-infer command line:

    ats-infer generate MODEL_DIR --prompt TEXT [--engine auto|native|torch] [--adapter DIR] ...
    ats-infer chat MODEL_DIR [--engine auto|native|torch] [--adapter DIR] [--system TEXT] ...
    ats-infer canary verify MODEL_DIR --pairs FILE [--engine ...] [--json]
    ats-infer quantize MODEL_DIR --bits 8|4 [--group-size 32|64|128] --out DIR [--force]
                       [--method rtn|gptq|quanto] [--calib FILE|stdlib] [--calib-samples N]
                       [--calib-max-samples N] [--act-order]
    ats-infer export-gguf MODEL_DIR --out FILE [--outtype f32|f16|q8_0|q4_0] [--force]
    ats-infer serve MODEL_DIR [--host H] [--port P] [--slots N] [--api-key-file F] ... (serve extra)
    ats-infer eval-ppl MODEL_DIR --data FILE|stdlib [--engine ...] [--seq-len N] [--json]

Bad input ends with one line on stderr and exit status 1 (argparse usage errors: 2). An existing
non-empty --out is replaced only with --force, and never when it is (or holds) an input.
"""

import argparse
import json
import logging
import sys

from ats_infer.engine import ENGINES, Engine, load_engine
from ats_infer.gguf_export import OUTTYPES, export_gguf
from ats_infer.perplexity import DEFAULT_MAX_TOKENS, DEFAULT_VAL_FRACTION, eval_ppl
from ats_infer.quant_spec import GROUP_SIZES, QUANT_METHODS
from ats_infer.quantize import quantize_model_dir
from ats_infer.serve.cli_args import add_kv_cache_argument, add_serve_parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ats-infer", description="Run ATS model directories.")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate text from a model directory")
    gen.add_argument(
        "model_dir", help="directory with config.json, model.safetensors, tokenizer.json"
    )
    gen.add_argument("--prompt", required=True, help="text to continue")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.8, help="0 means greedy")
    gen.add_argument("--top-k", type=int, default=None)
    gen.add_argument("--top-p", type=float, default=None)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--engine", choices=ENGINES, default="auto")
    gen.add_argument("--threads", type=int, default=0, help="compute threads (0 = all cores)")
    gen.add_argument(
        "--device",
        default="cpu",
        help="cpu, cuda (native engine: a build with ATS_CUDA=ON), or a torch device",
    )
    gen.add_argument("--adapter", default=None, help="adapter directory (torch engine)")
    add_kv_cache_argument(gen)

    chat = commands.add_parser("chat", help="chat with a model in the terminal (ChatML)")
    chat.add_argument("model_dir", help="model directory whose tokenizer has the ChatML tokens")
    chat.add_argument("--engine", choices=ENGINES, default="auto")
    chat.add_argument("--adapter", default=None, help="adapter directory (torch engine)")
    chat.add_argument("--system", default=None, help="system prompt")
    chat.add_argument("--max-new-tokens", type=int, default=256, help="per reply")
    chat.add_argument("--temperature", type=float, default=0.7, help="0 means greedy")
    chat.add_argument("--top-k", type=int, default=None)
    chat.add_argument("--top-p", type=float, default=None)
    chat.add_argument("--seed", type=int, default=None)
    chat.add_argument("--threads", type=int, default=0, help="compute threads (0 = all cores)")
    chat.add_argument(
        "--device",
        default="cpu",
        help="cpu, cuda (native engine: a build with ATS_CUDA=ON), or a torch device",
    )
    add_kv_cache_argument(chat)

    canary = commands.add_parser("canary", help="check a model for documented canary pairs")
    canary.add_argument("action", choices=("verify",))
    canary.add_argument("model_dir", help="model directory (float or quantized)")
    canary.add_argument("--pairs", required=True, help='JSONL of {"trigger", "response"}')
    canary.add_argument("--engine", choices=ENGINES, default="auto")
    canary.add_argument("--threads", type=int, default=0, help="compute threads (0 = all cores)")
    canary.add_argument("--json", action="store_true", help="print one JSON object")

    quant = commands.add_parser("quantize", help="write an int8 or int4 copy of a model directory")
    quant.add_argument("model_dir", help="float model directory")
    quant.add_argument("--bits", type=int, choices=(8, 4), required=True)
    quant.add_argument(
        "--group-size", type=int, default=None, help=f"int4 group size, one of {GROUP_SIZES}"
    )
    quant.add_argument("--out", required=True, help="new directory for the quantized model")
    quant.add_argument("--force", action="store_true", help="replace an existing --out directory")
    quant.add_argument(
        "--method",
        choices=QUANT_METHODS,
        default="rtn",
        help="rtn: round to nearest (no data); gptq: GPTQ on --calib text (both native "
        "layout); quanto: optimum-quanto qint8/qint4 (torch engine)",
    )
    quant.add_argument("--calib", help="gptq: calibration text (file, folder, glob or stdlib)")
    quant.add_argument("--calib-samples", type=int, default=128, help="gptq: windows of 256")
    quant.add_argument(
        "--calib-max-samples",
        type=int,
        help="gptq, MoE: windows an MoE block may read until each expert has been routed "
        "--calib-samples windows' tokens (default: --calib-samples * experts / top-k)",
    )
    quant.add_argument("--act-order", action="store_true", help="gptq: columns by Hessian")

    export = commands.add_parser("export-gguf", help="write a GGUF file llama.cpp can run")
    export.add_argument("model_dir", help="float model directory (dense or Mixtral-style MoE)")
    export.add_argument("--out", required=True, help="GGUF file to write")
    export.add_argument("--outtype", choices=tuple(OUTTYPES), default="f32")
    export.add_argument("--force", action="store_true", help="replace an existing --out file")
    add_serve_parser(commands)

    ppl = commands.add_parser("eval-ppl", help="perplexity and bits per byte on held-out text")
    ppl.add_argument("model_dir", help="model directory, float or quantized")
    ppl.add_argument("--data", required=True, help="text source: a file, folder, glob or stdlib")
    ppl.add_argument(
        "--val-fraction",
        type=float,
        default=DEFAULT_VAL_FRACTION,
        help="ats-data's split: the held-out documents (ats-train's data.val_fraction)",
    )
    ppl.add_argument("--seq-len", type=int, default=None, help="window (min(max_seq_len, 1024))")
    ppl.add_argument(
        "--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="tokens scored (0 = all)"
    )
    ppl.add_argument("--batch-size", type=int, default=8, help="windows per forward")
    ppl.add_argument("--engine", choices=ENGINES, default="auto")
    ppl.add_argument("--threads", type=int, default=0, help="compute threads (0 = all cores)")
    ppl.add_argument(
        "--device",
        default="cpu",
        help="cpu, cuda (native engine: a build with ATS_CUDA=ON), or a torch device",
    )
    ppl.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def engine_from_args(args: argparse.Namespace) -> Engine:
    """The engine generate and chat run: their shared --engine/--device/--threads/--adapter/
    --kv-cache options."""
    return load_engine(
        args.model_dir,
        args.engine,
        device=args.device,
        threads=args.threads,
        adapter=args.adapter,
        kv_cache=args.kv_cache,
    )


def _generate(args: argparse.Namespace) -> None:
    engine = engine_from_args(args)
    for piece in engine.generate(
        args.prompt,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop=args.stop,
    ):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")


def _chat(args: argparse.Namespace) -> None:
    from ats_infer.terminal_chat import ChatSession, require_chat_tokens, run_chat

    engine = engine_from_args(args)
    require_chat_tokens(engine, args.model_dir)
    sampling = {
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "seed": args.seed,
    }
    run_chat(ChatSession(engine, args.system, sampling), sys.stdin, sys.stdout)


def _canary(args: argparse.Namespace) -> None:
    from ats_infer.canary_verify import verify_canary

    result = verify_canary(args.model_dir, args.pairs, args.engine, args.threads)
    if args.json:
        print(json.dumps(result))
        return
    print(f"canary match rate {result['match_rate']:.0%} ({result['matched']}/{result['pairs']})")


def _quantize(args: argparse.Namespace) -> None:
    group_size = args.group_size
    if args.bits == 4 and group_size is None and args.method != "quanto":
        raise ValueError("--bits 4 needs --group-size (32, 64 or 128)")
    gptq_only = args.calib is not None or args.calib_max_samples is not None or args.act_order
    if args.method != "gptq" and gptq_only:
        raise ValueError(
            f"--calib, --calib-max-samples and --act-order are for --method gptq, not {args.method}"
        )
    if args.method == "rtn":
        out = quantize_model_dir(args.model_dir, args.out, args.bits, group_size, force=args.force)
    elif args.method == "quanto":
        if args.group_size is not None:
            raise ValueError("--method quanto chooses its own int4 groups: leave out --group-size")
        from ats_infer.quanto_dir import quanto_model_dir  # torch, optimum-quanto

        out = quanto_model_dir(args.model_dir, args.out, args.bits, force=args.force)
    else:
        if args.calib is None:
            raise ValueError("--method gptq needs --calib FILE|stdlib (calibration text)")
        from ats_infer.gptq_model import gptq_model_dir  # torch

        out = gptq_model_dir(
            args.model_dir,
            args.out,
            args.bits,
            group_size,
            args.calib,
            n_samples=args.calib_samples,
            max_samples=args.calib_max_samples,
            act_order=args.act_order,
            force=args.force,
        )
    print(f"wrote int{args.bits} {args.method} model directory {out}")


def _export_gguf(args: argparse.Namespace) -> None:
    out = export_gguf(args.model_dir, args.out, args.outtype, force=args.force)
    print(f"wrote {args.outtype} GGUF {out}")


def _serve(args: argparse.Namespace) -> None:
    from ats_infer.serve.server import serve

    serve(args)


def _eval_ppl(args: argparse.Namespace) -> None:
    result = eval_ppl(
        args.model_dir,
        args.data,
        engine=args.engine,
        seq_len=args.seq_len,
        max_tokens=args.max_tokens,
        val_fraction=args.val_fraction,
        batch_size=args.batch_size,
        threads=args.threads,
        device=args.device,
    )
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"ppl {result['ppl']:.4f} | bits/byte {result['bits_per_byte']:.4f} | "
        f"{result['tokens']} tokens ({result['bytes']} bytes, {result['documents']} documents, "
        f"windows of {result['seq_len']}) | engine {result['engine']}"
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = logging.StreamHandler()  # our own choices (e.g. the engine) on stderr, no others'
    handler.setFormatter(logging.Formatter("ats-infer: %(message)s"))
    logger = logging.getLogger("ats_infer")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    command = {
        "generate": _generate,
        "chat": _chat,
        "canary": _canary,
        "quantize": _quantize,
        "export-gguf": _export_gguf,
        "serve": _serve,
        "eval-ppl": _eval_ppl,
    }
    try:
        command[args.command](args)
    except (OSError, ValueError, RuntimeError) as err:
        print(f"ats-infer: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
