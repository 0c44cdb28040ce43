"""TorchPolicy: masked sampling and greedy play, exact log-probs, seeding by the Generator only."""

from __future__ import annotations

import copy
import pickle
import warnings

import numpy as np
import pytest
import torch

from ludus.agents.nets import ActorCritic, FusedActing, NetConfig, StackedActors
from ludus.agents.policy import ActBatch, AskedAlone, Policy, RandomPolicy, act_in_order
from ludus.agents.threads import torch_threads
from ludus.agents.torch_policy import TorchPolicy
from ludus.games.core import GameSpec

SPEC = GameSpec("test:flat", num_players=2, num_actions=9, observation_shape=(27,))
CONV_SPEC = GameSpec("test:board", num_players=2, num_actions=7, observation_shape=(3, 6, 7))


def _net(spec: GameSpec, config: NetConfig = NetConfig(hidden=(32, 32)), seed: int = 0) -> ActorCritic:
    torch.manual_seed(seed)
    net = ActorCritic(spec, config)
    # Larger policy-head weights than the near-uniform init, so the distribution is far from uniform.
    with torch.no_grad():
        net.policy_head.weight.mul_(300.0)
    return net


def _batch(spec: GameSpec, rows: int, rng: np.random.Generator) -> ActBatch:
    obs = rng.standard_normal((rows, *spec.observation_shape)).astype(np.float32)
    mask = rng.random((rows, spec.num_actions)) < rng.random((rows, 1))  # densities from ~0 to 1 per row
    mask[np.arange(rows), rng.integers(0, spec.num_actions, rows)] = True
    return ActBatch(obs, mask, seats=rng.integers(0, 2, rows))


def _reference_log_softmax(net: ActorCritic, batch: ActBatch) -> np.ndarray:
    """log-softmax over legal actions only, from the unmasked logits, in float64."""
    with torch.no_grad():
        x = torch.from_numpy(batch.obs).reshape(len(batch), -1)
        if net.config.kind == "conv":
            x = torch.from_numpy(batch.obs)
        raw = net.policy_head(net.actor_trunk(x)).double().numpy()
    raw = np.where(batch.mask, raw, -np.inf)
    return raw - np.logaddexp.reduce(raw, axis=1, keepdims=True)


def test_is_a_policy():
    assert isinstance(TorchPolicy(_net(SPEC)), Policy)
    assert TorchPolicy(_net(SPEC)).needs_history is False


@pytest.mark.parametrize("spec,config", [(SPEC, NetConfig(hidden=(32, 32))),
                                         (CONV_SPEC, NetConfig(kind="conv", channels=(8,), hidden=(32,)))])
@pytest.mark.parametrize("greedy", [False, True])
def test_never_picks_an_illegal_action(spec, config, greedy):
    policy, rng = TorchPolicy(_net(spec, config)), np.random.default_rng(1)
    for _ in range(20):
        batch = _batch(spec, 500, rng)
        out = policy.act(batch, rng, greedy=greedy)
        assert out.actions.shape == (500,) and out.actions.dtype == np.int64
        assert batch.mask[np.arange(500), out.actions].all()


def test_single_legal_action_is_always_taken_with_log_prob_zero():
    policy, rng = TorchPolicy(_net(SPEC)), np.random.default_rng(2)
    batch = _batch(SPEC, 300, rng)
    only = rng.integers(0, SPEC.num_actions, 300)
    mask = np.zeros_like(batch.mask)
    mask[np.arange(300), only] = True
    out = policy.act(ActBatch(batch.obs, mask, batch.seats), rng)
    np.testing.assert_array_equal(out.actions, only)
    np.testing.assert_allclose(out.log_probs, 0.0, atol=1e-6)


@pytest.mark.parametrize("layer_norm", [False, True])
@pytest.mark.parametrize("greedy", [False, True])
def test_log_probs_are_log_softmax_over_legal_actions(greedy, layer_norm):
    net, rng = _net(SPEC, NetConfig(hidden=(32, 32), layer_norm=layer_norm)), np.random.default_rng(3)
    if layer_norm:  # LayerNorm on the input and after each hidden activation (MAPPO's MLPBase)
        assert sum(isinstance(m, torch.nn.LayerNorm) for m in net.actor_trunk) == 3
    batch = _batch(SPEC, 1000, rng)
    out = TorchPolicy(net).act(batch, rng, greedy=greedy)
    reference = _reference_log_softmax(net, batch)
    np.testing.assert_allclose(out.log_probs, reference[np.arange(1000), out.actions], rtol=1e-4, atol=1e-4)
    assert out.log_probs.dtype == np.float32
    if greedy:
        np.testing.assert_array_equal(out.actions, reference.argmax(axis=1))


