"""Reads, runs and the response models of the Traces service (contract §3-5, §9)."""
