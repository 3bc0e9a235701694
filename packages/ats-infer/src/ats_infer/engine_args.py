"""The thread count and sampling seed every engine accepts, checked in one place: threads 0 (all
cores) to THREADS_PER_CPU x the CPUs (ats_native's own bound, include/ats/threads.h: more only
exhausts the host's process limit), seeds any integer 0 to 2**64 - 1."""

import os

THREADS_PER_CPU = 4
SEED_MAX = 2**64 - 1


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
