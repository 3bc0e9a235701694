"""The CUDA backend (Model(..., device="cuda"), native/src/cuda) against the CPU runtime on the
same model directory: logits of fp32 / bf16 weights within fp32 summation order of the CPU's (and
of ats-model's), int8 / int4 weights within the CPU integer scheme's own rounding-flip tolerance
(test_quantized.py), greedy generation token-identical, several sequences in one session equal to
each alone, slots reused after a reset. GPU tests carry the `gpu` marker (run them on the
accelerator machine: native/tools/cuda_check.sh); the error paths run everywhere."""

import copy

import ats_native
import numpy as np
import pytest
import torch
from ats_infer.quantize import quantize_model_dir
from ats_model import build_model, save_pretrained

FLOAT_REL_TOL = 1e-4
# int8 / int4: the GPU runs the CPU's integer scheme (Q8_0 activations, exact integer dots, fp16
# int4 scales) in another summation order, so most tokens agree to INT_REL_TOL (measured on the
# H200: medians ~2e-7); an activation that lands at a rounding boundary can round one code step
# the other way, which moves that token and, through its key and value, the later tokens of its
# sequence by up to ~2e-2 (test_quantized.py: FLIP_REL_TOL; measured up to 1.9e-2, in up to 14%
# of the tokens of 3 x 19). A wrong kernel or a float-activation path moves every token by far
# more than INT_REL_TOL.
INT_REL_TOL = 1e-5
FLIP_REL_TOL = 5e-2
SCHEMES = {"int8": (8, None), "int4-g32": (4, 32), "int4-g64": (4, 64)}

gpu = pytest.mark.gpu


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def token_rel_errs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per token (last axis = vocabulary): max |a - b| / max |b| of that token's logits."""
    return np.abs(a - b).max(axis=-1) / np.abs(b).max(axis=-1)


def fp32_oracle(model: torch.nn.Module) -> torch.nn.Module:
    """An fp32 ats-model (fp32 RoPE tables) holding model's weights: the runtimes compute bf16
    weights in fp32 (test_parity.py)."""
    ref = build_model(model.config).eval()
    ref.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    return ref


def assert_int_parity(errs: np.ndarray) -> None:
    """Per-token errors of an int8 / int4 model: see INT_REL_TOL and FLIP_REL_TOL."""
    assert np.median(errs) < INT_REL_TOL, np.sort(errs.ravel())[::-1][:10]
    assert errs.max() < FLIP_REL_TOL, errs.max()


def random_ids(vocab: int, shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, size=shape, dtype=np.int64)


def test_unknown_device_is_a_clear_error(saved_model) -> None:
    _, directory = saved_model("tiny-dense")
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        ats_native.Model(str(directory), threads=1, device="tpu")


def test_cpu_is_the_default_device(saved_model) -> None:
    _, directory = saved_model("tiny-dense")
    model = ats_native.Model(str(directory), threads=1)
    assert model.device == "cpu" and model.kernels != "cuda"


@pytest.mark.skipif(ats_native.cuda_built(), reason="this build holds the CUDA backend")
def test_cuda_in_a_cpu_build_says_how_to_build_it(saved_model) -> None:
    _, directory = saved_model("tiny-dense")
    with pytest.raises(ValueError, match="no CUDA backend.*ATS_CUDA=ON"):
        ats_native.Model(str(directory), threads=1, device="cuda")


@pytest.fixture(scope="module")
def quantized_dirs(saved_model, tmp_path_factory) -> dict[str, str]:
    _, directory = saved_model("tiny-dense")
    out = {}
    for name, (bits, group) in SCHEMES.items():
        out[name] = str(quantize_model_dir(directory, tmp_path_factory.mktemp(name), bits, group))
    return out


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float_logits_match_cpu_and_ats_model(saved_model, dtype: torch.dtype) -> None:
    model, directory = saved_model("tiny-dense", dtype)
    cpu = ats_native.Model(str(directory), threads=2)
    cuda = ats_native.Model(str(directory), device="cuda")
    assert cuda.device == "cuda" and cuda.kernels == "cuda"
    ids = random_ids(model.config.vocab_size, (3, 19), 1)
    ours, theirs = cuda.logits(ids), cpu.logits(ids)
    assert ours.shape == theirs.shape == (3, 19, model.config.vocab_size)
    assert rel_err(ours, theirs) < FLOAT_REL_TOL
    with torch.no_grad():
        ref = fp32_oracle(model)(torch.from_numpy(ids)).logits.numpy()
    assert rel_err(ours, ref) < FLOAT_REL_TOL


