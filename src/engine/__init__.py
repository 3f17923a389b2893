"""The engine: corpus, tokenizer, model, training, drafts, sampling, decoding, timing.

Torch only (plus tqdm for progress and filelock for the model cache): it never imports the
sweep harness (hydra, mlflow), so it can be read, benchmarked and tested on its own.
"""
