"""Language-model policies: the tiny GPT-2, snapshots, batched generation, masked and seeded sampling,
and loading a local Hugging Face model offline. (The pretrained SmolLM2 smoke test is opt-in:
tests/smoke_smollm.py.)"""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest
import torch

from ludus.agents.lm.generation import LMPolicy
from ludus.agents.lm.model import (
    LMError,
    LMWithValueHead,
    TinyLMConfig,
    build_tiny_lm,
    lm_architecture_mismatch,
    lm_from_snapshot_files,
    lm_state_for_snapshot,
    load_hf_causal_lm,
)
from ludus.agents.policy import ActBatch, Policy
from ludus.agents.threads import torch_threads

VOCAB = 40
PAD = 0
STOP = 7
@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """These models are tiny: per-call overhead dominates and a second intra-op thread only spins
    (badly so when other tests load the 2 cores). Restored afterwards."""
    with torch_threads(1):
        yield


SMALL = TinyLMConfig(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4)


@pytest.fixture(scope="module")
def model() -> LMWithValueHead:
    return build_tiny_lm(SMALL, seed=0)


def _prompts(rng: np.random.Generator, n: int) -> list[list[int]]:
    return [rng.integers(1, VOCAB, size=int(rng.integers(1, 12))).tolist() for _ in range(n)]


def test_tiny_gpt2_matches_reference_size_and_is_seeded():
    big = build_tiny_lm(TinyLMConfig(), seed=0)  # docs/reference.md §3: GPT-2 75/128/64/2/4 has 113k parameters
    lm_params = sum(p.numel() for p in big.lm.parameters())
    assert lm_params == 113_088
    assert sum(p.numel() for p in big.parameters()) == lm_params + 65  # value head 64 + 1
    state = torch.random.get_rng_state()
    again = build_tiny_lm(TinyLMConfig(), seed=0)
    assert torch.equal(torch.random.get_rng_state(), state)  # no global RNG state leaked
    for a, b in zip(big.state_dict().values(), again.state_dict().values()):
        assert torch.equal(a, b)
    other = build_tiny_lm(TinyLMConfig(), seed=1)
    assert not torch.equal(other.value_head.weight, big.value_head.weight)


def test_forward_shapes(model):
    logits, values, past = model(torch.randint(0, VOCAB, (3, 5)))
    assert logits.shape == (3, 5, VOCAB) and values.shape == (3, 5) and past is None


def test_snapshot_roundtrip_safetensors_and_json(model, tmp_path):
    from safetensors.torch import load as safetensors_load
    from safetensors.torch import save as safetensors_save

    parts = lm_state_for_snapshot(model)
    assert parts.extra_files == {}
    architecture = json.loads(json.dumps(parts.architecture))  # plain JSON, nothing else
    tensors = safetensors_load(safetensors_save(parts.tensors))
    rebuilt = lm_from_snapshot_files(architecture, tensors).model
    ids = torch.randint(0, VOCAB, (2, 9))
    with torch.no_grad():
        for a, b in zip(model(ids)[:2], rebuilt(ids)[:2]):
            assert torch.equal(a, b)
    # The record is the same for the same model wherever it was saved (it enters the content hash).
    assert lm_state_for_snapshot(rebuilt).architecture == parts.architecture

    # Through the snapshot writer as kind "lm" (manifest.json + weights.safetensors).
    from ludus.agents.snapshot import WEIGHTS_NAME, Lineage, read_manifest, verify_snapshot, write_snapshot
    from ludus.games.core import GameSpec

    spec = GameSpec("negotiation", 2, VOCAB, (69,), zero_sum=False, utility_sum=None, observation_dtype="int64")
    header = {"format_version": 1, "game": spec.to_json(), "game_id": spec.id, "kind": "lm",
              "architecture": parts.architecture, "lineage": Lineage().to_json()}
    ref = write_snapshot(tmp_path / "snap", header, {WEIGHTS_NAME: safetensors_save(parts.tensors)})
    assert verify_snapshot(tmp_path / "snap").snapshot_id == ref.snapshot_id
    manifest, _ = read_manifest(tmp_path / "snap")
    loaded = lm_from_snapshot_files(manifest.architecture,
                                    safetensors_load((tmp_path / "snap" / WEIGHTS_NAME).read_bytes())).model
    with torch.no_grad():
        assert torch.equal(loaded(ids)[0], model(ids)[0])