@gpu
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_quantized_logits_match_cpu(quantized_dirs, scheme: str) -> None:
    cpu = ats_native.Model(quantized_dirs[scheme], threads=2)
    cuda = ats_native.Model(quantized_dirs[scheme], device="cuda")
    assert cuda.weight_format == cpu.weight_format == scheme.split("-")[0]
    ids = random_ids(cpu.vocab_size, (3, 19), 2)
    assert_int_parity(token_rel_errs(cuda.logits(ids), cpu.logits(ids)))


@gpu
@pytest.mark.parametrize("dim", [2048, 9216])  # rms_norm: rows in registers; 8192 in them + more
@pytest.mark.parametrize("scheme", ["float", "int8"])  # y alone; y and its Q8_0 blocks
def test_wide_rows_match_cpu(saved_model, tmp_path, dim: int, scheme: str) -> None:
    changes = dict(dim=dim, n_layer=1, n_head=2, n_kv_head=1, head_dim=64, ffn_dim=256)
    _, directory = saved_model("tiny-dense", **changes)
    path = str(directory)
    if scheme != "float":
        path = str(quantize_model_dir(directory, tmp_path / scheme, *SCHEMES[scheme]))
    cpu = ats_native.Model(path, threads=2)
    cuda = ats_native.Model(path, device="cuda")
    ids = random_ids(cpu.vocab_size, (2, 5), 7)
    errs = token_rel_errs(cuda.logits(ids), cpu.logits(ids))
    if scheme == "float":
        assert errs.max() < FLOAT_REL_TOL, errs
    else:
        assert_int_parity(errs)


@gpu
@pytest.mark.parametrize("graphs", ["1", "0"])  # decode steps replayed from CUDA graphs, or not
@pytest.mark.parametrize("scheme", ["float", *SCHEMES])
def test_greedy_generation_matches_cpu(
    saved_model, quantized_dirs, scheme: str, graphs: str, monkeypatch
) -> None:
    monkeypatch.setenv("ATS_CUDA_GRAPHS", graphs)  # read when a session starts
    path = str(saved_model("tiny-dense")[1]) if scheme == "float" else quantized_dirs[scheme]
    cpu = ats_native.Model(path, threads=2)
    cuda = ats_native.Model(path, device="cuda")
    prompt = random_ids(cpu.vocab_size, (9,), 3)
    ours, theirs = list(cuda.generate(prompt, 40)), list(cpu.generate(prompt, 40))
    assert len(set(theirs)) > 3, "degenerate model: the test would not see decoding errors"
    if scheme == "float":
        assert ours == theirs
    else:  # a rounding flip may change a near-tie; the first tokens agree
        assert ours[:8] == theirs[:8]


@gpu
def test_several_sequences_and_reused_slots_match_alone(saved_model) -> None:
    _, directory = saved_model("tiny-dense")
    cuda = ats_native.Model(str(directory), device="cuda")
    prompts = [list(range(5, 40)), [9], [3, 7, 11, 200, 5], list(range(100, 160))]
    alone = [list(cuda.generate(p, 12)) for p in prompts]
    assert cuda.generate_batch(prompts, 12) == alone
    # continuous batching: 2 slots, requests join as slots free up (a reset cache per request),
    # prompts prefilled in chunks while the other slot decodes
    batch = ats_native.Batch(cuda, n_slots=2, max_len=128)
    got: dict[int, list[int]] = {}
    pending, owner = list(enumerate(prompts)), {}
    while pending or batch.busy(0) or batch.busy(1):
        for slot in (0, 1):
            if pending and not batch.busy(slot):
                request, prompt = pending.pop(0)
                batch.start(slot, prompt, 12)
                owner[slot] = request
        for slot, token, *_ in batch.step(prefill_budget=7):
            got.setdefault(owner[slot], []).append(token)
    assert [got[i] for i in range(len(prompts))] == alone


