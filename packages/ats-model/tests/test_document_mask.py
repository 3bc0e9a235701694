"""Packed rows (forward's document_ids): each document computes exactly as if it ran alone, and the
options that cannot honour the block-diagonal mask are refused."""

import pytest
import torch
from ats_model import build_model
from ats_model.model import document_mask, document_positions


def test_positions_restart_at_each_document() -> None:
    docs = torch.tensor([[0, 0, 0, 1, 1, 2], [5, 5, 5, 5, 5, 5]])
    assert document_positions(docs).tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]


def test_mask_is_block_diagonal_causal() -> None:
    mask = document_mask(torch.tensor([[0, 0, 1, 1]]))[0, 0].int().tolist()
    assert mask == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]


@pytest.mark.parametrize("family", ["dense", "moe"])
def test_packed_row_equals_documents_run_separately(make_config, family: str) -> None:
    config = make_config(family)
    # dropless MoE (the default): with a capacity, drops depend on the other tokens in the forward
    assert config.moe is None or config.moe.capacity_factor is None
    torch.manual_seed(0)
    model = build_model(config, dtype=torch.float64).eval()
    lengths = [5, 3, 7]
    docs = [torch.randint(0, 23, (n,)) for n in lengths]
    packed = torch.cat(docs)[None]  # (1, 15)
    doc_ids = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])[None]
    logits = model(packed, document_ids=doc_ids).logits[0]  # (15, V)
    alone = torch.cat([model(d[None]).logits[0] for d in docs])  # (15, V)
    torch.testing.assert_close(logits, alone, rtol=0, atol=1e-12)
    # and without the mask the later documents see the earlier ones: the test can fail
    assert not torch.allclose(model(packed).logits[0, 5:], alone[5:], atol=1e-6)


def test_refused_with_mod_and_with_a_cache_or_padding(make_config) -> None:
    idx = torch.randint(0, 23, (1, 6))
    docs = torch.zeros(1, 6, dtype=torch.long)
    with pytest.raises(ValueError, match="not supported by MoD layers"):
        build_model(make_config("mod"))(idx, document_ids=docs)
    model = build_model(make_config("dense"))
    with pytest.raises(ValueError, match="cannot be combined with attention_mask"):
        model(idx, document_ids=docs, attention_mask=torch.ones(1, 6))
    with pytest.raises(ValueError, match="document_ids has shape"):
        model(idx, document_ids=docs[:, :4])
