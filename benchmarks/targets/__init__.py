"""The performance targets, outside the Hydra app: `python -m benchmarks.targets` (`__main__`)
measures them and prints one table. One module per role, read top-down:

table            a row of the table (`Target`), the bounds it is judged by, the table printed and
                 written as CSV (`--csv`)
kernels          the shape every target measures at (`Shape`), the kernels timed (the registry's
                 variants and the settings the targets name), the model
call_timing      how a call is timed: fixed random inputs, one untimed call, rounds, the yardstick
peers            the public implementations the kernels are compared with (the `compare` extra)
speed            speed-ups over SDPA, FLOP rates, scaling exponents, ratios to the peers (4K-32K)
flex_compare     each fixed pattern's forward against compiled FlexAttention
step_memory      one-layer training-step peak at 64K
reversible_depth reversible depth 12 / 1 peak memory and reversible / residual step time
decode           exact decode's bandwidth, the fixed states' flat time, the window caches' size
steps            one training step per process: its wall and CPU time and peak RSS (`--step-row`)
million          one layer at 2^20 tokens per O(L) variant (`--million`)
reformer         12 LSH layers at 64K, reversible against residual (`--reformer`)

The project's own parts measure: kernels and models are built from one `variants.ModelConfig`
(by default d_model 256, 4 heads) as a model builds them, each call is timed by
`experiments.measurement.timing.time_call`, the yardstick is
`experiments.measurement.timing.matmul_call`, peak memory is
`experiments.measurement.memory.peak_memory_bytes` and exponents are `analysis.fit.fit_power_law`.
"""
