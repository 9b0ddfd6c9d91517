"""The link records rank 0 holds, pass by pass: each pass's records as columns (`Batch.cols`,
what `pairing` reads: at 64k ranks a pass holds a million records, and a dict each was seconds,
issue 38) and, where a caller asks (one rank's records, tests), as each rank's list of dicts."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

# A batch's columns (`pairing` reads them): rank, peer, round (int); intra, known (bool);
# g (gbps_out), low (gbps_low_out, else g), starved (0: none), ceiling (gbps_ceiling_out, NaN:
# none) (float); reps, starved_reps, extra_reps (int, 0: none); and per carried field
# "carried:NAME", a list of its values as they were (None: not set).


@dataclass
class Batch:
    """One pass's records: `cols` (the columns above, in rank then slot order) and `dicts()`, every
    rank's records as dicts (made on the first call)."""

    cols: dict[str, np.ndarray | list]
    make_dicts: Callable[[], dict[int, list[dict]]]
    _dicts: dict[int, list[dict]] | None = None

    def dicts(self) -> dict[int, list[dict]]:
        if self._dicts is None:
            self._dicts = self.make_dicts()
        return self._dicts


class Records(Mapping):
    """Every rank's records of the passes closed so far (rank -> its records, as dicts, made
    on first use), and the passes' `batches` as columns."""

    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self._all: dict[int, list[dict]] | None = None

    def add(self, batch: Batch) -> None:
        self.batches.append(batch)
        self._all = None

    def _dicts(self) -> dict[int, list[dict]]:
        if self._all is None:
            out: dict[int, list[dict]] = {}
            for batch in self.batches:
                for r, recs in batch.dicts().items():
                    out.setdefault(r, []).extend(recs)
            self._all = out
        return self._all

    def __getitem__(self, rank: int) -> list[dict]:
        return self._dicts()[rank]

    def __iter__(self) -> Iterator[int]:
        return iter(self._dicts())

    def __len__(self) -> int:
        return len(self._dicts())
