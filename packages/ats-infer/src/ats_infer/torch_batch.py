"""The torch engine's batch for the server: the interface of ats_native.Batch (start / step /
cancel over n slots, the same events and sampling rules: logits cut to the request's vocab_limit,
logit bias, presence/frequency penalties, then greedy or temperature, top-k, top-p, a seeded draw)
over ats-model's forward with one KVCache per slot. A step runs one forward per busy slot (a
prompt chunk or one token); slots are not yet fused into one batched forward, since ats-model's
KVCache shares one write position across its batch."""

import os
from collections.abc import Sequence

import torch
from ats_model import KVCache, Transformer

FINISH_NONE, FINISH_STOP, FINISH_LENGTH = 0, 1, 2  # as ats_native
MAX_TOP_LOGPROBS = 20


class Slot:
    def __init__(self, model: Transformer, prompt: list[int], max_new: int, max_len: int,
                 device: str, sampling: dict) -> None:  # fmt: skip
        self.prompt, self.max_new, self.fed, self.produced, self.last = prompt, max_new, 0, 0, -1
        self.cache = KVCache(model.config, 1, max_len, device, next(model.parameters()).dtype)
        self.s = sampling
        self.counts: dict[int, int] = {}
        self.generator = torch.Generator(device=device).manual_seed(sampling["seed"] % 2**63)


class TorchBatch:
    def __init__(self, model: Transformer, n_slots: int, max_len: int, device: str) -> None:
        if n_slots < 1 or not 1 <= max_len <= model.config.max_seq_len:
            raise ValueError(f"a batch needs n_slots >= 1 and 1 <= max_len <= "
                             f"{model.config.max_seq_len}, got {n_slots}, {max_len}")  # fmt: skip
        self.model, self.n_slots, self.max_len, self.device = model, n_slots, max_len, device
        self.vocab = model.config.vocab_size
        self.slots: list[Slot | None] = [None] * n_slots

    def busy(self, slot: int) -> bool:
        return 0 <= slot < self.n_slots and self.slots[slot] is not None

    def start(self, slot: int, prompt: list[int], max_new_tokens: int, *, temperature: float = 0.0,
              top_k: int = 0, top_p: float = 1.0, seed: int = 0, presence_penalty: float = 0.0,
              frequency_penalty: float = 0.0, logit_bias: dict[int, float] | None = None,
              stop_tokens: list[int] = (), logprobs: bool = False, top_logprobs: int = 0,
              vocab_limit: int = 0) -> None:  # fmt: skip
        """As ats_native.Batch.start: vocab_limit N > 0 draws, argmaxes and reports logprobs over
        the ids below N only (a vocabulary padded past the tokenizer's N ids); 0 = all."""
        if not 0 <= slot < self.n_slots:
            raise ValueError(f"slot {slot} is out of range [0, {self.n_slots})")
        if self.slots[slot] is not None:
            raise ValueError(f"slot {slot} is busy")
        if not prompt or len(prompt) >= self.max_len:
            raise ValueError(f"a prompt of {len(prompt)} tokens needs 1 <= length < {self.max_len}")
        if max_new_tokens < 1 or not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError("need max_new_tokens >= 1 and top_logprobs in [0, 20]")
        if temperature < 0 or top_k < 0 or not 0 < top_p <= 1:
            raise ValueError("need temperature >= 0, top_k >= 0, top_p in (0, 1]")
        if not 0 <= vocab_limit <= self.vocab:
            raise ValueError(f"vocab_limit {vocab_limit} is out of range [0, {self.vocab}] "
                             "(0 = the whole vocabulary)")  # fmt: skip
        limit = vocab_limit or self.vocab
        bad = [t for t in prompt if not 0 <= t < self.vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is out of range [0, {self.vocab})")
        bad = [t for t in logit_bias or {} if not 0 <= t < limit]
        if bad:
            raise ValueError(f"logit_bias token id {bad[0]} is out of range [0, {limit})")
        sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed,
                    "presence": presence_penalty, "frequency": frequency_penalty,
                    "bias": dict(logit_bias or {}), "stops": set(stop_tokens),
                    "logprobs": logprobs, "top": top_logprobs, "limit": limit}  # fmt: skip
        self.slots[slot] = Slot(self.model, list(prompt), max_new_tokens, self.max_len,
                                self.device, sampling)  # fmt: skip

    def cancel(self, slot: int) -> None:
        if 0 <= slot < self.n_slots:
            self.slots[slot] = None

    @torch.no_grad()
    def step(self, prefill_budget: int = 0, wake_fds: Sequence[int] = ()) -> list[tuple]:
        if prefill_budget < 0:
            raise ValueError("prefill_budget must be >= 0 (0 = no limit)")
        for fd in wake_fds:  # as ats_native.Batch.step: one byte each before the forward pass
            try:
                os.write(fd, b"\0")
            except BlockingIOError:  # the pipe is full: a wake-up is already pending
                pass
            except OSError as err:
                raise ValueError(f"wake_fds: cannot write to fd {fd}: {err.strerror}") from err
        budget = prefill_budget or 1 << 30
        events = []
        for i, s in enumerate(self.slots):
            if s is None:
                continue
            if s.fed < len(s.prompt):
                take = min(len(s.prompt) - s.fed, budget)
                if take == 0:
                    continue
                budget -= take
                ids, s.fed = s.prompt[s.fed : s.fed + take], s.fed + take
                if s.fed < len(s.prompt):
                    self._forward(s, ids)
                    continue
            else:
                ids = [s.last]
            logits = self._forward(s, ids)  # (V,) float32
            events.append(self._sample(i, s, logits))
        return events

    def _forward(self, s: Slot, ids: list[int]) -> torch.Tensor:
        idx = torch.tensor([ids], dtype=torch.long, device=self.device)
        out = self.model(idx, kv_cache=s.cache, causal_routing=True).logits
        return out[0, -1].float()

    def _sample(self, i: int, s: Slot, raw: torch.Tensor) -> tuple:
        p = s.s
        raw = raw[: p["limit"]]  # ids past the limit are never drawn nor reported
        z = raw.clone()
        for token, b in p["bias"].items():
            z[token] += b
        for token, count in s.counts.items():
            z[token] -= p["presence"] + p["frequency"] * count
        if p["temperature"] == 0:
            token = int(torch.argmax(z))
        else:
            z = z / p["temperature"]
            if 0 < p["top_k"] < z.numel():
                z = z.masked_fill(z < torch.topk(z, p["top_k"]).values[-1], float("-inf"))
            if p["top_p"] < 1:
                sorted_z, order = torch.sort(z, descending=True)
                probs = torch.softmax(sorted_z.double(), -1)
                drop = (probs.cumsum(-1) - probs) >= p["top_p"]
                z[order[drop]] = float("-inf")
            probs = torch.softmax(z.double(), -1)
            token = int(torch.multinomial(probs, 1, generator=s.generator))
        logprob, top = 0.0, []
        if p["logprobs"]:
            lsm = torch.log_softmax(raw.double(), -1)
            logprob = float(lsm[token])
            if p["top"]:
                values, ids = torch.topk(lsm, p["top"])
                top = [(int(t), float(v)) for t, v in zip(ids, values, strict=True)]
        s.counts[token] = s.counts.get(token, 0) + 1
        s.last, s.produced = token, s.produced + 1
        finish = FINISH_NONE
        if token in p["stops"]:
            finish = FINISH_STOP
        elif s.produced >= s.max_new or s.cache.length >= self.max_len:
            finish = FINISH_LENGTH
        if finish != FINISH_NONE:
            self.slots[i] = None
        return (i, token, finish, logprob, top)