def test_snapshot_refuses_bad_records(model):
    parts = lm_state_for_snapshot(model)
    shapes = {k: tuple(t.shape) for k, t in parts.tensors.items()}
    assert lm_architecture_mismatch(parts.architecture, shapes) == ""
    wide = json.loads(json.dumps(parts.architecture))
    wide["hf_config"]["n_embd"] = 10**6  # built on the meta device: costs nothing
    assert "shape" in lm_architecture_mismatch(wide, shapes)
    with pytest.raises(LMError, match="format"):
        lm_from_snapshot_files({"format": "pickle"}, parts.tensors)
    bad_type = json.loads(json.dumps(parts.architecture))
    bad_type["hf_config"]["model_type"] = "vit"  # an image model
    with pytest.raises(LMError, match="causal LM"):
        lm_from_snapshot_files(bad_type, parts.tensors)
    with pytest.raises(LMError, match="extra files"):
        lm_from_snapshot_files(parts.architecture, parts.tensors, {"model.pkl": b"x"})


@pytest.mark.parametrize("greedy", [True, False])
def test_batched_generation_equals_naive(model, greedy):
    prompts = _prompts(np.random.default_rng(0), 9)
    assert len({len(p) for p in prompts}) > 3  # different prompt lengths: left padding matters
    batched = LMPolicy(model).generate(prompts, 20, np.random.default_rng(5), stop_token=STOP, greedy=greedy)
    naive = LMPolicy(model).generate_naive(prompts, 20, np.random.default_rng(5), stop_token=STOP, greedy=greedy)
    np.testing.assert_array_equal(batched.tokens, naive.tokens)
    np.testing.assert_array_equal(batched.lengths, naive.lengths)
    np.testing.assert_allclose(batched.log_probs, naive.log_probs, atol=1e-5)
    np.testing.assert_allclose(batched.values, naive.values, atol=1e-5)
    for i in range(len(prompts)):
        row = batched.row(i)
        assert STOP not in row[:-1]  # a row ends at its first stop token
        assert (batched.tokens[i, len(row):] == PAD).all()


@pytest.mark.parametrize("greedy", [True, False])
def test_shared_prefix_is_read_once_with_the_same_tokens(model, greedy):
    """Prompts that start alike (rules, a role's prompt): the prefix's KV cache is computed once
    and shared; the tokens, log-probs and values equal generation without reuse."""
    rng = np.random.default_rng(3)
    prefix = [int(t) for t in rng.integers(1, VOCAB, size=12)]
    prompts = [prefix + p for p in _prompts(rng, 7)] + [prefix[:5]]  # one prompt inside the prefix
    reused = LMPolicy(model).generate(prompts, 15, np.random.default_rng(5), stop_token=STOP, greedy=greedy)
    plain = LMPolicy(model).generate(prompts, 15, np.random.default_rng(5), stop_token=STOP, greedy=greedy,
                                     reuse_prefix=False)
    np.testing.assert_array_equal(reused.tokens, plain.tokens)
    np.testing.assert_array_equal(reused.lengths, plain.lengths)
    np.testing.assert_allclose(reused.log_probs, plain.log_probs, atol=1e-5)
    np.testing.assert_allclose(reused.values, plain.values, atol=1e-5)


def test_generation_agrees_with_full_forward(model):
    """KV-cache log-probs and values equal those of one full forward over prompt + generated tokens."""
    prompts = _prompts(np.random.default_rng(1), 4)
    gen = LMPolicy(model).generate(prompts, 10, np.random.default_rng(2), stop_token=None)
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([prompt + gen.row(i)])
        with torch.no_grad():
            logits, values, _ = model(ids)
        positions = range(len(prompt) - 1, ids.shape[1] - 1)
        expected = [torch.log_softmax(logits[0, p], -1)[ids[0, p + 1]].item() for p in positions]
        np.testing.assert_allclose(gen.log_probs[i], expected, atol=1e-5)
        np.testing.assert_allclose(gen.values[i], values[0, list(positions)].numpy(), atol=1e-5)


