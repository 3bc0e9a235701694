"""`ats-infer serve`: settings from the command line, the checks that must pass before binding
(model directory, API keys, loopback without a key), then uvicorn until SIGTERM / SIGINT: it stops
accepting, lets in-flight requests finish within --shutdown-timeout, cancels the rest, exits 0."""

import argparse
import logging
import signal
import sys
import time
from pathlib import Path

from ats_infer.engine import load_engine
from ats_infer.serve.auth import KeyChecker, check_bind, load_keys
from ats_infer.serve.limits import RateLimiter, parse_rate_limit
from ats_infer.serve.metrics import Metrics
from ats_infer.serve.scheduler import Scheduler
from ats_infer.serve.state import ServerState, Settings
from ats_infer.tensor_files import CONFIG_FILE

log = logging.getLogger("ats_infer")


def settings_from_args(args: argparse.Namespace) -> Settings:
    model_dir = Path(args.model_dir)
    if not (model_dir / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{model_dir}: not a model directory (no {CONFIG_FILE})")
    for name in ("slots", "max_queue", "prefill_chunk", "max_body_bytes"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} = {getattr(args, name)} must be >= 1")
    for name in ("request_timeout", "shutdown_timeout"):
        if not getattr(args, name) > 0:
            raise ValueError(f"--{name.replace('_', '-')} = {getattr(args, name)} must be > 0")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} is not a TCP port (0..65535)")
    return Settings(
        model_dir=str(model_dir),
        model_name=args.model_name or model_dir.resolve().name,
        engine=args.engine,
        device=args.device,
        threads=args.threads,
        kv_cache=args.kv_cache,
        slots=args.slots,
        max_queue=args.max_queue,
        prefill_chunk=args.prefill_chunk,
        request_timeout=args.request_timeout,
        max_body_bytes=args.max_body_bytes,
        shutdown_timeout=args.shutdown_timeout,
        adapter=args.adapter,
    )


def load_model(state: ServerState) -> None:
    """The engine, its batch and the scheduler thread; then the server is ready."""
    s = state.settings
    engine = load_engine(
        s.model_dir,
        s.engine,
        device=s.device,
        threads=s.threads,
        adapter=s.adapter,
        kv_cache=s.kv_cache,
    )
    state.engine = engine
    state.tokenizer = engine.tokenizer
    state.vocab_size = engine.vocab_size
    state.max_seq_len = engine.max_seq_len
    # a vocabulary padded past the tokenizer's ids: the engine never draws the padding rows
    state.vocab_limit = min(engine.tokenizer.vocab_size, engine.vocab_size)
    state.scheduler = Scheduler(engine.batch(s.slots), state.metrics, s.max_queue, s.prefill_chunk)
    state.scheduler.start()
    state.created = int(time.time())
    state.status = "ok"
    log.info("serving %s (%s engine, %d slots)", s.model_name, s.engine, s.slots)


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    from ats_infer.serve.app import build_app

    settings = settings_from_args(args)
    keys = load_keys(args.api_key_file)
    check_bind(args.host, keys, args.insecure_no_auth)
    limiter = RateLimiter(*parse_rate_limit(args.rate_limit)) if args.rate_limit else None
    state = ServerState(settings, KeyChecker(keys), limiter, Metrics(settings.model_name))
    failure: list[Exception] = []
    server: uvicorn.Server | None = None

    def on_load_error(err: Exception) -> None:
        failure.append(err)
        server.should_exit = True

    app = build_app(state, load_model, on_load_error)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        timeout_graceful_shutdown=settings.shutdown_timeout,
        log_level="info",
        # uvloop's event loop and httptools' parser (the serve extra): the loop's share of a
        # streamed token's CPU time, named so that a missing one fails at start, not silently
        loop="asyncio" if sys.platform == "win32" else "uvloop",
        http="httptools",
    )
    server = uvicorn.Server(config)
    # uvicorn shuts down gracefully on SIGTERM, then re-raises it under the handler it found: with
    # SIGTERM ignored there, the process exits 0 after a graceful shutdown instead of dying of it
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    server.run()
    if failure:
        raise RuntimeError(f"loading {settings.model_dir} failed: {failure[0]}")