def test_values_are_the_critics():
    net, rng = _net(SPEC), np.random.default_rng(4)
    batch = _batch(SPEC, 64, rng)
    out = TorchPolicy(net).act(batch, rng)
    with torch.no_grad():
        expected = net.value(torch.from_numpy(batch.obs)).numpy()
    np.testing.assert_allclose(out.values, expected, rtol=1e-6, atol=1e-6)
    assert out.values.dtype == np.float32


def test_samples_follow_the_masked_softmax():
    net, rng = _net(SPEC, seed=5), np.random.default_rng(5)
    one = _batch(SPEC, 1, rng)
    rows = 40_000
    batch = ActBatch(np.repeat(one.obs, rows, 0), np.repeat(one.mask, rows, 0), np.zeros(rows, np.int64))
    out = TorchPolicy(net).act(batch, rng)
    probs = np.exp(_reference_log_softmax(net, one)[0])
    freq = np.bincount(out.actions, minlength=SPEC.num_actions) / rows
    # 4 standard errors of a frequency estimated from 40k draws
    np.testing.assert_allclose(freq, probs, atol=4 * np.sqrt(0.25 / rows))


def test_same_generator_seed_gives_same_actions_and_torch_rng_plays_no_part():
    policy = TorchPolicy(_net(SPEC))
    batch = _batch(SPEC, 1000, np.random.default_rng(6))
    torch.manual_seed(1)
    a = policy.act(batch, np.random.default_rng(42)).actions
    torch.manual_seed(2)
    b = policy.act(batch, np.random.default_rng(42)).actions
    c = policy.act(batch, np.random.default_rng(43)).actions
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()


def test_greedy_is_deterministic_and_ignores_rng():
    policy = TorchPolicy(_net(SPEC))
    batch = _batch(SPEC, 200, np.random.default_rng(7))
    np.testing.assert_array_equal(policy.act(batch, np.random.default_rng(1), greedy=True).actions,
                                  policy.act(batch, np.random.default_rng(2), greedy=True).actions)


def test_read_only_inputs_work_without_warnings():
    policy, rng = TorchPolicy(_net(SPEC)), np.random.default_rng(8)
    batch = _batch(SPEC, 10, rng)
    batch.obs.flags.writeable = False
    batch.mask.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = policy.act(batch, rng)
    assert batch.mask[np.arange(10), out.actions].all()


def test_no_gradients_are_recorded():
    net = _net(SPEC)
    TorchPolicy(net).act(_batch(SPEC, 10, np.random.default_rng(9)), np.random.default_rng(9))
    assert all(p.grad is None for p in net.parameters())


@pytest.mark.parametrize("spec, config", [(SPEC, NetConfig(hidden=(32, 32))), (SPEC, NetConfig(hidden=(32, 32), layer_norm=True)),
                                          (CONV_SPEC, NetConfig(kind="conv", channels=(8,), hidden=(16,)))])
def test_bfloat16_acting_is_the_net_in_bfloat16(spec, config):
    """A bf16 policy plays legal moves and its log-probs and values are the float32 net's within
    bf16 rounding; it is deterministic given the Generator, like float32."""
    net = _net(spec, config)
    with torch.no_grad():
        net.policy_head.weight.div_(30.0)  # logits of a few units: bf16 keeps ~3 significant digits
    batch = _batch(spec, 50, np.random.default_rng(5))  # padded to 64 rows inside
    fast = TorchPolicy(net, dtype=torch.bfloat16)
    out = fast.act(batch, np.random.default_rng(0))
    assert batch.mask[np.arange(50), out.actions].all()
    exact = _reference_log_softmax(net, batch)[np.arange(50), out.actions]
    np.testing.assert_allclose(out.log_probs, exact, atol=0.1)
    with torch.no_grad():
        np.testing.assert_allclose(out.values, net.value(torch.from_numpy(batch.obs)).numpy(), rtol=0.05, atol=0.05)
    again = fast.act(batch, np.random.default_rng(0))
    np.testing.assert_array_equal(out.actions, again.actions)
    np.testing.assert_array_equal(out.log_probs, again.log_probs)
    assert out.log_probs.dtype == np.float32 and out.values.dtype == np.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_policy_follows_its_nets_updates(dtype):
    """A learner's policy reads its live net: an optimizer step or a load_state_dict shows at once
    (the bf16 copy is remade when the weights change)."""
    net, other = _net(SPEC, seed=0), _net(SPEC, seed=1)
    policy = TorchPolicy(net, dtype=dtype)
    batch = _batch(SPEC, 32, np.random.default_rng(4))
    before = policy.act(batch, np.random.default_rng(0), greedy=True)
    net.load_state_dict(other.state_dict())
    after = policy.act(batch, np.random.default_rng(0), greedy=True)
    expected = TorchPolicy(other, dtype=dtype).act(batch, np.random.default_rng(0), greedy=True)
    np.testing.assert_array_equal(after.log_probs, expected.log_probs)
    assert not np.array_equal(before.log_probs, after.log_probs)
    optimizer = torch.optim.SGD(net.parameters(), lr=1.0)
    net(torch.from_numpy(batch.obs), torch.from_numpy(batch.mask))[1].sum().backward()
    optimizer.step()
    stepped = policy.act(batch, np.random.default_rng(0), greedy=True)
    assert not np.array_equal(stepped.values, after.values)


