"""How one configuration is measured: the job's measurements (measure.py), the timers
(timing.py), memory peaks (memory.py), the time and memory budgets (budget.py), the allocator
setting (allocator.py), where a record was measured (provenance.py), what decoding costs
(decode_cost.py), the approximation error against exact attention (approximation.py), the trained
reference model whose activations it is measured on (reference_model.py) and the fitting of a
kernel's learned state to that reference (kernel_fit.py). Importing it starts nothing."""
