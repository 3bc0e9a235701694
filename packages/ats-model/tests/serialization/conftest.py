"""Small random ATS models for the serialization tests: every tensor is perturbed away from its
init (norm weights included), so a swapped or dropped tensor changes the logits."""

from collections.abc import Callable

import ats_model
import pytest
import torch
from ats_model.config import ModelConfig, MoEConfig


def _dense_config(**overrides) -> ModelConfig:
    fields = dict(
        family="dense", vocab_size=97, dim=32, n_layer=2, n_head=4, n_kv_head=2, ffn_dim=48,
        max_seq_len=64, rope_theta=50000.0, norm_eps=1e-6,
    )  # fmt: skip
    return ModelConfig(**{**fields, **overrides})


def _moe_config(**moe_overrides) -> ModelConfig:
    moe = MoEConfig(**{"n_experts": 4, "top_k": 2, **moe_overrides})
    return _dense_config(family="moe", ffn_dim=24, moe=moe)


@pytest.fixture
def make_model() -> Callable[..., torch.nn.Module]:
    def make(config: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32):
        torch.manual_seed(seed)
        model = ats_model.build_model(config, dtype=dtype, kernels="reference")
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g).to(p.dtype))
        return model.eval()

    return make


def _random_ids(vocab_size: int, shape=(2, 13), seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab_size, shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def dense_config() -> Callable[..., ModelConfig]:
    """dense_config(**fields): a 2-layer GQA (4 q heads, 2 kv heads) dense config."""
    return _dense_config


@pytest.fixture
def moe_config() -> Callable[..., ModelConfig]:
    """moe_config(**moe_fields): the dense config with a 4-expert top-2 Mixtral-style FFN."""
    return _moe_config


@pytest.fixture
def random_ids() -> Callable[..., torch.Tensor]:
    return _random_ids
