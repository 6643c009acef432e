"""`python -m benchmarks.targets` (`__main__`) measures the performance targets outside the Hydra
app and prints one table, measured with the project's own parts (docs/internals-analysis.md). Roles:

table            a row of the table (`Target`), its bounds, the table printed and as CSV
kernels          the shape every target measures at (`Shape`), the kernels timed, the model
call_timing      how a call is timed: fixed random inputs, one untimed call, rounds, yardstick
peers            the public implementations the kernels are compared with (the `compare` extra)
speed            speed-ups over SDPA, FLOP rates, scaling exponents, ratios to the peers (4K-32K)
flex_compare     each fixed pattern's forward against compiled FlexAttention
step_memory      one-layer training-step peak at 64K
reversible_depth reversible depth 12 / 1 peak memory and reversible / residual step time
decode           exact decode's bandwidth, the fixed states' flat time, the window caches' size
steps            one training step per process: wall and CPU time, peak RSS (`--step-row`)
million          one layer at 2^20 tokens per O(L) variant (`--million`)
reformer         12 LSH layers at 64K, reversible against residual (`--reformer`)
"""
