"""DPO learns a preference: on one fixed batch of pairs (rows as the CLI reads them) the loss
starts at log 2 (policy == frozen reference), falls, and every training pair ends ranked chosen
first by the implicit reward, [:, 0] of pair_batch being the chosen completion."""

import json
import math

import torch
from ats_data.records import Record
from ats_model.serialization.model_dir import load_pretrained
from ats_tokenizer import Tokenizer
from ats_train.objectives.batching import pair_batch
from ats_train.objectives.dpo import DPOObjective
from ats_train.objectives.examples import dpo_pair
from ats_train.objectives.reference import FrozenReference


def test_dpo_overfits_one_batch(base_model, rows_file) -> None:
    tok = Tokenizer.load(base_model / "tokenizer.json")
    lines = rows_file("dpo").read_text().splitlines()[:8]
    pairs = [dpo_pair(tok, Record(f"dpo:{i}", json.loads(x))) for i, x in enumerate(lines)]
    assert pairs[0].chosen.ids != pairs[0].rejected.ids
    x, y = pair_batch(pairs, tok.eos_id, None)
    torch.manual_seed(0)
    model = load_pretrained(base_model)
    objective = DPOObjective(0.5, "sigmoid", FrozenReference(load_pretrained(base_model)), [])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses, accuracies = [], []
    for _ in range(40):
        loss, _, stats = objective.losses(model, x, y, 0)
        losses.append(loss.item())
        accuracies.append(stats["rewards/accuracies"].item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert math.isclose(losses[0], math.log(2), abs_tol=1e-6)  # identical policy and reference
    assert losses[-1] < 0.2 * losses[0], losses[::5]
    assert accuracies[-1] == 1.0, accuracies[::5]
