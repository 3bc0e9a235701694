"""optimum-quanto directories for the torch engine (`ats-infer quantize --method quanto`):

    config.json, tokenizer.json   copied from the float directory
    quanto.json                   {"format_version": 1, "weights": "qint8" | "qint4",
                                   "map": quanto's quantization_map (module -> qtypes)}
    model.safetensors             the frozen quantized model's state dict (quanto's tensor names)

quanto quantizes nn.Linear modules (qint8: symmetric per output row; qint4: quanto's grouped
affine scheme, groups of 128 inputs where a row allows). ats-model stores an MoE layer's experts
stacked in three tensors, so they are first rebuilt as one nn.Linear per expert and matrix
(LinearExperts, the same math), and quanto quantizes every one of them. Routers, MoD predictors,
embeddings and norms stay float. The native engine does not read this layout.
"""

import json
from pathlib import Path

import torch
from ats_model import ModelConfig, build_model
from optimum.quanto import freeze, qint4, qint8, quantization_map, quantize, requantize
from safetensors.torch import load_file, save_file
from torch import nn

from ats_infer.model_dir import open_model_dir, read_config
from ats_infer.output_paths import new_directory
from ats_infer.quant_spec import QUANTO_FILE
from ats_infer.quantize import check_quantizable
from ats_infer.tensor_files import (
    CONFIG_FILE,
    SINGLE_FILE,
    TOKENIZER_FILE,
    path_kind,
    read_json_object,
)

QTYPES = {8: qint8, 4: qint4}
FORMAT_VERSION = 1


class LinearExperts(nn.Module):
    """ats_model's Experts (stacked w1/w3 (E, F, C), w2 (E, C, F)) as 3 * E nn.Linear modules."""

    def __init__(self, n_experts: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.ModuleList(nn.Linear(dim, hidden, bias=False) for _ in range(n_experts))
        self.w3 = nn.ModuleList(nn.Linear(dim, hidden, bias=False) for _ in range(n_experts))
        self.w2 = nn.ModuleList(nn.Linear(hidden, dim, bias=False) for _ in range(n_experts))

    def forward(self, x_sorted: torch.Tensor, per_expert: torch.Tensor) -> torch.Tensor:
        """x_sorted (M, C) rows grouped by expert, per_expert (E,) rows per group -> (M, C)."""
        outs = []
        for e, x in enumerate(torch.split(x_sorted, per_expert.tolist())):
            outs.append(self.w2[e](nn.functional.silu(self.w1[e](x)) * self.w3[e](x)))
        return torch.cat(outs)


def _linear_experts(model: nn.Module, copy_weights: bool) -> None:
    """Replace every MoE layer's stacked experts by LinearExperts (weights copied if asked)."""
    for layer in model.moe_layers():
        E, F, C = layer.experts.w1.shape
        new = LinearExperts(E, C, F)
        if copy_weights:
            with torch.no_grad():
                for e in range(E):
                    for key in ("w1", "w3", "w2"):
                        getattr(new, key)[e].weight.copy_(getattr(layer.experts, key)[e])
        layer.experts = new


def _module_names(model: nn.Module, matrices: tuple[str, ...]) -> list[str]:
    """Names of the nn.Linear modules standing for the directory's matmul weights."""
    wanted = {m.removesuffix(".weight") for m in matrices}
    names = []
    for name, module in model.named_modules():
        stacked = name.rsplit(".", 1)[0]  # layers.N.ffn.experts.w1.E -> layers.N.ffn.experts.w1
        if isinstance(module, nn.Linear) and (name in wanted or stacked in wanted):
            names.append(name)
    return names


def quanto_model_dir(src: str | Path, out: str | Path, bits: int, *, force: bool = False) -> Path:
    """Write the optimum-quanto quantized copy of float model directory `src` as `out`."""
    if bits not in QTYPES:
        raise ValueError(f"bits = {bits!r} is not supported by --method quanto: expected 8 or 4")
    model_dir = open_model_dir(src)
    check_quantizable(model_dir, 8, None)  # float input; quanto picks its own int4 groups
    model = build_model(ModelConfig.from_dict(model_dir.config), kernels="reference").eval()
    tensors = {k: torch.from_numpy(v.copy()) for k, v in model_dir.tensors().items()}
    model.load_state_dict(tensors)
    _linear_experts(model, copy_weights=True)
    names = _module_names(model, model_dir.matrices)
    quantize(model, weights=QTYPES[bits], include=names)
    freeze(model)
    spec = {
        "format_version": FORMAT_VERSION,
        "weights": f"qint{bits}",
        "map": quantization_map(model),
    }
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    with new_directory(Path(out), [model_dir.path, *model_dir.files()], force) as tmp:
        save_file(state, str(tmp / SINGLE_FILE), metadata={"format": "pt"})
        (tmp / QUANTO_FILE).write_text(json.dumps(spec, indent=2) + "\n")
        for name in (CONFIG_FILE, TOKENIZER_FILE):
            if path_kind(model_dir.path / name) != "missing":
                (tmp / name).write_bytes((model_dir.path / name).read_bytes())
    return Path(out)


def load_quanto(path: str | Path, device: str = "cpu") -> nn.Module:
    """The eval-mode ats-model a quanto directory holds, its Linear weights quanto tensors."""
    path = Path(path)
    spec = read_json_object(path / QUANTO_FILE)
    if spec.get("format_version") != FORMAT_VERSION or spec.get("weights") not in (
        "qint8",
        "qint4",
    ):
        raise ValueError(
            f"{path / QUANTO_FILE}: format_version {spec.get('format_version')!r} / weights "
            f"{spec.get('weights')!r}: expected {FORMAT_VERSION} / qint8 or qint4"
        )
    if not isinstance(spec.get("map"), dict):
        raise ValueError(f"{path / QUANTO_FILE}: missing object 'map' (quanto's quantization map)")
    model = build_model(ModelConfig.from_dict(read_config(path)), device=device).eval()
    _linear_experts(model, copy_weights=False)
    requantize(model, load_file(str(path / SINGLE_FILE)), spec["map"], device=torch.device(device))
    return model.eval()
