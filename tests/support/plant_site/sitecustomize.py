"""A planted hang in `lockstep preflight`'s ranks (tests only), put on their PYTHONPATH: with
`PLANT_PREFLIGHT_STUCK=RANK`, rank RANK blocks in Python where the others start checking the
collectives by value (`lockstep.preflight.collectives.verify`), so they wait in its first all_reduce
until preflight's own --timeout. lockstep's `forensics/site/sitecustomize.py`, first on the
path, runs this one after installing its watcher."""

import os

if os.environ.get("PLANT_PREFLIGHT_STUCK", "") == os.environ.get("RANK", "-"):
    import time

    from lockstep.preflight import collectives

    def _stuck(dist, torch, device):
        while True:  # blocked in Python, no collective pending
            time.sleep(3600)

    collectives.verify = _stuck
