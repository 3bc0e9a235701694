"""`ats-infer quantize --method gptq`: GPTQ (gptq.py) over a whole model directory, written in the
native runtime's int8/int4 layout (quantize.py), so `ats-infer generate` runs it.

Calibration: windows of the "train" documents of --calib (corpus.py: never the text eval-ppl holds
out). Blocks are quantized in order, as in the paper: block i's Hessians come from a forward pass
in which blocks 0..i-1 already hold their quantized weights; then the untied output head.
Embeddings, norms, routers and MoD predictors stay float32.

MoE: each expert's w1/w3 Hessian comes from the tokens routed to it and its w2 Hessian from its
hidden activations on those tokens. A top-k router sends an expert about k/E of the tokens, so on
the windows a dense layer is calibrated on, an expert's Hessian would rest on E/k times fewer
rows: an MoE block reads further windows until every expert has been routed as many tokens as a
dense layer sees, up to a cap (default n_samples * E / k windows: enough for an expert of average
load). An expert still routed fewer tokens than its widest matrix has inputs (too few for a
full-rank Hessian, typically a rarely chosen expert) is calibrated on every token entering its
layer instead, as if routed to it; windows per block and such experts are logged.
MoD and hybrid blocks are calibrated on the tokens their routers select, as they run.
"""

import logging
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from ats_model import ModelConfig, build_model
from ats_tokenizer import Tokenizer
from torch import nn

from ats_infer.corpus import DEFAULT_VAL_FRACTION, split_documents, token_windows
from ats_infer.gptq import SHRINK, gptq_quantize
from ats_infer.model_dir import open_model_dir
from ats_infer.output_paths import check_output
from ats_infer.quant_spec import quant_spec
from ats_infer.quantize import check_quantizable, pack_int4, write_quantized_dir
from ats_infer.tensor_files import TOKENIZER_FILE, path_kind

log = logging.getLogger("ats_infer")

BATCH = 8  # calibration windows per forward


class _Hessian:
    """Running sum of x^T x over rows x (in,), float64; `value` = 2/n sum x^T x."""

    def __init__(self, n_in: int) -> None:
        self.sum = torch.zeros(n_in, n_in, dtype=torch.float64)
        self.rows = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).to(torch.float64)
        self.sum += x.T @ x
        self.rows += x.shape[0]

    @property
    def value(self) -> torch.Tensor:
        return self.sum * (2.0 / max(self.rows, 1))


