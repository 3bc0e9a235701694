"""KV cache for incremental decoding: preallocated keys/values per layer plus validity masks.

All sequences of a batch share one write position (`length`); left padding is handled by
`pad_valid` (False on pad slots). MoD layers also mark the slots whose token skipped them as
invalid in their own `valid`, so later tokens never attend to keys that were never computed.
"""

from dataclasses import dataclass

import torch

from ats_model.config import ModelConfig


@dataclass
class KVLayer:
    k: torch.Tensor  # (B, n_kv_head, L, hd)
    v: torch.Tensor  # (B, n_kv_head, L, hd)
    valid: torch.Tensor  # (B, L) bool: slot holds a key this layer computed (MoD layers)


class KVCache:
    def __init__(
        self,
        config: ModelConfig,
        batch_size: int,
        max_len: int,
        device: torch.device | str,
        dtype: torch.dtype,
    ) -> None:
        if max_len > config.max_seq_len:
            raise ValueError(
                f"KVCache: max_len = {max_len} exceeds ModelConfig.max_seq_len = {config.max_seq_len}"
            )
        shape = (batch_size, config.n_kv_head, max_len, config.head_dim)
        self.layers = [
            KVLayer(
                k=torch.zeros(shape, device=device, dtype=dtype),
                v=torch.zeros(shape, device=device, dtype=dtype),
                valid=torch.zeros(batch_size, max_len, device=device, dtype=torch.bool),
            )
            for _ in range(config.n_layer)
        ]
        self.pad_valid = torch.zeros(batch_size, max_len, device=device, dtype=torch.bool)
        self.batch_size = batch_size
        self.max_len = max_len
        self.length = 0
