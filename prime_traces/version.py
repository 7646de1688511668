"""The version of both distributions built from this repository (prime-runs and prime-traces)."""

__version__ = "0.2.0"
