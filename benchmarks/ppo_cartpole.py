"""Wall time to reach mean return 475 on CartPole-v1: Ludus PPO through the game layer vs CleanRL.

(a) ours: `ludus.agents.rl.ppo.train_single_player("gym:CartPole-v1", ...)` — the registry's Gymnasium
    adapter, `LoopVectorGame`, `TorchPolicy`, `SeatTrajectoryBuilder` and `PPOLearner`.
(b) reference: a single-file PPO written below the way CleanRL's ppo.py is (gymnasium's
    SyncVectorEnv directly, its rollout storage and GAE loop, its update), with the same
    hyperparameters and the same 64x64 tanh actor and critic.

Both use CleanRL's defaults (4 envs x 128 steps, lr 2.5e-4 annealed over 500k steps, 4
minibatches, 4 epochs, gamma 0.99, lambda 0.95, clip 0.2, ent 0.01, vf 0.5, grad 0.5), one
torch thread, and stop once the mean return of the last 20 finished episodes reaches 475.
For each of 5 seeds both run in this process, alternating which goes first. The figure is the
median over seeds of reference_time / ours_time (>= 1.0: ours is as fast or faster).

    python benchmarks/ppo_cartpole.py [--seeds 1 2 3 4 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from ludus.agents.nets import layer_init
from ludus.agents.rl.ppo import PPOConfig, train_single_player

TARGET_RETURN = 475.0
RETURN_WINDOW = 20
TOTAL_STEPS = 500_000
NUM_ENVS = 4
NUM_STEPS = 128


@dataclass(frozen=True)
class RunResult:
    reached: bool
    steps: int
    seconds: float
    cpu_seconds: float
    """CPU time of this process: less sensitive than wall time to other load on the machine."""


class Agent(nn.Module):
    """CleanRL's PPO agent for vector observations."""

    def __init__(self, obs_dim: int, num_actions: int):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, num_actions), std=0.01),
        )

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def get_action_and_value(self, x: torch.Tensor, generator: torch.Generator, action: torch.Tensor | None = None):
        logits = self.actor(x)
        probs = torch.distributions.Categorical(logits=logits)
        if action is None:
            # Categorical.sample is torch.multinomial on the probabilities; drawn from an explicit generator.
            action = torch.multinomial(probs.probs, 1, generator=generator).squeeze(1)
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


def reference_ppo(seed: int, config: PPOConfig) -> RunResult:
    """CleanRL's ppo.py main loop (gymnasium 1.x, same-step autoreset as gym's old vector envs)."""
    start_time, start_cpu = time.perf_counter(), time.process_time()
    generator = torch.Generator().manual_seed(seed)
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1")) for _ in range(NUM_ENVS)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    obs_shape = envs.single_observation_space.shape
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        agent = Agent(int(np.prod(obs_shape)), int(envs.single_action_space.n))
    optimizer = torch.optim.Adam(agent.parameters(), lr=config.learning_rate, eps=config.adam_eps)
    batch_size = NUM_ENVS * NUM_STEPS
    minibatch_size = batch_size // config.num_minibatches

    obs = torch.zeros((NUM_STEPS, NUM_ENVS) + obs_shape)
    actions = torch.zeros((NUM_STEPS, NUM_ENVS))
    logprobs = torch.zeros((NUM_STEPS, NUM_ENVS))
    rewards = torch.zeros((NUM_STEPS, NUM_ENVS))
    dones = torch.zeros((NUM_STEPS, NUM_ENVS))
    values = torch.zeros((NUM_STEPS, NUM_ENVS))

    global_step = 0
    episode_returns: list[float] = []
    next_obs, _ = envs.reset(seed=[seed + i for i in range(NUM_ENVS)])
    next_obs = torch.Tensor(next_obs)
    next_done = torch.zeros(NUM_ENVS)
    num_updates = TOTAL_STEPS // batch_size
    for update in range(1, num_updates + 1):
        if config.anneal_lr:
            optimizer.param_groups[0]["lr"] = (1.0 - (update - 1.0) / num_updates) * config.learning_rate

        for step in range(NUM_STEPS):
            global_step += NUM_ENVS
            obs[step] = next_obs
            dones[step] = next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs, generator)
                values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob

            next_obs, reward, terminations, truncations, infos = envs.step(action.numpy())
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = torch.tensor(reward).view(-1)
            next_obs, next_done = torch.Tensor(next_obs), torch.Tensor(next_done)

            if "final_info" in infos:
                finished = infos["final_info"]["_episode"]
                episode_returns.extend(infos["final_info"]["episode"]["r"][finished].tolist())
                if (len(episode_returns) >= RETURN_WINDOW
                        and np.mean(episode_returns[-RETURN_WINDOW:]) >= TARGET_RETURN):
                    envs.close()
                    return RunResult(True, global_step, time.perf_counter() - start_time,
                                     time.process_time() - start_cpu)

        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards)
            lastgaelam = 0
            for t in reversed(range(NUM_STEPS)):
                if t == NUM_STEPS - 1:
                    nextnonterminal = 1.0 - next_done
                    nextvalues = next_value
                else:
                    nextnonterminal = 1.0 - dones[t + 1]
                    nextvalues = values[t + 1]
                delta = rewards[t] + config.gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + config.gamma * config.gae_lambda * nextnonterminal * lastgaelam
            returns = advantages + values

        b_obs = obs.reshape((-1,) + obs_shape)
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape(-1)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)

        for epoch in range(config.update_epochs):
            b_inds = torch.randperm(batch_size, generator=generator)
            for start in range(0, batch_size, minibatch_size):
                mb_inds = b_inds[start:start + minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(
                    b_obs[mb_inds], generator, b_actions.long()[mb_inds])
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()

                mb_advantages = b_advantages[mb_inds]
                if config.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - config.clip_coef, 1 + config.clip_coef)
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                newvalue = newvalue.view(-1)
                v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                v_clipped = b_values[mb_inds] + torch.clamp(
                    newvalue - b_values[mb_inds], -config.clip_coef, config.clip_coef)
                v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()

                entropy_loss = entropy.mean()
                loss = pg_loss - config.ent_coef * entropy_loss + v_loss * config.vf_coef

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), config.max_grad_norm)
                optimizer.step()
    envs.close()
    return RunResult(False, global_step, time.perf_counter() - start_time, time.process_time() - start_cpu)


