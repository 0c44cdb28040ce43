"""Decode steps on packed weights (agents/lm/packed.py) against the model's own forward.

`DecodeStep` runs the Llama family's layers with q/k/v and gate/up stacked, on weights packed
once for oneDNN, the LoRA adapters stacked beside. Generation takes it wherever
`DecodeStep.supports` the model; these tests compare it with the model's own forward (the path
every other model takes, and every host without oneDNN packing) on a tiny random Llama with
SmolLM2's tokenizer: the same hidden states and logits to float32 rounding, the same tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ludus.agents.lm.generation import LMPolicy
from ludus.agents.lm.packed import DecodeStep, PackedBase, packed_base, packing_status
from ludus.agents.lm.pretrained import LoRAConfig, PretrainedLMConfig, adapter_disabled, load_pretrained_lm
from ludus.agents.lm.prompt_cache import SharedPromptCache
from ludus.agents.nets import onednn_packing

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _lm(base, dtype: str = "float32", targets=ALL, activation_tokens: int = 0, seed: int = 0):
    lora = LoRAConfig(rank=4, alpha=8.0, target_modules=targets, activation_tokens=activation_tokens)
    lm = load_pretrained_lm(PretrainedLMConfig(base=str(base), lora=lora, dtype=dtype), seed=seed)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for name, parameter in lm.model.named_parameters():
            if "lora_B" in name:  # B starts at 0: give the adapters something to add
                parameter.normal_(0.0, 0.3)
    return lm


def _prompts(lm, count: int = 6) -> list[list[int]]:
    """Chat prompts sharing the system prompt, two of them asked twice (entries with 2 rows)."""
    system = "You play tic-tac-toe. Answer with the number of a free cell."
    rows = [lm.tokenizer(lm.tokenizer.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": f"Board {i}: " + "x." * i}],
        tokenize=False, add_generation_prompt=True), add_special_tokens=False)["input_ids"] for i in range(count)]
    return rows + rows[:2]


def _own_forward(monkeypatch):
    monkeypatch.setattr(DecodeStep, "supports", staticmethod(lambda model: False))


def test_the_host_says_which_path_llama_decoding_takes(tiny_bases):
    lm = _lm(tiny_bases[0])
    assert DecodeStep.supports(lm.model) == onednn_packing(torch.float32)
    assert ("packed" in packing_status(torch.float32)) == onednn_packing(torch.float32)


@pytest.mark.parametrize("activation_tokens", [0, 3])
def test_packed_steps_give_the_tokens_and_log_probs_of_the_models_own_forward(tiny_bases, monkeypatch,
                                                                              activation_tokens):
    """Greedy and sampled generation, classic and activated adapters, a shared prefix and entries
    of two rows: the same tokens, log-probs and values as the model's own forward to 1e-4."""
    lm = _lm(tiny_bases[0], activation_tokens=activation_tokens)
    policy = LMPolicy(lm.model, pad_id=lm.tokenizer.eos_token_id)
    rows = _prompts(lm)
    runs = {}
    for path in ("packed", "own"):
        if path == "own":
            _own_forward(monkeypatch)
        runs[path] = [policy.generate(rows, 10, np.random.default_rng(seed), stop_token=None, greedy=greedy)
                      for seed, greedy in ((0, True), (1, False), (2, False))]
    for packed, own in zip(runs["packed"], runs["own"]):
        np.testing.assert_array_equal(packed.tokens, own.tokens)
        np.testing.assert_allclose(packed.log_probs, own.log_probs, atol=1e-4)
        np.testing.assert_allclose(packed.values, own.values, atol=1e-4)


def _step_against_forward(lm, rows, tolerance: float) -> None:
    """Two decode steps through a shared-prefix cache: `DecodeStep` against the model's trunk."""
    assert DecodeStep.supports(lm.model)
    results = []
    with torch.inference_mode():
        for decoder in (DecodeStep(lm.model), None):
            cache = SharedPromptCache(lm.model, rows, prefix_once=True)
            cache.reserve(4)
            owner = np.zeros((cache.num_entries, 1), dtype=np.int64)
            positions = cache.prompt_length[:, None].astype(np.int64)
            tokens = np.arange(cache.num_entries, dtype=np.int64)[:, None] + 30
            first = cache.extend(tokens, owner, positions, decoder)
            second = cache.extend(tokens + 1, owner, positions + 1, decoder)
            heads = (decoder or lm.model).heads(second[:, 0])
            results.append([first, second, *heads])
    for packed, own in zip(*results):
        scale = float(own.abs().max()) or 1.0
        assert float((packed.float() - own.float()).abs().max()) <= tolerance * scale


