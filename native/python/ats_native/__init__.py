"""ats_native: the C++ runtime of ATS, exposed through one nanobind module.

Tokenizer fast path (contract: the ats_tokenizer package is the reference): `pretokenize`,
`BpeEncoder`, `WordCounter`, `train_bpe`.
Model runtime (issue 7; contract: briefs/native_runtime.md): `Model` (a model directory:
logits, streaming `generate` -> `Generation`, `generate_batch`), `Batch` (continuous batching:
requests start in slots of one KV cache, one forward per step), `Tokenizer` (tokenizer.json),
`cpu_features`, `cpu_peak` (measured peak multiply-adds/s), `cuda_built` (whether Model takes
device="cuda"), `quantized_matmul` (one int8/int4 matmul through the runtime's path, for tests),
`half_round` (the f16 KV cache's rounding, for tests), `threads_max` (the most threads any call
may use).
"""

from ats_native._ats_native import (
    FINISH_LENGTH,
    FINISH_NONE,
    FINISH_STOP,
    MAX_TOP_LOGPROBS,
    Batch,
    BpeEncoder,
    Generation,
    Model,
    Tokenizer,
    WordCounter,
    cpu_features,
    cpu_peak,
    cuda_built,
    half_round,
    pretokenize,
    quantized_matmul,
    threads_max,
    train_bpe,
    version,
)

__all__ = [
    "FINISH_LENGTH",
    "FINISH_NONE",
    "FINISH_STOP",
    "MAX_TOP_LOGPROBS",
    "Batch",
    "BpeEncoder",
    "Generation",
    "Model",
    "Tokenizer",
    "WordCounter",
    "cpu_features",
    "cpu_peak",
    "cuda_built",
    "half_round",
    "pretokenize",
    "quantized_matmul",
    "threads_max",
    "train_bpe",
    "version",
]
