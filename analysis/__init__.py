"""Turn a sweep's MLflow runs into the seed's tables, cost models, figures and predictions. It reads
runs and fits; it never runs a model (tests/test_layers.py).

Entry point: `python -m analysis.report` (see analysis/report.py); `python -m src.predict` runs its
probes on the trial floor and predicts with analysis/prediction.py.
"""
