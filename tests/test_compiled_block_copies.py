"""torch.compile must not add copies around our kernels in a training block (H200 only).

Inductor turns some layouts of a custom kernel's inputs into `clone` kernels of whole (B, T, C)
tensors: when a custom autograd.Function's backward reads the strides of its incoming gradients,
dynamo makes them contiguous first (measured: three copies per layer of the attention's dq, dk
and dv, 0.9 ms per 124M step; a torch.library custom op with a fixed stride order removed them), and a Triton kernel writing into views of one buffer makes Inductor
clone the buffer (measured: 4.6 ms per step). This compiles the blocks of a 2-layer model at the
124M width with the fused projections, runs forward and backward under bf16 autocast on cuDNN
attention, and counts the clone kernels in Inductor's generated code.
"""

import dataclasses
import io
import logging
import re

import pytest
import torch
from ats_model import ForwardOptions, build_model, presets

pytestmark = pytest.mark.gpu


def test_compiled_training_block_has_no_clone_kernels() -> None:
    # Fresh compilation, whatever ran before in this process or on this machine: the suite's
    # other compiled tests use Block.forward too, and past dynamo's recompile limit a block runs
    # eager (nothing compiled, nothing to count); a graph from Inductor's on-disk caches logs no
    # output code.
    torch._dynamo.reset()
    with (
        torch._inductor.config.patch(fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    ):
        code = _compiled_block_code()
    assert "def call(" in code, "no Inductor output code was logged: nothing was compiled"
    kernels = re.findall(r"^(triton_\w+) = async_compile\.triton\(", code, re.MULTILINE)
    assert kernels, "no Triton kernel in Inductor's output code"
    assert [k for k in kernels if "clone" in k] == []


def _compiled_block_code() -> str:
    """Inductor's output code for a forward and backward of the compiled blocks."""
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    inductor_log = logging.getLogger("torch._inductor")
    torch._logging.set_logs(output_code=True)
    inductor_log.addHandler(handler)
    try:
        config = dataclasses.replace(presets.get("124m-dense"), n_layer=2)
        model = build_model(config, device=torch.device("cuda"), kernels="triton")
        model.set_forward_options(ForwardOptions(autocast_residual=True))
        model.fuse_projections(True)
        for block in model.layers:
            block.compile()
        x = torch.randint(0, config.vocab_size, (2, 256), device="cuda")
        backend = torch.nn.attention.SDPBackend.CUDNN_ATTENTION
        with torch.autocast("cuda", dtype=torch.bfloat16), torch.nn.attention.sdpa_kernel(backend):
            model(x, targets=x).loss.backward()
        torch.cuda.synchronize()
    finally:
        inductor_log.removeHandler(handler)
        torch._logging.set_logs()
    return log.getvalue()
