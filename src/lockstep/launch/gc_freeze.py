"""A forkserver's last preload: its heap collected once and frozen, so forked ranks' garbage
collectors never walk (and so copy) it. A module because a preload can only import modules.
Design: docs/design/launch.md"""

import gc

gc.collect()
gc.freeze()
