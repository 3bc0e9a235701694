"""Input checks give one line naming the input and the position: JSON syntax errors with the line
and column json itself reports, nesting too deep for Python's parser (a RecursionError before),
non-UTF-8 bytes, and paths that are not regular files (a device would be read forever)."""

import json
import os

import pytest
from ats_tokenizer.inputs import check_input_file, decode_utf8, parse_json, read_json_file


class Oops(ValueError):
    pass


@pytest.mark.parametrize(
    "text",
    ['{"a": 1,\n  "b": }', "[1, 2", '{"text": "ab', '\n\n  {"a" 1}', "", "[1] x"],
)
def test_syntax_errors_name_the_line_and_column_json_finds(text):
    with pytest.raises(json.JSONDecodeError) as reference:
        json.loads(text)
    ref = reference.value
    with pytest.raises(Oops) as err:
        parse_json(text, "f.json", Oops)
    message = str(err.value)
    assert message.startswith(f"f.json: not valid JSON at line {ref.lineno} column {ref.colno}: ")
    assert "\n" not in message and not message.endswith(" at")


def test_line_offset_places_a_jsonl_record_in_its_file():
    with pytest.raises(Oops, match=r"^d.jsonl: not valid JSON at line 7 column 10: Unterminated"):
        parse_json('{"text": "ab', "d.jsonl", Oops, line=7)


@pytest.mark.parametrize("open_close", ["[]", "{}"])
def test_deep_nesting_is_one_line_not_a_recursion_error(open_close):
    depth = 100_000
    if open_close == "[]":
        text = "[" * depth + "]" * depth
    else:
        text = '{"a":' * depth + "1" + "}" * depth
    with pytest.raises(Oops, match=r"^x: not valid JSON for this reader: .* nested more than"):
        parse_json(text, "x", Oops)
    assert parse_json("[" * 50 + "]" * 50, "x") == json.loads("[" * 50 + "]" * 50)


def test_utf8_errors_name_the_byte_and_offset():
    assert decode_utf8("héllo".encode(), "t") == "héllo"
    with pytest.raises(Oops, match=r"^t: not UTF-8 text \(byte 0xff at offset 3\)$"):
        decode_utf8(b"abc\xffdef", "t", Oops)


def test_input_file_kinds(tmp_path):
    good = tmp_path / "good.json"
    good.write_text('{"k": [1, 2]}', encoding="utf-8")
    assert read_json_file(good, "thing") == {"k": [1, 2]}
    with pytest.raises(FileNotFoundError, match="thing '.*missing.json' does not exist$"):
        check_input_file(tmp_path / "missing.json", "thing")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="does not exist \\(a symlink to nothing\\)"):
        check_input_file(tmp_path / "dangling", "thing")
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    with pytest.raises(OSError, match="cannot be opened: Too many levels of symbolic links"):
        check_input_file(tmp_path / "loop1", "thing")
    with pytest.raises(IsADirectoryError, match="is a folder, expected a file"):
        check_input_file(tmp_path, "thing")
    if os.path.exists("/dev/zero"):
        with pytest.raises(OSError, match="'/dev/zero' is not a regular file"):
            read_json_file("/dev/zero", "thing")
    binary = tmp_path / "binary.json"
    binary.write_bytes(b'{"a": "\xc3"}')
    with pytest.raises(Oops, match=r"binary.json: not UTF-8 text \(byte 0xc3 at offset 7\)"):
        read_json_file(binary, "thing", Oops)