def test_acting_together_is_acting_in_turn(monkeypatch):
    """act_in_order answers each run of consecutive TorchPolicies with one act_together call: the
    same actions, log-probs and values as one act() per policy, and the same draws from the
    Generator (greedy rows draw none); a policy without act_together splits the run."""
    calls = []
    together = TorchPolicy.act_together

    def spy(requests, rng):
        calls.append(len(requests))
        return together(requests, rng)

    monkeypatch.setattr(TorchPolicy, "act_together", staticmethod(spy))
    policies = [TorchPolicy(_net(SPEC, seed=0)), TorchPolicy(_net(SPEC, seed=1), compute_values=False),
                RandomPolicy(), TorchPolicy(_net(SPEC, seed=2), compute_values=False), TorchPolicy(_net(SPEC, seed=3))]
    rng = np.random.default_rng(11)
    requests = [(policy, _batch(SPEC, rows, rng), greedy)
                for policy, rows, greedy in zip(policies, (50, 7, 5, 1, 30), (False, True, False, False, False))]
    rng_together, rng_in_turn = np.random.default_rng(3), np.random.default_rng(3)
    outputs = act_in_order(requests, rng_together)
    assert calls == [2, 2]
    for (policy, batch, greedy), out in zip(requests, outputs):
        alone = policy.act(batch, rng_in_turn, greedy=greedy)
        for name in ("actions", "log_probs", "values"):
            np.testing.assert_array_equal(getattr(out, name), getattr(alone, name))
    assert rng_together.random() == rng_in_turn.random()


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_frozen_bfloat16_nets_act_as_one_stack(monkeypatch, activation):
    """Frozen bf16 nets of one architecture are evaluated as one StackedActors (one batched matmul
    per layer): their logits are each net's own bf16 logits within rounding, and acting draws from
    the Generator exactly as acting in turn."""
    config = NetConfig(hidden=(32, 32), activation=activation)
    nets = [_net(SPEC, config, seed=s) for s in range(3)]
    for net in nets:
        with torch.no_grad():
            net.policy_head.weight.div_(30.0)  # logits of a few units, as in the bf16 test above
    policies = [TorchPolicy(net, compute_values=False, dtype=torch.bfloat16) for net in nets]
    rng = np.random.default_rng(12)
    batches = [_batch(SPEC, rows, rng) for rows in (20, 70, 5)]
    stacks, original = [], StackedActors.policy_logits
    monkeypatch.setattr(StackedActors, "policy_logits",
                        lambda self, *a, **k: stacks.append(self) or original(self, *a, **k))
    rng_together, rng_in_turn = np.random.default_rng(4), np.random.default_rng(4)
    outputs = act_in_order([(p, b, False) for p, b in zip(policies, batches)], rng_together)
    assert len(stacks) == 1 and stacks[0].num_nets == 3
    for policy, batch, out in zip(policies, batches, outputs):
        alone = policy.act(batch, rng_in_turn)
        assert batch.mask[np.arange(len(batch)), out.actions].all()
        assert (out.actions == alone.actions).mean() >= 0.9
        same = out.actions == alone.actions
        np.testing.assert_allclose(out.log_probs[same], alone.log_probs[same], atol=0.05)
        np.testing.assert_array_equal(out.values, 0.0)
    assert rng_together.random() == rng_in_turn.random()
    with torch.inference_mode():
        copies = [p.acting_net() for p in policies]
        obs = [torch.from_numpy(b.obs) for b in batches]
        mask = torch.from_numpy(np.concatenate([b.mask for b in batches]))
        stacked = StackedActors(copies).policy_logits(obs, mask, pad_rows=64)
        own = torch.cat([c.policy_logits(o, torch.from_numpy(b.mask)).float() for c, o, b in zip(copies, obs, batches)])
    np.testing.assert_allclose(stacked.numpy(), own.numpy(), rtol=0.02, atol=0.02)


