"""Small configs shared by the ats-model tests (tiny sizes so float64 gradchecks stay fast)."""

import pytest
from ats_model import MoDConfig, ModelConfig, MoEConfig


def small_config(family: str = "dense", **kw) -> ModelConfig:
    base = dict(
        family=family,
        vocab_size=23,
        dim=8,
        n_layer=2,
        n_head=2,
        n_kv_head=1,
        ffn_dim=12,
        max_seq_len=32,
    )
    if family in ("moe", "hybrid"):
        base["moe"] = MoEConfig(n_experts=4, top_k=2)
    if family in ("mod", "hybrid"):
        base["mod"] = MoDConfig(capacity=0.5, placement="all", predictor_dim=4)
    base.update(kw)
    return ModelConfig(**base)


@pytest.fixture
def make_config():
    return small_config
