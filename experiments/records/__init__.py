"""The records every floor shares: the record schema (record.py), the sweep's store of records
(store.py) and each job's per-step history (history.py). Analysis reads these and nothing else
of experiments; they import nothing else of it."""
