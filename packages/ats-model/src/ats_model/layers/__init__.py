"""Shared transformer layers every family builds from: norm, RoPE, attention, FFNs, MoE, MoD, blocks."""
