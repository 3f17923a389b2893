"""Draft models. Each is built from its `conf/draft/NAME.yaml` by Hydra's instantiate."""
from .base import Draft
from .bigram import BigramDraft
from .model_draft import ModelDraft
from .quantized import QuantizedDraft

__all__ = ["Draft", "BigramDraft", "ModelDraft", "QuantizedDraft"]
