"""The sweep harness: configs (hydra), planning, launching, resume, tracking (mlflow).

It turns a composed config into engine calls and records what they measured.
"""