class _ExpertsHessians:
    """Per-expert Hessians of one MoE layer's stacked experts (w1/w3 share their input): from the
    tokens routed to each expert, and, for the experts in `stand_in`, from every token entering
    the layer."""

    def __init__(self, experts: nn.Module) -> None:
        self.experts = experts
        E, F, C = experts.w1.shape
        self.width = max(C, F)  # inputs of the widest expert matrix: rows for a full-rank Hessian
        self.routed_in = [_Hessian(C) for _ in range(E)]
        self.routed_hidden = [_Hessian(F) for _ in range(E)]
        self.stand_in: dict[int, tuple[_Hessian, _Hessian]] = {}

    def hidden(self, e: int, x: torch.Tensor) -> torch.Tensor:
        w1, w3 = self.experts.w1[e], self.experts.w3[e]
        return nn.functional.silu(x @ w1.T) * (x @ w3.T)  # (rows, F)

    def add_layer_input(self, x: torch.Tensor) -> None:
        flat = x.reshape(-1, x.shape[-1])  # (N, C): every token entering the MoE FFN
        for e, (h_in, h_hidden) in self.stand_in.items():
            h_in.add(flat)
            h_hidden.add(self.hidden(e, flat))

    def add_routed(self, x_sorted: torch.Tensor, per_expert: torch.Tensor) -> None:
        start = 0
        for e, count in enumerate(per_expert.tolist()):
            rows = x_sorted[start : start + count]
            start += count
            if count:
                self.routed_in[e].add(rows)
                self.routed_hidden[e].add(self.hidden(e, rows))

    def fewest_routed(self) -> int:
        return min(h.rows for h in self.routed_in)

    def short(self) -> list[int]:
        """Experts routed fewer tokens than their widest matrix has inputs."""
        return [e for e, h in enumerate(self.routed_in) if h.rows < self.width]

    def for_expert(self, e: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(input Hessian, hidden Hessian)."""
        if e in self.stand_in:
            h_in, h_hidden = self.stand_in[e]
            return h_in.value, h_hidden.value
        return self.routed_in[e].value, self.routed_hidden[e].value


class _BlockDone(Exception):
    """Raised after the block being calibrated: the blocks after it need not run."""


def _stop(module: nn.Module, args: tuple, output: object) -> None:
    raise _BlockDone


def _calibrate(model: nn.Module, ids: torch.Tensor, hooks: list, last: nn.Module | None) -> None:
    """Forward windows ids (N, T) through `model` with `hooks` set, up to module `last` (None:
    the whole model)."""
    handles = [module.register_forward_pre_hook(fn) for module, fn in hooks]
    if last is not None:
        handles.append(last.register_forward_hook(_stop))
    try:
        with torch.no_grad():
            for b in range(0, ids.shape[0], BATCH):
                try:
                    model(ids[b : b + BATCH])
                except _BlockDone:
                    pass
    finally:
        for handle in handles:
            handle.remove()


def _quantize_matrix(
    w: torch.Tensor, hessian: torch.Tensor, bits: int, group_size: int | None, act_order: bool
) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
    """-> (N.q, N.scale) in the stored layout and the dequantized weight."""
    codes, scale = gptq_quantize(w, hessian, bits, group_size, act_order=act_order)
    if bits == 8:
        deq = codes.float() * scale[:, None]
        return codes.numpy(), scale.numpy(), deq
    groups = codes.float().view(codes.shape[0], -1, group_size) * scale[..., None]
    return pack_int4(codes.numpy()), scale.numpy(), groups.view(codes.shape)


def gptq_model(
    model: nn.Module,
    matrices: set[str],
    ids: torch.Tensor,
    bits: int,
    group_size: int | None,
    act_order: bool = False,
    *,
    n_samples: int | None = None,
    expert_rows: int = 0,
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, int]]:
    """GPTQ every matmul weight named in `matrices` of ats-model `model` block by block; the
    model's weights become the dequantized ones. Calibration windows ids (N, T): the first
    `n_samples` (default all N) calibrate every block; a block with experts reads on through ids,
    BATCH windows at a time, until each of its experts has been routed `expert_rows` tokens or ids
    runs out. Returns ({name: (N.q, N.scale)}, {block prefix: windows it was calibrated on})."""
    n_samples = ids.shape[0] if n_samples is None else min(n_samples, ids.shape[0])
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    windows: dict[str, int] = {}
    stand_ins = 0
    prefixes = [f"layers.{i}." for i in range(len(model.layers))] + ["output"]
    modules = dict(model.named_modules())
    for prefix in prefixes:
        linears: dict[str, _Hessian] = {}
        experts: dict[str, _ExpertsHessians] = {}
        hooks: list[tuple[nn.Module, Callable]] = []
        layer_hooks: list[tuple[nn.Module, Callable]] = []  # every token entering an MoE FFN
        for name, module in modules.items():
            if not (name.startswith(prefix) or name == prefix):
                continue
            if isinstance(module, nn.Linear) and name + ".weight" in matrices:
                h = linears[name] = _Hessian(module.in_features)
                hooks.append((module, lambda m, args, h=h: h.add(args[0])))
            elif name + ".w1" in matrices:  # ats_model.layers.moe.Experts
                eh = experts[name] = _ExpertsHessians(module)
                moe_ffn = modules[name.rsplit(".", 1)[0]]
                hooks.append((module, lambda m, args, eh=eh: eh.add_routed(args[0], args[1])))
                layer_hooks.append((moe_ffn, lambda m, args, eh=eh: eh.add_layer_input(args[0])))
        if not hooks:
            continue
        last = None if prefix == "output" else modules[prefix[:-1]]
        used = n_samples
        _calibrate(model, ids[:used], hooks, last)
        while experts and used < ids.shape[0]:
            if min(eh.fewest_routed() for eh in experts.values()) >= expert_rows:
                break
            _calibrate(model, ids[used : used + BATCH], hooks, last)
            used = min(used + BATCH, ids.shape[0])
        windows[prefix] = used
        short = {name: eh.short() for name, eh in experts.items()}
        if any(short.values()):  # a second pass, on the same windows, for the stand-ins
            for name, eh in experts.items():
                C, F = eh.routed_in[0].sum.shape[0], eh.routed_hidden[0].sum.shape[0]
                eh.stand_in = {e: (_Hessian(C), _Hessian(F)) for e in short[name]}
                stand_ins += len(short[name])
            _calibrate(model, ids[:used], layer_hooks, last)
        with torch.no_grad():
            for name, h in linears.items():
                weight = modules[name].weight
                q, s, deq = _quantize_matrix(weight, h.value, bits, group_size, act_order)
                out[name + ".weight"] = (q, s)
                weight.copy_(deq)
            for name, eh in experts.items():
                module = modules[name]
                results = {"w1": [], "w3": [], "w2": []}
                for e in range(module.w1.shape[0]):
                    h_in, h_hidden = eh.for_expert(e)
                    for key, h in (("w1", h_in), ("w3", h_in), ("w2", h_hidden)):
                        results[key].append(
                            _quantize_matrix(
                                getattr(module, key)[e], h, bits, group_size, act_order
                            )
                        )
                for key, per_expert in results.items():
                    out[f"{name}.{key}"] = (
                        np.stack([q for q, _, _ in per_expert]),
                        np.stack([s for _, s, _ in per_expert]),
                    )
                    getattr(module, key).copy_(torch.stack([d for _, _, d in per_expert]))
        if experts:
            log.info(
                "gptq: %s calibrated on %d windows; fewest tokens routed to one expert: %d",
                prefix[:-1],
                used,
                min(eh.fewest_routed() for eh in experts.values()),
            )
    if stand_ins:
        log.info(
            "gptq: %d expert(s) had fewer routed calibration tokens than inputs and were "
            "calibrated on every token of their layer",
            stand_ins,
        )
    missing = matrices - out.keys()
    if missing:
        raise RuntimeError(f"gptq: no calibration input reached {sorted(missing)}")
    return out, windows


def expert_windows(config: dict, n_samples: int) -> int:
    """The calibration windows an MoE model may read: n_samples * n_experts / top_k, so that an
    expert of average load is routed as many tokens as a dense layer sees in n_samples windows
    (a top-k router sends each expert about k / E of the tokens). n_samples without experts."""
    moe = config.get("moe")
    if moe is None:
        return n_samples
    return math.ceil(n_samples * moe["n_experts"] / moe["top_k"])


def gptq_model_dir(
    src: str | Path,
    out: str | Path,
    bits: int,
    group_size: int | None,
    calib: str,
    *,
    n_samples: int = 128,
    max_samples: int | None = None,
    seq_len: int = 256,
    act_order: bool = False,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    force: bool = False,
) -> Path:
    """Write the GPTQ-quantized copy of float model directory `src` as the new directory `out`,
    calibrated on `n_samples` windows of `seq_len` tokens of the "train" documents of `calib`
    (a path or "stdlib"). An MoE block reads further windows, up to `max_samples` in all
    (default expert_windows()), until each expert has been routed n_samples * seq_len tokens,
    as many as a dense layer sees. Everything is checked before the model is loaded."""
    model_dir = open_model_dir(src)
    check_quantizable(model_dir, bits, group_size)
    out = Path(out)
    check_output(out, [model_dir.path, *model_dir.files()], "directory", force)
    if n_samples < 1:
        raise ValueError(f"calibration samples = {n_samples} must be >= 1")
    if max_samples is None:
        max_samples = expert_windows(model_dir.config, n_samples)
    if max_samples < n_samples:
        raise ValueError(
            f"calibration max samples = {max_samples} must be >= calibration samples = {n_samples}"
        )
    max_seq_len = model_dir.config["max_seq_len"]
    seq_len = min(seq_len, max_seq_len)
    tokenizer_path = model_dir.path / TOKENIZER_FILE
    if path_kind(tokenizer_path) != "file":
        raise FileNotFoundError(f"{src}: no {TOKENIZER_FILE} to tokenize the calibration text with")
    tokenizer = Tokenizer.load(tokenizer_path)
    documents = split_documents(calib, "train", val_fraction)
    windows = token_windows(tokenizer, documents, seq_len, max_samples * seq_len)
    if windows.ids.shape[0] < n_samples:
        raise ValueError(
            f"calibration text {calib} holds {windows.ids.shape[0]} windows of {seq_len} tokens "
            f"in its train split; {n_samples} needed: give more text or fewer samples"
        )
    model = build_model(ModelConfig.from_dict(model_dir.config), kernels="reference").eval()
    model.load_state_dict(
        {k: torch.from_numpy(np.array(v)) for k, v in model_dir.tensors().items()}
    )
    ids = torch.from_numpy(windows.ids[:, :-1])
    results, used = gptq_model(
        model,
        set(model_dir.matrices),
        ids,
        bits,
        group_size,
        act_order,
        n_samples=n_samples,
        expert_rows=n_samples * seq_len,
    )
    spec = quant_spec(bits, group_size, list(model_dir.matrices), "gptq")
    spec["calibration"] = {
        "source": str(calib),
        "samples": n_samples,
        "max_samples": max_samples,
        "seq_len": seq_len,
        "act_order": act_order,
        "int4_scale_shrink": [round(f, 2) for f in SHRINK] if bits == 4 else [1.0],
        "windows_per_block": used,
    }
    return write_quantized_dir(model_dir, out, spec, lambda name, w: results[name], force)
