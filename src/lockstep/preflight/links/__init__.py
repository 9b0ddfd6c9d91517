"""The link stage of `lockstep preflight`: point-to-point bandwidth and latency between node
pairs, and the one slow node or link named among them.

- `stage`: the ranks' side (the rounds, the second plan through rank 0, rank 0's collection);
- `results`: each pass's readings as a sealed fixed-size row per rank, gathered to rank 0, and
  rank 0's plan for the next pass, broadcast;
- `layout`: where each rank is (host, rail) and its partner in a round;
- `measure`: the table of link measurements a pair runs (`latency`, `bandwidth`, on a `pair`);
- `schedule`: which node pairs each round measures (plain data);
- `stats`, `verdict`, `section`: the readings' robust statistics, the slow nodes and links of
  a rail, and the report's `links` section (plain data);
- `plot`: the heatmap (`--plot DIR`).
"""
