#!/usr/bin/env python3
"""Write the SmolLM2 GGUF as a Hugging Face folder (float32 safetensors, config, tokenizer) for
../shared/bench/hf_baseline.py.

Why not ../shared/bench/convert_gguf_to_hf.py: with transformers >= 5 a model loaded from GGUF
keeps its GGUF quantizer attached and `save_pretrained` refuses it ("quantized with gguf and is
not serializable"), although the weights are already dequantized to float32. This script drops
that marker before saving; the numbers written are the same dequantized Q4_1 values.

Usage: python benchmarks/hf_export.py GGUF_FILE OUT_DIR
"""

from __future__ import annotations

import os
import sys

from transformers import AutoModelForCausalLM, AutoTokenizer


def export(gguf_path: str, out_dir: str) -> None:
    """Dequantize `gguf_path` through transformers and save it under `out_dir` (about 0.5 GB)."""
    folder, name = os.path.split(os.path.abspath(gguf_path))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


if __name__ == "__main__":
    export(sys.argv[1], sys.argv[2])