def ours_ppo(seed: int, config: PPOConfig) -> RunResult:
    start_cpu = time.process_time()
    result = train_single_player("gym:CartPole-v1", config, TOTAL_STEPS, seed, num_envs=NUM_ENVS,
                                 num_steps=NUM_STEPS, target_return=TARGET_RETURN, return_window=RETURN_WINDOW)
    return RunResult(result.reached_target, result.steps, result.seconds, time.process_time() - start_cpu)


def _time(run: RunResult) -> float:
    return run.seconds if run.reached else float("inf")


def _cpu_time(run: RunResult) -> float:
    return run.cpu_seconds if run.reached else float("inf")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = PPOConfig()

    ratios, cpu_ratios, our_times, reference_times = [], [], [], []
    print(f"{'seed':>4} {'ours steps':>10} {'ours s':>7} {'ours cpu':>8} {'ours sps':>8} {'ref steps':>10} "
          f"{'ref s':>7} {'ref cpu':>8} {'ref sps':>8} {'ref/ours':>8}")
    for index, seed in enumerate(args.seeds):
        if index % 2 == 0:
            ours, reference = ours_ppo(seed, config), reference_ppo(seed, config)
        else:
            reference, ours = reference_ppo(seed, config), ours_ppo(seed, config)
        ratio = _time(reference) / _time(ours)
        ratios.append(ratio)
        cpu_ratios.append(_cpu_time(reference) / _cpu_time(ours))
        our_times.append(_time(ours))
        reference_times.append(_time(reference))
        print(f"{seed:>4} {ours.steps:>10} {_time(ours):>7.1f} {_cpu_time(ours):>8.1f} "
              f"{ours.steps / ours.seconds:>8.0f} {reference.steps:>10} {_time(reference):>7.1f} "
              f"{_cpu_time(reference):>8.1f} {reference.steps / reference.seconds:>8.0f} {ratio:>8.2f}", flush=True)
    ratio = statistics.median(ratios)
    print(f"median time to {TARGET_RETURN:.0f}: ours {statistics.median(our_times):.1f} s, "
          f"reference {statistics.median(reference_times):.1f} s; ratio of medians "
          f"{statistics.median(reference_times) / statistics.median(our_times):.2f}x; "
          f"median CPU-time ratio {statistics.median(cpu_ratios):.2f}x")
    print(f"goal ppo_cartpole_wall_vs_reference: {ratio:.2f}x (target 1.0x) {'PASS' if ratio >= 1.0 else 'FAIL'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