def test_frozen_float32_nets_stack_where_the_float32_kernel_runs(monkeypatch):
    """Frozen float32 nets act as one StackedActors exactly where the float32 grouped kernel runs
    (elsewhere one product per net is faster than the padded baddbmm): each net's own logits to
    float32 rounding, the same draws from the Generator. A float32 policy acts with its net
    itself, not a copy, so when those weights change in place the stack is rebuilt at once."""
    from collections import OrderedDict

    import ludus.agents.torch_policy as torch_policy
    from ludus.agents.kernels import grouped_path

    monkeypatch.setattr(torch_policy, "_STACKS", OrderedDict())
    nets = [_net(SPEC, NetConfig(hidden=(32, 32), activation="relu"), seed=s) for s in range(3)]
    policies = [TorchPolicy(net, compute_values=False) for net in nets]
    rng = np.random.default_rng(13)
    batches = [_batch(SPEC, rows, rng) for rows in (20, 70, 5)]
    stacks, original = [], StackedActors.policy_logits
    monkeypatch.setattr(StackedActors, "policy_logits",
                        lambda self, *a, **k: stacks.append(self) or original(self, *a, **k))

    def compare(expected_nets):
        rng_together, rng_in_turn = np.random.default_rng(4), np.random.default_rng(4)
        outputs = act_in_order([(p, b, False) for p, b in zip(policies, batches)], rng_together)
        for net, batch, out in zip(expected_nets, batches, outputs):
            alone = TorchPolicy(net, compute_values=False).act(batch, rng_in_turn)
            assert (out.actions == alone.actions).mean() >= 0.99
            same = out.actions == alone.actions
            np.testing.assert_allclose(out.log_probs[same], alone.log_probs[same], rtol=1e-4, atol=1e-4)
        assert rng_together.random() == rng_in_turn.random()

    compare(nets)
    kernel = grouped_path(torch.float32)
    assert [s.path for s in stacks] == ([kernel] if kernel else [])
    other = _net(SPEC, NetConfig(hidden=(32, 32), activation="relu"), seed=9)
    nets[1].load_state_dict(other.state_dict())
    compare([nets[0], other, nets[2]])
    assert len(stacks) == (2 if kernel else 0) and (not kernel or stacks[0] is not stacks[1])


def _cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo: what the CPU has, independent of the checks
    torch and oneDNN make, which the tests below hold to them."""
    with open("/proc/cpuinfo") as cpuinfo:
        return set(next((line for line in cpuinfo if line.startswith("flags")), "").split())


_PATH_FLAGS = {"amx": {"amx_bf16", "amx_tile"}, "avx512bf16": {"avx512f", "avx512bw", "avx512vl", "avx512_bf16"},
               "avx2": {"avx2", "fma"}}
"""The CPU flags each grouped-kernel path needs (ludus.agents.kernels.PATHS)."""


def _cpu_runs(path: str) -> bool:
    """Whether this CPU has what `path` needs, by its flags (the kernel's own checks are oneDNN's
    `could_pack` for AMX and `__builtin_cpu_supports` for the others; tests hold them to these)."""
    return _PATH_FLAGS[path] <= _cpu_flags()


def _kernel_runs_here(path: str) -> None:
    """A path's numerics can only be tested on a CPU that has it; the test below checks that every
    path the CPU has is used. These skips (AMX on a CPU without tiles, say) are on
    tests/conftest.py's allowlist: a missing CPU feature, not a missing package."""
    from ludus.agents.kernels import grouped_linear_status, grouped_paths

    if not _cpu_runs(path):
        pytest.skip(f"this CPU has no {'/'.join(sorted(_PATH_FLAGS[path]))}: the {path} kernel does not run here")
    assert path in grouped_paths(), grouped_linear_status()  # (and the extension is loaded)


