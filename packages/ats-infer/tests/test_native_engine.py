"""The native runtime on quantized directories against the Python reference (ats-model's forward
over quantize.dequantize's weights), issue 7's quality bars on a trained model, and the native
engine's text against the torch engine's."""

import numpy as np
import pytest
from ats_infer.engine import load_engine
from ats_infer.quantize import dequantize_tensors, quantize_model_dir
from ats_infer.tensor_files import load_tensors

ats_native = pytest.importorskip("ats_native")

# Native int8/int4 matmuls round their activations to int8 per 32-block (llama.cpp's Q8_0) and dot
# them with the codes in integers (native/README.md); float32 math on the dequantized weights
# differs from that by the activation rounding: 2e-3 to 3.5e-2 of max|logit| on these random
# models. The exact integer scheme is tested against a numpy reference in native/tests/runtime
# (test_matmul.py, and test_quantized.py against an activation-rounding ats-model); here the bound
# is the rounding's scale: a wrong code layout or scale moves logits by O(1).
REL_TOL = 5e-2


def ids_for(vocab: int, shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, shape)


@pytest.mark.parametrize(
    ("preset", "changes", "bits", "group_size"),
    [
        ("tiny-dense", {}, 8, None),
        ("tiny-dense", {}, 4, 32),
        ("tiny-dense", {}, 4, 64),
        ("tiny-dense", {"dim": 128, "head_dim": 32, "ffn_dim": 256}, 4, 128),
        ("tiny-moe", {}, 8, None),
        ("tiny-moe", {}, 4, 32),
        ("tiny-dense", {"tie_embeddings": True}, 8, None),
    ],
)
def test_quantized_logits_match_the_python_dequantizer(
    make_model_dir, oracle, tmp_path, preset, changes, bits, group_size
) -> None:
    model_dir = make_model_dir(preset, **{"tie_embeddings": False, **changes})
    out = quantize_model_dir(model_dir, tmp_path / "q", bits, group_size)
    ids = ids_for(512, (2, 40))
    ref = oracle.torch_logits(model_dir, dequantize_tensors(out), ids)
    model = ats_native.Model(str(out), threads=2)
    got = model.logits(ids)
    assert got.shape == ref.shape and got.dtype == np.float32
    assert np.abs(got - ref).max() <= REL_TOL * np.abs(ref).max()
    # (T,) input and another length: each row's result does not depend on the batch around it
    np.testing.assert_array_equal(model.logits(ids[1, :7]), got[1, :7])


@pytest.fixture(scope="module")
def trained_logits(trained_dense_dir, held_out_ids, tmp_path_factory):
    """Native logits on held-out text: fp32, int8, int4 (groups of 32)."""
    ids = held_out_ids[:, :-1]
    dirs = {"fp32": trained_dense_dir}
    root = tmp_path_factory.mktemp("quantized")
    dirs["int8"] = quantize_model_dir(trained_dense_dir, root / "int8", 8)
    dirs["int4"] = quantize_model_dir(trained_dense_dir, root / "int4", 4, 32)
    return {k: ats_native.Model(str(d), threads=2).logits(ids) for k, d in dirs.items()}


def test_native_fp32_matches_ats_model(trained_dense_dir, held_out_ids, oracle, trained_logits):
    ref = oracle.torch_logits(
        trained_dense_dir, load_tensors(trained_dense_dir), held_out_ids[:, :-1]
    )
    np.testing.assert_allclose(
        trained_logits["fp32"], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max()
    )


def test_int8_meets_the_issue_bars(held_out_ids, oracle, trained_logits) -> None:
    """Issue 7: int8 top-1 agreement >= 99% and perplexity within 1% of fp32 on held-out text."""
    fp32, int8 = trained_logits["fp32"], trained_logits["int8"]
    assert oracle.top1_agreement(int8, fp32) >= 0.99
    ppl = oracle.perplexity(fp32, held_out_ids)
    assert ppl < 100  # the model learned (uniform guessing: 512)
    assert abs(oracle.perplexity(int8, held_out_ids) / ppl - 1) <= 0.01


