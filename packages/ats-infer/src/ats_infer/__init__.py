"""ats_infer."""