def test_the_grouped_kernel_is_built_and_used_where_the_cpu_can():
    """The kernel always builds (CI's machine has a C++ compiler), and each path is used exactly
    where the CPU has what it needs: a bf16 stack takes AMX tiles, else AVX512-BF16, else baddbmm;
    a float32 stack AVX2 with FMA, else baddbmm; the status line names them. Asking for a path the
    CPU lacks, or one of another dtype, is a one-line error naming why; grouped=False is baddbmm."""
    from ludus.agents.kernels import PATHS, grouped_linear_status, grouped_path, grouped_paths

    status = grouped_linear_status()
    assert not status.startswith("not built"), status
    assert grouped_paths() == tuple(path for path in PATHS if _cpu_runs(path))
    expected_bf16 = next((path for path in ("amx", "avx512bf16") if _cpu_runs(path)), None)
    expected_fp32 = "avx2" if _cpu_runs("avx2") else None
    assert grouped_path(torch.bfloat16) == expected_bf16 and grouped_path(torch.float32) == expected_fp32
    for dtype, expected in ((torch.bfloat16, expected_bf16), (torch.float32, expected_fp32)):
        nets = [_net(SPEC, seed=s).to(dtype) for s in range(2)]
        assert StackedActors(nets).path == expected and StackedActors(nets).grouped == (expected is not None)
        assert StackedActors(nets, grouped=False).path is None
        if expected is None:
            with pytest.raises(ValueError, match="no grouped kernel runs"):
                StackedActors(nets, grouped=True)
        else:
            assert PATHS[expected][1] in status
        for path in PATHS:
            if PATHS[path][0] != dtype:
                with pytest.raises(ValueError, match=f"grouped='{path}' is not a path for {dtype}"):
                    StackedActors(nets, grouped=path)
            elif not _cpu_runs(path):
                with pytest.raises(ValueError, match=f"this CPU does not run the '{path}' kernel"):
                    StackedActors(nets, grouped=path)
    if not _cpu_runs("amx"):
        with pytest.raises(RuntimeError, match="this CPU has no bf16 BRGeMM packing"):
            torch.ops.ludus.pack_weights(torch.zeros(2, 8, 4, dtype=torch.bfloat16))
    if not _cpu_runs("avx512bf16"):
        with pytest.raises(RuntimeError, match="this CPU has no AVX512-BF16"):
            torch.ops.ludus.pack_weights_avx512bf16(torch.zeros(2, 8, 4, dtype=torch.bfloat16))


@pytest.mark.parametrize("activation", ["relu", "tanh"])
@pytest.mark.parametrize("spec,hidden", [(SPEC, (32, 32)), (CONV_SPEC, (256, 256)), (SPEC, (33, 40))])
@pytest.mark.parametrize("path", ["amx", "avx512bf16", "avx2"])
def test_the_grouped_kernel_gives_the_padded_stacks_logits(path, activation, spec, hidden):
    """Each path of the stack's grouped kernel (agents/grouped_linear.cpp: each net's rows only,
    weights packed once) gives the logits of the padded baddbmm stack and of each net on its own
    rows: in bf16 the same bf16 products, equal up to the last bit of a rare sum accumulated in
    another order; in float32 equal to float32 rounding. Uneven and empty groups, an odd input
    width (27), an odd hidden width (33: the next layer's inputs do not pair up), output widths
    that are not a whole vector (7, 9, 33, 40) and the connect-four preset's shape."""
    _kernel_runs_here(path)
    from ludus.agents.kernels import PATHS

    dtype = PATHS[path][0]
    config = NetConfig(hidden=hidden, activation=activation)
    nets = [_net(spec, config, seed=s).to(dtype) for s in range(5)]
    for net in nets:
        with torch.no_grad():
            net.policy_head.weight.div_(30.0)
    rng = np.random.default_rng(7)
    sizes = [33, 0, 1, 100, 64]
    obs = [torch.from_numpy(rng.integers(0, 2, (n, *spec.observation_shape)).astype(np.float32)) for n in sizes]
    mask = torch.from_numpy(rng.random((sum(sizes), spec.num_actions)) < 0.7)
    mask[:, 0] = True
    if path == "amx" and hidden[0] % 2:
        # AMX reads a layer's inputs in pairs: an odd hidden width runs on AVX512-BF16 instead
        with pytest.raises(ValueError, match="odd hidden width: use grouped=True"):
            StackedActors(nets, grouped=path)
        path = "avx512bf16"
        assert StackedActors(nets).path == path
    grouped, padded = StackedActors(nets, grouped=path), StackedActors(nets, grouped=False)
    assert grouped.path == path and not padded.grouped
    with torch.inference_mode():
        got = grouped.policy_logits(obs, mask, pad_rows=64)
        want = padded.policy_logits(obs, mask, pad_rows=64)
        # (each net's own bf16 logits mask to bf16's -1e9, so only the legal ones are compared)
        own = torch.cat([net.policy_logits(o, m).float() for net, o, m in zip(nets, obs, torch.split(mask, sizes))])
    assert got.shape == want.shape == (sum(sizes), spec.num_actions) and got.dtype == torch.float32
    legal = mask.numpy()
    np.testing.assert_array_equal(got.numpy()[~legal], want.numpy()[~legal])  # the mask's -1e9
    tolerance = 2 ** -7 if dtype == torch.bfloat16 else 1e-5
    for reference in (want, own):
        np.testing.assert_allclose(got.numpy()[legal], reference.numpy()[legal], rtol=tolerance, atol=tolerance)
        if dtype == torch.bfloat16:
            assert (got.numpy()[legal] != reference.numpy()[legal]).mean() < 0.01


