"""The kernel sets this CPU can run, for tests that run one case per set (Model(kernels=...),
quantized_matmul(kernels=...)): scalar always, then what ats_native.cpu_features() reports."""

import ats_native


def available_kernels() -> list[str]:
    f = ats_native.cpu_features()
    names = ["scalar"]
    if f["avx2"] and f["fma"]:
        names.append("avx2")
    if f["avx512f"] and f["avx512bw"] and f["avx512vl"]:
        names.append("avx512")
    if f["neon"]:
        names.append("neon")
    return names
