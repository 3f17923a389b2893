"""One trial, one cell of a sweep: a config resolved into a `TrialSpec` (spec.py), its corpus,
target and draft loaded (load.py), its counters, component costs and paired timings measured
(trial.py) and rendered (render.py); and predict's probes, a cheap kind of trial (probes.py).
No Hydra, no MLflow: tracking is the sweep's.
"""
