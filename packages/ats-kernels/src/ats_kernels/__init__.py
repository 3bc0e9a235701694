"""ats_kernels."""