def test_a_step_with_adapters_off_or_on_some_projections_is_the_models_forward(tiny_bases):
    lm = _lm(tiny_bases[0], targets=("q_proj", "v_proj", "down_proj"))  # stacks with and without adapters
    rows = _prompts(lm)
    _step_against_forward(lm, rows, 1e-5)
    with adapter_disabled(lm.model):
        _step_against_forward(lm, rows, 1e-5)


def test_a_bfloat16_base_decodes_packed_where_onednn_has_bf16(tiny_bases):
    lm = _lm(tiny_bases[0], dtype="bfloat16")
    if not onednn_packing(torch.bfloat16):
        assert not DecodeStep.supports(lm.model)  # this host: bfloat16 decodes with the model's own forward
        return
    _step_against_forward(lm, _prompts(lm), 1e-2)


def test_models_the_step_cannot_run_decode_with_their_own_forward(tiny_bases):
    from ludus.agents.lm.model import TinyLMConfig, build_tiny_lm

    assert not DecodeStep.supports(build_tiny_lm(TinyLMConfig(), seed=0))  # GPT-2: no Llama layers
    lm = _lm(tiny_bases[0])
    for module in lm.model.modules():  # adapter dropout while training changes every forward
        if hasattr(module, "lora_dropout"):
            module.lora_dropout["default"] = torch.nn.Dropout(0.1)
    lm.model.train()
    assert not DecodeStep.supports(lm.model)
    lm.model.eval()
    assert DecodeStep.supports(lm.model) == onednn_packing(torch.float32)


def test_the_base_is_packed_again_after_its_weights_change(tiny_bases):
    lm = _lm(tiny_bases[0])
    if not onednn_packing(torch.float32):
        assert not DecodeStep.supports(lm.model)
        return
    first = packed_base(lm.model)
    assert isinstance(first, PackedBase) and packed_base(lm.model) is first and not first.stale()
    with torch.no_grad():
        lm.model.lm.get_output_embeddings().weight.mul_(2.0)
    assert first.stale()
    again = packed_base(lm.model)
    assert again is not first and not again.stale()
    _step_against_forward(lm, _prompts(lm), 1e-5)


def test_a_model_that_decoded_packed_can_still_be_copied(tiny_bases):
    from ludus.agents.lm.model import frozen_copy

    lm = _lm(tiny_bases[0])
    LMPolicy(lm.model, pad_id=lm.tokenizer.eos_token_id).generate(_prompts(lm), 2, np.random.default_rng(0),
                                                                   stop_token=None)
    clone = frozen_copy(lm.model)  # the packed weights are held beside the model, not copied with it
    assert all(torch.equal(a, b) for a, b in zip(clone.state_dict().values(), lm.model.state_dict().values()))


def test_prompt_blocks_read_together_are_the_floats_of_each_read_alone(tiny_bases):
    """`read_blocks` (what `BaseReadings` reads with): blocks of several prompts read in one call,
    each block after the ones before it, give every block the same floats as reading its prompt
    alone, a block of one token too, and the model's own forward to float32 rounding."""
    from ludus.agents.lm.packed import reads_blocks
    from ludus.agents.lm.prompt_cache import BaseReadings

    lm = _lm(tiny_bases[0], activation_tokens=3)
    if not reads_blocks(lm.model):
        assert not onednn_packing(torch.float32)
        return
    rows = [row[:-3] for row in _prompts(lm)[:6]]
    rows.append(rows[0][:17])  # blocks of 8, 8 and one token
    together = BaseReadings(block=8)
    with torch.no_grad(), adapter_disabled(lm.model):
        read = together.read_many(lm.model, rows)
        assert together.computed == len(together.blocks) > len(rows)  # prompts that begin alike share blocks
        for row, layers in zip(rows, read):
            alone = BaseReadings(block=8).read(lm.model, row)
            assert all(torch.equal(a, b) for pair in zip(layers, alone) for a, b in zip(*pair))
            _, past = lm.model.trunk(torch.tensor([row]), None, None, torch.arange(len(row))[None], use_cache=True)
            for (keys, values), own in zip(layers, past.layers):
                for mine, theirs in ((keys, own.keys), (values, own.values)):
                    assert mine.shape == theirs.shape
                    assert float((mine - theirs).abs().max()) <= 1e-5 * float(theirs.abs().max())
