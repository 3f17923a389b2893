"""What runs a target's passes: eager PyTorch, torch.compile (engines) and ONNX Runtime
(onnx_engine), behind the one interface the loops call."""
