"""Which way of running the self-play nets is fastest here: the measurement behind the runner's inference path.

A runner's step asks every policy it holds for actions on its own rows: in connect four self-play
(the `connect_four` preset's net, a 256-wide shared-trunk relu MLP; 4096 boards; a learner
against 16 PFSP-drawn snapshots, as `league_selfplay_vs_pettingzoo.py` plays it) that is one
batch of ~2,500 learner rows and sixteen batches of ~100 snapshot rows per step. The rows of real
steps are recorded once (observations and masks per policy), then every candidate computes the
same masked logits for the same steps, interleaved round by round, one torch thread:

* `torch fp32, one call per policy` — one forward per policy (`ActorCritic.policy_logits`;
  the learner's rows with its value head), as `TorchPolicy` computes a net's logits;
* `torch fp32, stacked snapshots (bmm)` — the snapshots' weights stacked once, their rows padded
  to the largest group and evaluated in one `torch.baddbmm` per layer (issue 19's "one batched
  call per step");
* `torch fp32, stacked snapshots, 64-row chunks` — the same with each group cut into 64-row
  chunks, so that padding is at most 63 rows per group;
* `numpy fp32, one call per policy` — the same matmuls through numpy's BLAS;
* `torch.compile fp32, one call per policy` — inductor, dynamic batch sizes;
* `torch bf16, one call per policy` — weights and activations in bfloat16, fp32 logits
  (AVX512-BF16 here);
* `torch fp32/bf16, transposed weights, addmm` — weights stored [in, out], relu in place;
* `torch bf16, fused, one call per policy` — each net alone through `ludus.agents.nets.FusedActing`;
* `torch bf16, StackedActors` — frozen nets in bfloat16 as one `ludus.agents.nets.StackedActors`,
  either padded (`baddbmm`: stacked weights, one batched matmul per layer, groups padded to a
  multiple of `ludus.agents.torch_policy.PAD_ROWS`) or grouped (the runner's path where the kernel
  has a path for this CPU: AMX tiles or AVX512-BF16, each net's rows only, weights packed once,
  see agents/kernels.py), with the learner's net as it is (`learner unfused`) or as the runner
  runs it (`learner fused`: `ludus.agents.nets.FusedActing`, each activation inside its product,
  the policy and value heads one product);
* `torch fp32, StackedActors (grouped, avx2)` — the float32 kernel where it runs (AVX2 with FMA),
  the runner's float32 path for frozen nets;

and prints each one's time per step relative to the first. The recorded steps repeat from
round to round, and so do their batch sizes, which flatters bf16: oneDNN builds a bf16 matmul
for every new row count (`ludus.agents.torch_policy.PAD_ROWS`). Logits are not all of a runner's
step, either: sampling, and the calls themselves. So the script then plays whole self-play tasks
through `Runner.play`, interleaved: every policy asked alone in float32 (one `act` per policy,
as runners asked before `TorchPolicy.act_together`; each call samples as `act` does now), the policies asked together in float32 (one sampling pass
for all rows), and together in bfloat16 (the league's `inference_dtype`; frozen nets stacked).
With `--run RUN_DIR` (a `ludus train connect_four` run) it also measures what bf16 acting does to
the policy a learner trains on: for the run's main snapshots, over self-play positions, how far
the bf16 log-probs of the actions played are from float32's (PPO's ratio divides by the former).
Nothing here is asserted.

    python benchmarks/inference_paths.py [--steps 40] [--rounds 5] [--run RUN_DIR]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path
from typing import Callable

# One BLAS thread for numpy too (OpenBLAS starts one per core by default), as for torch: runners
# are single-threaded processes, one per core.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ludus.agents.kernels import grouped_linear_status, grouped_path  # noqa: E402
from ludus.agents.nets import ActorCritic, FusedActing, NetConfig, StackedActors, masked_logits  # noqa: E402
from ludus.agents.policy import ActBatch, ActOutput, AskedAlone  # noqa: E402
from ludus.agents.snapshot import load_snapshot  # noqa: E402
from ludus.agents.torch_policy import PAD_ROWS, TorchPolicy  # noqa: E402
from ludus.games.registry import make_vector, spec as game_spec  # noqa: E402
from ludus.league.play.backends import make_runner  # noqa: E402
from league_selfplay_vs_pettingzoo import build_task  # noqa: E402

Step = list[tuple[int, np.ndarray, np.ndarray]]
"""One runner step: (policy index, observations, masks) per policy that acted."""


class Recorder:
    """A policy that acts as its TorchPolicy does and keeps the rows it was asked about."""

    needs_history = False

    def __init__(self, index: int, policy: TorchPolicy, log: list):
        self.index, self.policy, self.log = index, policy, log

    def act(self, batch: ActBatch, rng: np.random.Generator, greedy: bool = False) -> ActOutput:
        self.log.append((self.index, np.array(batch.obs, dtype=np.float32), np.array(batch.mask, dtype=bool)))
        return self.policy.act(batch, rng, greedy)


def record_steps(nets: list[ActorCritic], boards: int, steps: int) -> list[Step]:
    """The per-policy rows of the first `steps` steps of a PFSP self-play task."""
    log: list = []
    policies = {"learner": Recorder(0, TorchPolicy(nets[0]), log)}
    for i in range(1, len(nets)):
        policies[f"snap{i - 1}"] = Recorder(i, TorchPolicy(nets[i], compute_values=False), log)
    runner = make_runner("connect_four", boards, seed=0)
    runner.play(build_task(boards, len(nets) - 1, np.random.default_rng(0), 0), policies.__getitem__)
    recorded: list[Step] = [[]]
    for entry in log:  # a new step starts when a policy index repeats or decreases
        if recorded[-1] and entry[0] <= recorded[-1][-1][0]:
            recorded.append([])
        recorded[-1].append(entry)
    return [step for step in recorded if sum(len(o) for _, o, _ in step) >= boards // 2][:steps]


def layers(net: ActorCritic) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(weight [out, in], bias [out]) of the trunk's linear layers, then the policy head."""
    linear = [m for m in net.actor_trunk if isinstance(m, torch.nn.Linear)]
    return [(m.weight.detach(), m.bias.detach()) for m in linear + [net.policy_head]]


