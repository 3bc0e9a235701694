"""tokenizer.json interop: HF `tokenizers` trains byte-level BPEs (GPT-2 ByteLevel style and GPT-4
Split+ByteLevel style); ATS loads them and encodes identically. Unsupported fields and broken
files are refused with the field named."""

import importlib.util
import json

import pytest
from ats_tokenizer import GPT2_PATTERN, GPT4_PATTERN, Tokenizer
from ats_tokenizer.hf_json import TokenizerFileError
from ats_tokenizer_inputs import oracle_text
from hypothesis import given, settings
from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>"]


def hf_train(texts: list[str], style: str) -> HFTokenizer:
    hf = HFTokenizer(models.BPE())
    if style == "gpt2":
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(GPT4_PATTERN), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1200,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator(texts, trainer)
    return hf


@pytest.fixture(scope="module", params=["gpt2", "gpt4"])
def hf_pair(request, train_texts, tmp_path_factory):
    hf = hf_train(train_texts, request.param)
    path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    hf.save(str(path))
    return request.param, hf, path, Tokenizer.load(path, backend="python")


def test_loads_hf_layout(hf_pair):
    style, hf, _, ours = hf_pair
    assert ours.pattern == (GPT2_PATTERN if style == "gpt2" else GPT4_PATTERN)
    assert ours.vocab_size == hf.get_vocab_size()
    assert ours.special_tokens == {s: hf.token_to_id(s) for s in SPECIALS}
    assert ours.byte_ids != tuple(range(256))  # HF puts specials first: a different id layout


@settings(max_examples=120, deadline=None)
@given(text=oracle_text)
def test_ats_encodes_hf_trained_file_identically(hf_pair, text):
    _, hf, _, ours = hf_pair
    ids = ours.encode(text, allowed_special="all")
    assert ids == hf.encode(text).ids
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=False) == text


def test_held_out_source_identical(hf_pair, held_out_texts):
    _, hf, _, ours = hf_pair
    for text in held_out_texts:
        assert ours.encode_ordinary(text) == hf.encode(text).ids


@pytest.mark.skipif(
    importlib.util.find_spec("ats_native") is None, reason="ats_native is not built"
)
def test_native_backend_on_hf_id_layout(hf_pair, held_out_texts):
    _, hf, path, _ = hf_pair
    native = Tokenizer.load(path, backend="native")
    assert native.backend == "native"
    assert native.encode_batch(held_out_texts) == [hf.encode(t).ids for t in held_out_texts]


def test_string_merges_form(hf_pair, tmp_path, held_out_texts):
    _, hf, path, ours = hf_pair
    data = json.loads(path.read_text(encoding="utf-8"))
    data["model"]["merges"] = [" ".join(m) for m in data["model"]["merges"]]
    legacy = tmp_path / "legacy.json"
    legacy.write_text(json.dumps(data), encoding="utf-8")
    assert Tokenizer.load(legacy).merges == ours.merges


