"""Preflight's local checks: what one rank can find wrong before meeting its peers.

A check is a function `(info, torch) -> dict | None` (`info`: this rank's
`lockstep.launch.detect.RankInfo`) that returns `check.result(name, status, detail)`, status
ok, warn, fail or skip, or None where it has nothing to check on this rank. Each built-in
check is a module here and a row of `registry.LOCAL_CHECKS`; a check from outside lockstep
is `registry.register(LocalCheck(...))`, called in every rank's process before `lockstep
preflight` runs there. The report shows every check's row; a `fail` fails the preflight.
"""