def torch_per_policy(nets: list[ActorCritic]) -> Callable[[Step], None]:
    def run(step: Step) -> None:
        with torch.inference_mode():
            for index, obs, mask in step:
                o, m = torch.from_numpy(obs), torch.from_numpy(mask)
                if index == 0:
                    nets[0](o, m)
                else:
                    nets[index].policy_logits(o, m)
    return run


def numpy_per_policy(nets: list[ActorCritic]) -> Callable[[Step], None]:
    weights = [[(w.numpy().T.copy(), b.numpy().copy()) for w, b in layers(net)] for net in nets]
    value_head = (nets[0].value_head.weight.detach().numpy().T.copy(), nets[0].value_head.bias.detach().numpy().copy())

    def run(step: Step) -> None:
        for index, obs, mask in step:
            x = obs.reshape(len(obs), -1)
            *trunk, head = weights[index]
            for w, b in trunk:
                x = x @ w
                x += b
                np.maximum(x, 0.0, out=x)
            logits = x @ head[0] + head[1]
            np.where(mask, logits, -1e9)
            if index == 0:
                x @ value_head[0] + value_head[1]
    return run


def torch_transposed(nets: list[ActorCritic], dtype: torch.dtype) -> Callable[[Step], None]:
    """Weights stored transposed ([in, out], contiguous) in `dtype`: x @ W + b by addmm, relu in place."""
    weights = [[(w.T.contiguous().to(dtype), b.to(dtype)) for w, b in layers(net)] for net in nets]
    value_head = (nets[0].value_head.weight.detach().T.contiguous().to(dtype), nets[0].value_head.bias.detach().to(dtype))

    def run(step: Step) -> None:
        with torch.inference_mode():
            for index, obs, mask in step:
                x = torch.from_numpy(obs).reshape(len(obs), -1).to(dtype)
                *trunk, head = weights[index]
                for w, b in trunk:
                    x = torch.addmm(b, x, w).relu_()
                masked_logits(torch.addmm(head[1], x, head[0]).float(), torch.from_numpy(mask))
                if index == 0:
                    torch.addmm(value_head[1], x, value_head[0]).float()
    return run


