"""A DeepSpeed engine behind the learners' update seam (agents/ppo_core.py `UpdateBackend`).

`DeepSpeedBackend.step(loss)` is `engine.backward(loss); engine.step()` with DeepSpeed doing the
gradient clipping; the client optimizer is the same `torch.optim.Adam` the plain torch backends
use (DeepSpeed's own "Adam" means AdamW and would change the update), so at ZeRO stage 0 the
two backends take the same steps. ZeRO stages 1 and 2 partition optimizer states and gradients
across data-parallel ranks (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models", §5); with one learner process there is a single partition, so the
update is still Adam's, computed from DeepSpeed's fp32 master copy of the weights.

Checkpoints, two ways:

* `state_dict()` / `load_state_dict()`: named tensors in the torch backend's layout
  (``lr``, ``state.<i>.exp_avg|exp_avg_sq|step`` per parameter in model order) plus
  ``master.<i>`` (the fp32 master weights) under ZeRO, so the league's safetensors checkpoints
  and exact resume work unchanged, and a torch-backend checkpoint loads into a DeepSpeed learner.
* `save_checkpoint()` / `load_checkpoint()`: DeepSpeed's native format (one file per rank, made
  with torch.save, i.e. pickle). These are our own files, written and read by the same trusted
  process or job; never load a DeepSpeed checkpoint that someone else could have written
  (unlike snapshots, which are JSON + safetensors and safe to take from strangers).

CPU facts (docs/reference.md §3): DeepSpeed picks its CPU accelerator and gloo; a process
that was not started by a launcher needs MASTER_ADDR/MASTER_PORT/RANK/LOCAL_RANK/WORLD_SIZE (set
here for a single rank on loopback); the shared-memory comm op must be disabled before
`initialize` or it is JIT-compiled (40-100 s); fp16 is refused on CPU, which `LearnerBackendConfig`
refuses first, at config time.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from ludus.agents.ppo_core import TorchAdam, flat_optimizer_state, load_flat_optimizer_state
from ludus.bounds import bounds
from ludus.errors import UserError


class LearnerBackendError(UserError):
    """A learner backend setting that cannot work; the message says which and what to use."""


@dataclass(frozen=True)
class LearnerBackendConfig:
    """How a learner turns its loss into a parameter update: torch Adam or a DeepSpeed engine."""

    backend: Literal["torch", "deepspeed"] = "torch"
    """'torch' (Adam with gradient clipping, in this process) or 'deepspeed' (a DeepSpeed engine)."""
    zero_stage: int = field(default=0, metadata=bounds(0, 2))
    """DeepSpeed ZeRO stage: 0 (none), 1 (optimizer states partitioned), 2 (and gradients). Stage 3
    (parameters partitioned too) is refused: the league reads the learner's whole weights every
    iteration for runners and snapshots, and with one learner process there is nothing to split."""
    bf16: bool = False
    """bfloat16 weights and activations, fp32 master weights in the optimizer (needs zero_stage >= 1)."""
    fp16: bool = False
    """float16 with loss scaling: GPUs only, refused on CPU."""
    offload_optimizer: bool = False
    """ZeRO-Offload: optimizer states and step in CPU memory (needs zero_stage >= 1; on a machine
    without a GPU everything is in CPU memory already)."""
    train_micro_batch_size: int | None = field(default=None, metadata=bounds(1, 10**6))
    """DeepSpeed's micro batch size; it must equal the learner's minibatch size (each minibatch is
    one optimizer step); None takes the learner's."""
    ranks: int = field(default=1, metadata=bounds(1, 256))
    """Data-parallel ranks of each learner: the league's process is rank 0 and starts ranks - 1
    helper processes on this machine (gloo; league/learners/ranks.py); each rank trains on 1/ranks of
    every batch and they take the update one rank would take on all of it (agents/rl/ppo.py
    `DataShard`). With ZeRO 1-2 the optimizer state (and gradients) are split among them."""

    def __post_init__(self) -> None:
        if self.ranks < 1:
            raise LearnerBackendError(f"learner_backend.ranks must be >= 1, got {self.ranks}")
        if self.ranks > 1 and self.backend != "deepspeed":
            raise LearnerBackendError("learner_backend.ranks > 1 needs learner_backend.backend=deepspeed (the ranks are "
                                      "DeepSpeed's data-parallel processes)")
        if self.backend not in ("torch", "deepspeed"):
            raise LearnerBackendError(f"learner_backend.backend must be 'torch' or 'deepspeed', got {self.backend!r}")
        if self.backend == "torch":
            changed = [name for name, default in (("zero_stage", 0), ("bf16", False), ("fp16", False),
                                                  ("offload_optimizer", False), ("train_micro_batch_size", None))
                       if getattr(self, name) != default]
            if changed:
                raise LearnerBackendError(f"learner_backend.{changed[0]} is a DeepSpeed setting: set learner_backend.backend=deepspeed "
                                          f"or drop it")
            return
        if self.zero_stage == 3:
            raise LearnerBackendError("learner_backend.zero_stage=3 partitions the parameters, but the league reads the "
                                      "learner's whole weights every iteration: use zero_stage 0, 1 or 2")
        if self.zero_stage not in (0, 1, 2):
            raise LearnerBackendError(f"learner_backend.zero_stage must be 0, 1 or 2, got {self.zero_stage}")
        if self.fp16 and self.bf16:
            raise LearnerBackendError("learner_backend.fp16 and learner_backend.bf16 are both set: pick one")
        if self.fp16 and not torch.cuda.is_available():
            raise LearnerBackendError("learner_backend.fp16 needs a GPU (DeepSpeed refuses fp16 on CPU): "
                                      "use learner_backend.bf16=true or leave both off for fp32")
        if self.bf16 and self.zero_stage == 0:
            raise LearnerBackendError("learner_backend.bf16 needs zero_stage 1 or 2 (ZeRO keeps the fp32 master weights "
                                      "that checkpoints and resume need)")
        if self.offload_optimizer and self.zero_stage == 0:
            raise LearnerBackendError("learner_backend.offload_optimizer needs zero_stage 1 or 2 (ZeRO-Offload)")
        if self.train_micro_batch_size is not None and self.train_micro_batch_size < 1:
            raise LearnerBackendError(f"learner_backend.train_micro_batch_size must be >= 1, got {self.train_micro_batch_size}")


