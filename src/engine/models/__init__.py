"""The target and its text: the corpus, the tokenizer, the KV-cached transformer, its training (and
the shipped default target, weights/), and its quantized copies (fake-quantized; real int8 kernels)."""
