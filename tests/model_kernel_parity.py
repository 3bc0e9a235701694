"""Run by test_model_kernel_parity.py in a process with TRITON_INTERPRET=1 (or on a CUDA device):
one model built twice, kernels="reference" and kernels="triton", same weights and batch; prints
one JSON line {preset, mode, loss, triton_loss, max_grad_rel_err} per PRESET:MODE, all in one
process (the interpreter's start and Triton's import are paid once).
argv: DEVICE PRESET:MODE..., MODE "fp32" (no autocast) or "bf16-stream" (bf16 autocast with the
residual stream in bf16: the norms write bf16, the fused residual add runs on a bf16 stream). The
Triton model fuses its head into the loss (ForwardOptions.fused_loss, in chunks of 24 of the 64
rows) and its q|k|v and gate|up projections (rope_qkv, swiglu_packed) against the reference's
plain ones."""

import contextlib
import json
import sys

import torch
from ats_model import ForwardOptions, build_model, presets


def loss_and_grads(model: torch.nn.Module, x: torch.Tensor, mode: str) -> tuple[float, dict]:
    autocast = (
        torch.autocast(x.device.type, dtype=torch.bfloat16)
        if mode == "bf16-stream"
        else contextlib.nullcontext()
    )
    with autocast:
        out = model(x, targets=x.roll(-1, dims=1))
    loss = out.loss + 0.01 * sum(out.aux.values())
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def compare(preset: str, device: str, mode: str) -> dict:
    config = presets.get(preset)
    torch.manual_seed(0)
    reference = build_model(config, device=torch.device(device), kernels="reference")
    fast = build_model(config, device=torch.device(device), kernels="triton")
    fast.load_state_dict(reference.state_dict())
    stream = mode == "bf16-stream"
    reference.set_forward_options(ForwardOptions(autocast_residual=stream))
    fast.set_forward_options(
        ForwardOptions(autocast_residual=stream, fused_loss=True, fused_loss_rows=24)
    )
    fast.fuse_projections(True)
    x = torch.randint(0, config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(1))
    x = x.to(device)
    loss, grads = loss_and_grads(reference, x, mode)
    fast_loss, fast_grads = loss_and_grads(fast, x, mode)
    assert grads.keys() == fast_grads.keys()
    err = max(
        ((fast_grads[n] - g).norm() / g.norm().clamp_min(1e-12)).item() for n, g in grads.items()
    )
    return {"loss": loss, "triton_loss": fast_loss, "max_grad_rel_err": err}


def main(device: str, cases: list[str]) -> None:
    for case in cases:
        preset, mode = case.split(":")
        print(json.dumps({"preset": preset, "mode": mode, **compare(preset, device, mode)}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