def test_int4_group_32_meets_the_issue_bar(held_out_ids, oracle, trained_logits) -> None:
    """Issue 7: int4 with groups of 32 within 5% of fp32 perplexity on held-out text."""
    ppl = oracle.perplexity(trained_logits["fp32"], held_out_ids)
    assert abs(oracle.perplexity(trained_logits["int4"], held_out_ids) / ppl - 1) <= 0.05


@pytest.mark.parametrize(("bits", "group_size"), [(8, None), (4, 32)])
def test_quantized_greedy_decoding_follows_the_reference(
    trained_dense_dir, held_out_ids, oracle, tmp_path, bits, group_size
) -> None:
    """Prefill + KV-cache decode on int8/int4 weights picks the reference's argmax every step."""
    out = quantize_model_dir(trained_dense_dir, tmp_path / "q", bits, group_size)
    state = dequantize_tensors(out)
    prompt = [int(i) for i in held_out_ids[0, :12]]
    tokens = list(ats_native.Model(str(out), threads=2).generate(prompt, 10))
    expected, seq = [], list(prompt)
    for _ in range(10):  # reference: full recompute per step, no cache
        nxt = int(oracle.torch_logits(trained_dense_dir, state, np.array([seq]))[0, -1].argmax())
        expected.append(nxt)
        seq.append(nxt)
    assert tokens == expected


def test_native_engine_text_equals_torch_engine_text(trained_dense_dir) -> None:
    native = load_engine(trained_dense_dir, "native", threads=2)
    torch_engine = load_engine(trained_dense_dir, "torch")
    kwargs = dict(max_new_tokens=24, temperature=0.0, top_k=None, top_p=None, seed=None, stop=[])
    text = "".join(native.generate("def read_file(path):\n    ", **kwargs))
    assert text == "".join(torch_engine.generate("def read_file(path):\n    ", **kwargs))
    assert len(text) > 0


def test_native_engine_stops_at_a_stop_string(trained_dense_dir) -> None:
    native = load_engine(trained_dense_dir, "native", threads=1)
    kwargs = dict(max_new_tokens=40, temperature=0.0, top_k=None, top_p=None, seed=None)
    full = "".join(native.generate("import os\n", **kwargs, stop=[]))
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    cut = "".join(native.generate("import os\n", **kwargs, stop=[stop]))
    assert stop in cut and full.startswith(cut) and len(cut) < len(full)


def test_native_engine_runs_quantized_dirs_and_torch_refuses_them(
    trained_dense_dir, tmp_path
) -> None:
    out = quantize_model_dir(trained_dense_dir, tmp_path / "q8", 8)
    native = load_engine(out, "native")
    kwargs = dict(max_new_tokens=5, temperature=0.0, top_k=None, top_p=None, seed=None, stop=[])
    assert isinstance("".join(native.generate("class ", **kwargs)), str)
    with pytest.raises(ValueError, match="use --engine native"):
        load_engine(out, "torch")


def test_native_engine_devices(trained_dense_dir) -> None:
    with pytest.raises(ValueError, match="native engine runs on 'cpu' or 'cuda'"):
        load_engine(trained_dense_dir, "native", device="mps")
    if not ats_native.cuda_built():
        with pytest.raises(ValueError, match="no CUDA backend.*ATS_CUDA=ON"):
            load_engine(trained_dense_dir, "native", device="cuda")


@pytest.mark.gpu
def test_native_engine_on_cuda_writes_the_cpu_text(trained_dense_dir) -> None:
    kwargs = dict(max_new_tokens=24, temperature=0.0, top_k=None, top_p=None, seed=None, stop=[])
    cpu = load_engine(trained_dense_dir, "native", threads=2)
    cuda = load_engine(trained_dense_dir, "native", device="cuda")
    text = "".join(cuda.generate("def read_file(path):\n    ", **kwargs))
    assert text == "".join(cpu.generate("def read_file(path):\n    ", **kwargs))