@gpu
def test_logits_and_greedy_id_steps_match_cpu(saved_model) -> None:
    # with logprobs a step copies each sequence's logits back (runs of consecutive sequences in
    # one copy; slot 1 stops early, leaving slots 0 and 2 apart); without, only the GPU's argmax
    path = str(saved_model("tiny-dense")[1])
    prompts, lengths = [[5, 9, 13], [200, 7], [3, 1, 4, 1, 5]], [10, 4, 10]

    def run(model: ats_native.Model, logprobs: bool) -> list[list[int]]:
        batch = ats_native.Batch(model, n_slots=3, max_len=64)
        for slot, (prompt, n) in enumerate(zip(prompts, lengths, strict=True)):
            batch.start(slot, prompt, n, logprobs=logprobs)
        out: dict[int, list[int]] = {}
        while any(batch.busy(slot) for slot in range(3)):
            for slot, token, *_ in batch.step(0):
                out.setdefault(slot, []).append(token)
        return [out[slot] for slot in range(3)]

    cpu = ats_native.Model(path, threads=2)
    cuda = ats_native.Model(path, device="cuda")
    ref = run(cpu, False)
    assert [len(t) for t in ref] == lengths
    assert run(cpu, True) == ref and run(cuda, True) == ref and run(cuda, False) == ref


@gpu
@pytest.mark.parametrize("graphs", ["1", "0"])  # splits sized by the cache's max_len, or by pos
@pytest.mark.parametrize("n_prompt", [1, 40, 3000])
def test_decode_over_split_keys_matches_cpu(
    saved_model, monkeypatch, graphs: str, n_prompt: int
) -> None:
    # a decode step's attention splits the key slots over blocks (1 to 48 splits here): tokens
    # and the top logprobs of every step as the CPU's, 1 to 3020 keys
    monkeypatch.setenv("ATS_CUDA_GRAPHS", graphs)
    path = str(saved_model("tiny-dense", max_seq_len=4096)[1])
    prompt = random_ids(512, (n_prompt,), 8)

    def run(model: ats_native.Model) -> tuple[list[int], np.ndarray]:
        batch = ats_native.Batch(model, n_slots=1, max_len=3072)
        batch.start(0, prompt, 20, logprobs=True, top_logprobs=5)
        tokens, logprobs = [], []
        while batch.busy(0):
            for _, token, _, logprob, top in batch.step(0):
                tokens.append(token)
                logprobs.append([logprob, *(lp for _, lp in top)])
        return tokens, np.array(logprobs)

    (ours, our_lp), (theirs, their_lp) = (
        run(ats_native.Model(path, device="cuda")),
        run(ats_native.Model(path, threads=2)),
    )
    assert ours == theirs and len(set(theirs)) > 3
    assert np.abs(our_lp - their_lp).max() < FLOAT_REL_TOL * np.abs(their_lp).max()


@gpu
@pytest.mark.parametrize("scheme", ["float", "bf16", *SCHEMES])
def test_decode_steps_match_prefill_of_the_same_tokens(
    saved_model, tmp_path, monkeypatch, scheme: str
) -> None:
    # a decode step's matmuls (a warp per 4 output rows; 1000 logits end in a group of 8) sum
    # each row in the order of prefill's (a warp per row, 8 activation rows): the logprobs of a
    # token agree to rounding whichever path computed them (graphs off: the same key splits)
    monkeypatch.setenv("ATS_CUDA_GRAPHS", "0")
    dtype = torch.bfloat16 if scheme == "bf16" else torch.float32
    _, directory = saved_model("tiny-dense", dtype, vocab_size=1000)
    path = str(directory)
    if scheme in SCHEMES:
        path = str(quantize_model_dir(directory, tmp_path / scheme, *SCHEMES[scheme]))
    cuda = ats_native.Model(path, device="cuda")
    prompt = random_ids(1000, (9,), 9).tolist()

    def steps(ids: list[int], n: int) -> list[tuple[int, list[float]]]:
        batch = ats_native.Batch(cuda, n_slots=1, max_len=64)
        batch.start(0, ids, n, logprobs=True, top_logprobs=5)
        out = []
        while batch.busy(0):
            for _, token, _, logprob, top in batch.step(0):
                out.append((token, [logprob, *(lp for _, lp in top)]))
        return out

    decoded = steps(prompt, 12)
    tokens = [token for token, _ in decoded]
    assert len(set(tokens)) > 3
    for k in (1, 5, 11):
        token, logprobs = steps(prompt + tokens[:k], 1)[0]
        assert token == tokens[k]
        np.testing.assert_allclose(logprobs, decoded[k][1], rtol=1e-5, atol=1e-6)


