"""The units-digit probe behind benchmarks/post_training.py's open problem: the same task for an
ats-model Transformer and for torch's nn.TransformerEncoder of the same width, depth, heads and
FFN size. Each reads `a1 a0 + b1 b0 =` (one token per digit) and is trained, with the loss on
the last position only, to predict (a0 + b0) mod 10 (`--target sum`), the first digit the
post-training demo's worked answer writes, or to copy a0 there (`--target copy`), which needs
the same attention to the operand without the arithmetic. `--learners hf` adds HF transformers'
LlamaForCausalLM of the same shape (the architecture ats-model exports to; RoPE, RMSNorm,
SwiGLU). Prints accuracy on fresh batches; `--lr` is AdamW's (constant).

    uv run python benchmarks/units_digit_probe.py --steps 500 --seeds 0,1 --lr 3e-4
    uv run python benchmarks/units_digit_probe.py --lr 3e-3 --learners ats,hf
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from ats_model import ModelConfig, build_model
from torch import nn

PLUS, EQUALS, VOCAB = 10, 11, 16


class TorchEncoder(nn.Module):
    """nn.TransformerEncoder, causal, pre-norm, learned absolute positions, ReLU FFN."""

    def __init__(self, dim: int, n_layer: int, n_head: int, ffn_dim: int) -> None:
        super().__init__()
        self.emb, self.pos = nn.Embedding(VOCAB, dim), nn.Embedding(16, dim)
        layer = nn.TransformerEncoderLayer(
            dim, n_head, ffn_dim, dropout=0.0, batch_first=True, norm_first=True
        )
        self.enc = nn.TransformerEncoder(layer, n_layer, enable_nested_tensor=False)
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        h = self.emb(x) + self.pos(torch.arange(T, device=x.device))  # (B, T, C)
        mask = nn.Transformer.generate_square_subsequent_mask(T, device=x.device)
        return self.head(self.enc(h, mask=mask, is_causal=True))  # (B, T, V)


def batch(n: int, target: str, g: torch.Generator) -> torch.Tensor:
    """(n, 7): a1 a0 + b1 b0 = y."""
    d = torch.randint(0, 10, (n, 4), generator=g)  # a1 a0 b1 b0
    y = (d[:, 1] + d[:, 3]) % 10 if target == "sum" else d[:, 1]
    plus, equals = torch.full((n,), PLUS), torch.full((n,), EQUALS)
    return torch.stack([d[:, 0], d[:, 1], plus, d[:, 2], d[:, 3], equals, y], dim=1)


def hf_llama(dim: int, n_layer: int, n_head: int, n_kv_head: int, ffn_dim: int) -> nn.Module:
    # benchmarks/kernels.py, on sys.path as this script's folder, would pass for the `kernels`
    # package that transformers probes for, and its imports fail
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    from transformers.models.llama import modeling_llama  # a test dependency of ats-model

    config = modeling_llama.LlamaConfig(
        vocab_size=VOCAB, hidden_size=dim, num_hidden_layers=n_layer, num_attention_heads=n_head,
        num_key_value_heads=n_kv_head, intermediate_size=ffn_dim, max_position_embeddings=16,
        tie_word_embeddings=False, attn_implementation="sdpa",
    )  # fmt: skip
    return modeling_llama.LlamaForCausalLM(config)


def train(
    model: nn.Module, logits_of, target: str, steps: int, seed: int, lr: float
) -> list[float]:
    """Accuracy on 512 fresh problems every 100 steps."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    out = []
    for step in range(1, steps + 1):
        x = batch(64, target, g)
        loss = nn.functional.cross_entropy(logits_of(model, x[:, :-1])[:, -1], x[:, -1])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0:
            with torch.no_grad():
                x = batch(512, target, g)
                right = logits_of(model, x[:, :-1])[:, -1].argmax(-1) == x[:, -1]
            out.append(round(float(right.float().mean()), 3))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--target", choices=["sum", "copy"], default="sum")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW's, constant")
    parser.add_argument("--learners", default="ats,torch", help="of ats, torch, hf")
    args = parser.parse_args(argv)
    learners = args.learners.split(",")
    # the post-training demo's --scale cpu model
    dim, n_layer, n_head, n_kv_head, ffn_dim = 128, 4, 4, 2, 384
    for seed in (int(s) for s in args.seeds.split(",")):
        results = {}
        for learner in learners:
            torch.manual_seed(seed)
            if learner == "ats":
                config = ModelConfig(vocab_size=VOCAB, dim=dim, n_layer=n_layer, n_head=n_head,
                                     n_kv_head=n_kv_head, ffn_dim=ffn_dim, max_seq_len=16)  # fmt: skip
                model, logits_of = build_model(config), lambda m, x: m(x).logits
            elif learner == "torch":
                model, logits_of = TorchEncoder(dim, n_layer, n_head, ffn_dim), lambda m, x: m(x)
            elif learner == "hf":
                model = hf_llama(dim, n_layer, n_head, n_kv_head, ffn_dim)
                logits_of = lambda m, x: m(input_ids=x).logits  # noqa: E731
            else:
                raise SystemExit(f"unknown learner {learner!r}: ats, torch or hf")
            results[learner] = train(model, logits_of, args.target, args.steps, seed, args.lr)
        print(f"seed {seed} target {args.target} lr {args.lr:g}: accuracy every 100 steps, "
              + ", ".join(f"{k} {v}" for k, v in results.items()), flush=True)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