@pytest.mark.parametrize("path", ["amx", "avx512bf16", "avx2"])
def test_the_grouped_kernel_refuses_mismatched_rows(path):
    """A row count that does not add up, rows of another width or dtype are one-line errors from
    each path's kernel, not a wild read; and the product with its bias is exact on small integers."""
    _kernel_runs_here(path)
    from ludus.agents.kernels import PATHS

    dtype, _, pack_name, linear_name = PATHS[path]
    pack, linear = getattr(torch.ops.ludus, pack_name), getattr(torch.ops.ludus, linear_name)
    packed = pack(torch.zeros(2, 8, 4, dtype=dtype))
    x = torch.zeros(5, 8, dtype=dtype)
    with pytest.raises(RuntimeError, match="row counts sum to 6 for 5 rows"):
        linear(x, [3, 3], packed, torch.zeros(2, 4), 4, True)
    with pytest.raises(RuntimeError, match="rows of width 8 for weights of input width (5 or )?6"):
        linear(x, [2, 3], pack(torch.zeros(2, 6, 4, dtype=dtype)), torch.zeros(2, 4), 4, True)
    other = torch.float32 if dtype == torch.bfloat16 else torch.bfloat16
    with pytest.raises(RuntimeError, match="grouped_linear wants contiguous"):
        linear(x.to(other), [2, 3], packed, torch.zeros(2, 4), 4, True)
    np.testing.assert_array_equal(
        linear(x + 1, [2, 3], packed, torch.arange(8.0).reshape(2, 4), 4, False).float(),
        np.repeat([[0.0, 1, 2, 3], [4, 5, 6, 7]], [2, 3], axis=0))
    weights = torch.arange(2 * 8 * 4).reshape(2, 8, 4).to(dtype) % 5 - 2  # small integers, exact in bf16
    rows = torch.arange(5 * 8).reshape(5, 8).to(dtype) % 3
    expected = torch.cat([rows[:2].double() @ weights[0].double(), rows[2:].double() @ weights[1].double()])
    np.testing.assert_array_equal(linear(rows, [2, 3], pack(weights), torch.zeros(2, 4), 4, True).double(),
                                  expected.clamp(min=0))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_stacks_in_place_relu_is_relu(dtype):
    """StackedActors' ReLU (in bf16 a clamp of the int16 view) equals torch.relu on finite values,
    infinities and signed zeros, in place."""
    from ludus.agents.nets import _relu_

    x = torch.cat([torch.randn(1000) * 10, torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 1e-30, -1e-30])])
    x = x.to(dtype)
    expected = torch.relu(x)
    out = _relu_(x)
    assert out.data_ptr() == x.data_ptr() and out.dtype == dtype
    assert torch.equal(out, expected) and not (out < 0).any()


def test_a_stack_of_more_nets_serves_a_subset_of_them(monkeypatch):
    """As a task's last matches finish, fewer frozen nets act from step to step: a cached stack
    holding them (up to twice as many nets) answers, the others getting no rows, with the same
    actions as a stack of just those nets; a subset of fewer than half builds its own."""
    from collections import OrderedDict

    import ludus.agents.torch_policy as torch_policy

    monkeypatch.setattr(torch_policy, "_STACKS", OrderedDict())
    policies = [TorchPolicy(_net(SPEC, seed=s), compute_values=False, dtype=torch.bfloat16) for s in range(5)]
    rng = np.random.default_rng(3)
    batches = [_batch(SPEC, rows, rng) for rows in (20, 70, 5, 9, 33)]
    act_in_order([(p, b, False) for p, b in zip(policies, batches)], np.random.default_rng(0))
    built, original = [], StackedActors.__init__
    monkeypatch.setattr(StackedActors, "__init__", lambda self, nets: built.append(len(nets)) or original(self, nets))
    subset = [(policies[i], batches[i], False) for i in (4, 1, 2)]  # out of the stack's order
    reused = act_in_order(subset, np.random.default_rng(5))
    assert built == []
    torch_policy._STACKS.clear()
    own = act_in_order(subset, np.random.default_rng(5))
    assert built == [3]
    for out, alone in zip(reused, own):
        np.testing.assert_array_equal(out.actions, alone.actions)
        np.testing.assert_allclose(out.log_probs, alone.log_probs, atol=1e-6)
    act_in_order([(p, b, False) for p, b in zip(policies, batches)], np.random.default_rng(0))
    act_in_order([(policies[i], batches[i], False) for i in (0, 3)], np.random.default_rng(0))
    assert built == [3, 5, 2]


def _cpu_has_avx512_core() -> bool:
    """Whether this CPU has the AVX-512 subsets oneDNN's bf16 needs (BW, VL, DQ; torch's
    `mkldnn_bf16_device_check`; `FusedActing.available` is held to it below)."""
    return {"avx512bw", "avx512vl", "avx512dq"} <= _cpu_flags()