def first_argmax(logits: np.ndarray) -> int:
    """logits_argmax's rule: the first index of the largest value, NaN never larger (index 0 when
    logits[0] is NaN)."""
    return 0 if np.isnan(logits[0]) else int(np.nanargmax(logits))


# (rows given twice the top logit's output row: exact ties above every other logit, rows made
# NaN, the id logits_argmax picks) over a vocabulary of 5000: the GPU argmax's chunks of 2048
ARGMAX_CASES = [
    ([4999, 3000, 2048], [], 2048),
    ([2048, 2047], [], 2047),
    ([5, 6, 4097], [], 5),
    ([0, 4999], [], 0),
    (list(range(5000)), [], 0),
    ([3000], [0], 0),
    ([3001, 4000], [10, 3000, 4999], 3001),
    ([4096], list(range(2048, 4096)), 4096),
    ([4999], list(range(1, 4999)), 4999),
]


@gpu
@pytest.mark.parametrize(("top", "nan", "want"), ARGMAX_CASES)
def test_greedy_ids_keep_the_argmax_rule_on_ties_and_nan(
    saved_model, tmp_path, top: list[int], nan: list[int], want: int
) -> None:
    model, directory = saved_model("tiny-dense", vocab_size=5000, tie_embeddings=False)
    prompt = random_ids(5000, (7,), 6)
    best = int(ats_native.Model(str(directory), threads=1).logits(prompt)[-1].argmax())
    model = copy.deepcopy(model)
    with torch.no_grad():  # doubling a row doubles its logit exactly; a NaN row's logit is NaN
        w = model.output.weight
        w[top] = 2 * w[best].clone()
        w[nan] = float("nan")
    save_pretrained(model, tmp_path)
    cpu = ats_native.Model(str(tmp_path), threads=1)
    logits = cpu.logits(prompt)[-1]
    assert len(set(logits[top].tolist())) == 1 and np.isnan(logits[nan]).all()
    assert first_argmax(logits) == want

    def greedy_ids(m: ats_native.Model) -> list[int]:  # no logprobs: the ids come back alone
        batch = ats_native.Batch(m, n_slots=2, max_len=16)
        for slot in (0, 1):
            batch.start(slot, prompt, 1)
        return sorted(token for _, token, *_ in batch.step(0))

    assert greedy_ids(cpu) == [want, want]
    assert greedy_ids(ats_native.Model(str(tmp_path), device="cuda")) == [want, want]


@gpu
@pytest.mark.parametrize("setting", ["ATS_CUDA_GRAPHS", "ATS_CUDA_PDL", "ATS_CUDA_MMA"])
def test_bad_graphs_setting_is_a_clear_error(saved_model, monkeypatch, setting: str) -> None:
    cuda = ats_native.Model(str(saved_model("tiny-dense")[1]), device="cuda")
    monkeypatch.setenv(setting, "yes")
    with pytest.raises(ValueError, match=f"{setting} must be 0 or 1, got 'yes'"):
        cuda.logits([1, 2, 3])


@gpu
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_batched_quantized_matmuls_equal_the_warp_kernel(
    saved_model, tmp_path, monkeypatch, scheme: str
) -> None:
    # int8 / int4 matmuls of N > 1 rows run on the tensor cores (one mma per Q8_0 block, summed
    # in the warp kernel's order), so their logits equal the warp kernel's (ATS_CUDA_MMA=0) bit
    # for bit: N = 2, odd, past one 8-row tile, not a multiple of 16, several 32-row tiles, and
    # 1000 output rows (a partial 16-row tile); and they stay within the CPU's tolerance
    _, directory = saved_model("tiny-dense", vocab_size=1000)
    path = str(quantize_model_dir(directory, tmp_path / scheme, *SCHEMES[scheme]))
    cpu = ats_native.Model(path, threads=2)
    cuda = ats_native.Model(path, device="cuda")
    errs = []
    for k, shape in enumerate([(1, 2), (1, 7), (1, 13), (3, 17), (2, 40)]):
        ids = random_ids(1000, shape, 20 + k)
        monkeypatch.setenv("ATS_CUDA_MMA", "1")  # read when a session starts
        ours = cuda.logits(ids)
        monkeypatch.setenv("ATS_CUDA_MMA", "0")
        assert np.array_equal(ours, cuda.logits(ids)), shape
        errs.append(token_rel_errs(ours, cpu.logits(ids)).ravel())
    assert_int_parity(np.concatenate(errs))


