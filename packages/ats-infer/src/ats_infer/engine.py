"""Engine selection: one explicit choice per process, logged once, never a silent fallback.

An engine turns a model directory (config.json + safetensors + tokenizer.json) into text.
    native  the C++ runtime (`ats_native`, the `native` extra): float, int8 and int4 directories
    torch   ats-model's forward (the `torch` extra): float and optimum-quanto directories
    auto    torch for an optimum-quanto directory (quanto.json); otherwise native when ats_native
            is installed, else torch when torch and ats-model are, else an error saying what to
            install
ats-infer itself imports neither torch nor ats_native at module level.

An adapter (`--adapter DIR`, ats-model adapter directory: LoRA or router weights) is applied on
the torch engine at load, without merging; the native engine refuses one (it reads the model
directory in C++): merge it first with `ats-train merge-adapter`.
"""

import importlib.util
import logging
from pathlib import Path
from typing import Protocol

from ats_infer.model_dir import open_model_dir
from ats_infer.quant_spec import QUANT_FILE, QUANTO_FILE
from ats_infer.tensor_files import path_kind, require_model_dir

log = logging.getLogger("ats_infer")

ENGINES = ("auto", "native", "torch")
# the native engine's KV cache element types (ats_native.Model's kv_cache): f16 halves the cache's
# memory and decode attention's reads
KV_CACHES = ("f32", "f16")


class Engine(Protocol):
    def generate(
        self,
        prompt: str,
        *,
        max_new_tokens: int,
        temperature: float,
        top_k: int | None,
        top_p: float | None,
        seed: int | None,
        stop: list[str],
    ): ...

    def generate_tokens(
        self,
        ids: list[int],
        max_new_tokens: int,
        stop_tokens: tuple[int, ...],
        *,
        temperature: float,
        top_k: int | None,
        top_p: float | None,
        seed: int | None,
    ): ...


def _installed(*modules: str) -> bool:
    return all(importlib.util.find_spec(name) is not None for name in modules)


def resolve_engine(engine: str) -> str:
    """The concrete engine ("native" or "torch") a request names; "auto" is resolved and logged."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")
    if engine == "native" and not _installed("ats_native"):
        raise RuntimeError("engine 'native' needs ats_native: pip install 'ats-infer[native]'")
    if engine == "torch" and not _installed("torch", "ats_model"):
        raise RuntimeError(
            "engine 'torch' needs torch and ats-model: pip install 'ats-infer[torch]'"
        )
    if engine != "auto":
        return engine
    if _installed("ats_native"):
        chosen = "native"
    elif _installed("torch", "ats_model"):
        chosen = "torch"
    else:
        raise RuntimeError(
            "no engine installed: pip install 'ats-infer[native]' (C++ runtime) or "
            "'ats-infer[torch]' (PyTorch)"
        )
    log.info("engine auto -> %s", chosen)
    return chosen


def engine_for(model_dir: str | Path, engine: str) -> str:
    """The concrete engine for `model_dir`: resolve_engine, except that "auto" picks torch for
    an optimum-quanto directory, and native refuses one."""
    quanto = path_kind(Path(model_dir) / QUANTO_FILE) != "missing"
    if quanto and engine == "auto":
        chosen = resolve_engine("torch")
        log.info("engine auto -> torch (%s: an optimum-quanto directory)", model_dir)
        return chosen
    if quanto and engine == "native":
        raise ValueError(
            f"{model_dir}: is an optimum-quanto directory ({QUANTO_FILE}); it runs on the torch "
            "engine only: use --engine torch (or ats-infer quantize --method rtn|gptq for native)"
        )
    return resolve_engine(engine)


def load_engine(
    model_dir: str | Path,
    engine: str = "auto",
    device: str = "cpu",
    threads: int = 0,
    adapter: str | Path | None = None,
    kv_cache: str = "f32",
) -> Engine:
    """An engine over `model_dir`; `threads` = compute threads (0 = all cores / torch default);
    `adapter` an adapter directory applied on the torch engine (module docstring); `kv_cache`
    "f32" or "f16", the native engine's KV cache type (ats_native.Model)."""
    if kv_cache not in KV_CACHES:
        raise ValueError(f"kv_cache {kv_cache!r}: expected one of {', '.join(KV_CACHES)}")
    model_dir = Path(model_dir)
    require_model_dir(model_dir)
    if adapter is not None:
        chosen = engine_for_adapter(model_dir, engine)
    else:
        chosen = engine_for(model_dir, engine)
    if chosen == "native":
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device {device!r}: the native engine runs on 'cpu' or 'cuda'")
        from ats_infer.native_engine import NativeEngine

        return NativeEngine(model_dir, threads=threads, device=device, kv_cache=kv_cache)
    if kv_cache != "f32":
        raise ValueError(
            f"--kv-cache {kv_cache} is the native engine's: the torch engine keeps its KV cache in "
            "the model's dtype"
        )
    # The native loader checks the directory itself; the torch engine's is checked here, as
    # quantize and export-gguf check theirs, before ats-model builds anything from config.json.
    if path_kind(model_dir / QUANTO_FILE) == "missing" and open_model_dir(model_dir).quantization:
        raise ValueError(
            f"{model_dir}: is an int8/int4 directory ({QUANT_FILE}); the torch engine runs float "
            "directories only: use --engine native"
        )
    from ats_infer.torch_engine import TorchEngine

    return TorchEngine(model_dir, device=device, threads=threads, adapter=adapter)


def engine_for_adapter(model_dir: Path, engine: str) -> str:
    """The torch engine, which applies an adapter without merging; native and quantized
    directories are refused with what to do instead."""
    if engine == "native":
        raise ValueError(
            "--adapter runs on the torch engine only (the native engine reads a model directory "
            "as saved): use --engine torch, or merge the adapter first with "
            "`ats-train merge-adapter --model DIR --adapter DIR --out DIR`"
        )
    if path_kind(model_dir / QUANTO_FILE) != "missing" or open_model_dir(model_dir).quantization:
        raise ValueError(
            f"{model_dir}: is a quantized directory; an adapter applies to float weights: merge "
            "it into the float model (ats-train merge-adapter), then quantize the result"
        )
    chosen = resolve_engine("torch")
    if engine == "auto":
        log.info("engine auto -> torch (--adapter)")
    return chosen