def stacked_actors(nets: list[ActorCritic], dtype: torch.dtype, fuse_learner: bool,
                   grouped: bool) -> Callable[[Step], None]:
    """Frozen nets of one architecture as one ludus.agents.nets.StackedActors: the grouped kernel, or one
    baddbmm per layer with groups padded to the largest (rounded up to PAD_ROWS); the learner
    alone, with its activations fused into the products (ludus.agents.nets.FusedActing) or not."""
    copies = [copy.deepcopy(net).to(dtype) for net in nets]
    stack = StackedActors(copies[1:], grouped=grouped)
    learner = FusedActing(copies[0], with_values=True) if fuse_learner else copies[0]

    def run(step: Step) -> None:
        with torch.inference_mode():
            obs = [torch.zeros(0, *nets[0].spec.observation_shape)] * stack.num_nets
            masks = []
            for index, o, mask in step:
                if index == 0:
                    learner(torch.from_numpy(o), torch.from_numpy(mask))
                else:
                    obs[index - 1] = torch.from_numpy(o)
                    masks.append(mask)
            stack.policy_logits(obs, torch.from_numpy(np.concatenate(masks)), PAD_ROWS)
    return run


def fused_per_policy(nets: list[ActorCritic]) -> Callable[[Step], None]:
    """Every net alone in bf16 with its activations fused (ludus.agents.nets.FusedActing), rows padded
    to a multiple of PAD_ROWS as TorchPolicy pads them."""
    fused = [FusedActing(copy.deepcopy(net).to(torch.bfloat16), with_values=i == 0) for i, net in enumerate(nets)]

    def run(step: Step) -> None:
        with torch.inference_mode():
            for index, obs, mask in step:
                rows = -(-len(obs) // PAD_ROWS) * PAD_ROWS
                o = np.zeros((rows, *obs.shape[1:]), dtype=obs.dtype)
                m = np.ones((rows, mask.shape[1]), dtype=bool)
                o[:len(obs)], m[:len(obs)] = obs, mask
                fused[index](torch.from_numpy(o), torch.from_numpy(m))
    return run


def compiled_per_policy(nets: list[ActorCritic]) -> Callable[[Step], None]:
    forward = [torch.compile(nets[0].forward, dynamic=True)] + [
        torch.compile(net.policy_logits, dynamic=True) for net in nets[1:]]

    def run(step: Step) -> None:
        with torch.inference_mode():
            for index, obs, mask in step:
                forward[index](torch.from_numpy(obs), torch.from_numpy(mask))
    return run


def stacked(nets: list[ActorCritic], chunk: int | None) -> Callable[[Step], None]:
    """Snapshots (policies 1..K) in one baddbmm per layer; the learner alone."""
    per_net = [layers(net) for net in nets[1:]]
    stack = [(torch.stack([p[i][0].T for p in per_net]).contiguous(), torch.stack([p[i][1] for p in per_net])[:, None])
             for i in range(len(per_net[0]))]

    def run(step: Step) -> None:
        with torch.inference_mode():
            groups = []
            for index, obs, mask in step:
                if index == 0:
                    nets[0](torch.from_numpy(obs), torch.from_numpy(mask))
                    continue
                x = torch.from_numpy(obs).reshape(len(obs), -1)
                pieces = [x] if chunk is None else list(torch.split(x, chunk))
                groups += [(index - 1, piece) for piece in pieces]
            width = max(len(piece) for _, piece in groups)
            which = torch.tensor([g for g, _ in groups])
            x = torch.zeros(len(groups), width, groups[0][1].shape[1])
            for k, (_, piece) in enumerate(groups):
                x[k, :len(piece)] = piece
            for i, (w, b) in enumerate(stack):
                x = torch.baddbmm(b[which], x, w[which])
                if i < len(stack) - 1:
                    x = torch.relu(x)
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--boards", type=int, default=4096)
    parser.add_argument("--snapshots", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--steps", type=int, default=40, help="recorded steps each candidate computes per round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; each path's time is its median")
    parser.add_argument("--run", type=Path, default=None,
                        help="a connect_four run directory: also measure bf16's log-prob drift on its main snapshots")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"grouped kernel (agents/kernels.py): {grouped_linear_status()}")
    spec = game_spec("connect_four")
    config = NetConfig(hidden=(args.hidden, args.hidden), activation="relu", shared_trunk=True)
    nets = []
    for i in range(args.snapshots + 1):
        torch.manual_seed(i)
        nets.append(ActorCritic(spec, config).eval())
    steps = record_steps(nets, args.boards, args.steps)
    rows = np.mean([sum(len(o) for _, o, _ in s) for s in steps])
    learner_rows = np.mean([sum(len(o) for i, o, _ in s if i == 0) for s in steps])
    print(f"{len(steps)} recorded steps: {rows:.0f} rows per step, {learner_rows:.0f} of them the learner's, "
          f"the rest over {args.snapshots} snapshots")
    candidates = {
        "torch fp32, one call per policy": torch_per_policy(nets),
        "torch fp32, stacked snapshots (bmm)": stacked(nets, None),
        "torch fp32, stacked snapshots, 64-row chunks": stacked(nets, 64),
        "numpy fp32, one call per policy": numpy_per_policy(nets),
        "torch.compile fp32, one call per policy": compiled_per_policy(nets),
        # the nets themselves in bf16 (ActorCritic reads its input in its weights' dtype)
        "torch bf16, one call per policy": torch_per_policy([copy.deepcopy(net).to(torch.bfloat16) for net in nets]),
        "torch fp32, transposed weights, addmm": torch_transposed(nets, torch.float32),
        "torch bf16, transposed weights, addmm": torch_transposed(nets, torch.bfloat16),
        "torch bf16, fused, one call per policy": fused_per_policy(nets),
        "torch bf16, StackedActors (baddbmm), learner unfused": stacked_actors(nets, torch.bfloat16, False, False),
        "torch bf16, StackedActors (baddbmm), learner fused": stacked_actors(nets, torch.bfloat16, True, False),
    }
    if grouped_path(torch.bfloat16):
        candidates[f"torch bf16, StackedActors (grouped, {grouped_path(torch.bfloat16)}), learner fused "
                   "(the runner's path)"] = stacked_actors(nets, torch.bfloat16, True, True)
    if grouped_path(torch.float32):
        candidates[f"torch fp32, StackedActors (grouped, {grouped_path(torch.float32)}) (the runner's "
                   "float32 path)"] = stacked_actors(nets, torch.float32, False, True)
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for run in candidates.values():  # warm-up (and compilation)
        for step in steps[:3]:
            run(step)
    for _ in range(args.rounds):
        for name, run in candidates.items():
            start = time.perf_counter()
            for step in steps:
                run(step)
            times[name].append((time.perf_counter() - start) / len(steps))
    first = float(np.median(times["torch fp32, one call per policy"]))
    for name, values in times.items():
        median = float(np.median(values))
        print(f"  {name:<72} {median * 1e3:6.2f} ms per step  {first / median:5.2f}x the first")
    runner_rates(nets, args.boards, args.rounds)
    if args.run is not None:
        bf16_drift(args.run, args.boards)
    return 0


def bf16_drift(run: Path, boards: int, steps: int = 20) -> None:
    """|log pi_bf16(a|s) - log pi_fp32(a|s)| of the actions a float32 main snapshot plays against
    itself, for the middle and the last main snapshot of `run`."""
    snapshots = sorted(run.glob("snapshots/main@*"), key=lambda path: int(path.name.split("@")[1]))
    if not snapshots:
        raise SystemExit(f"inference_paths: no main snapshots under {run}/snapshots")
    for path in dict.fromkeys([snapshots[len(snapshots) // 2], snapshots[-1]]):
        net = load_snapshot(path).net
        full, half = TorchPolicy(net, dtype=torch.float32), TorchPolicy(net, dtype=torch.bfloat16)
        vec = make_vector("connect_four", boards, seed=1)
        ts = vec.reset(np.arange(boards, dtype=np.uint64))
        rng = np.random.default_rng(0)
        drift = []
        for _ in range(steps):
            seat = ts.acting.argmax(axis=1)
            rows = np.arange(boards)
            batch = ActBatch(ts.obs[rows, seat], ts.mask[rows, seat], seat, None, None)
            played = full.act(batch, rng)
            with torch.inference_mode():
                chosen = torch.from_numpy(played.actions)[:, None]
                bf16 = torch.log_softmax(half.masked_logits(batch)[0], dim=1).gather(1, chosen).squeeze(1)
            drift.append(np.abs(bf16.numpy() - played.log_probs))
            actions = np.zeros((boards, 2), dtype=np.int64)
            actions[rows, seat] = played.actions
            ts = vec.step(actions)
        gaps = np.concatenate(drift)
        ratios = np.exp(gaps)
        print(f"bf16 acting, {path.name}: |log-prob - float32's| mean {gaps.mean():.4f}, 99th percentile "
              f"{np.quantile(gaps, 0.99):.4f}, max {gaps.max():.4f}; PPO ratios off by more than 0.2: "
              f"{np.mean(ratios > 1.2):.3%} of {len(gaps)} moves")


def runner_rates(nets: list[ActorCritic], boards: int, rounds: int) -> None:
    """Whole tasks through Runner.play, interleaved: each policy asked alone (float32, as runners
    did before `act_together`), the policies asked together in float32 and in bfloat16."""
    runner = make_runner("connect_four", boards, seed=0)
    rng = np.random.default_rng(1)
    ways = {"float32, one act() per policy": (torch.float32, True),
            "float32, together (frozen nets stacked where the float32 kernel runs)": (torch.float32, False),
            "bfloat16, together (frozen nets stacked, the learner fused)": (torch.bfloat16, False)}
    rates: dict[str, list[float]] = {name: [] for name in ways}
    for r in range(rounds + 1):  # round 0 warms up
        task = build_task(4 * boards, len(nets) - 1, rng, (r + 1) * 10**6)
        for name, (dtype, alone) in ways.items():
            policies = {"learner": TorchPolicy(nets[0], dtype=dtype)}
            policies.update({f"snap{i - 1}": TorchPolicy(nets[i], compute_values=False, dtype=dtype)
                             for i in range(1, len(nets))})
            players = {pid: AskedAlone(policy) for pid, policy in policies.items()} if alone else policies
            start = time.perf_counter()
            result = runner.play(task, players.__getitem__)
            if r:
                rates[name].append(result.env_steps / (time.perf_counter() - start))
    before = float(np.median(rates["float32, one act() per policy"]))
    for name, values in rates.items():
        print(f"Runner.play, {4 * boards} matches per task, {name}: {np.median(values) / 1e3:.0f}k moves/s "
              f"({np.median(values) / before:.2f}x)")


if __name__ == "__main__":
    raise SystemExit(main())
