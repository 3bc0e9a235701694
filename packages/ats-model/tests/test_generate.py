"""Generation: KV-cache logits and greedy tokens equal full recomputation, left-padded batches
equal unpadded single runs, causality of the cached path, and the sampling options."""

import pytest
import torch
from ats_model import KVCache, build_model, generate

FAMILIES = ["dense", "moe", "mod", "hybrid"]


def _model(make_config, family: str):
    torch.manual_seed(0)
    return build_model(make_config(family, max_seq_len=40), dtype=torch.float64).eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_kv_cache_equals_full_recompute(make_config, family: str) -> None:
    model = _model(make_config, family)
    prompt = torch.randint(0, 23, (2, 6))
    out = generate(model, prompt, 10, temperature=0)
    assert out.shape == (2, 16) and torch.equal(out[:, :6], prompt)
    full = model(out, causal_routing=True).logits  # (2, 16, V)
    assert torch.equal(full[:, 5:-1].argmax(-1), out[:, 6:])  # greedy tokens
    cache = KVCache(model.config, 2, 16, "cpu", torch.float64)
    steps = [model(out[:, :6], kv_cache=cache).logits]
    steps += [model(out[:, t : t + 1], kv_cache=cache).logits for t in range(6, 16)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-10)
    if family in ("mod", "hybrid"):  # the predictor really skipped some tokens and kept others
        valid = cache.layers[0].valid[:, :16]
        assert 0 < valid.sum() < valid.numel()


@pytest.mark.parametrize("family", FAMILIES)
def test_left_padded_batch_equals_single_runs(make_config, family: str) -> None:
    model = _model(make_config, family)
    prompts = [torch.randint(0, 23, (n,)) for n in (7, 3, 5)]
    batch = torch.zeros(3, 7, dtype=torch.long)
    mask = torch.zeros(3, 7, dtype=torch.long)
    for b, p in enumerate(prompts):
        batch[b, 7 - len(p) :] = p
        mask[b, 7 - len(p) :] = 1
    out = generate(model, batch, 8, attention_mask=mask, temperature=0)
    for b, p in enumerate(prompts):
        single = generate(model, p, 8, temperature=0)
        assert single.dim() == 1
        assert torch.equal(out[b, 7:], single[len(p) :])


@pytest.mark.parametrize("family", ["dense", "hybrid"])
def test_cached_path_is_causal(make_config, family: str) -> None:
    model = _model(make_config, family)
    idx = torch.randint(0, 23, (1, 12))
    changed = idx.clone()
    changed[0, 8] = (changed[0, 8] + 3) % 23
    logits = []
    for seq in (idx, changed):
        cache = KVCache(model.config, 1, 12, "cpu", torch.float64)
        logits.append(
            torch.cat([model(seq[:, t : t + 1], kv_cache=cache).logits for t in range(12)], 1)
        )
    torch.testing.assert_close(logits[0][:, :8], logits[1][:, :8], rtol=0, atol=0)
    assert not torch.allclose(logits[0][:, 8:], logits[1][:, 8:])


def test_sampling_options(make_config) -> None:
    model = _model(make_config, "moe")
    prompt = torch.randint(0, 23, (2, 4))
    a = generate(model, prompt, 12, temperature=1.0, seed=3)
    b = generate(model, prompt, 12, temperature=1.0, seed=3)
    c = generate(model, prompt, 12, temperature=1.0, seed=4)
    assert torch.equal(a, b) and not torch.equal(a, c)
    greedy = generate(model, prompt, 12, temperature=0)
    assert torch.equal(generate(model, prompt, 12, temperature=0.7, top_k=1, seed=1), greedy)
    assert torch.equal(generate(model, prompt, 12, temperature=0.7, top_p=1e-9, seed=1), greedy)
    assert not model.training


def test_repetition_penalty_matches_ctrl_rule(make_config) -> None:
    model = _model(make_config, "dense")
    prompt = torch.tensor([[1, 2, 3]])
    logits = model(prompt).logits[0, -1]
    penalized = torch.where(logits > 0, logits / 50.0, logits * 50.0)
    expect = logits.clone()
    expect[[1, 2, 3]] = penalized[[1, 2, 3]]
    out = generate(model, prompt, 1, temperature=0, repetition_penalty=50.0)
    assert out[0, -1].item() == expect.argmax().item()


def test_stop_tokens_end_and_pad(make_config) -> None:
    model = _model(make_config, "dense")
    prompt = torch.randint(0, 23, (2, 4))
    greedy = generate(model, prompt, 10, temperature=0)
    stop = greedy[0, 6].item()  # sequence 0 emits it at its 3rd new token
    out = generate(model, prompt, 10, temperature=0, stop_tokens=[stop], pad_token_id=22)
    first = (out[0, 4:] == stop).nonzero()[0].item() + 4
    assert torch.equal(out[0, : first + 1], greedy[0, : first + 1])
    assert (out[0, first + 1 :] == 22).all()
    both = generate(
        model, prompt, 10, temperature=0, stop_tokens=[greedy[0, 4].item(), greedy[1, 4].item()]
    )
    assert both.shape == (2, 5)  # every sequence stopped at once


def test_bad_arguments(make_config) -> None:
    model = _model(make_config, "dense")
    ids = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="temperature = -1"):
        generate(model, ids, 2, temperature=-1)
    with pytest.raises(ValueError, match="top_p = 0"):
        generate(model, ids, 2, top_p=0)
    with pytest.raises(ValueError, match="top_k = 0"):
        generate(model, ids, 2, top_k=0)
    with pytest.raises(ValueError, match=r"max_len = 43 exceeds ModelConfig.max_seq_len = 40"):
        generate(model, ids, 40)
    with pytest.raises(ValueError, match="attention_mask shape"):
        generate(model, ids, 2, attention_mask=torch.ones(1, 2))


def test_generation_is_dropless_and_restores_the_model(make_config) -> None:
    model = _model(make_config, "moe")
    prompt = torch.randint(0, 23, (3, 5))
    dropless = generate(model, prompt, 6, temperature=0)
    for layer in model.moe_layers():
        layer.capacity_factor = 0.5  # would drop tokens of a 3-sequence decode step
        layer.bias_update_rate = 0.1
    model.train()
    assert torch.equal(generate(model, prompt, 6, temperature=0), dropless)
    assert model.training
    for layer in model.moe_layers():
        assert layer.capacity_factor == 0.5
        assert layer.expert_bias.abs().sum() == 0  # eval while generating: no bias updates
