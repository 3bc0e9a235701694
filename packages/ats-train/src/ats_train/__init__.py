"""ats_train."""