def _fused_acting_runs_here() -> None:
    """The fused path's numerics need oneDNN's bf16, i.e. AVX-512; without it bf16 nets act
    through their own forward, which test_bf16_nets_act_fused_exactly_where_the_cpu_can checks. The
    skip is on tests/conftest.py's allowlist (a missing CPU feature, not a missing package)."""
    if not _cpu_has_avx512_core():
        pytest.skip("this CPU has no AVX-512: oneDNN has no bf16 here, bf16 nets act unfused")


def test_bf16_nets_act_fused_exactly_where_the_cpu_can():
    """FusedActing is available exactly where the CPU has AVX-512 (BW, VL, DQ); elsewhere a bf16
    policy acts through the bf16 net's own forward, with the same logits and values."""
    assert FusedActing.available() == _cpu_has_avx512_core()
    if FusedActing.available():
        return
    net = _net(SPEC, NetConfig(hidden=(32, 32), activation="relu"))
    policy = TorchPolicy(net, compute_values=True, dtype=torch.bfloat16)
    assert not FusedActing.can_fuse(policy.acting_net()) and policy._acting_copy()[1] is None
    batch = _batch(SPEC, 40, np.random.default_rng(3))
    obs, mask = torch.from_numpy(batch.obs), torch.from_numpy(batch.mask)
    with torch.inference_mode():
        own_logits = policy.acting_net().policy_logits(obs, mask).float()
        own_values = policy.acting_net().value(obs).float()
        acted_logits, acted_values = policy.masked_logits(batch)
    np.testing.assert_array_equal(acted_logits.numpy()[batch.mask], own_logits.numpy()[batch.mask])
    np.testing.assert_array_equal(acted_values.numpy(), own_values.numpy())


@pytest.mark.parametrize("config", [NetConfig(hidden=(32, 32), activation="relu", shared_trunk=True),
                                    NetConfig(hidden=(32, 32), activation="tanh"),
                                    NetConfig(hidden=(32,), activation="tanh", head="regret_matching")],
                         ids=["relu-shared", "tanh-separate", "regret-matching"])
@pytest.mark.parametrize("with_values", [True, False])
def test_bfloat16_nets_act_fused(config, with_values):
    """A bf16 'mlp' net acts through FusedActing (each activation inside its product, the heads
    as one product): the same logits and values as the bf16 net's own forward, exactly with relu
    (it commutes with rounding to bf16) and within bf16 rounding with tanh (applied before the
    rounding, not after), and the policy acts through it."""
    _fused_acting_runs_here()
    net = _net(SPEC, config)
    with torch.no_grad():
        net.policy_head.weight.div_(30.0)
    policy = TorchPolicy(net, compute_values=with_values, dtype=torch.bfloat16)
    batch = _batch(SPEC, 130, np.random.default_rng(3))
    obs, mask = torch.from_numpy(batch.obs), torch.from_numpy(batch.mask)
    with torch.inference_mode():
        copy_ = policy.acting_net()
        logits, values = FusedActing(copy_, with_values)(obs, mask)
        own_logits = copy_.policy_logits(obs, mask).float()
        own_values = copy_.value(obs).float()
        acted_logits, acted_values = policy.masked_logits(batch)
    assert isinstance(policy._acting_copy()[1], FusedActing)
    np.testing.assert_array_equal(acted_logits.numpy(), logits.numpy())
    legal = batch.mask
    if config.head == "regret_matching":
        # regret matching takes the positive part of the head's outputs: compare the policies
        np.testing.assert_allclose(torch.softmax(logits, 1).numpy(), torch.softmax(own_logits, 1).numpy(), atol=0.02)
    elif config.activation == "relu":
        np.testing.assert_array_equal(logits.numpy()[legal], own_logits.numpy()[legal])
    else:
        np.testing.assert_allclose(logits.numpy()[legal], own_logits.numpy()[legal], atol=0.05)
    assert (logits.numpy()[~legal] < -1e8).all()
    if with_values:
        np.testing.assert_allclose(values.numpy(), own_values.numpy(), atol=0.0 if config.activation == "relu" else 0.05)
        np.testing.assert_array_equal(acted_values.numpy(), values.numpy())
    else:
        assert values is None
        np.testing.assert_array_equal(acted_values.numpy(), 0.0)


