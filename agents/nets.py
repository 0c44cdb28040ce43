"""Actor-critic networks with a masked categorical head.

A net maps observations to (logits, value). Illegal actions get a logit of -1e9 before the
softmax (the "invalid action masking" of Huang & Ontañón 2020), so they are never sampled and
the log-probabilities of legal actions are exact: the masked softmax renormalises over legal
actions only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Literal, Mapping, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ludus.agents.kernels import PATHS, grouped_linear_status, grouped_path, grouped_paths
from ludus.games.core import GameSpec
from ludus.bounds import bounds

MASKED_LOGIT = -1e9


def masked_logits(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Logits with illegal actions pushed to -1e9 (finite, so no NaN in entropy or gradients)."""
    return torch.where(mask, logits, torch.full_like(logits, MASKED_LOGIT))


def masked_categorical(logits: torch.Tensor, mask: torch.Tensor) -> torch.distributions.Categorical:
    return torch.distributions.Categorical(logits=masked_logits(logits, mask))


def layer_init(layer: nn.Linear | nn.Conv2d, std: float = math.sqrt(2), bias: float = 0.0):
    """Orthogonal init as in CleanRL's PPO (Engstrom et al. 2020, "implementation matters")."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


@dataclass(frozen=True)
class NetConfig:
    """Architecture of an actor-critic net; stored in snapshot manifests to rebuild it."""

    kind: Literal["mlp", "conv"] = "mlp"
    """'mlp' (any observation, flattened) or 'conv' (observations shaped [C, H, W])."""
    hidden: tuple[int, ...] = field(default=(128, 128), metadata=bounds(1, 65536))
    """Widths of the hidden layers of the MLP trunk (for 'conv': of the layers after the convolutions)."""
    channels: tuple[int, ...] = field(default=(32, 64), metadata=bounds(1, 4096))
    """Convolution channels, 3x3 kernels with padding 1 ('conv' only)."""
    activation: Literal["tanh", "relu"] = "tanh"
    """'tanh' (CleanRL's default for PPO on vectors) or 'relu'."""
    shared_trunk: bool = False
    """True: actor and critic share the trunk; False: separate trunks (CleanRL's default)."""
    layer_norm: bool = False
    """LayerNorm on the MLP trunk's input and after each hidden activation, as MAPPO's MLPBase
    (Yu et al. 2022, "The Surprising Effectiveness of PPO in Cooperative Multi-Agent Games",
    `use_feature_normalization`): observations of unequal scales (MPE positions and velocities)
    need no hand scaling. 'mlp' only."""
    head: Literal["softmax", "regret_matching"] = "softmax"
    """How the policy head's outputs become the policy: 'softmax' (they are logits) or
    'regret_matching' (they are estimated advantages, regrets, and the policy is proportional to
    their positive part: Deep CFR's policy, Brown et al. 2019; learner 'sdcfr', agents/solvers/deep_cfr.py)."""

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(data: dict) -> "NetConfig":
        data = dict(data)
        for key in ("hidden", "channels"):
            if key in data:
                data[key] = tuple(data[key])
        return NetConfig(**data)


_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


def regret_matching_logits(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Log-probabilities (masked: -1e9) of regret matching on estimated advantages (Hart and
    Mas-Colell 2000; Deep CFR, Brown et al. 2019, eq. 2): each legal action in proportion to its
    positive advantage; when no legal action has one, the best ones (Deep CFR picks the argmax;
    ties share it). A softmax over these logits is that policy exactly."""
    advantages = advantages.float()
    positive = torch.where(mask, advantages.clamp(min=0.0), torch.zeros_like(advantages))
    any_positive = (positive > 0).any(-1, keepdim=True)
    legal = torch.where(mask, advantages, torch.full_like(advantages, -math.inf))
    best = mask & (legal == legal.max(-1, keepdim=True).values)
    masked = torch.full_like(advantages, MASKED_LOGIT)
    proportional = torch.where(positive > 0, torch.log(positive.clamp(min=1e-30)), masked)
    return torch.where(any_positive, proportional, torch.where(best, torch.zeros_like(advantages), masked))


_HEADS = {"softmax": masked_logits, "regret_matching": regret_matching_logits}


def run_sequential(seq: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """`seq(x)` without nn.Module's per-call machinery (hooks, __getattr__): the same math, but
    self-play calls small MLPs thousands of times per second and that overhead was ~30% of it."""
    for layer in seq._modules.values():
        kind = type(layer)
        if kind is nn.Linear:
            x = F.linear(x, layer._parameters["weight"], layer._parameters["bias"])
        elif kind is nn.Tanh:
            x = torch.tanh(x)
        elif kind is nn.ReLU:
            x = torch.relu(x)
        elif kind is nn.LayerNorm:
            x = F.layer_norm(x, layer.normalized_shape, layer._parameters["weight"], layer._parameters["bias"],
                             layer.eps)
        else:
            x = layer(x)
    return x


def mlp_trunk(in_dim: int, hidden: tuple[int, ...], activation: str, input_norm: bool = False,
              hidden_norm: bool = False) -> tuple[nn.Sequential, int]:
    """An MLP trunk and its output width: per hidden layer Linear (orthogonal init) -> activation,
    with LayerNorm on the input (`input_norm`) and after each activation (`hidden_norm`) as MAPPO's
    MLPBase has them."""
    if activation not in _ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}: use one of {sorted(_ACTIVATIONS)}")
    layers: list[nn.Module] = [nn.LayerNorm(in_dim)] if input_norm else []
    dim = in_dim
    for width in hidden:
        layers += [layer_init(nn.Linear(dim, width)), _ACTIVATIONS[activation]()]
        if hidden_norm:
            layers.append(nn.LayerNorm(width))
        dim = width
    return nn.Sequential(*layers), dim


class ActorCritic(nn.Module):
    """forward(obs, mask) -> (masked logits [N, A], value [N])."""

    def __init__(self, spec: GameSpec, config: NetConfig = NetConfig()):
        super().__init__()
        self.spec = spec
        self.config = config
        self.obs_dim = int(np.prod(spec.observation_shape))
        if config.layer_norm and config.kind != "mlp":
            raise ValueError(f"layer_norm is for kind 'mlp' nets, not {config.kind!r}")
        if config.head not in _HEADS:
            raise ValueError(f"unknown policy head {config.head!r}: use one of {sorted(_HEADS)}")
        self._policy_from_head = _HEADS[config.head]
        if config.kind == "mlp":
            norms = dict(input_norm=config.layer_norm, hidden_norm=config.layer_norm)
            self.actor_trunk, dim = mlp_trunk(self.obs_dim, config.hidden, config.activation, **norms)
            self.critic_trunk = (self.actor_trunk if config.shared_trunk
                                 else mlp_trunk(self.obs_dim, config.hidden, config.activation, **norms)[0])
        elif config.kind == "conv":
            self.actor_trunk, dim = self._conv_trunk(spec, config)
            self.critic_trunk = self.actor_trunk if config.shared_trunk else self._conv_trunk(spec, config)[0]
        else:
            raise ValueError(f"unknown net kind {config.kind!r}: use 'mlp' or 'conv'")
        # Small policy-head init keeps the initial policy near uniform (CleanRL: std=0.01).
        self.policy_head = layer_init(nn.Linear(dim, spec.num_actions), std=0.01)
        self.value_head = layer_init(nn.Linear(dim, 1), std=1.0)

    @staticmethod
    def _conv_trunk(spec: GameSpec, config: NetConfig) -> tuple[nn.Sequential, int]:
        if len(spec.observation_shape) != 3:
            raise ValueError(f"conv net needs observations shaped [C, H, W]; game {spec.id!r} has "
                             f"{spec.observation_shape}: use kind 'mlp'")
        c, h, w = spec.observation_shape
        layers: list[nn.Module] = []
        for out in config.channels:
            layers += [layer_init(nn.Conv2d(c, out, 3, padding=1)), nn.ReLU()]
            c = out
        layers.append(nn.Flatten())
        head, dim = mlp_trunk(c * h * w, config.hidden, config.activation)
        return nn.Sequential(*layers, *head), dim

    def _trunk_input(self, obs: torch.Tensor) -> torch.Tensor:
        # in the weights' dtype: float32, or bfloat16 in a copy that only acts (ludus.agents.torch_policy)
        obs = obs.to(self.policy_head.weight.dtype)
        if self.config.kind == "mlp":
            return obs.reshape(obs.shape[0], self.obs_dim)
        return obs

    def forward(self, obs: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self._trunk_input(obs)
        hidden = run_sequential(self.actor_trunk, x)
        logits = self._policy_from_head(F.linear(hidden, self.policy_head.weight, self.policy_head.bias), mask)
        if self.config.shared_trunk:
            value_hidden = hidden
        else:
            value_hidden = run_sequential(self.critic_trunk, x)
        value = F.linear(value_hidden, self.value_head.weight, self.value_head.bias).squeeze(-1)
        return logits, value

    def policy_logits(self, obs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Masked logits only: frozen opponents need no critic (half the work with separate trunks)."""
        return self._policy_from_head(self.head_outputs(obs), mask)

    def head_outputs(self, obs: torch.Tensor) -> torch.Tensor:
        """The policy head's raw outputs [N, A]: logits, or advantages for a 'regret_matching' head."""
        hidden = run_sequential(self.actor_trunk, self._trunk_input(obs))
        return F.linear(hidden, self.policy_head.weight, self.policy_head.bias)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        hidden = run_sequential(self.critic_trunk, self._trunk_input(obs))
        return F.linear(hidden, self.value_head.weight, self.value_head.bias).squeeze(-1)


def shape_mismatch(expected: Mapping[str, tuple[int, ...]], shapes: Mapping[str, tuple[int, ...]]) -> str:
    """Why tensors of `shapes` cannot be a state dict of `expected` shapes; '' if they can."""
    missing, unexpected = sorted(set(expected) - set(shapes)), sorted(set(shapes) - set(expected))
    if missing or unexpected:
        return f"missing tensors {missing[:3]}, unexpected tensors {unexpected[:3]}"
    for name, shape in expected.items():
        if tuple(shapes[name]) != shape:
            return f"tensor {name} has shape {list(shapes[name])}, the architecture needs {list(shape)}"
    return ""


def _relu_(x: torch.Tensor) -> torch.Tensor:
    """In-place ReLU; in bfloat16 as a clamp of the int16 view of the same bits. A bf16 value is
    negative exactly when its int16 view is (the sign bit), so clamping the view at 0 zeroes the
    negatives in one integer pass: ~4x faster here than torch's bf16 relu_, which widens to
    float32 and back (no gain in float32, left to relu_). Unlike relu_ it also zeroes a NaN whose
    sign bit is set; a net with NaN weights still gives NaN logits (its head has no ReLU)."""
    if x.dtype == torch.bfloat16:
        x.view(torch.int16).clamp_min_(0)
        return x
    return torch.relu_(x)


_IN_PLACE = {nn.ReLU: _relu_, nn.Tanh: torch.tanh_}
"""The trunk activations `StackedActors` knows, applied in place."""

_FUSED_ACTIVATIONS = {nn.ReLU: "relu", nn.Tanh: "tanh"}
"""Trunk activations that `FusedActing` runs inside the product, by oneDNN's post-op name."""


def onednn_packing(dtype: torch.dtype) -> bool:
    """Whether this torch build and CPU run oneDNN's inner product on weights packed once
    (`mkldnn._reorder_linear_weight`, `mkldnn._linear_pointwise`: private ops, what torch.compile's
    CPU backend emits for frozen linear layers) in `dtype` (float32, or bfloat16 where oneDNN
    has bf16 support)."""
    ops = torch.ops.mkldnn
    if not (torch.backends.mkldnn.is_available()
            and all(hasattr(ops, name) for name in ("_linear_pointwise", "_reorder_linear_weight"))):
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and hasattr(ops, "_is_mkldnn_bf16_supported") and ops._is_mkldnn_bf16_supported()


class FusedActing:
    """A bfloat16 'mlp' net's acting pass as oneDNN inner products: each hidden layer's
    activation fused into its product, the weights reordered once into oneDNN's blocked layout,
    and the policy and value heads one product when the trunk is shared.

    In self-play the elementwise pass of an unfused activation over a [rows, 256] bf16 layer
    cost half as much as the AMX product itself: fused, a 256-wide net's forward on ~2,300 rows
    took 0.44 ms instead of 0.84 here, with the same logits (with tanh, to within bf16
    rounding; benchmarks/inference_paths.py compares the ways to run the self-play nets).
    `torch.ops.mkldnn._linear_pointwise` is the op torch.compile's CPU backend emits for this
    fusion; it needs oneDNN with bf16 support (`available`), else nets act unfused.
    Built from an acting copy whose weights no longer change (ludus.agents.torch_policy).
    """

    def __init__(self, net: ActorCritic, with_values: bool):
        if not self.can_fuse(net):
            raise ValueError("FusedActing needs a bfloat16 'mlp' net with relu or tanh and no layer norm, "
                             "and oneDNN with bf16 support")
        self.obs_dim = net.obs_dim
        self.num_actions = net.spec.num_actions
        self.dtype = net.policy_head.weight.dtype
        self.head = net._policy_from_head
        self.actor = self._trunk(net.actor_trunk)
        heads = [net.policy_head]
        self.critic = None
        if with_values:
            if net.config.shared_trunk:
                heads.append(net.value_head)
            else:
                value = net.value_head
                self.critic = self._trunk(net.critic_trunk) + [self._pack(value.weight, value.bias)]
        self.actor.append(self._pack(torch.cat([m.weight for m in heads]), torch.cat([m.bias for m in heads])))

    @staticmethod
    def available() -> bool:
        """oneDNN with bf16 support, and the (private) ops this needs in this torch build."""
        return onednn_packing(torch.bfloat16)

    @staticmethod
    def can_fuse(net: ActorCritic) -> bool:
        modules = list(net.actor_trunk) + list(net.critic_trunk)
        return (FusedActing.available() and net.config.kind == "mlp" and not net.config.layer_norm
                and net.policy_head.weight.dtype == torch.bfloat16
                and all(isinstance(m, nn.Linear) or type(m) in _FUSED_ACTIVATIONS for m in modules))

    @classmethod
    def _trunk(cls, trunk: nn.Sequential) -> list[tuple[torch.Tensor, torch.Tensor, str]]:
        modules = list(trunk)
        return [cls._pack(linear.weight, linear.bias, _FUSED_ACTIVATIONS[type(activation)])
                for linear, activation in zip(modules[::2], modules[1::2])]

    @staticmethod
    def _pack(weight: torch.Tensor, bias: torch.Tensor,
              activation: str = "none") -> tuple[torch.Tensor, torch.Tensor, str]:
        # the batch-size argument is only a hint for the layout; every row count works
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 256), bias.detach(), activation

    @staticmethod
    def _run(layers: list[tuple[torch.Tensor, torch.Tensor, str]], x: torch.Tensor) -> torch.Tensor:
        for weight, bias, activation in layers:
            x = torch.ops.mkldnn._linear_pointwise(x, weight, bias, activation, [], "")
        return x

    def __call__(self, obs: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """float32 (masked logits [N, A], values [N] or None without values) of `obs` [N, ...]."""
        x = obs.to(self.dtype).reshape(obs.shape[0], self.obs_dim)
        out = self._run(self.actor, x).float()
        logits = self.head(out[:, :self.num_actions], mask)
        if self.critic is not None:
            return logits, self._run(self.critic, x).float()[:, 0]
        return logits, out[:, self.num_actions] if out.shape[1] > self.num_actions else None


class StackedActors:
    """The actors of several nets of one MLP architecture, evaluated as one.

    A self-play runner asks ~16 frozen snapshots for ~100 rows each per step; one call per net
    is bound by per-call overhead, not arithmetic. Where `ludus.agents.kernels` has a path for the
    nets' dtype, each layer is one call of its grouped kernel (agents/grouped_linear.cpp): every
    net's rows, and only those, times its own weights, packed once at construction, ReLU fused —
    bfloat16 on AMX tiles or AVX512-BF16, float32 on AVX2. Elsewhere each layer is one
    `torch.baddbmm` over all the nets with each group padded to the largest (~2x the products at
    PFSP's uneven groups, and ~15 us per net and layer of weight re-layout). On the preset's
    16-net stack the kernels ran 1.8-1.9x faster than `baddbmm` on AMX tiles, 2.7x on AVX512-BF16
    without AMX, and the float32 one 1.4x faster than one product per net, where the float32
    `baddbmm` is 0.5x (docs/scale_out.md); the runner stacks float32 nets only where the float32
    kernel runs (ludus.agents.torch_policy).
    The weights are copied once, at construction: build a new stack when a net's weights change.
    """

    def __init__(self, nets: Sequence[ActorCritic], grouped: bool | str | None = None):
        """`grouped`: the grouped kernel's path (a key of `ludus.agents.kernels.PATHS`), True for
        this CPU's path for the nets' dtype, False for `baddbmm`; default: the kernel where this
        CPU has a path for the dtype, else `baddbmm`."""
        if not self.can_stack(nets):
            raise ValueError("StackedActors needs two or more 'mlp' nets of one config and dtype without layer norm")
        self.num_nets = len(nets)
        self.obs_dim = nets[0].obs_dim
        self.dtype = nets[0].policy_head.weight.dtype
        self.head = nets[0]._policy_from_head
        here = grouped_path(self.dtype)
        odd = any(m.out_features % 2 for m in nets[0].actor_trunk if isinstance(m, nn.Linear))
        if here == "amx" and odd:
            here = "avx512bf16"  # (every CPU with AMX tiles has it)
        path = here if grouped is None or grouped is True else grouped or None
        if path == "amx" and odd:
            raise ValueError("the AMX kernel reads a layer's inputs in pairs, and these nets have an odd hidden "
                             "width: use grouped=True (AVX512-BF16 then)")
        if grouped is True and here is None:
            raise ValueError(f"no grouped kernel runs {self.dtype} nets here ({grouped_linear_status()}); "
                             "use grouped=False")
        if path is not None and (path not in PATHS or PATHS[path][0] != self.dtype):
            raise ValueError(f"grouped={path!r} is not a path for {self.dtype} nets: use one of "
                             f"{sorted(p for p in PATHS if PATHS[p][0] == self.dtype)}, True or False")
        if path is not None and path not in grouped_paths():
            raise ValueError(f"this CPU does not run the {path!r} kernel ({grouped_linear_status()}); "
                             "use grouped=True or False")
        self.path = path
        """The grouped kernel's path (`ludus.agents.kernels.PATHS`), or None for `baddbmm`."""
        self.grouped = path is not None
        self.in_dim = self.obs_dim + self.obs_dim % 2 if path == "amx" else self.obs_dim
        """Input width: AMX reads its inputs in pairs (VNNI), so an odd one gets a zero column."""
        self.layers: list[tuple[torch.Tensor, torch.Tensor] | type[nn.Module]] = []
        """baddbmm path (empty on the grouped one), per layer: (weights [G, in, out], biases
        [G, 1, out]) of a Linear, or the activation's class."""
        self.grouped_layers: list[tuple[torch.Tensor, torch.Tensor, int, bool, type[nn.Module] | None]] = []
        """Grouped path (empty on the baddbmm one), per Linear: (packed weights, float32 biases
        [G, out], out width, ReLU fused, the activation applied after it otherwise or None)."""
        if path is not None:
            pack, self._linear = (getattr(torch.ops.ludus, name) for name in PATHS[path][2:])
        modules_in_order = [list(net.actor_trunk) + [net.policy_head] for net in nets]
        for i, modules in enumerate(zip(*modules_in_order)):
            if not isinstance(modules[0], nn.Linear):
                if not self.grouped:
                    self.layers.append(type(modules[0]))
                continue
            weights, biases = self._stack(modules)
            if not self.grouped:
                self.layers.append((weights, biases))
                continue
            after = type(modules_in_order[0][i + 1]) if i + 1 < len(modules_in_order[0]) else None
            after = None if after is nn.Linear else after
            if i == 0 and self.in_dim != self.obs_dim:
                weights = torch.cat([weights, weights.new_zeros(self.num_nets, self.in_dim - self.obs_dim,
                                                                weights.shape[2])], dim=1)
            self.grouped_layers.append((pack(weights), biases[:, 0].float().contiguous(),
                                        weights.shape[2], after is nn.ReLU, None if after is nn.ReLU else after))

    @staticmethod
    def _stack(linears: Sequence[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor]:
        weights = torch.stack([m.weight.detach().T for m in linears]).contiguous()
        return weights, torch.stack([m.bias.detach() for m in linears])[:, None]

    @staticmethod
    def can_stack(nets: Sequence[ActorCritic]) -> bool:
        """Two or more 'mlp' nets of one config (no layer norm), game shape and dtype."""
        first = nets[0] if nets else None
        return (len(nets) >= 2 and first.config.kind == "mlp" and not first.config.layer_norm
                and all(type(m) in _IN_PLACE for m in first.actor_trunk if not isinstance(m, nn.Linear))
                and all(net.config == first.config and net.obs_dim == first.obs_dim
                        and net.spec.num_actions == first.spec.num_actions
                        and net.policy_head.weight.dtype == first.policy_head.weight.dtype for net in nets))

    def policy_logits(self, obs: Sequence[torch.Tensor], mask: torch.Tensor, pad_rows: int = 1) -> torch.Tensor:
        """Masked float32 logits [sum of rows, A] of net g on `obs[g]` (one tensor per net, in
        order; empty ones allowed), the groups' rows concatenated in order; `mask` is [sum of rows, A].
        On the baddbmm path the groups are padded to a multiple of `pad_rows` rows (see
        ludus.agents.torch_policy.PAD_ROWS); the grouped kernel needs no padding."""
        if len(obs) != self.num_nets:
            raise ValueError(f"{len(obs)} observation groups for {self.num_nets} stacked nets")
        sizes = [len(o) for o in obs]
        if self.grouped:
            x = torch.empty(sum(sizes), self.in_dim, dtype=self.dtype)
            if self.in_dim != self.obs_dim:
                x[:, self.obs_dim:] = 0
            start = 0
            for o, n in zip(obs, sizes):
                x[start:start + n, :self.obs_dim] = o.reshape(n, self.obs_dim)  # converted as it is copied
                start += n
            for packed, biases, width, relu, after in self.grouped_layers:
                x = self._linear(x, sizes, packed, biases, width, relu)
                if after is not None:
                    x = _IN_PLACE[after](x)
            return self.head(x.float(), mask)
        x = torch.zeros(self.num_nets, -(-max(sizes) // pad_rows) * pad_rows, self.obs_dim, dtype=self.dtype)
        for g, o in enumerate(obs):
            x[g, :sizes[g]] = o.reshape(sizes[g], self.obs_dim)
        for layer in self.layers:
            x = torch.baddbmm(layer[1], x, layer[0]) if isinstance(layer, tuple) else _IN_PLACE[layer](x)
        outputs = torch.cat([x[g, :n] for g, n in enumerate(sizes)]).float()
        return self.head(outputs, mask)
