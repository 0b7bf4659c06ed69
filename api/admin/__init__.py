"""The endpoints around generation: /v1/models, /tokenize and /detokenize, LoRA load/unload,
/health and /version, /metrics; their shapes in protocol.py."""
