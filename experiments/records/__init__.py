"""The records every floor shares: the record schema (record.py), the sweep's store of records
(store.py), each job's per-step history (history.py), a record's values as one type (values.py)
and the project's one atomic write and one file lock (files.py). Analysis reads these and nothing
else of experiments; they import nothing else of it."""
