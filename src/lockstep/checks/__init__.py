"""Training invariant checks: `registry` names each check, one file per check holds it, the
other modules hold what the checks share. Design: docs/design/checks.md.
"""