def micro_batch_size(config: LearnerBackendConfig, minibatch_size: int | None) -> int:
    """DeepSpeed's micro batch size for a learner whose minibatches have `minibatch_size` rows."""
    if minibatch_size is None:
        raise LearnerBackendError("the DeepSpeed learner needs fixed-size minibatches: set ppo.minibatch_size "
                                  "(num_minibatches gives minibatches whose size changes with the batch)")
    if config.train_micro_batch_size is not None and config.train_micro_batch_size != minibatch_size:
        raise LearnerBackendError(f"learner_backend.train_micro_batch_size={config.train_micro_batch_size} differs from the "
                                  f"learner's minibatch size {minibatch_size}: make them equal (one minibatch is "
                                  f"one DeepSpeed step)")
    return minibatch_size


def text_micro_batch_size(config: LearnerBackendConfig, micro_batch: int) -> int:
    """DeepSpeed's micro batch size for a text learner whose micro-batches have `micro_batch` turns."""
    if config.train_micro_batch_size not in (None, micro_batch):
        raise LearnerBackendError(f"learner_backend.train_micro_batch_size={config.train_micro_batch_size} differs "
                                  f"from text_lm.ppo.micro_batch_size {micro_batch}: make them equal or drop it")
    return micro_batch


def deepspeed_config(config: LearnerBackendConfig, micro_batch: int, max_grad_norm: float,
                     accumulate: bool = False) -> dict[str, Any]:
    """The DeepSpeed JSON config for one learner step per minibatch. `accumulate`: a minibatch is
    several `backward` calls (micro-batches, as many as it needs) and then one `apply`."""
    zero: dict[str, Any] = {"stage": config.zero_stage}
    if config.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        # unmanaged accumulation: every engine.step() is the boundary, whatever the number of
        # backward calls before it (a minibatch's last micro-batch may be short, the count varies)
        "managed_gradient_accumulation": not accumulate,
        # ZeRO clips the gradient partitions it holds (and reports the norm); at stage 0 the
        # gradients are whole in `p.grad` and DeepSpeedBackend clips them with torch's
        # clip_grad_norm_, exactly as the torch backend does.
        "gradient_clipping": max_grad_norm if config.zero_stage > 0 else 0.0,
        "zero_optimization": zero,
        "bf16": {"enabled": config.bf16},
        "fp16": {"enabled": config.fp16},
        # ZeRO-Offload insists on DeepSpeed's CPUAdam (a 60 s JIT build) unless told that the
        # client's torch Adam is fine.
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**62,
        "wall_clock_breakdown": False,
    }


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (a rendezvous for this machine's ranks)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def loopback_rank_environment(rank: int, world_size: int, port: int) -> dict[str, str]:
    """The rendezvous variables of rank `rank` of a `world_size`-rank job on this machine: the
    master on loopback, and gloo's traffic kept on loopback too (Linux)."""
    environment = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                   "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size)}
    if sys.platform.startswith("linux"):
        environment["GLOO_SOCKET_IFNAME"] = "lo"
    return environment


def single_process_environment() -> None:
    """The rendezvous variables of a one-rank job on loopback, unless a launcher (torchrun,
    `deepspeed`) already set them."""
    if "LOCAL_RANK" in os.environ or "WORLD_SIZE" in os.environ:
        return
    environment = loopback_rank_environment(0, 1, free_loopback_port())
    interface = environment.pop("GLOO_SOCKET_IFNAME", None)
    os.environ.update(environment)
    if interface is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)