def test_gpt2_hub_style_fields_are_accepted(hf_pair, tmp_path, held_out_texts):
    # GPT-2's published tokenizer.json: ByteLevel post-processor (offsets only), "" prefixes.
    def gpt2_style(d):
        d["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False}
        d["model"].update(continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
        d["added_tokens"][0]["normalized"] = True

    _, hf, path, ours = hf_pair
    edited = _edit(path, tmp_path, gpt2_style)
    loaded = Tokenizer.load(edited)
    hf_edited = HFTokenizer.from_file(edited)
    for text in held_out_texts:
        assert loaded.encode_ordinary(text) == hf_edited.encode(text).ids == hf.encode(text).ids


def test_hf_file_cannot_go_to_tiktoken(hf_pair):
    with pytest.raises(ValueError, match="ids are not in merge order"):
        hf_pair[3].to_tiktoken()


def _edit(path, tmp_path, edit) -> str:
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)
    out = tmp_path / "edited.json"
    out.write_text(json.dumps(data), encoding="utf-8")
    return str(out)


REFUSALS = [
    (lambda d: d.update(normalizer={"type": "NFC"}), "field 'normalizer'"),
    (lambda d: d["model"].update(type="WordPiece"), "field 'model.type': 'WordPiece'"),
    (lambda d: d["model"].update(dropout=0.1), "field 'model.dropout'"),
    (lambda d: d["model"].update(ignore_merges=True), "field 'model.ignore_merges'"),
    (lambda d: d["model"].update(byte_fallback=True), "field 'model.byte_fallback'"),
    (
        lambda d: d.update(pre_tokenizer={"type": "ByteLevel", "add_prefix_space": True}),
        "field 'pre_tokenizer.add_prefix_space': true is not supported",
    ),
    (lambda d: d.update(pre_tokenizer={"type": "Whitespace"}), "'Whitespace' is not supported"),
    (lambda d: d.update(decoder=None), "field 'decoder'"),
    (lambda d: d.update(post_processor={"type": "TemplateProcessing"}), "post_processor"),
    (lambda d: d["added_tokens"][0].update(lstrip=True), "added_tokens\\[0\\].lstrip"),
    (lambda d: d["added_tokens"][0].update(special=False), "non-special added tokens"),
    (lambda d: d["model"]["merges"].append(["x", "q"]), "token 'xq' is not in model.vocab"),
    (lambda d: d["model"]["vocab"].pop("Ġ"), "byte 0x20"),
    (lambda d: d["model"]["vocab"].update({"\u4e00": 99999}), "ByteLevel|neither a byte"),
    # wrong JSON types where an object or an id belongs (an AttributeError or TypeError before)
    (lambda d: d.update(added_tokens=[1]), "added_tokens\\[0\\]': expected a JSON object"),
    (lambda d: d.update(added_tokens={}), "added_tokens': expected a list, got dict"),
    (lambda d: d.update(post_processor=[1]), "post_processor': expected a JSON object, got list"),
    (
        lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [1, 2]}),
        "pretokenizers\\[0\\]': expected a JSON object, got int",
    ),
    (
        lambda d: d.update(
            pre_tokenizer={
                "type": "Sequence",
                "pretokenizers": [
                    {"type": "Split", "pattern": "x", "behavior": "Isolated"},
                    {"type": "ByteLevel", "use_regex": False},
                ],
            }
        ),
        "pretokenizers\\[0\\].pattern': expected \\{'Regex': str\\}",
    ),
    (lambda d: d["model"]["vocab"].update({"zz": "x"}), "entry 'zz' has id 'x', expected an int"),
    (lambda d: d["model"]["vocab"].update({"Ġ": -5}), "entry 'Ġ' has id -5, expected an int >= 0"),
    (lambda d: d["model"]["merges"].append(["x", None]), "token None is not in model.vocab"),
    (lambda d: d["added_tokens"][0].update(id=True), "an integer 'id' >= 0"),
    # a table BpeTable refuses: the error names the file too
    (
        lambda d: d["model"]["merges"].append(d["model"]["merges"][0]),
        r"edited.json: merge \d+: merged id \d+ is already in use",
    ),
]


@pytest.mark.parametrize("edit,message", REFUSALS, ids=[m for _, m in REFUSALS])
def test_unsupported_or_broken_fields_are_refused(hf_pair, tmp_path, edit, message):
    edited = _edit(hf_pair[2], tmp_path, edit)
    with pytest.raises(TokenizerFileError, match=message):
        Tokenizer.load(edited)


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Tokenizer.load(tmp_path / "nope.json")
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text('{"model": {', encoding="utf-8")
    with pytest.raises(TokenizerFileError, match="corrupt.json: not valid JSON"):
        Tokenizer.load(corrupt)
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TokenizerFileError, match="not UTF-8"):
        Tokenizer.load(binary)
    other = tmp_path / "other.json"
    other.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(TokenizerFileError, match="top level is a JSON list.*not a tokenizer.json"):
        Tokenizer.load(other)
    deep = tmp_path / "deep.json"
    deep.write_text('{"model": ' + "[" * 100_000 + "]" * 100_000 + "}", encoding="utf-8")
    with pytest.raises(TokenizerFileError, match="deep.json: not valid JSON for this reader"):
        Tokenizer.load(deep)
    with pytest.raises(IsADirectoryError, match="is a folder"):
        Tokenizer.load(tmp_path)
