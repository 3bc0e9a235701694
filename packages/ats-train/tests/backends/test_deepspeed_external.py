"""What the DeepSpeed backend registers with ZeRO-3 as read outside its owner's forward: checked
against the model's own structure (the readers' forwards in attention.py and ffn.py)."""

import torch
from ats_model import build_model, presets
from ats_model.layers.attention import Attention
from ats_model.layers.ffn import SwiGLUFFN
from ats_train.backends.deepspeed import external_parameters


def test_external_parameters_are_the_head_and_every_fused_projection() -> None:
    for tie in (True, False):
        config = presets.get("tiny-dense")
        config.tie_embeddings = tie
        model = build_model(config, kernels="reference")
        pairs = external_parameters(model)
        head = model.tok_embeddings if tie else model.output
        assert pairs[0][0] is model and pairs[0][1] is head.weight
        attns = [m for m in model.modules() if isinstance(m, Attention)]
        ffns = [m for m in model.modules() if isinstance(m, SwiGLUFFN)]
        want = {(id(m), id(lin.weight)) for m in attns for lin in (m.wq, m.wk, m.wv)}
        want |= {(id(m), id(lin.weight)) for m in ffns for lin in (m.w1, m.w3)}
        got = {(id(m), id(p)) for m, p in pairs[1:]}
        assert got == want and len(pairs) == 1 + 3 * len(attns) + 2 * len(ffns)
        assert attns and ffns
        # each reader owns its parameter through a child: that is why ZeRO-3 must be told
        owned = {id(p) for m, _ in pairs for p in m.parameters()}
        assert all(id(p) in owned for _, p in pairs)
        assert all(isinstance(p, torch.nn.Parameter) for _, p in pairs)
