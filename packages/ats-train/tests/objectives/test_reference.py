"""The reference policies DPO and GRPO score against: a frozen copy of the initial weights, or
(under LoRA) the training model itself with its adapters off; both give the same log-probs."""

import copy

import torch
from ats_model import build_model
from ats_model.adapters import LoRAConfig, apply_lora
from ats_model.adapters.lora import lora_modules
from ats_train.objectives.reference import AdapterDisabledReference, FrozenReference

from conftest import tiny_config


def test_adapter_disabled_reference_equals_a_frozen_copy_of_the_base() -> None:
    torch.manual_seed(0)
    base = build_model(tiny_config(300)).double()
    model = copy.deepcopy(base)
    apply_lora(model, LoRAConfig(rank=4, targets=("wq", "wv", "w1", "w2")))
    for m in lora_modules(model):  # a trained adapter: the policy differs from the base
        for name, p in m.named_parameters():
            if name.startswith("lora_"):
                torch.nn.init.normal_(p, std=0.5)
    model.train()
    ids = torch.randint(0, 300, (2, 12))
    mask = torch.ones_like(ids)
    labels = ids.roll(-1, 1)
    labels[:, -1] = -100

    frozen = FrozenReference(base).token_logprobs(ids, mask, labels)
    disabled = AdapterDisabledReference(model).token_logprobs(ids, mask, labels)
    torch.testing.assert_close(disabled, frozen, rtol=0, atol=1e-12)
    assert model.training and all(m.enabled for m in lora_modules(model))  # put back as it was
    with torch.no_grad():
        logits = model(ids, attention_mask=mask).logits
    on = torch.log_softmax(logits, -1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
    assert (on - frozen[:, :-1]).abs().max() > 1e-3
