"""Turn a sweep's MLflow runs into the seed's tables, cost models and figures.

Entry point: `python -m analysis.report` (see analysis/report.py).
"""
