"""save_pretrained / load_pretrained: bitwise round trips (single file and sharded) with equal
logits, and corrupted directories rejected with errors naming the file, tensor and expectation."""

import json
from pathlib import Path

import ats_model
import pytest
import torch
from ats_model.config import FORMAT_VERSION
from ats_model.serialization import load_pretrained, save_pretrained
from ats_model.serialization.model_dir import DTYPE_KEY
from safetensors.torch import load_file, save_file


def assert_same_model(a: torch.nn.Module, b: torch.nn.Module, ids: torch.Tensor) -> None:
    assert a.config == b.config
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for key, t in sa.items():
        assert t.dtype == sb[key].dtype and torch.equal(t, sb[key]), key
    with torch.no_grad():
        assert torch.equal(a.eval()(ids).logits, b.eval()(ids).logits)


@pytest.mark.parametrize("preset", ["tiny-dense", "tiny-moe", "tiny-mod", "tiny-hybrid"])
def test_round_trip_is_bitwise(tmp_path, make_model, random_ids, preset):
    config = ats_model.presets.get(preset)
    model = make_model(config)
    if config.moe is not None:
        with torch.no_grad():  # a trained bias-balancing state must survive too
            model.moe_layers()[0].expert_bias.copy_(torch.linspace(-1, 1, config.moe.n_experts))
    save_pretrained(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["format_version"] == FORMAT_VERSION
    assert_same_model(model, load_pretrained(tmp_path), random_ids(config.vocab_size))


def test_sharded_round_trip(tmp_path, make_model, moe_config, random_ids):
    model = make_model(moe_config())
    save_pretrained(model, tmp_path, max_shard_bytes=8_000)
    shards = sorted(p.name for p in tmp_path.glob("model-*-of-*.safetensors"))
    assert len(shards) > 3 and not (tmp_path / "model.safetensors").exists()
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == shards
    assert set(index["weight_map"]) == set(model.state_dict())
    assert_same_model(model, load_pretrained(tmp_path), random_ids(97))


def test_bf16_round_trip_and_dtype_override(tmp_path, make_model, dense_config, random_ids):
    model = make_model(dense_config(), dtype=torch.bfloat16)
    save_pretrained(model, tmp_path)
    assert_same_model(model, load_pretrained(tmp_path), random_ids(97))
    upcast = load_pretrained(tmp_path, dtype=torch.float32)
    assert upcast.tok_embeddings.weight.dtype == torch.float32
    assert torch.equal(upcast.tok_embeddings.weight, model.tok_embeddings.weight.float())


def test_tokenizer_json_is_copied(tmp_path, make_model, dense_config):
    tokenizer = tmp_path / "tok.json"
    tokenizer.write_text('{"model": {"type": "BPE"}}')
    save_pretrained(make_model(dense_config()), tmp_path / "m", tokenizer_json=tokenizer)
    assert (tmp_path / "m" / "tokenizer.json").read_text() == tokenizer.read_text()
    with pytest.raises(FileNotFoundError, match="tokenizer_json: no such file"):
        save_pretrained(make_model(dense_config()), tmp_path / "m", tokenizer_json=tmp_path / "x")


@pytest.fixture
def saved(tmp_path, make_model, moe_config) -> Path:
    save_pretrained(make_model(moe_config()), tmp_path)
    return tmp_path


def _rewrite_tensors(directory: Path, edit) -> None:
    path = directory / "model.safetensors"
    state = load_file(str(path))
    edit(state)
    save_file(state, str(path), metadata={"format": "pt", DTYPE_KEY: "float32"})


def _rewrite_config(directory: Path, edit) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))


def test_truncated_file(saved):
    path = saved / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(ValueError, match=r"model.safetensors: truncated: \S+ ends at byte"):
        load_pretrained(saved)


def test_wrong_shape_names_tensor_and_config(saved):
    _rewrite_config(saved, lambda c: c.update(ffn_dim=40))
    with pytest.raises(
        ValueError,
        match=r"model.safetensors: layers.0.ffn.experts.w1 has shape \(4, 24, 32\), "
        r"expected \(4, 40, 32\) from config.json",
    ):
        load_pretrained(saved)


def test_wrong_dtype(saved):
    _rewrite_tensors(saved, lambda s: s.update({"norm.weight": s["norm.weight"].half()}))
    with pytest.raises(
        ValueError, match="model.safetensors: norm.weight has dtype float16, expected float32"
    ):
        load_pretrained(saved)


def test_missing_tensor(saved):
    _rewrite_tensors(saved, lambda s: s.pop("layers.1.ffn.router.weight"))
    with pytest.raises(
        ValueError, match=r"model.safetensors: missing tensor layers.1.ffn.router.weight \(shape"
    ):
        load_pretrained(saved)


