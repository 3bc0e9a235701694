"""eval-ppl: the held-out split is ats-data's own (prepare's val shards are the oracle), every
token after the first is scored once, and perplexity / bits per byte match a hand computation and
the torch reference through both engines."""

import json
import math
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from ats_data import ShardDataset, prepare
from ats_infer.corpus import split_documents, token_windows
from ats_infer.perplexity import eval_ppl, evaluate
from ats_tokenizer import Tokenizer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of 40 small text documents (each file one document), ~5% of them held out."""
    folder = tmp_path_factory.mktemp("corpus")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(stdlib.glob("*.py"))[100:104])
    for i in range(40):
        (folder / f"doc{i:02d}.txt").write_text(f"# document {i}\n" + text[i * 900 : i * 900 + 800])
    return folder


def test_val_split_is_ats_datas(corpus, tokenizer_json, tmp_path) -> None:
    prepared = prepare(corpus, tokenizer_json, tmp_path / "prepared", val_fraction=0.2)
    shards = ShardDataset(prepared)
    tokenizer = Tokenizer.load(tokenizer_json)
    for split in ("train", "val"):
        windows = token_windows(tokenizer, split_documents(corpus, split, 0.2), 1, 0)
        expected = np.concatenate([np.asarray(s) for s in shards.shards(split)])
        # the stream is <|endoftext|> + prepare's split, and with windows of 1 every token is kept
        np.testing.assert_array_equal(windows.ids[:, 1], expected)
        np.testing.assert_array_equal(windows.ids[0, 0], tokenizer.eos_id)
    val = list(split_documents(corpus, "val", 0.2))
    train = list(split_documents(corpus, "train", 0.2))
    assert 0 < len(val) < 40 and len(val) + len(train) == 40 and not set(val) & set(train)


def test_windows_score_each_token_once(corpus, tokenizer_json) -> None:
    tokenizer = Tokenizer.load(tokenizer_json)
    docs = list(split_documents(corpus, "train", 0.2))
    windows = token_windows(tokenizer, iter(docs), 16, 200)
    assert windows.ids.shape == (12, 17) and windows.n_tokens == 192  # 200 // 16 whole windows
    np.testing.assert_array_equal(windows.ids[1:, 0], windows.ids[:-1, -1])  # one token shared
    stream = [tokenizer.eos_id]
    for d in docs:
        stream += [*tokenizer.encode_ordinary(d), tokenizer.eos_id]
    np.testing.assert_array_equal(windows.ids[:, :-1].reshape(-1), stream[:192])
    scored = [t for t in stream[1:193] if t != tokenizer.eos_id]
    assert windows.n_bytes == len(tokenizer.decode_bytes(scored))
    whole = token_windows(tokenizer, iter(docs), 16, 0)
    text_bytes = sum(len(d.encode()) for d in docs)
    assert whole.n_tokens == (len(stream) - 1) // 16 * 16
    assert text_bytes - 16 * 8 <= whole.n_bytes <= text_bytes  # all but a partial last window
    with pytest.raises(ValueError, match="fewer than one window of 4096"):
        token_windows(tokenizer, iter(docs[:1]), 4096, 0)


class Uniform:
    """Equal logits over V ids: perplexity V, bits per byte tokens * log2(V) / bytes."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def logits(self, ids: np.ndarray) -> np.ndarray:
        return np.zeros((*ids.shape, self.vocab), np.float32)


def test_uniform_model_by_hand(corpus, tokenizer_json) -> None:
    tokenizer = Tokenizer.load(tokenizer_json)
    windows = token_windows(tokenizer, split_documents(corpus, "train", 0.2), 32, 500)
    result = evaluate(Uniform(512), windows, batch_size=5)
    assert result["tokens"] == 480 and math.isclose(result["ppl"], 512, rel_tol=1e-12)
    expected_bpb = 480 * 9 / windows.n_bytes
    assert math.isclose(result["bits_per_byte"], expected_bpb, rel_tol=1e-12)


def test_engines_match_the_torch_reference(trained_dense_dir, corpus, oracle) -> None:
    tokenizer = Tokenizer.load(trained_dense_dir / "tokenizer.json")
    windows = token_windows(tokenizer, split_documents(corpus, "val", 0.2), 64, 0)
    from ats_infer.tensor_files import load_tensors

    logits = oracle.torch_logits(
        trained_dense_dir, load_tensors(trained_dense_dir), windows.ids[:, :-1]
    )
    expected = oracle.perplexity(logits, windows.ids)
    for engine in ("torch", "native"):
        result = eval_ppl(
            trained_dense_dir,
            str(corpus),
            engine=engine,
            seq_len=64,
            max_tokens=0,
            val_fraction=0.2,
        )
        assert result["engine"] == engine and result["tokens"] == windows.n_tokens
        assert math.isclose(result["ppl"], expected, rel_tol=1e-4), (engine, result, expected)
        assert result["ppl"] < 200  # the fixture learned: far below 512 for a uniform guess


def test_cli_json_and_errors(trained_dense_dir, corpus, tmp_path, ats_infer) -> None:
    def run(*args):
        return ats_infer("eval-ppl", *args)  # cli.main in this process

    ok = run(
        trained_dense_dir, "--data", corpus, "--val-fraction", "0.2", "--seq-len", "64", "--json"
    )
    assert ok.returncode == 0, ok.stderr
    result = json.loads(ok.stdout)
    assert {"ppl", "bits_per_byte", "tokens"} <= result.keys() and result["tokens"] > 0
    for args, message in [
        (["--data", tmp_path / "missing.txt"], "missing.txt"),
        (["--data", corpus, "--seq-len", "100000"], "seq_len = 100000"),
        (["--data", corpus, "--val-fraction", "0"], "val_fraction = 0 holds nothing out"),
    ]:
        bad = run(trained_dense_dir, *args)
        assert bad.returncode == 1 and "Traceback" not in bad.stderr, bad.stderr
        assert bad.stderr.strip().splitlines()[-1].startswith("ats-infer: error:")
        assert message in bad.stderr, bad.stderr


def test_without_ats_data_eval_ppl_names_the_extra_and_generate_runs(dense_dir) -> None:
    # ats_data made unimportable in a fresh interpreter, as in an install without [eval]
    block = (
        "import sys\n"
        "class NoData:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'ats_data':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, NoData())\n"
        "from ats_infer.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )

    def run(*args):
        command = [sys.executable, "-c", block, *map(str, args)]
        return subprocess.run(command, capture_output=True, text=True, timeout=300)

    bad = run("eval-ppl", dense_dir, "--data", "stdlib", "--engine", "native")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr, bad.stderr
    assert "pip install 'ats-infer[eval]'" in bad.stderr.strip().splitlines()[-1], bad.stderr
    ok = run(
        "generate", dense_dir, "--prompt", "def", "--max-new-tokens", "2", "--engine", "native"
    )
    assert ok.returncode == 0, ok.stderr
