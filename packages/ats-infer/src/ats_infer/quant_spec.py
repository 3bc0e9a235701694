"""quantization.json, the file that makes a model directory an int8 or int4 one:

    {"format_version": 1, "bits": 8 | 4, "group_size": null (int8) | 32 | 64 | 128 (int4),
     "scheme": "symmetric", "quantized": [names of the matmul weights stored as N.q + N.scale],
     "method": "rtn" | "gptq" (how the codes were chosen; optional: the runtime reads only the
     layout)}

The layouts themselves: quantize.py. Read and written here, checked as the native loader checks it.
"""

from pathlib import Path
from typing import Any

from ats_infer.tensor_files import path_kind, read_json_object

QUANT_FILE = "quantization.json"
QUANTO_FILE = "quanto.json"  # an optimum-quanto directory (torch engine only): quanto_dir.py
METHODS = ("rtn", "gptq")  # what quantization.json records
QUANT_METHODS = ("rtn", "gptq", "quanto")  # what `ats-infer quantize --method` offers
FORMAT_VERSION = 1
SCHEME = "symmetric"
BITS = (8, 4)
GROUP_SIZES = (32, 64, 128)


def check_scheme(bits: int, group_size: int | None) -> None:
    if type(bits) is not int or bits not in BITS:
        raise ValueError(f"bits = {bits!r} is not supported: expected 8 or 4")
    if bits == 8 and group_size is not None:
        raise ValueError(f"group_size = {group_size} is for int4; int8 is per output channel")
    if bits == 4 and (type(group_size) is not int or group_size not in GROUP_SIZES):
        raise ValueError(
            f"group_size = {group_size!r} is not supported for int4: expected 32, 64 or 128"
        )


def quant_spec(
    bits: int, group_size: int | None, quantized: list[str], method: str
) -> dict[str, Any]:
    """The quantization.json object for `quantized` weights in the given scheme."""
    check_scheme(bits, group_size)
    if method not in METHODS:
        raise ValueError(f"method {method!r}: expected one of {', '.join(METHODS)}")
    return {
        "method": method,
        "format_version": FORMAT_VERSION,
        "bits": bits,
        "group_size": group_size,
        "scheme": SCHEME,
        "quantized": sorted(quantized),
    }


def read_quantization(model_dir: Path) -> dict[str, Any] | None:
    """quantization.json of a model directory (checked), or None for a float directory."""
    path = Path(model_dir) / QUANT_FILE
    if path_kind(path) == "missing":
        return None
    spec = read_json_object(path)
    for key in ("format_version", "bits", "group_size", "scheme", "quantized"):
        if key not in spec:
            raise ValueError(f"{path}: missing key {key!r}")
    version = spec["format_version"]
    if type(version) is not int or version != FORMAT_VERSION or spec["scheme"] != SCHEME:
        raise ValueError(
            f"{path}: format_version {spec['format_version']!r} / scheme {spec['scheme']!r} is "
            f"not supported: expected {FORMAT_VERSION} / {SCHEME!r}"
        )
    try:
        check_scheme(spec["bits"], spec["group_size"])
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    if spec.get("method", "rtn") not in METHODS:
        raise ValueError(
            f"{path}: method = {spec['method']!r} is not supported: expected one of "
            f"{', '.join(METHODS)}"
        )
    names = spec["quantized"]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{path}: quantized = {names!r}: expected a list of tensor names")
    return spec