class DeepSpeedBackend:
    """A DeepSpeed engine over `model` with a client `torch.optim.Adam`; one `step` per minibatch."""

    def __init__(self, model: nn.Module, config: LearnerBackendConfig, micro_batch: int, learning_rate: float,
                 adam_eps: float, max_grad_norm: float, parameters: list[nn.Parameter] | None = None,
                 accumulate: bool = False):
        """`parameters`: the ones this engine trains (default: every parameter of `model` that
        requires grad). `accumulate`: gradients of several `backward` calls make one `apply`."""
        if config.backend != "deepspeed":
            raise LearnerBackendError("DeepSpeedBackend needs learner_backend.backend=deepspeed")
        import deepspeed

        single_process_environment()
        # Without this, initialize JIT-compiles a shared-memory all-reduce op (40-100 s) that a
        # CPU run does not need.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        self.config = config
        self.model = model
        self.parameters = [p for p in (model.parameters() if parameters is None else parameters) if p.requires_grad]
        optimizer = torch.optim.Adam(self.parameters, lr=learning_rate, eps=adam_eps)
        self.max_grad_norm = max_grad_norm
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                    config=deepspeed_config(config, micro_batch, max_grad_norm, accumulate))
        self.optimizer = self.engine.optimizer
        """The engine's optimizer: the client Adam at stage 0, DeepSpeed's ZeRO wrapper otherwise."""
        if config.bf16:
            _run_forward_in_bf16(model)

    @property
    def zero(self) -> bool:
        return self.config.zero_stage > 0

    def step(self, loss: torch.Tensor) -> float:
        self.engine.backward(loss)
        return self.apply()

    def backward(self, loss: torch.Tensor) -> None:
        """Add `loss`'s gradients to those of the minibatch so far (one micro-batch)."""
        self.engine.backward(loss)

    def apply(self) -> float:
        """One optimizer step on the gradients since the last one; returns their norm before clipping."""
        if not self.zero:
            grad_norm = nn.utils.clip_grad_norm_(self.parameters, self.max_grad_norm)
            self.engine.step()
            return float(grad_norm)
        self.engine.step()
        return float(self.engine.get_global_grad_norm())

    def set_learning_rate(self, learning_rate: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate

    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    # --------------------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Optimizer state as named tensors, per parameter in model order (the torch backend's layout)."""
        if not self.zero:
            return flat_optimizer_state(self.optimizer)
        flat = {"lr": torch.tensor(self.learning_rate(), dtype=torch.float64)}
        from deepspeed.utils import (
            safe_get_full_fp32_param,
            safe_get_full_optimizer_state,
        )

        step = self._zero_step()
        for index, param in enumerate(self.parameters):
            flat[f"master.{index}"] = safe_get_full_fp32_param(param).detach().clone()
            if step is None:
                continue  # no optimizer step yet: Adam has no moments to save
            for name in ("exp_avg", "exp_avg_sq"):
                flat[f"state.{index}.{name}"] = safe_get_full_optimizer_state(param, name).detach().clone()
            flat[f"state.{index}.step"] = step.clone()
        return flat

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore `state_dict()` output (or a torch backend's). Load the model's weights first
        (PPOLearner.load_state_dict does): without ``master.<i>`` entries the fp32 masters are
        taken from the model."""
        if not self.zero:
            load_flat_optimizer_state(self.optimizer, state)
            return
        from deepspeed.utils import (
            safe_set_full_fp32_param,
            safe_set_full_optimizer_state,
        )

        masters = [state.get(f"master.{index}", param.detach()).float().clone()
                   for index, param in enumerate(self.parameters)]
        if self._zero_step() is None:
            # ZeRO creates Adam's state (and links it to the parameters) at the first step. A step
            # on zero gradients creates it without changing the masters (Adam's update is
            # lr * m / (sqrt(v) + eps) with m = v = 0), but it copies the masters, which are
            # still the initial weights, over the model's weights: both are set again below.
            self.engine.backward(sum((p * 0.0).sum() for p in self.parameters))
            self.engine.step()
        for index, param in enumerate(self.parameters):
            safe_set_full_fp32_param(param, masters[index])
            with torch.no_grad():
                param.copy_(masters[index].to(param.dtype))
            for name in ("exp_avg", "exp_avg_sq"):
                value = state.get(f"state.{index}.{name}")
                if value is not None:
                    safe_set_full_optimizer_state(param, value.float(), name)
        # ZeRO steps all parameters together; a torch-backend state may lack parameters that never
        # had a gradient, so take the largest count (none at all: an optimizer that never stepped).
        steps = [float(v) for k, v in state.items() if k.startswith("state.") and k.endswith(".step")]
        for param_state in self._base_optimizer().state.values():
            param_state["step"] = torch.tensor(max(steps, default=0.0), dtype=torch.float32)
        self.set_learning_rate(float(state["lr"]))

    def _base_optimizer(self) -> torch.optim.Optimizer:
        return self.optimizer.optimizer  # the client Adam inside DeepSpeed's ZeRO wrapper

    def _zero_step(self) -> torch.Tensor | None:
        """Adam's step count under ZeRO (one flat parameter per group, all stepped together)."""
        for param_state in self._base_optimizer().state.values():
            if "step" in param_state:
                return param_state["step"]
        return None

    def save_checkpoint(self, directory: str | os.PathLike, tag: str) -> None:
        """DeepSpeed's native checkpoint (pickle files: for this job only, never from strangers)."""
        self.engine.save_checkpoint(str(directory), tag=tag)

    def load_checkpoint(self, directory: str | os.PathLike, tag: str) -> None:
        """Load weights and optimizer state saved by `save_checkpoint` of a trusted run of ours."""
        if not os.path.isdir(os.path.join(directory, tag)):
            raise LearnerBackendError(f"no DeepSpeed checkpoint {tag!r} in {directory}: give the directory and "
                                      f"tag that save_checkpoint was called with")
        path, _ = self.engine.load_checkpoint(str(directory), tag=tag, load_optimizer_states=True,
                                              load_lr_scheduler_states=False)
        if path is None:
            raise LearnerBackendError(f"DeepSpeed could not load checkpoint {tag!r} from {directory}")


def _run_forward_in_bf16(model: nn.Module) -> None:
    """Run `model`'s forward under bf16 autocast and hand back float32 outputs.

    DeepSpeed's bf16 mode stores the module's weights in bfloat16 but leaves inputs alone; the
    learners call the module directly with float32 observations (and ActorCritic casts them to
    float), so autocast does the casting inside, and the losses are computed in float32 as in
    mixed-precision training (Micikevicius et al. 2018)."""
    state: dict[str, Any] = {}

    def enter(module: nn.Module, args: tuple) -> None:
        state["autocast"] = torch.autocast("cpu", dtype=torch.bfloat16)
        state["autocast"].__enter__()

    def leave(module: nn.Module, args: tuple, output: Any) -> Any:
        state.pop("autocast").__exit__(None, None, None)
        return _to_float32(output)

    model.register_forward_pre_hook(enter)
    model.register_forward_hook(leave, always_call=True)


def _to_float32(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.float() if value.is_floating_point() else value
    if isinstance(value, tuple):
        return tuple(_to_float32(v) for v in value)
    if isinstance(value, list):
        return [_to_float32(v) for v in value]
    return value


# ------------------------------------------------------------------------------- factories


def as_backend_config(config: Any) -> LearnerBackendConfig:
    """Validated settings from a `LearnerBackendConfig` or any record with its fields (such as a
    league config's `learner_backend`); fields it lacks keep their defaults."""
    if isinstance(config, LearnerBackendConfig):
        return config
    return LearnerBackendConfig(backend=config.backend, zero_stage=config.zero_stage, bf16=config.bf16,
                                fp16=getattr(config, "fp16", False), offload_optimizer=config.offload_optimizer,
                                train_micro_batch_size=getattr(config, "train_micro_batch_size", None))


def make_update_backend(net: nn.Module, ppo_config, backend_config: Any):
    """The `UpdateBackend` of a `PPOLearner` (agents/rl/ppo.py) over `net`."""
    backend_config = as_backend_config(backend_config)
    if backend_config.backend == "torch":
        return TorchAdam(net.parameters(), ppo_config.learning_rate, ppo_config.adam_eps, ppo_config.max_grad_norm)
    return DeepSpeedBackend(net, backend_config, micro_batch_size(backend_config, ppo_config.minibatch_size),
                            ppo_config.learning_rate, ppo_config.adam_eps, ppo_config.max_grad_norm)


def make_text_update_backend(model: nn.Module, parameters: list[nn.Parameter], text_config, backend_config: Any):
    """The adapters' `UpdateBackend` of a `TextPPOLearner` (agents/lm/text_ppo.py): `parameters` of
    `model`, a minibatch accumulated over micro-batches (`backward` per micro-batch, `apply` per
    minibatch). The value head keeps its own small torch Adam in the learner."""
    backend_config = as_backend_config(backend_config)
    if backend_config.backend == "torch":
        return TorchAdam(parameters, text_config.learning_rate, text_config.adam_eps, text_config.max_grad_norm,
                         fused=False)
    return DeepSpeedBackend(model, backend_config, text_micro_batch_size(backend_config, text_config.micro_batch_size),
                            text_config.learning_rate,
                            text_config.adam_eps, text_config.max_grad_norm, parameters=parameters, accumulate=True)


def make_token_update_backend(model: nn.Module, token_config, backend_config: Any):
    """The `UpdateBackend` of a `TokenPPOLearner` (agents/rl/token_ppo.py) over `model`.

    Build the learner with an explicit `ref_model` (or copy the reference before this call): the
    engine attaches DeepSpeed state to the model's parameters, which a deep copy would drag along."""
    from ludus.agents.rl.token_ppo import token_adam

    backend_config = as_backend_config(backend_config)
    if backend_config.backend == "torch":
        return token_adam(model, token_config)
    return DeepSpeedBackend(model, backend_config, micro_batch_size(backend_config, token_config.minibatch_size),
                            token_config.lr, token_config.adam_eps, token_config.max_grad_norm)
