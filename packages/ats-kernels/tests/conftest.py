"""ats-kernels tests. Without a CUDA device, TRITON_INTERPRET=1 is set here, before any test module
imports triton (transformers does, through torch), so tests/triton runs its kernels in Triton's CPU
interpreter: triton.jit reads the variable when triton.language and each kernel are decorated."""

import os

import torch

if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "1"
