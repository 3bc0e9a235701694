"""ats_data."""
