"""ats_native: the C++ runtime of ATS, exposed through one nanobind module."""

from ats_native._ats_native import version

__all__ = ["version"]
