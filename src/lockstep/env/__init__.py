"""Environment: fingerprint one rank, compare ranks, run the pre-launch preflight."""
