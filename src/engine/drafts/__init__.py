"""Draft models. Each is built from its `conf/draft/NAME.yaml` by Hydra's instantiate."""
from .base import Draft
from .bigram import BigramDraft
from .heads import HeadsDraft
from .model_draft import ModelDraft
from .quantized import QuantizedDraft

__all__ = ["Draft", "BigramDraft", "HeadsDraft", "ModelDraft", "QuantizedDraft"]