def test_masked_sampling_never_emits_an_illegal_token(model):
    rng = np.random.default_rng(3)
    policy = LMPolicy(model, pad_id=PAD)
    assert isinstance(policy, Policy)
    obs = np.zeros((500, 12), dtype=np.int64)
    lengths = rng.integers(1, 13, size=500)
    for i, n in enumerate(lengths):
        obs[i, :n] = rng.integers(1, VOCAB, size=n)
    mask = rng.random((500, VOCAB)) < 0.1
    mask[np.arange(500), rng.integers(0, VOCAB, 500)] = True
    mask.setflags(write=False)  # games hand out read-only cached masks
    obs.setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. torch's warning about non-writable arrays
        out = policy.act(ActBatch(obs, mask, np.zeros(500, np.int64)), rng)
    assert mask[np.arange(500), out.actions].all()
    assert (out.log_probs <= 0).all() and np.isfinite(out.log_probs).all()

    # Generation: only even tokens legal.
    even = np.zeros(VOCAB, bool)
    even[::2] = True
    gen = policy.generate(_prompts(rng, 16), 15, rng, stop_token=None,
                          legal_mask_fn=lambda rows, new: np.tile(even, (len(rows), 1)))
    assert (gen.tokens % 2 == 0).all()


def test_act_reads_right_padded_rows_like_unpadded_ones(model):
    rng = np.random.default_rng(4)
    prompts = _prompts(rng, 6)
    obs = np.full((6, 15), PAD, dtype=np.int64)
    for i, p in enumerate(prompts):
        obs[i, : len(p)] = p
    mask = np.ones((6, VOCAB), bool)
    out = LMPolicy(model).act(ActBatch(obs, mask, np.zeros(6, np.int64)), rng, greedy=True)
    for i, p in enumerate(prompts):
        with torch.no_grad():
            logits, values, _ = model(torch.tensor([p]))
        assert out.actions[i] == int(logits[0, -1].argmax())
        assert out.values[i] == pytest.approx(values[0, -1].item(), abs=1e-5)


def test_seeded_sampling_is_reproducible(model):
    policy = LMPolicy(model)
    prompts = _prompts(np.random.default_rng(6), 8)
    a = policy.generate(prompts, 16, np.random.default_rng(11), stop_token=None)
    b = policy.generate(prompts, 16, np.random.default_rng(11), stop_token=None)
    c = policy.generate(prompts, 16, np.random.default_rng(12), stop_token=None)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert not np.array_equal(a.tokens, c.tokens)
    obs = np.array([[3, 4, 5, 0]] * 64)
    batch = ActBatch(obs, np.ones((64, VOCAB), bool), np.zeros(64, np.int64))
    first = policy.act(batch, np.random.default_rng(9)).actions
    np.testing.assert_array_equal(first, policy.act(batch, np.random.default_rng(9)).actions)
    assert len(set(first.tolist())) > 1  # sampling, not argmax


def test_generation_refuses_too_long_prompts(model):
    with pytest.raises(ValueError, match="positions"):
        LMPolicy(model).generate([[1] * 60], 10, np.random.default_rng(0), stop_token=None)


def _word_tokenizer(words: list[str]):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>",
                                   eos_token="<eou>")


def test_load_local_hf_model_offline_with_tokenizer(model, tmp_path):
    words = ["<pad>", "<unk>", "<eou>", *[f"w{i}" for i in range(VOCAB - 3)]]
    tokenizer = _word_tokenizer(words)
    model.lm.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")

    loaded = load_hf_causal_lm(tmp_path / "m")
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    ids = torch.tensor([tokenizer("w1 w5 w9")["input_ids"]])
    assert ids.tolist() == [[4, 8, 12]]
    with torch.no_grad():
        assert torch.allclose(loaded.model(ids)[0], model(ids)[0], atol=1e-6)
    assert loaded.tokenizer("w1 w5 w9")["input_ids"] == [4, 8, 12]
    gen = LMPolicy(loaded.model).generate([[4, 8]], 5, np.random.default_rng(0), stop_token=2)
    assert 1 <= gen.lengths[0] <= 5

    # Tokenizer files travel with an "lm" snapshot and come back.
    parts = lm_state_for_snapshot(loaded.model, loaded.tokenizer)
    assert "tokenizer.json" in parts.extra_files
    again = lm_from_snapshot_files(parts.architecture, parts.tensors, parts.extra_files)
    assert again.tokenizer("w1 w5 w9")["input_ids"] == [4, 8, 12]

    # Without tokenizer files there is no tokenizer (not an invented empty one).
    model.lm.save_pretrained(tmp_path / "bare")
    assert load_hf_causal_lm(tmp_path / "bare").tokenizer is None
    # A pickled pytorch_model.bin is refused, not loaded.
    (tmp_path / "pickled").mkdir()
    model.lm.config.save_pretrained(tmp_path / "pickled")
    torch.save(model.lm.state_dict(), tmp_path / "pickled" / "pytorch_model.bin")
    with pytest.raises(LMError, match="safetensors"):
        load_hf_causal_lm(tmp_path / "pickled")
    with pytest.raises(LMError, match="no model directory"):
        load_hf_causal_lm(tmp_path / "missing")


