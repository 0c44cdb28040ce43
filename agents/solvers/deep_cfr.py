"""Single Deep CFR (Steinberger 2019, arXiv 1901.07621) on OpenSpiel games: a regret-based learner.

Counterfactual regret minimisation (Zinkevich et al. 2007) plays, at every information state I,
regret matching on the regrets accumulated there; the *average* of its iterates converges to a
Nash equilibrium of a two-player zero-sum game. Deep CFR (Brown et al. 2019, arXiv 1811.00164)
replaces the regret table by a network trained on sampled regrets. One CFR iteration t:

1. for each player p, `traversals` external-sampling traversals (Lanctot et al. 2009): from the
   root, chance and the other player sample one action from the current strategy sigma^t, and at
   p's own nodes every legal action is explored; each of p's nodes yields one sample
   (I, t, r) with r(a) = v(I, a) - sum_b sigma^t(b | I) v(I, b), the sampled instantaneous regret;
2. the samples join a reservoir memory (Vitter 1985) that keeps a uniform sample of all samples
   of all iterations;
3. the advantage net is trained on the memory with loss sum w_t (A(I) - r)^2 over legal actions,
   so it estimates the average regret, whose regret matching is sigma^{t+1}
   (`ludus.agents.nets.regret_matching_logits`, the net's 'regret_matching' head); w_t = 1 as vanilla
   CFR, or t as linear CFR (Brown and Sandholm 2019; `linear_weighting`).

Single Deep CFR drops Deep CFR's second network (the average strategy): the average strategy is
the mixture of the iterates sigma^t (weighted as their regrets were), each sampled once per game,
which plays exactly the reach-weighted average (Steinberger 2019, Theorem 1). In a league, every
snapshot of an 'sdcfr' learner is an iterate and the league's output policy `uniform_average`
(or `average`, the k-th snapshot weighing k, for linear weighting) is that mixture
(league/output.py). On Leduc poker the uniform pair was the better one (docs/league.md).

Here one net acts for every seat (OpenSpiel's information-state tensors name the player), is
trained on every seat's samples, and is trained on from the previous iteration's weights instead
of retrained from scratch as in the papers (200 minibatch steps per iteration instead of
thousands; the from-scratch variant was not measured here). Traversals walk pyspiel states directly (they
need the game tree: chance, undo by branching), so the learner draws its own data; the league's
matches rate its snapshots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pyspiel
import torch

from ludus.agents.nets import ActorCritic
from ludus.agents.ppo_core import TorchAdam, prefixed
from ludus.bounds import bounds


@dataclass(frozen=True)
class DeepCFRConfig:
    """Single Deep CFR's settings (the `cfr` keys of a league config with `learner: sdcfr`);
    the defaults are the Leduc poker recipe measured in docs/league.md."""

    iterations_per_update: int = field(default=5, metadata=bounds(1, 10**6))
    """CFR iterations per league update (each: traversals for every seat, then training); the
    league snapshots after an update, so this is also the spacing of the averaged iterates."""
    traversals: int = field(default=300, metadata=bounds(1, 10**9))
    """External-sampling traversals per seat per CFR iteration."""
    train_steps: int = field(default=200, metadata=bounds(1, 10**9))
    """Minibatch steps of the advantage net per CFR iteration (on the whole memory)."""
    batch_size: int = field(default=512, metadata=bounds(1, 10**7))
    """Samples per minibatch step."""
    learning_rate: float = field(default=1e-3, metadata=bounds(0, 1, low_open=True))
    """Adam step size of the advantage net."""
    memory_size: int = field(default=400_000, metadata=bounds(1, 10**10))
    """Capacity of the reservoir memory of regret samples (all seats together); the league
    checkpoints it with the learner every update (~14 MB per 100k samples of Leduc poker)."""
    linear_weighting: bool = False
    """Weigh each regret sample by its iteration t in the loss (linear CFR, Brown and Sandholm
    2019; pair it with `output_policy: average`); False: every sample alike, vanilla CFR's regrets
    (with `output_policy: uniform_average`)."""

    def __post_init__(self) -> None:
        for name in ("iterations_per_update", "traversals", "train_steps", "batch_size", "memory_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"cfr.{name} must be >= 1, got {getattr(self, name)}")
        if not self.learning_rate > 0:
            raise ValueError(f"cfr.learning_rate must be > 0, got {self.learning_rate}")


class ReservoirMemory:
    """A uniform sample of at most `capacity` of all rows ever added (reservoir sampling,
    Vitter 1985, algorithm R): once full, the n-th row replaces a random slot with probability
    capacity / n."""

    def __init__(self, capacity: int, obs_dim: int, num_actions: int):
        self.capacity = capacity
        self.size = 0
        self.seen = 0
        # storage grows by doubling up to `capacity` (a checkpoint stores only the filled rows)
        self.obs = np.zeros((0, obs_dim), np.float32)
        self.regrets = np.zeros((0, num_actions), np.float32)
        self.mask = np.zeros((0, num_actions), bool)
        self.iteration = np.zeros(0, np.float32)

    def __len__(self) -> int:
        return self.size

    def add(self, obs: np.ndarray, regrets: np.ndarray, mask: np.ndarray, iteration: float,
            rng: np.random.Generator) -> None:
        n = len(obs)
        room = min(self.capacity - self.size, n)
        if room:  # not full yet: append
            self._reserve(self.size + room)
            self._put(np.arange(self.size, self.size + room), obs[:room], regrets[:room], mask[:room], iteration)
            self.size += room
        if room < n:
            # the i-th new row is row number seen + i (0-based) of all rows: it takes slot j ~ U[0, seen + i]
            # if j < capacity; a later row drawing the same slot overwrites it, as one at a time would
            rows = np.arange(room, n)
            slots = rng.integers(0, self.seen + rows + 1)
            keep = slots < self.capacity
            self._put(slots[keep], obs[rows[keep]], regrets[rows[keep]], mask[rows[keep]], iteration)
        self.seen += n

    def _reserve(self, size: int) -> None:
        if size <= len(self.iteration):
            return
        allocated = min(self.capacity, max(size, 2 * len(self.iteration)))
        for name in ("obs", "regrets", "mask", "iteration"):
            old = getattr(self, name)
            new = np.zeros((allocated, *old.shape[1:]), old.dtype)
            new[:self.size] = old[:self.size]
            setattr(self, name, new)

    def _put(self, slots, obs, regrets, mask, iteration) -> None:
        self.obs[slots], self.regrets[slots], self.mask[slots], self.iteration[slots] = obs, regrets, mask, iteration

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"obs": torch.from_numpy(self.obs[:self.size].copy()),
                "regrets": torch.from_numpy(self.regrets[:self.size].copy()),
                "mask": torch.from_numpy(self.mask[:self.size].copy()),
                "iteration": torch.from_numpy(self.iteration[:self.size].copy()),
                "seen": torch.tensor(self.seen, dtype=torch.int64)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.obs, self.regrets = state["obs"].numpy().copy(), state["regrets"].numpy().copy()
        self.mask, self.iteration = state["mask"].numpy().copy(), state["iteration"].numpy().copy()
        self.size, self.seen = len(self.iteration), int(state["seen"])


class ExternalSampler:
    """External-sampling traversals of a pyspiel game under the strategy an advantage net
    defines, recording the traverser's sampled regrets (module docstring, step 1)."""

    def __init__(self, game: pyspiel.Game, observe, net: ActorCritic, rng: np.random.Generator,
                 known_limit: int = 20_000):
        self.game, self.observe, self.net, self.rng = game, observe, net, rng
        self.num_actions = game.num_distinct_actions()
        self.samples: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._strategies: dict[bytes, np.ndarray] = {}
        # information states met so far (up to `known_limit`): each iteration evaluates them all in
        # one batched forward instead of one small forward per state (a small game's are soon all known)
        self._known: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}
        self.known_limit = known_limit
        self.nodes = 0

    def start_iteration(self) -> None:
        """The net changed: recompute the strategies of the known information states."""
        self._strategies.clear()
        if self._known:
            obs, mask = (np.stack(column) for column in zip(*self._known.values()))
            for key, probs in zip(self._known, self._evaluate(obs, mask)):
                self._strategies[key] = probs

    def _evaluate(self, obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            logits = self.net.policy_logits(torch.from_numpy(obs), torch.from_numpy(mask))
            probs = torch.softmax(logits.float(), dim=-1).double().numpy()
        return probs / probs.sum(-1, keepdims=True)

    def strategy(self, obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """sigma^t at an information state, from the net (memoised per iteration by what the seat sees)."""
        key = obs.tobytes()
        probs = self._strategies.get(key)
        if probs is None:
            self._strategies[key] = probs = self._evaluate(obs[None], mask[None])[0]
            if len(self._known) < self.known_limit:
                self._known[key] = (obs, mask)
        return probs

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The known information states, in order: a restored sampler batches the same rows, so
        its strategies are the same to the last bit (an exact resume)."""
        if not self._known:
            return {}
        obs, mask = (np.stack(column) for column in zip(*self._known.values()))
        return {"known_obs": torch.from_numpy(obs), "known_mask": torch.from_numpy(mask)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self._known = {}
        if "known_obs" in state:
            for obs, mask in zip(state["known_obs"].numpy(), state["known_mask"].numpy()):
                self._known[obs.tobytes()] = (obs.copy(), mask.copy())

    def traverse(self, state: pyspiel.State, traverser: int) -> float:
        """The traverser's sampled value of `state`; records a regret sample at each of its nodes."""
        self.nodes += 1
        if state.is_terminal():
            return state.returns()[traverser]
        if state.is_chance_node():
            outcomes, probs = zip(*state.chance_outcomes())
            return self.traverse(state.child(outcomes[self.rng.choice(len(outcomes), p=probs)]), traverser)
        player = state.current_player()
        obs = self.observe(state, player)
        mask = np.zeros(self.num_actions, bool)
        legal = state.legal_actions()
        mask[legal] = True
        sigma = self.strategy(obs, mask)
        if player != traverser:
            return self.traverse(state.child(int(self.rng.choice(self.num_actions, p=sigma))), traverser)
        values = np.zeros(self.num_actions)
        for action in legal:
            values[action] = self.traverse(state.child(action), traverser)
        value = float(sigma @ values)
        self.samples.append((obs.reshape(-1), np.where(mask, values - value, 0.0).astype(np.float32), mask))
        return value

    def take_samples(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        obs, regrets, mask = (np.stack(column) for column in zip(*self.samples))
        self.samples = []
        return obs, regrets, mask


@dataclass(frozen=True)
class CFRStats:
    """What one `SDCFRLearner.update` did."""

    cfr_iterations: int
    """CFR iterations so far (t of the newest iterate)."""
    regret_loss: float
    """Mean weighted squared error of the advantage net over this update's minibatch steps."""
    samples: int
    """Regret samples drawn in this update."""
    memory: int
    """Samples held by the reservoir memory."""
    nodes: int
    """Game-tree nodes the traversals visited in this update."""


class SDCFRLearner:
    """Pure compute: `update()` runs `iterations_per_update` CFR iterations on the net."""

    def __init__(self, game: pyspiel.Game, observe, net: ActorCritic, config: DeepCFRConfig, seed: int):
        """`observe(state, seat)`: what the seat's policy sees (ludus.games.adapters.spiel.spiel_observation)."""
        if game.get_type().dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL or game.num_players() != 2:
            raise ValueError(f"Single Deep CFR here needs a sequential two-player game, not "
                             f"{game.get_type().short_name!r}")
        if net.config.head != "regret_matching":
            raise ValueError("Single Deep CFR's net needs net.head 'regret_matching' (its outputs are regrets)")
        self.game, self.net, self.config = game, net, config
        self.rng = np.random.default_rng(seed)
        self.sampler = ExternalSampler(game, observe, net, self.rng)
        obs_dim = int(np.prod(net.spec.observation_shape))
        self.memory = ReservoirMemory(config.memory_size, obs_dim, game.num_distinct_actions())
        # no gradient clipping (max norm inf): the regret targets' scale is the game's payoffs
        self.backend = TorchAdam(net.parameters(), config.learning_rate, adam_eps=1e-8, max_grad_norm=math.inf)
        self.iteration = 0
        """CFR iterations done; the net defines sigma^{iteration + 1}."""
        self.updates = 0

    def update(self) -> CFRStats:
        samples = nodes = 0
        losses: list[float] = []
        for _ in range(self.config.iterations_per_update):
            self.iteration += 1
            self.sampler.start_iteration()
            self.sampler.nodes = 0
            for traverser in range(self.game.num_players()):
                for _ in range(self.config.traversals):
                    self.sampler.traverse(self.game.new_initial_state(), traverser)
            obs, regrets, mask = self.sampler.take_samples()
            self.memory.add(obs, regrets, mask, float(self.iteration), self.rng)
            samples += len(obs)
            nodes += self.sampler.nodes
            losses.append(self._train())
        self.updates += 1
        return CFRStats(self.iteration, float(np.mean(losses)), samples, len(self.memory), nodes)

    def _train(self) -> float:
        """Fit the advantage net to the memory: min sum w_t (A(I) - r)^2 over legal actions."""
        memory, total = self.memory, 0.0
        for _ in range(self.config.train_steps):
            rows = self.rng.integers(0, len(memory), self.config.batch_size)
            obs = torch.from_numpy(memory.obs[rows])
            target = torch.from_numpy(memory.regrets[rows])
            mask = torch.from_numpy(memory.mask[rows])
            weight = torch.from_numpy(memory.iteration[rows] if self.config.linear_weighting
                                      else np.ones(len(rows), np.float32))
            error = torch.where(mask, self.net.head_outputs(obs) - target, torch.zeros_like(target))
            # normalised by the minibatch's weights: the step size does not grow with t
            loss = (weight[:, None] * error ** 2).sum() / weight.sum()
            self.backend.step(loss)
            total += float(loss.detach())
        return total / self.config.train_steps

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Net, optimizer, memory and counters; with `rng`'s state (which the caller stores, e.g.
        ludus.league.seeds.rng_to_tensor), everything an exact resume needs."""
        state = {f"net.{name}": tensor.detach().clone() for name, tensor in self.net.state_dict().items()}
        state.update({f"optimizer.{name}": tensor for name, tensor in self.backend.state_dict().items()})
        state.update({f"memory.{name}": tensor for name, tensor in self.memory.state_dict().items()})
        state.update({f"sampler.{name}": tensor for name, tensor in self.sampler.state_dict().items()})
        state["iteration"] = torch.tensor(self.iteration, dtype=torch.int64)
        state["updates"] = torch.tensor(self.updates, dtype=torch.int64)
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.net.load_state_dict(prefixed(state, "net."))
        self.backend.load_state_dict(prefixed(state, "optimizer."))
        self.memory.load_state_dict(prefixed(state, "memory."))
        self.sampler.load_state_dict(prefixed(state, "sampler."))
        self.iteration, self.updates = int(state["iteration"]), int(state["updates"])
