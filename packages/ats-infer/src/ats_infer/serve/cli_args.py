"""The `serve` subcommand's arguments (no server dependency imported: `ats-infer --help` works
without the serve extra)."""

from ats_infer.engine import ENGINES, KV_CACHES


def add_serve_parser(commands) -> None:
    p = commands.add_parser("serve", help="serve a model directory over an OpenAI-compatible API")
    p.add_argument(
        "model_dir", help="directory with config.json, model.safetensors, tokenizer.json"
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--engine", choices=[e for e in ENGINES if e != "auto"], default="native")
    p.add_argument(
        "--device",
        default="cpu",
        help="cpu, cuda (native engine: a build with ATS_CUDA=ON), or a torch device",
    )
    p.add_argument("--adapter", default=None, help="adapter directory (torch engine)")
    p.add_argument("--threads", type=int, default=0, help="compute threads (0 = all cores)")
    p.add_argument("--slots", type=int, default=8, help="requests decoded together")
    add_kv_cache_argument(p)
    p.add_argument(
        "--model-name", default=None, help="the name clients ask for (default: dir name)"
    )
    p.add_argument("--api-key-file", default=None, help="file of API keys, one per line")
    p.add_argument(
        "--insecure-no-auth", action="store_true", help="allow a public bind without key"
    )
    p.add_argument("--max-queue", type=int, default=256, help="waiting requests before 503")
    p.add_argument("--rate-limit", default=None, metavar="RPM,TPM", help="per-key limits")
    p.add_argument("--prefill-chunk", type=int, default=256, help="prompt tokens per step")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20)
    p.add_argument("--shutdown-timeout", type=float, default=30.0, help="seconds")


def add_kv_cache_argument(parser) -> None:
    """--kv-cache, shared by serve, generate and chat."""
    parser.add_argument(
        "--kv-cache",
        choices=KV_CACHES,
        default="f32",
        help="native engine's KV cache type: f16 halves its memory and decode attention's reads",
    )
