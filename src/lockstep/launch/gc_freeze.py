"""Imported last into a forkserver (`forkserver.start_forkserver`, which names this module in
its preload): what the server imported is collected once and frozen (`gc.freeze`, as Python's
docs advise before fork without exec), so a forked rank's garbage collector never walks the
server's heap. Walking it wrote to every object it visited and so copied the whole heap into
each rank: about 0.7 CPU-s a rank here.

A module of its own because a forkserver's preload can only import modules, and the freeze
must come after every other one of them, and never happen in the launching process."""

import gc

gc.collect()
gc.freeze()
