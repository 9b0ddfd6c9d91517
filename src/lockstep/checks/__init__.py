"""Training invariant checks: determinism, resume, clipping, equivalence and more."""
