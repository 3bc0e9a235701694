"""Thread counts (include/ats/threads.h): every call that starts threads rejects a negative count or
one above ats_native.threads_max() with a clear ValueError, and when the system refuses a thread
part-way (EAGAIN from pthread_create, what a pids cgroup or RLIMIT_NPROC gives), the threads
already started are stopped and joined and the call raises, with no hang and no std::terminate.

The refusal is real but placed deterministically: an LD_PRELOAD shim wraps pthread_create and,
once the child arms it through an environment variable, lets a given number of threads start and
fails the next with EAGAIN. (RLIMIT_NPROC would do the same for a non-root user, but root, as in
CI containers, is exempt from it.)"""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import ats_native
import numpy as np
import pytest

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

typedef int (*create_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
static int started;

/* ATS_TEST_THREADS_ALLOWED=N (read at every call): N more threads start, then EAGAIN */
int pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*f)(void *), void *arg) {
    create_fn real = (create_fn)dlsym(RTLD_NEXT, "pthread_create");
    const char *allowed = getenv("ATS_TEST_THREADS_ALLOWED");
    if (allowed && __atomic_fetch_add(&started, 1, __ATOMIC_SEQ_CST) >= atoi(allowed)) {
        return EAGAIN;
    }
    return real(t, a, f, arg);
}
"""


@pytest.fixture(scope="module")
def refusing_pthread(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler (cc) for the pthread_create shim")
    directory = tmp_path_factory.mktemp("shim")
    (directory / "shim.c").write_text(SHIM)
    lib = directory / "libshim.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-o", str(lib), str(directory / "shim.c"), "-ldl"],
        check=True,
    )
    return lib


def run_refused(lib: Path, body: str) -> subprocess.CompletedProcess:
    """Runs body in a fresh Python with the shim preloaded; `arm(n)` lets n more threads start,
    `disarm()` lifts the refusal. A hang fails the test through the timeout."""
    script = textwrap.dedent(
        """
        import os
        import ats_native
        import numpy as np

        def arm(n):
            os.environ["ATS_TEST_THREADS_ALLOWED"] = str(n)

        def disarm():
            del os.environ["ATS_TEST_THREADS_ALLOWED"]
        """
    ) + textwrap.dedent(body)
    env = {**os.environ, "LD_PRELOAD": str(lib), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )


def test_model_pool_refused_part_way_raises_and_recovers(saved_model, refusing_pthread) -> None:
    _, directory = saved_model("tiny-dense")
    threads = min(8, ats_native.threads_max())
    result = run_refused(
        refusing_pthread,
        f"""
        arm(3)  # the pool's 4th worker (thread 4 of {threads - 1}) is refused
        try:
            ats_native.Model({str(directory)!r}, threads={threads})
        except ValueError as e:
            print("refused:", e)
        disarm()
        model = ats_native.Model({str(directory)!r}, threads=2)
        print("after:", model.logits([1, 2, 3]).shape)
        """,
    )
    assert result.returncode == 0, result.stderr
    assert f"refused: could not start thread 4 of {threads - 1}" in result.stdout
    assert "thread limit is reached; use fewer threads" in result.stdout
    assert "after: (3, " in result.stdout


@pytest.mark.parametrize(
    "call",
    [
        "ats_native.quantized_matmul(np.zeros((4, 64), np.int8), np.ones(4, np.float32), "
        "np.ones((1, 64), np.float32), 8, threads=4)",
        "ats_native.cpu_peak('fp32', 4, 0.05)",
        "ats_native.BpeEncoder(list(range(256)), [], 'gpt2').encode_batch(['a'] * 10, threads=4)",
        "ats_native.WordCounter('gpt2').add(['a b c'] * 10, threads=4)",
    ],
    ids=["quantized_matmul", "cpu_peak", "encode_batch", "word_counter"],
)
def test_other_thread_starts_refused_part_way_raise(refusing_pthread, call: str) -> None:
    if ats_native.threads_max() < 4:
        pytest.skip("threads_max() < 4")
    result = run_refused(
        refusing_pthread,
        f"""
        arm(1)
        try:
            {call}
        except ValueError as e:
            print("refused:", e)
        """,
    )
    assert result.returncode == 0, result.stderr
    assert "refused: could not start thread 2 of " in result.stdout, result.stdout


def test_thread_counts_out_of_range_are_clear_errors(saved_model) -> None:
    _, directory = saved_model("tiny-dense")
    limit = ats_native.threads_max()
    assert limit == 4 * os.cpu_count()
    for bad in (-1, limit + 1, 100_000, 2**40):
        with pytest.raises(ValueError, match=rf"threads = {bad}: expected 0 \(all .*\) to {limit}"):
            ats_native.Model(str(directory), threads=bad)
        with pytest.raises(ValueError, match=rf"threads = {bad}: expected 0 .* to {limit}"):
            ats_native.BpeEncoder(list(range(256)), [], "gpt2").encode_batch(["a"], threads=bad)
        with pytest.raises(ValueError, match=rf"threads = {bad}: expected 0 .* to {limit}"):
            ats_native.WordCounter("gpt2").add(["a"], threads=bad)
        with pytest.raises(ValueError, match=rf"threads = {bad}: expected"):
            ats_native.cpu_peak("fp32", bad, 0.01)
    assert ats_native.Model(str(directory), threads=limit).logits([1, 2]).shape[0] == 2
    x = np.ones((1, 64), np.float32)
    codes, scale = np.zeros((4, 64), np.int8), np.ones(4, np.float32)
    with pytest.raises(ValueError, match=rf"n_threads = {limit + 1}: expected 0 .* to {limit}"):
        ats_native.quantized_matmul(codes, scale, x, 8, threads=limit + 1)
