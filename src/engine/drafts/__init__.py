"""Draft models. Each is built from its `conf/draft/NAME.yaml`: src/trial/load.py imports the class its
`_target_` names and calls it with the file's options (build_draft)."""
from .base import Draft
from .bigram import BigramDraft
from .distilled import DistilledDraft
from .heads import HeadsDraft
from .int8_kernels import Int8KernelDraft
from .model_draft import ModelDraft
from .ngram import NgramDraft
from .prompt_lookup import PromptLookupDraft
from .quantized import QuantizedDraft
from .table import TableDraft

__all__ = ["Draft", "BigramDraft", "DistilledDraft", "HeadsDraft", "Int8KernelDraft", "ModelDraft", "NgramDraft",
           "PromptLookupDraft", "QuantizedDraft", "TableDraft"]
