"""The run's random streams, all spawned from its one seed (numpy's SeedSequence).

Every stream has a fixed spawn key, so a resumed run, a run with more runners and a run on
another backend draw the same numbers for the same purpose:

* ``(0, match_id)``: the seed of one match (order-free: independent of which runner plays it);
* ``(1, 2)``: matchmaking (the planner's `np.random.Generator`, saved in every checkpoint);
* ``(1, 3, learner)``: a learner's initial weights;
* ``(1, 4, learner[, reset])``: a learner's update randomness (minibatch order), again per reset;
* ``(1, 5, iteration, shard)``: the action sampling of one runner task.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

MATCHMAKING = 2
INIT_WEIGHTS = 3
LEARNER = 4
SAMPLING = 5


def match_seed(run_seed: int, match_id: int) -> int:
    """The seed of match `match_id`: a SeedSequence child spawned by match id (order-free)."""
    state = np.random.SeedSequence(run_seed, spawn_key=(0, match_id)).generate_state(2, np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)


def stream_seed(run_seed: int, *key: int) -> int:
    """A seed for another named random stream of the run (keys above)."""
    return int(np.random.SeedSequence(run_seed, spawn_key=(1, *key)).generate_state(1, np.uint32)[0])


def rng_to_json(rng: np.random.Generator) -> dict[str, Any]:
    return json.loads(json.dumps(rng.bit_generator.state, default=int))


def rng_from_json(state: dict[str, Any]) -> np.random.Generator:
    bit_generator = getattr(np.random, state["bit_generator"])()
    bit_generator.state = state
    return np.random.Generator(bit_generator)


def rng_to_tensor(rng: np.random.Generator):
    """A generator's state as a uint8 torch tensor of its JSON (safetensors stores only tensors):
    how a learner's update randomness travels in its checkpoint state dict."""
    import torch

    data = json.dumps(rng_to_json(rng), sort_keys=True).encode("ascii")
    return torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy())


def rng_from_tensor(tensor) -> np.random.Generator:
    """The generator `rng_to_tensor` stored (PCG64, numpy's default, is the only one Ludus makes)."""
    state = json.loads(bytes(tensor.numpy().astype(np.uint8).tobytes()).decode("ascii"))
    if state.get("bit_generator") != "PCG64":
        raise ValueError(f"unexpected generator state {state.get('bit_generator')!r} in a learner checkpoint")
    return rng_from_json(state)
