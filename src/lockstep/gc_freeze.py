"""Imported last into a forkserver (`local_ranks.forkserver_context`): what the server imported
is collected once and frozen (`gc.freeze`, as Python's docs advise before fork without exec),
so a forked rank's garbage collector never walks the server's heap. Walking it wrote to every
object it visited and so copied the whole heap into each rank: about 0.7 CPU-s a rank here."""

import gc

gc.collect()
gc.freeze()