def test_reserved_cache_layer_appends_like_a_dynamic_one():
    """agents/lm/kv_cache.py: appends written in place (within the reserve and beyond it), batch
    selection and repetition give the tensors `DynamicLayer`'s concatenation gives; reading with
    gradients through it is refused (a later append would overwrite what autograd saved)."""
    from transformers.cache_utils import DynamicLayer

    from ludus.agents.lm.kv_cache import ReservedLayer

    gen = torch.Generator().manual_seed(0)
    plain = DynamicLayer()

    def states(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        batch = plain.keys.shape[0] if plain.is_initialized else 3
        return torch.randn(batch, 2, n, 4, generator=gen), torch.randn(batch, 2, n, 4, generator=gen)

    plain.update(*states(5))
    reserved = ReservedLayer(plain.keys, plain.values, reserve=3)
    for step, n in enumerate([1, 2, 1, 4, 1]):  # 9 columns: past the reserve of 3, so it grows
        new = states(n)
        expected, got = plain.update(*new), reserved.update(*new)
        for a, b in zip(expected, got):
            assert torch.equal(a, b)
        assert reserved.get_seq_length() == plain.get_seq_length()
        if step == 2:
            for layer in (plain, reserved):
                layer.batch_select_indices(torch.tensor([2, 0]))
        if step == 3:
            for layer in (plain, reserved):
                layer.batch_repeat_interleave(2)
    assert torch.equal(reserved.keys, plain.keys) and torch.equal(reserved.values, plain.values)
    with pytest.raises(RuntimeError, match="generation only"):
        reserved.update(torch.randn(4, 2, 1, 4, requires_grad=True), torch.randn(4, 2, 1, 4))


def test_attention_over_a_shared_prefix_equals_attention_over_each_rows_copy():
    """agents/lm/kv_cache.py: one copy of the prefix read by every row's queries, merged with each
    row's own masked columns, equals SDPA over the prefix copied into every row (grouped-query
    heads, several query columns, a mask that hides some own columns)."""
    from ludus.agents.lm.kv_cache import shared_prefix_attention

    gen = torch.Generator().manual_seed(1)
    rows, heads, kv_heads, queries, own, prefix, dim = 3, 6, 2, 4, 7, 5, 8
    query = torch.randn(rows, heads, queries, dim, generator=gen)
    key, value = (torch.randn(rows, kv_heads, own, dim, generator=gen) for _ in range(2))
    prefix_kv = [tuple(torch.randn(1, kv_heads, prefix, dim, generator=gen) for _ in range(2))]
    sees = torch.rand(rows, 1, queries, own, generator=gen) < 0.6
    layer = type("Layer", (), {"layer_idx": 0, "num_key_value_groups": heads // kv_heads})()
    got, _ = shared_prefix_attention(layer, query, key, value, sees, scaling=0.3, shared_prefix=prefix_kv)

    full_key = torch.cat([prefix_kv[0][0].expand(rows, -1, -1, -1), key], dim=2).repeat_interleave(3, dim=1)
    full_value = torch.cat([prefix_kv[0][1].expand(rows, -1, -1, -1), value], dim=2).repeat_interleave(3, dim=1)
    full_mask = torch.cat([torch.ones(rows, 1, queries, prefix, dtype=torch.bool), sees], dim=3)
    expected = torch.nn.functional.scaled_dot_product_attention(query, full_key, full_value, attn_mask=full_mask,
                                                                scale=0.3)
    torch.testing.assert_close(got, expected.transpose(1, 2), atol=1e-6, rtol=1e-5)
