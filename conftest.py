"""Marker selection for every test folder: `gpu` and `install` tests run only when the -m expression
names them (`uv run pytest -m gpu`, `-m install`), so `uv run pytest` and the quick tier
`uv run pytest -m "not slow"` both leave them out without repeating it.

Two pytest-xdist workers by default (the suite otherwise keeps ~1.2 of 2 cores busy): unless the
command line says `-n N` (`-n 0`: one process, for pdb) or `-p no:xdist`, or -m names gpu (the GPU
tests share one device, so they run one at a time). Set here, not in pyproject's addopts, so that
`-p no:xdist` keeps working. One test file is one unit of work, so its module-scoped fixtures are
built once, and the files of each SHARED_FIXTURE_GROUPS entry are one unit, so that session fixture
is built once per run, not once per worker. (xdist's own `--dist loadgroup` writes `xdist_group`
marks into the node id, which pytest 9 no longer lets it change, so FileScheduling takes its
place.) The `dist` files (torchrun launches, the longest units) are handed out first, so that the
other worker works through the rest meanwhile instead of waiting on one of them at the end."""

import pytest

OPT_IN = ("gpu", "install")

# session fixture -> the test files that use it: one launch of every rank check, read by three
# files. (single_reference, one single-process run, is cheaper to build on each worker than to
# tie its four files, DeepSpeed's among them, to one.)
DISTRIBUTED = "packages/ats-train/tests/distributed/"
SHARED_FIXTURE_GROUPS = {
    "rank_checks": tuple(
        DISTRIBUTED + name
        for name in ("test_expert_bias.py", "test_expert_parallel.py", "test_fsdp2_records.py")
    ),
}


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns -n into workers
def pytest_cmdline_main(config: pytest.Config) -> None:
    if not config.pluginmanager.hasplugin("xdist"):  # -p no:xdist
        return
    chosen = config.option.numprocesses is not None or "gpu" in config.option.markexpr
    worker = hasattr(config, "workerinput")  # a worker runs this hook too: no workers of its own
    if not chosen and not worker:
        config.option.numprocesses, config.option.dist = 2, "loadgroup"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    expression = config.option.markexpr
    left_out = [f"not {marker}" for marker in OPT_IN if marker not in expression]
    if left_out:
        config.option.markexpr = " and ".join(
            ([f"({expression})"] if expression else []) + left_out
        )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: every test using a grouped fixture is in its group's files, and the
    `dist` tests go first (a stable sort: the same order on every worker, as xdist requires)."""
    if not hasattr(config, "workerinput"):
        return
    for item in items:
        for fixture, files in SHARED_FIXTURE_GROUPS.items():
            if fixture in item.fixturenames and _file(item.nodeid) not in files:
                raise pytest.UsageError(
                    f"{_file(item.nodeid)} uses the session fixture {fixture!r}: add it to "
                    f"SHARED_FIXTURE_GROUPS[{fixture!r}] in conftest.py"
                )
    items.sort(key=lambda item: item.get_closest_marker("dist") is None)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown under -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN001, ANN201
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        """Units of work: a test file, or one SHARED_FIXTURE_GROUPS entry's files."""

        def _split_scope(self, nodeid: str) -> str:
            path = _file(nodeid)
            return next((g for g, files in SHARED_FIXTURE_GROUPS.items() if path in files), path)

    return FileScheduling(config, log)


def _file(nodeid: str) -> str:
    return nodeid.split("::")[0]
