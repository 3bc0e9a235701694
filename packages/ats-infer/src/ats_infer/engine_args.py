"""The thread count and sampling settings every engine accepts, checked in one place: threads 0
(all cores) to THREADS_PER_CPU x the CPUs (ats_native's own bound, include/ats/threads.h: more only
exhausts the host's process limit), seeds any integer 0 to 2**64 - 1, and token counts and top_k
within the runtime's int32 (past it the binding's own conversion error was a traceback)."""

import math
import os

THREADS_PER_CPU = 4
SEED_MAX = 2**64 - 1
INT32_MAX = 2**31 - 1


def check_threads(threads: int) -> int:
    """threads as given when 0 <= threads <= THREADS_PER_CPU * os.cpu_count(), else ValueError."""
    limit = THREADS_PER_CPU * (os.cpu_count() or 1)
    if isinstance(threads, bool) or not isinstance(threads, int) or not 0 <= threads <= limit:
        raise ValueError(
            f"threads = {threads!r}: expected an integer 0 (all cores) to {limit} "
            f"({THREADS_PER_CPU} per CPU)"
        )
    return threads


def check_seed(seed: int | None) -> int | None:
    """seed as given when None or an integer 0 <= seed <= 2**64 - 1, else ValueError."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise ValueError(f"seed = {seed!r}: expected an integer 0 to 2**64 - 1")
    return seed


def _int_in(name: str, value: object, low: int, high: int, meaning: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} = {value!r}: expected an integer {low} to {high} ({meaning})")


def check_sampling(
    max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None
) -> None:
    """ValueError naming the first setting out of range; the model's context is checked by the
    engine, which knows the prompt's length."""
    _int_in("max_new_tokens", max_new_tokens, 0, INT32_MAX, "new tokens")
    if not (
        isinstance(temperature, int | float) and math.isfinite(temperature) and temperature >= 0
    ):
        raise ValueError(
            f"temperature = {temperature!r}: expected a finite number >= 0 (0 = greedy)"
        )
    if top_k is not None:
        _int_in("top_k", top_k, 0, INT32_MAX, "0 = off")
    if top_p is not None and not (isinstance(top_p, int | float) and 0 < top_p <= 1):
        raise ValueError(f"top_p = {top_p!r}: expected a number in (0, 1]")
