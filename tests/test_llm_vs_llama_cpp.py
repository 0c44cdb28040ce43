"""benchmarks/llm_vs_llama_cpp.py's bookkeeping (no speed is asserted): the FLOP counts it divides by,
the peak's mix, the positions it plays, and its one-line exit without llama-cpp-python."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("llm_vs_llama_cpp", REPO / "benchmarks" / "llm_vs_llama_cpp.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _smollm2_config():
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                       num_key_value_heads=3, head_dim=64, vocab_size=49152, tie_word_embeddings=True)


def test_matmul_parameters_are_the_models_linear_weights():
    config = _smollm2_config()
    # per layer: q, o 576x576; k, v 576x192; gate, up 576x1536; down 1536x576; the tied LM head 49152x576
    per_layer = 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536
    assert bench.matmul_params(config, layers=1, head=False) == per_layer
    assert bench.matmul_params(config) == 30 * per_layer + 49152 * 576 == 134_479_872
    import torch
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert bench.matmul_params(config) == linear


def test_lora_parameters_count_the_adapters():
    import torch
    from peft import LoraConfig, inject_adapter_in_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=100)
    model = LlamaForCausalLM(config)
    inject_adapter_in_model(LoraConfig(r=4, target_modules=["q_proj", "down_proj"]), model)
    # per layer: q 64->64 (4 x 64 + 64 x 4), down 128->64 (4 x 128 + 64 x 4)
    assert bench.lora_params(model, config) == 2 * (4 * 64 + 64 * 4 + 4 * 128 + 64 * 4)


def test_peak_is_the_mix_of_the_shapes_best_rates():
    import torch
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128)
    peak, lines = bench.gemm_peak(torch, config, 8, torch.float32, repeats=2, seconds=0.004)
    assert peak > 0 and len(lines) == 5
    _, without_head = bench.gemm_peak(torch, config, 8, torch.float32, repeats=1, seconds=0.004, head=False)
    assert len(without_head) == 4 and not any(line.startswith("lm_head") for line in without_head)


def test_positions_are_distinct_and_playable():
    found = bench.positions("tic_tac_toe", 12)
    assert len({(o.tobytes(), s) for o, s, _ in found}) == 12
    assert all(np.asarray(m).any() for _, _, m in found)


def test_without_llama_cpp_it_says_how_to_install_it_in_one_line(tmp_path):
    # a package named llama_cpp that fails to import stands for a host without it
    (tmp_path / "llama_cpp").mkdir()
    (tmp_path / "llama_cpp" / "__init__.py").write_text("raise ImportError('not built')\n")
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "llm_vs_llama_cpp.py")], capture_output=True,
                            text=True, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert result.returncode == 2
    assert result.stdout.strip().splitlines() == [
        "llama_cpp is not installed: pip install llama-cpp-python (builds llama.cpp from source; not part of CI)"]
