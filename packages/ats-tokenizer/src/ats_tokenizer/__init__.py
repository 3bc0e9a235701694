"""ats_tokenizer."""
