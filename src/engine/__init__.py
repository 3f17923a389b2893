"""The engine: corpus, tokenizer, model, training, drafts, sampling, decoding, timing.

Torch and what runs beside it only: torch, numpy (the tokenizer and the table drafts' rows),
tqdm (training's progress) and filelock (the caches' locks). It never imports the trial or the
sweep, nor hydra, omegaconf or mlflow (tests/test_layers.py), so it can be read, benchmarked and
tested on its own.
"""