def test_unexpected_tensor(saved):
    _rewrite_tensors(saved, lambda s: s.update({"layers.9.attn.wq.weight": torch.zeros(2)}))
    with pytest.raises(ValueError, match="model.safetensors: unexpected tensor layers.9.attn.wq"):
        load_pretrained(saved)


def test_missing_dtype_metadata(saved):
    path = saved / "model.safetensors"
    save_file(load_file(str(path)), str(path))
    with pytest.raises(ValueError, match="model.safetensors: header metadata lacks 'ats_dtype'"):
        load_pretrained(saved)


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda c: c.pop("n_head"), "config.json: missing key 'n_head'"),
        (lambda c: c["moe"].pop("top_k"), "config.json: missing key 'moe.top_k'"),
        (lambda c: c.pop("format_version"), "config.json: missing key 'format_version'"),
        (lambda c: c.update(format_version=99), "format_version = 99 is not supported"),
        (lambda c: c.update(n_heads=4), "config.json: ModelConfig: unknown field 'n_heads'"),
        (lambda c: c.update(n_kv_head=3), "config.json: ModelConfig.n_kv_head = 3 is invalid"),
    ],
    ids=["missing", "missing-nested", "no-version", "bad-version", "unknown", "invalid"],
)
def test_bad_config(saved, edit, message):
    _rewrite_config(saved, edit)
    with pytest.raises(ValueError, match=message):
        load_pretrained(saved)


def test_config_not_json_and_absent(saved):
    (saved / "config.json").write_text("{")
    with pytest.raises(ValueError, match="config.json: invalid JSON"):
        load_pretrained(saved)
    (saved / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_pretrained(saved)


def test_no_pickle_in_serialization():
    """Model files are never unpickled: the serialization sources call no torch.load / pickle."""
    import ats_model.serialization as ser

    sources = "".join(p.read_text() for p in Path(ser.__file__).parent.glob("*.py"))
    for forbidden in ("torch.load", "import pickle", "torch.save"):
        assert forbidden not in sources


def _rewrite_header(directory: Path, edit) -> None:
    """Edit the raw safetensors header, data bytes untouched (as a corrupt writer would)."""
    path = directory / "model.safetensors"
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    edit(header)
    blob = json.dumps(header).encode()
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + raw[8 + n :])


def _overlap(header: dict) -> None:
    header["norm.weight"]["data_offsets"] = header["layers.0.ffn_norm.weight"]["data_offsets"]


@pytest.mark.parametrize(
    "edit,message",
    [
        (_overlap, "tensors layers.0.ffn_norm.weight and norm.weight overlap at byte"),
        (lambda h: h["norm.weight"].update(data_offsets=["0", "128"]), "malformed header entry"),
        (lambda h: h["norm.weight"].update(data_offsets=[0.0, 128.0]), "malformed header entry"),
        (lambda h: h["norm.weight"].update(shape=None), "norm.weight has a malformed header"),
        (lambda h: h["norm.weight"].update(shape=[True] * 32), "malformed header entry"),
    ],
    ids=["overlap", "string-offsets", "float-offsets", "null-shape", "bool-shape"],
)
def test_corrupt_headers_are_refused_before_loading(saved, edit, message):
    """Issue 22: overlapping offsets reached safetensors' reader (SafetensorError)."""
    _rewrite_header(saved, edit)
    with pytest.raises(ValueError, match=message):
        load_pretrained(saved)


def test_a_huge_n_layer_is_refused_before_a_model_is_built(saved):
    """Issue 22: n_layer = 100000 built a (meta) model for minutes before the shape check."""
    _rewrite_config(saved, lambda c: c.update(n_layer=100_000))
    with pytest.raises(
        ValueError,
        match=r"config.json: n_layer = 100000 does not match the tensors: model.safetensors "
        r"holds layers.0 to layers.1",
    ):
        load_pretrained(saved)


@pytest.mark.parametrize(
    "target,message",
    [("/dev/zero", "is a character device"), ("loop", "is a symlink loop")],
)
def test_what_a_tensor_file_is_is_said(saved, target, message):
    """Issue 22: a symlink loop or /dev/zero was "no model.safetensors"."""
    (saved / "model.safetensors").unlink()
    (saved / "model.safetensors").symlink_to(target if target != "loop" else "model.safetensors")
    with pytest.raises(ValueError, match=f"model.safetensors: {message}"):
        load_pretrained(saved)
    (saved / "config.json").unlink()
    (saved / "config.json").symlink_to("config.json")
    with pytest.raises(ValueError, match="config.json: is a symlink loop"):
        load_pretrained(saved)
    (saved / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"notes.txt: not a model directory \(it is a file\)"):
        load_pretrained(saved / "notes.txt")