@gpu
@pytest.mark.parametrize("scheme", ["float", "int8", "int4-g32"])
def test_decode_graph_with_pdl_equals_without(
    saved_model, quantized_dirs, monkeypatch, scheme: str
) -> None:
    # the decode graph's kernels launched with programmatic dependent launch (each waits for
    # the one before it at its start): the same tokens as without, one sequence and three
    # (the tensor-core matmuls of 3 rows inside the graph)
    path = str(saved_model("tiny-dense")[1]) if scheme == "float" else quantized_dirs[scheme]
    cuda = ats_native.Model(path, device="cuda")
    prompts = [list(range(5, 40)), [9], [3, 7, 11, 200, 5]]

    def run(pdl: str) -> list:
        monkeypatch.setenv("ATS_CUDA_PDL", pdl)  # read when a session starts
        return [list(cuda.generate(prompts[0], 24)), cuda.generate_batch(prompts, 24)]

    with_pdl = run("1")
    assert len(set(with_pdl[0])) > 3
    assert with_pdl == run("0")


@gpu
@pytest.mark.parametrize("scheme", ["float", "int8", "int4-g32"])
def test_moe_logits_and_generation_match_cpu(
    saved_model, tmp_path, monkeypatch, scheme: str
) -> None:
    # tiny-moe with a shared expert, expert bias, router temperature and a capacity that drops
    # slots: every routing rule the host-side routing of the GPU path shares with the CPU's
    moe = dict(n_experts=4, top_k=2, capacity_factor=0.8, router_temperature=0.7)
    moe.update(norm_topk=False, n_shared_experts=1, bias_update_rate=0.0)
    model, _ = saved_model("tiny-moe", moe=moe)
    model = copy.deepcopy(model)
    with torch.no_grad():  # a non-zero expert bias changes the choice, never the weights
        for layer in model.moe_layers():
            layer.expert_bias.copy_(torch.tensor([0.3, -0.2, 0.0, 0.1]))
    directory = tmp_path / "float"
    save_pretrained(model, directory)
    path = str(directory)
    if scheme != "float":
        path = str(quantize_model_dir(directory, tmp_path / scheme, *SCHEMES[scheme]))
    cpu = ats_native.Model(path, threads=2)
    cuda = ats_native.Model(path, device="cuda")
    ids = random_ids(model.config.vocab_size, (3, 19), 4)
    ours = cuda.logits(ids)
    errs = token_rel_errs(ours, cpu.logits(ids))
    if scheme == "float":
        assert errs.max() < FLOAT_REL_TOL, errs
    else:
        assert_int_parity(errs)
        # each expert's rows (57 tokens x top-2 spread over 4 experts) through the tensor-core
        # kernel: the warp kernel's logits bit for bit
        monkeypatch.setenv("ATS_CUDA_MMA", "0")
        assert np.array_equal(ours, cuda.logits(ids))
        monkeypatch.delenv("ATS_CUDA_MMA")
    prompt = random_ids(model.config.vocab_size, (9,), 5)
    ours, theirs = list(cuda.generate(prompt, 24)), list(cpu.generate(prompt, 24))
    assert ours[:8] == theirs[:8] and (scheme != "float" or ours == theirs)


@gpu
def test_cuda_rejects_families_it_does_not_run(saved_model) -> None:
    _, directory = saved_model("tiny-mod")
    with pytest.raises(ValueError, match="runs dense and MoE models; this model's family is 'mod'"):
        ats_native.Model(str(directory), device="cuda")


@gpu
def test_cuda_refuses_head_dims_past_its_attention(saved_model) -> None:
    _, directory = saved_model("tiny-dense", n_head=1, n_kv_head=1, head_dim=288)
    with pytest.raises(ValueError, match=r"even head_dim <= 256 \(got dim 64, head_dim 288\)"):
        ats_native.Model(str(directory), device="cuda")
