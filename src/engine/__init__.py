"""The engine: the models, drafts, loops and clocks a trial is made of, in rooms (docs/layout.md),
lowest first: the root (errors, atomic files, locks, the sampling math), models/ (corpus,
tokenizer, model, training), drafts/, decoding/ (the loops), measuring/ (timing, costs,
acceptance, the formulas), runtimes/ (eager, compiled, ONNX Runtime), huggingface/ (transformers'
loop, models from a folder, the export). A room imports only itself and the rooms before it.

Torch and what runs beside it only: torch, numpy (the tokenizer and the table drafts' rows), tqdm
(training's progress), filelock (the caches' locks), ONNX and ONNX Runtime (runtimes/) and
transformers (huggingface/). It never imports the trial or the sweep, nor hydra, omegaconf or mlflow
(tests/test_layers.py), so it can be read, benchmarked and tested on its own.
"""
