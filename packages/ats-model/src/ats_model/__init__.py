"""ats_model."""
