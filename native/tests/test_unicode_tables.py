"""The committed src/unicode_tables.h is what tools/gen_unicode_tables.py makes from the installed
`regex` module (a `regex` upgrade that moves any code point fails here: regenerate the header)."""

import importlib.util
from pathlib import Path

NATIVE = Path(__file__).resolve().parent.parent


def test_committed_tables_match_the_regex_module() -> None:
    spec = importlib.util.spec_from_file_location("gen", NATIVE / "tools" / "gen_unicode_tables.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    text = gen.all_code_points()
    stage1, blocks = gen.two_level(gen.classify(text))
    fresh = gen.render(stage1, blocks, gen.case_variants(text)).splitlines()
    committed = (NATIVE / "src" / "unicode_tables.h").read_text().splitlines()
    # line 0 names the regex version that generated the file; the tables are what must agree
    assert fresh[1:] == committed[1:], (
        "src/unicode_tables.h is stale: run uv run --no-sync python native/tools/gen_unicode_tables.py"
    )
