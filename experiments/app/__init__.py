"""The Hydra app around the jobs: a job measured and recorded (job.py), the one end-of-sweep
step (sweep.py), W&B tracking (tracking.py), the sweep's progress line (sweep_clock.py), the cores a
timing sweep runs on (cores.py) and what the app registers with Hydra before it composes a
config (resolvers.py). The entry point is experiments/run.py."""
