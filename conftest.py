"""Marker selection for every test folder: `gpu` and `install` tests run only when the -m expression
names them (`uv run pytest -m gpu`, `-m install`), so `uv run pytest` and the quick tier
`uv run pytest -m "not slow"` both leave them out without repeating it."""

import pytest

OPT_IN = ("gpu", "install")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    expression = config.option.markexpr
    left_out = [f"not {marker}" for marker in OPT_IN if marker not in expression]
    if left_out:
        config.option.markexpr = " and ".join(
            ([f"({expression})"] if expression else []) + left_out
        )
