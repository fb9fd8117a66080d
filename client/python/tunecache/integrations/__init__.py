# Owns nothing itself: the drop-ins that make a framework's own autotuner cache use tunecached,
# one module per framework (trtllm.py for TensorRT-LLM).
"""Drop-ins that route a framework's autotuner cache through tunecached."""
