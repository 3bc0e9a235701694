"""engine.py: which engine a request gets, and the errors for what cannot run."""

import importlib.util
import logging
import os

import pytest
from ats_infer import engine as engine_module
from ats_infer.engine import ENGINES, load_engine, resolve_engine


def test_engines_are_the_documented_three() -> None:
    assert ENGINES == ("auto", "native", "torch")


def test_auto_prefers_native_and_logs_the_choice(caplog) -> None:
    expected = "native" if importlib.util.find_spec("ats_native") else "torch"
    with caplog.at_level(logging.INFO, logger="ats_infer"):
        assert resolve_engine("auto") == expected
    assert f"engine auto -> {expected}" in caplog.text
    assert resolve_engine("torch") == "torch"


def test_auto_without_native_falls_to_torch_and_without_both_raises(monkeypatch) -> None:
    def installed_without(missing: set[str]):
        return lambda *modules: not missing & set(modules)

    monkeypatch.setattr(engine_module, "_installed", installed_without({"ats_native"}))
    assert resolve_engine("auto") == "torch"
    with pytest.raises(RuntimeError, match=r"needs ats_native: pip install 'ats-infer\[native\]'"):
        resolve_engine("native")
    monkeypatch.setattr(engine_module, "_installed", installed_without({"ats_native", "torch"}))
    with pytest.raises(RuntimeError, match="no engine installed"):
        resolve_engine("auto")
    with pytest.raises(RuntimeError, match=r"needs torch and ats-model"):
        resolve_engine("torch")


def test_bad_requests_name_the_problem(dense_dir, tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown engine 'tensorrt'"):
        load_engine(dense_dir, "tensorrt")
    with pytest.raises(FileNotFoundError, match="not a model directory"):
        load_engine(tmp_path, "torch")
    limit = 4 * os.cpu_count()
    for engine in ("torch", "native") if importlib.util.find_spec("ats_native") else ("torch",):
        for threads in (-1, limit + 1, 100_000, 2.0):
            with pytest.raises(ValueError, match=rf"threads = {threads}: expected .* to {limit}"):
                load_engine(dense_dir, engine, threads=threads)


@pytest.mark.parametrize("engine", ["torch", "native"])
def test_seeds_are_0_to_2_pow_64_minus_1(trained_dense_dir, engine) -> None:
    if engine == "native":
        pytest.importorskip("ats_native")
    eng = load_engine(trained_dense_dir, engine, threads=1)
    kwargs = dict(max_new_tokens=4, temperature=1.0, top_k=None, top_p=None, stop=[])
    for seed in (-1, 2**64, True, "7"):
        with pytest.raises(ValueError, match=r"seed = .*: expected an integer 0 to 2\*\*64 - 1"):
            list(eng.generate("x", seed=seed, **kwargs))
    top = "".join(eng.generate("x", seed=2**64 - 1, **kwargs))
    assert top == "".join(eng.generate("x", seed=2**64 - 1, **kwargs))  # seeded: repeatable


@pytest.mark.parametrize("engine", ["torch", "native"])
def test_sampling_settings_out_of_range_are_named(trained_dense_dir, engine) -> None:
    """max_new_tokens = 2**40 reached the binding's int32 conversion as a TypeError traceback."""
    if engine == "native":
        pytest.importorskip("ats_native")
    eng = load_engine(trained_dense_dir, engine, threads=1)
    good = dict(max_new_tokens=2, temperature=1.0, top_k=None, top_p=None, seed=1, stop=[])
    bad = [
        ("max_new_tokens", 2**40, r"max_new_tokens = 1099511627776: expected an integer 0 to"),
        ("max_new_tokens", -1, r"max_new_tokens = -1: expected an integer 0 to"),
        ("top_k", 2**31, r"top_k = 2147483648: expected an integer 0 to 2147483647"),
        ("temperature", float("nan"), r"temperature = nan: expected a finite number >= 0"),
        ("top_p", 0.0, r"top_p = 0.0: expected a number in \(0, 1\]"),
    ]
    for name, value, message in bad:
        with pytest.raises(ValueError, match=message):
            list(eng.generate("x", **{**good, name: value}))
    assert "".join(eng.generate("x", **good)) == "".join(eng.generate("x", **good))


def test_torch_engine_streams_text(trained_dense_dir) -> None:
    eng = load_engine(trained_dense_dir, "torch", threads=1)
    pieces = list(
        eng.generate(
            "for i in range(",
            max_new_tokens=12,
            temperature=0.0,
            top_k=None,
            top_p=None,
            seed=None,
            stop=[],
        )
    )
    assert len(pieces) >= 2 and all(isinstance(p, str) for p in pieces)