def test_a_bfloat16_policy_copies_and_pickles_after_acting():
    """The fused weights are opaque oneDNN tensors: copies and pickles leave the cache behind."""
    policy = TorchPolicy(_net(SPEC, NetConfig(hidden=(32, 32), activation="relu")), dtype=torch.bfloat16)
    batch = _batch(SPEC, 40, np.random.default_rng(5))
    first = policy.act(batch, np.random.default_rng(0))
    for other in (copy.deepcopy(policy), pickle.loads(pickle.dumps(policy))):
        again = other.act(batch, np.random.default_rng(0))
        np.testing.assert_array_equal(again.actions, first.actions)
        np.testing.assert_array_equal(again.log_probs, first.log_probs)
        np.testing.assert_array_equal(again.values, first.values)


def test_only_bfloat16_mlp_nets_act_fused():
    plain = _net(SPEC, NetConfig(hidden=(32, 32)))
    # a bf16 mlp net fuses wherever oneDNN has bf16 (test_bf16_nets_act_fused_exactly_where_the_cpu_can)
    assert FusedActing.can_fuse(copy.deepcopy(plain).to(torch.bfloat16)) == FusedActing.available()
    assert not FusedActing.can_fuse(plain)  # float32 acts with the net itself
    norm = _net(SPEC, NetConfig(hidden=(32, 32), layer_norm=True)).to(torch.bfloat16)
    conv = _net(CONV_SPEC, NetConfig(kind="conv", channels=(8,), hidden=(16,))).to(torch.bfloat16)
    for net in (norm, conv):
        assert not FusedActing.can_fuse(net)
        with pytest.raises(ValueError, match="FusedActing needs"):
            FusedActing(net, with_values=True)
        assert TorchPolicy(net, dtype=torch.bfloat16)._acting_copy()[1] is None


def test_only_mlp_nets_of_one_shape_stack():
    plain = NetConfig(hidden=(32, 32))
    two = [_net(SPEC, plain, seed=0), _net(SPEC, plain, seed=1)]
    assert StackedActors.can_stack(two)
    assert not StackedActors.can_stack(two[:1])
    assert not StackedActors.can_stack([two[0], _net(SPEC, NetConfig(hidden=(32, 16)))])
    assert not StackedActors.can_stack([_net(SPEC, NetConfig(hidden=(32, 32), layer_norm=True)) for _ in range(2)])
    conv = NetConfig(kind="conv", channels=(8,), hidden=(16,))
    assert not StackedActors.can_stack([_net(CONV_SPEC, conv), _net(CONV_SPEC, conv)])
    assert not StackedActors.can_stack([two[0], copy.deepcopy(two[1]).to(torch.bfloat16)])
    with pytest.raises(ValueError, match="two or more"):
        StackedActors(two[:1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_runner_plays_the_same_matches_acting_together(dtype):
    """Runner.play with TorchPolicies (asked together) and with the same policies asked one by one:
    the same games, the same learner trajectories (bf16: the same draws; here also the same games)."""
    from ludus.games.registry import make_vector
    from ludus.league.play.runner import MatchAssignment, PlayTask, Runner

    spec = make_vector("connect_four", 1, seed=0).spec
    config = NetConfig(hidden=(64, 64), activation="relu", shared_trunk=True)
    nets = {pid: _net(spec, config, seed=s) for s, pid in enumerate(["main", "a", "b", "c"])}
    for net in nets.values():
        with torch.no_grad():
            net.policy_head.weight.div_(100.0)
    assignments = tuple(MatchAssignment(i, 1000 + i, ("main", "abc"[i % 3]) if i % 2 else ("abc"[i % 3], "main"))
                        for i in range(48))
    task = PlayTask(0, assignments, sample_seed=9, learners=("main",), learner_versions=(1,))
    results = []
    for alone in (False, True):
        policies = {pid: TorchPolicy(net, compute_values=pid == "main", dtype=dtype) for pid, net in nets.items()}
        if alone:
            policies = {pid: AskedAlone(policy) for pid, policy in policies.items()}
        results.append(Runner(lambda n: make_vector("connect_four", n, seed=0), 16).play(task, policies.__getitem__))
    together, in_turn = results
    assert [m.moves for m in together.matches] == [m.moves for m in in_turn.matches]
    np.testing.assert_array_equal(together.rollouts["main"].actions, in_turn.rollouts["main"].actions)
    np.testing.assert_allclose(together.rollouts["main"].logprobs, in_turn.rollouts["main"].logprobs,
                               atol=0 if dtype == torch.float32 else 0.05)


def test_torch_threads_sets_the_count_and_restores_it_even_on_an_error():
    before = torch.get_num_threads()
    other = 2 if before == 1 else 1
    with pytest.raises(RuntimeError, match="inside"):
        with torch_threads(other):
            assert torch.get_num_threads() == other
            raise RuntimeError("inside")
    assert torch.get_num_threads() == before
    with torch_threads(None):
        assert torch.get_num_threads() == before
