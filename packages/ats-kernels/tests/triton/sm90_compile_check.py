"""Compiles every Triton kernel of ats_kernels.triton for sm_90 (H100/H200) without a GPU.

Run in a fresh process without TRITON_INTERPRET (test_compile_sm90.py does), so the kernels are
real JITFunctions; triton.compile lowers them through ptxas for GPUTarget("cuda", 90, 32). Catches
type and lowering errors that the CPU interpreter cannot see. Exits 1 naming each failing kernel.
"""

import importlib
import os
import sys

if os.environ.get("TRITON_INTERPRET") == "1":
    raise SystemExit("sm90_compile_check: unset TRITON_INTERPRET (kernels must be JITFunctions)")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
FAILURES: list[str] = []


def m(name: str):
    return importlib.import_module(f"ats_kernels.triton.{name}")


def comp(fn, sig: dict, consts: dict, warps: int = 4) -> None:
    try:
        triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=TARGET,
                       options={"num_warps": warps})  # fmt: skip
    except Exception as err:  # collected and reported: every kernel is tried
        FAILURES.append(f"{fn.__name__} {consts}: {type(err).__name__}: {str(err)[:1500]}")


def main() -> None:
    rn = m("rms_norm")
    for dt in ["bf16", "fp32", "fp16"]:
        comp(
            rn._rms_norm_fwd_kernel,
            {
                "X": f"*{dt}",
                "R": f"*{dt}",
                "W": f"*{dt}",
                "Y": f"*{dt}",
                "H": f"*{dt}",
                "RSTD": "*fp32",
                "stride_x": "i32",
                "stride_r": "i32",
                "stride_y": "i32",
                "stride_h": "i32",
                "M": "i32",
                "N": "i32",
                "eps": "fp32",
                "HAS_RESIDUAL": "constexpr",
                "BLOCK_M": "constexpr",
                "BLOCK_N": "constexpr",
            },
            {"HAS_RESIDUAL": True, "BLOCK_M": 2, "BLOCK_N": 4096},
            16,
        )
        comp(
            rn._rms_norm_bwd_kernel,
            {
                "DY": f"*{dt}",
                "X": f"*{dt}",
                "W": f"*{dt}",
                "RSTD": "*fp32",
                "DH": f"*{dt}",
                "DX": f"*{dt}",
                "DW_PARTIAL": "*fp32",
                "stride_dy": "i32",
                "stride_x": "i32",
                "stride_dh": "i32",
                "stride_dx": "i32",
                "M": "i32",
                "N": "i32",
                "HAS_DH": "constexpr",
                "BLOCK_M": "constexpr",
                "BLOCK_N": "constexpr",
            },
            {"HAS_DH": True, "BLOCK_M": 1, "BLOCK_N": 4096},
            8,
        )
    rp = m("rope")
    for bw in [False, True]:
        sig = {k: "*bf16" for k in ["Q", "K", "QO", "KO"]} | {"COS": "*fp32", "SIN": "*fp32"}
        for k in [
            "sqb",
            "sqh",
            "sqt",
            "skb",
            "skh",
            "skt",
            "sqob",
            "sqoh",
            "sqot",
            "skob",
            "skoh",
            "skot",
            "scb",
            "sct",
            "T",
            "n_q_heads",
            "n_k_heads",
            "half",
        ]:
            sig[k] = "i32"
        sig |= {
            "BACKWARD": "constexpr",
            "HEADS": "constexpr",
            "BLOCK_T": "constexpr",
            "BLOCK_HALF": "constexpr",
        }
        comp(rp._rope_kernel, sig, {"BACKWARD": bw, "HEADS": 8, "BLOCK_T": 32, "BLOCK_HALF": 64}, 8)
    tail = ["scb", "sct", "T", "n_q_heads", "n_k_heads", "hd", "half"]
    blocks = {"HEADS": 8, "BLOCK_T": 32, "BLOCK_HALF": 64}
    fwd = {k: "*bf16" for k in ["QKV", "QO", "KO"]} | {"COS": "*fp32", "SIN": "*fp32"}
    fwd_ints = ["sxb", "sxt", "sqob", "sqoh", "sqot", "skob", "skoh", "skot", *tail]
    fwd |= {k: "i32" for k in fwd_ints} | {k: "constexpr" for k in blocks}
    comp(rp._rope_qkv_fwd_kernel, fwd, blocks, 8)
    bwd = {k: "*bf16" for k in ["DQ", "DK", "DV", "DQKV"]} | {"COS": "*fp32", "SIN": "*fp32"}
    strides = ["sqb", "sqh", "sqt", "skb", "skh", "skt", "svb", "svh", "svt", "syb", "syt"]
    bwd |= {k: "i32" for k in [*strides, *tail]} | {k: "constexpr" for k in blocks}
    comp(rp._rope_qkv_bwd_kernel, bwd, blocks, 8)
    sw = m("swiglu")
    comp(
        sw._swiglu_fwd_kernel,
        {
            "G": "*bf16",
            "U": "*bf16",
            "Y": "*bf16",
            "stride_g": "i32",
            "stride_u": "i32",
            "stride_y": "i32",
            "M": "i32",
            "N": "i32",
            "BLOCK_M": "constexpr",
            "BLOCK_N": "constexpr",
        },
        {"BLOCK_M": 2, "BLOCK_N": 4096},
        16,
    )
    comp(
        sw._swiglu_packed_fwd_kernel,
        {
            "GU": "*bf16",
            "Y": "*bf16",
            "stride_gu": "i32",
            "stride_y": "i32",
            "M": "i32",
            "N": "i32",
            "BLOCK_M": "constexpr",
            "BLOCK_N": "constexpr",
        },
        {"BLOCK_M": 2, "BLOCK_N": 4096},
        16,
    )
    comp(
        sw._swiglu_packed_bwd_kernel,
        {
            "DY": "*bf16",
            "GU": "*bf16",
            "DGU": "*bf16",
            "stride_dy": "i32",
            "stride_gu": "i32",
            "stride_dgu": "i32",
            "M": "i32",
            "N": "i32",
            "BLOCK_M": "constexpr",
            "BLOCK_N": "constexpr",
        },
        {"BLOCK_M": 2, "BLOCK_N": 4096},
        16,
    )
    comp(
        sw._swiglu_bwd_kernel,
        {
            "DY": "*bf16",
            "G": "*bf16",
            "U": "*bf16",
            "DG": "*bf16",
            "DU": "*bf16",
            "stride_dy": "i32",
            "stride_g": "i32",
            "stride_u": "i32",
            "stride_dg": "i32",
            "stride_du": "i32",
            "M": "i32",
            "N": "i32",
            "BLOCK_M": "constexpr",
            "BLOCK_N": "constexpr",
        },
        {"BLOCK_M": 2, "BLOCK_N": 4096},
        16,
    )
    ce = m("cross_entropy")
    for lg, wl, wg in [(False, True, True), (False, True, False), (True, False, True)]:
        comp(
            ce._ce_kernel,
            {
                "L": "*bf16",
                "stride_l": "i32",
                "G": "*bf16",
                "stride_g": "i32",
                "TGT": "*i64",
                "LOSS": "*fp32",
                "LSE": "*fp32",
                "SCALE": "*fp32",
                "V": "i32",
                "ignore_index": "i32",
                "LSE_GIVEN": "constexpr",
                "WRITE_LOSS": "constexpr",
                "WRITE_GRAD": "constexpr",
                "BLOCK_V": "constexpr",
            },
            {"LSE_GIVEN": lg, "WRITE_LOSS": wl, "WRITE_GRAD": wg, "BLOCK_V": 4096},
            8,
        )
    mr = m("moe_route")
    for k, kp, E in [(2, 2, 8), (8, 8, 64), (1, 1, 8), (3, 4, 6)]:
        be = triton.next_power_of_2(E)
        comp(
            mr._moe_route_kernel,
            {
                "L": "*bf16",
                "stride_l": "i32",
                "BIAS": "*fp32",
                "W_OUT": "*bf16",
                "IDX_OUT": "*i64",
                "PROBS": "*fp32",
                "COUNTS": "*i32",
                "N": "i32",
                "E": "i32",
                "inv_temperature": "fp32",
                "TOP_K": "constexpr",
                "K_PAD": "constexpr",
                "HAS_BIAS": "constexpr",
                "NORM_TOPK": "constexpr",
                "BLOCK_N": "constexpr",
                "BLOCK_E": "constexpr",
            },
            {
                "TOP_K": k,
                "K_PAD": kp,
                "HAS_BIAS": True,
                "NORM_TOPK": True,
                "BLOCK_N": min(64, 4096 // be),
                "BLOCK_E": be,
            },
        )
    mp = m("moe_permute")
    comp(
        mp._histogram_kernel,
        {
            "IDX": "*i64",
            "HIST": "*i32",
            "n_slots": "i32",
            "E": "i32",
            "BLOCK_S": "constexpr",
            "BLOCK_E": "constexpr",
        },
        {"BLOCK_S": 128, "BLOCK_E": 64},
    )
    comp(
        mp._rank_kernel,
        {
            "IDX": "*i64",
            "BASE": "*i32",
            "POS": "*i64",
            "SORT_ORDER": "*i64",
            "n_slots": "i32",
            "E": "i32",
            "BLOCK_S": "constexpr",
            "BLOCK_E": "constexpr",
        },
        {"BLOCK_S": 128, "BLOCK_E": 64},
    )
    comp(
        mp._gather_rows_kernel,
        {
            "X": "*bf16",
            "SRC": "*i64",
            "Y": "*bf16",
            "C": "i32",
            "stride_x": "i32",
            "stride_y": "i32",
            "TOP_K": "constexpr",
            "BLOCK_C": "constexpr",
        },
        {"TOP_K": 8, "BLOCK_C": 1024},
    )
    comp(
        mp._combine_kernel,
        {
            "Y": "*bf16",
            "POS": "*i64",
            "W": "*bf16",
            "OUT": "*bf16",
            "C": "i32",
            "stride_y": "i32",
            "stride_out": "i32",
            "HAS_WEIGHTS": "constexpr",
            "TOP_K": "constexpr",
            "BLOCK_C": "constexpr",
        },
        {"HAS_WEIGHTS": True, "TOP_K": 8, "BLOCK_C": 1024},
    )
    comp(
        mp._combine_bwd_kernel,
        {
            "DOUT": "*bf16",
            "Y": "*bf16",
            "POS": "*i64",
            "W": "*bf16",
            "DY": "*bf16",
            "DW": "*bf16",
            "C": "i32",
            "stride_dout": "i32",
            "stride_y": "i32",
            "stride_dy": "i32",
            "TOP_K": "constexpr",
            "BLOCK_C": "constexpr",
        },
        {"TOP_K": 8, "BLOCK_C": 1024},
    )
    gg = m("grouped_gemm")
    for dt, f32 in [("bf16", False), ("fp32", True)]:
        comp(
            gg._gmm_kernel,
            {
                "A": f"*{dt}",
                "B": f"*{dt}",
                "OUT": f"*{dt}",
                "OFFS": "*i32",
                "TILE_END": "*i32",
                "N": "i32",
                "K": "i32",
                "E": "i32",
                "sam": "i32",
                "sak": "i32",
                "sbe": "i32",
                "sbk": "i32",
                "sbn": "i32",
                "som": "i32",
                "son": "i32",
                "FP32_IEEE": "constexpr",
                "BLOCK_E": "constexpr",
                "BM": "constexpr",
                "BN": "constexpr",
                "BK": "constexpr",
            },
            {"FP32_IEEE": f32, "BLOCK_E": 8, "BM": 64, "BN": 64, "BK": 32},
        )
        comp(
            gg._gmm_wgrad_kernel,
            {
                "A": f"*{dt}",
                "B": f"*{dt}",
                "OUT": f"*{dt}",
                "OFFS": "*i32",
                "P": "i32",
                "Q": "i32",
                "sam": "i32",
                "sap": "i32",
                "sbm": "i32",
                "sbq": "i32",
                "soe": "i32",
                "sop": "i32",
                "soq": "i32",
                "FP32_IEEE": "constexpr",
                "BP": "constexpr",
                "BQ": "constexpr",
                "BK": "constexpr",
            },
            {"FP32_IEEE": f32, "BP": 64, "BQ": 64, "BK": 32},
        )

    for failure in FAILURES:
        print("FAIL", failure)
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
