"""Another host's process that reaches preflight's store and nothing else: it writes, adds and
waits through `TCPStore(host, port, is_master=False)` only, as the issue's attacker did. Run as
`python forger.py HOST PORT ACTIONS` (ACTIONS: JSON, a list of ["wait", key],
["set", key, hex bytes], ["add", key, amount]; `encoded` writes it), or forked with `main`.

The values it writes come from the test: a forged envelope (signed with another key), a value
from an earlier run (the job's key, another nonce), or bytes that parse as nothing.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta


def encoded(actions: list) -> str:
    """ACTIONS as `main` reads them (bytes given as `bytes`, passed as hex)."""
    plain = [[*a[:2], *(v.hex() if isinstance(v, bytes) else v for v in a[2:])] for a in actions]
    return json.dumps(plain)


def main(host: str, port: str, actions: str) -> None:
    import socket
    import time

    import torch.distributed as dist

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the store may not serve yet (torch's retries back off)
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=60))
    print("connected", flush=True)  # the test may start the honest ranks now
    for action in json.loads(actions):
        if action[0] == "wait":
            store.wait([action[1]])
        elif action[0] == "set":
            store.set(action[1], bytes.fromhex(action[2]))
        elif action[0] == "add":
            store.add(action[1], int(action[2]))


if __name__ == "__main__":
    main(*sys.argv[1:4])
