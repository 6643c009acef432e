"""How one configuration is measured: the job's measurements (measure.py), the timers
(timing.py), memory peaks (memory.py), the time and memory budgets (budget.py), the allocator
setting (allocator.py), where a record was measured (provenance.py), decoding (decode.py) and the
trained reference model whose activations the approximation error is measured on
(reference_model.py). Importing it starts nothing."""
