"""Building, loading and saving pi0.5 policies, with lerobot-compatible weight files.

Our parameter names are lerobot PI05Policy's (`model.paligemma_with_expert...`) minus its two
unused `lm_head`s. lerobot's real `model.safetensors` stores the tied token embedding as
`...paligemma.lm_head.weight` and has no `...embed_tokens.weight` (safetensors drops tied
duplicates), so we read either and write the `lm_head` form, which is what lerobot loads.
lerobot's `from_pretrained` loads strictly by default (and on a mismatch only prints a warning
and keeps random weights), so the file also carries the action expert's `lm_head`, which
nothing computes with: zeros, in bfloat16 to halve their size.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from relay.catalog import ACTION_HORIZON, MODELS
from relay_engine.errors import ConfigError
from relay_engine.hub_files import download, hub_endpoint
from relay_engine.models.config import Pi05Config, named_config
from relay_engine.models.lerobot_files import NORMALIZER_FILE, RobotFeatures, write_lerobot_config
from relay_engine.models.pi05 import Pi05Policy
from relay_engine.models.streamed_safetensors import PendingTensor, untouched_zeros, write_streamed

WEIGHTS_FILE = "model.safetensors"
# Relay's description of the model. config.json beside it is lerobot's (models.lerobot_files); outputs
# written before that split kept Relay's description in config.json, and are still read.
CONFIG_FILE = "relay_config.json"
OLD_CONFIG_FILE = "config.json"
# The statistics a model was trained with, in openpi's layout (lerobot's are in NORMALIZER_FILE).
NORM_STATS_FILE = "norm_stats.json"
CONFIG_FORMAT = "relay-pi05"
BASE_REPO = {"pi05": "lerobot/pi05_base"}
# The pi05-tiny base ships inside the package: pretrained on synthetic tasks by
# scripts/pretrain_tiny.py (its settings are in pretraining.json beside the weights).
TINY_BASE_DIR = Path(__file__).resolve().parent / "pi05_tiny"

_PREFIX = "model."
_EMBED = "model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
_LM_HEAD = "model.paligemma_with_expert.paligemma.lm_head.weight"
_EXPERT_LM_HEAD = "model.paligemma_with_expert.gemma_expert.lm_head.weight"
_ACTION_IN = "model.action_in_proj.weight"  # (expert width, 32)
# Older or openpi-converted files: plain expert norm scales (adaRMS has none), pi0 names.
_DROPPED = re.compile(
    r"model\.(paligemma_with_expert\.gemma_expert\.model\.(layers\.\d+\.(input|post_attention)_layernorm|norm)"
    r"\.weight|state_proj\..*)$"
)


def build_policy(
    name: str | Path | Pi05Config,
    *,
    device: str | torch.device = "cpu",
    action_horizon: int = ACTION_HORIZON,
    seed: int = 0,
) -> Pi05Policy:
    """A policy with freshly initialised weights (seeded), or structure only on device="meta".

    `name` is a model name, a config, or a directory whose config.json says which model it is.
    """
    if isinstance(name, Pi05Config):
        config = name
    elif str(name) not in MODELS and Path(name).expanduser().is_dir():
        config = read_config(Path(name).expanduser(), seed)
    else:
        config = named_config(str(name), action_horizon=action_horizon, seed=seed)
    device = torch.device(device)
    with torch.random.fork_rng(devices=[]), device:
        torch.manual_seed(config.seed)
        policy = Pi05Policy(config)
        # Only pi05 has pretrained weights; every other size's init stands in for them.
        policy.model.init_weights(stand_in=config.model != "pi05")
    return policy


def load_policy(
    name_or_path: str | Path,
    *,
    device: str | torch.device = "cpu",
    action_horizon: int | None = None,
    seed: int = 0,
) -> Pi05Policy:
    """One constructor for base models and trained outputs.

    - `pi05-tiny`: the base shipped in the package (TINY_BASE_DIR, see scripts/pretrain_tiny.py);
      `build_policy("pi05-tiny", seed=...)` gives random weights instead.
    - `pi05`: lerobot's base weights (`lerobot/pi05_base`, from the Hub cache or a download).
    - a directory: ours (config.json from `save_pretrained`) or lerobot's (pi05 sizes); its
      `model.safetensors` is loaded and a PaliGemma tokenizer there is used.
    - another Hub repo id holding a pi05 `model.safetensors`.

    `action_horizon` defaults to the saved one for a directory and to 10 for a base model.
    """
    name = str(name_or_path)
    local = Path(name).expanduser()
    if name == "pi05-tiny":
        directory = TINY_BASE_DIR
        if not (directory / WEIGHTS_FILE).is_file():
            raise ConfigError(
                f"the pi05-tiny base weights are missing from {directory}; "
                "remake them with `python scripts/pretrain_tiny.py`"
            )
    elif name not in MODELS and local.is_dir():
        directory = local
    elif name in MODELS or re.fullmatch(r"[\w.-]+/[\w.-]+", name):
        directory = fetch_from_hub(BASE_REPO.get(name, name))
    else:
        raise ConfigError(
            f"model {name!r} is neither a known model ({', '.join(MODELS)}) "
            f"nor a directory with {WEIGHTS_FILE}"
        )
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise ConfigError(f"{directory}: no {WEIGHTS_FILE} in this directory")
    config = read_config(directory, seed)
    if action_horizon is not None or name in MODELS:
        # A base model's chunks are the recipe's (10 by default), not its training's.
        config = config.replace(action_horizon=action_horizon or 10)
    return load_weights(config, weights, torch.device(device), str(directory))


def read_config(directory: Path, seed: int = 0) -> Pi05Config:
    path = directory / CONFIG_FILE
    if not path.is_file():
        path = directory / OLD_CONFIG_FILE
    if not path.is_file():
        if (directory / WEIGHTS_FILE).is_file():
            return named_config("pi05", seed=seed)  # a bare lerobot/openpi pi05 weights file
        raise ConfigError(
            f"{directory}: no {CONFIG_FILE} or {OLD_CONFIG_FILE}; cannot tell which model this is"
        )
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}: not valid JSON ({error})") from None
    if data.get("format") == CONFIG_FORMAT:
        return Pi05Config.from_dict(data)
    if data.get("type") == "pi05":  # lerobot's PI05Config
        return named_config("pi05", action_horizon=int(data.get("chunk_size", 10)), seed=seed)
    raise ConfigError(
        f"{path}: not a pi05 config (expected format {CONFIG_FORMAT!r} or lerobot's type 'pi05')"
    )


def fetch_from_hub(repo: str, revision: str | None = None, *, with_stats: bool = False) -> Path:
    """The directory in the Hub cache holding the repo's weights and config.json at `revision` (a
    branch, tag or commit; None: the default branch), named by its commit sha (the cache's
    snapshots/<sha>/). relay_engine.hub_files reads HF_ENDPOINT, HF_TOKEN and HF_HUB_CACHE at each call."""
    from huggingface_hub.errors import EntryNotFoundError

    at = f" at revision {revision}" if revision is not None else ""
    try:
        weights = download(repo, WEIGHTS_FILE, revision=revision)
        for config_file in (CONFIG_FILE, OLD_CONFIG_FILE):  # without either, the weights are pi05's
            with contextlib.suppress(EntryNotFoundError):
                download(repo, config_file, revision=revision)
        # The statistics a checkpoint was trained with (a recipe's from_checkpoint may normalize with
        # them); a repo without them is still a checkpoint.
        for stats_file in (NORM_STATS_FILE, NORMALIZER_FILE) if with_stats else ():
            with contextlib.suppress(EntryNotFoundError):
                download(repo, stats_file, revision=revision)
    except Exception as error:  # offline, gated, missing: say which and how to fix it
        raise ConfigError(
            f"cannot get {WEIGHTS_FILE} of {repo}{at} from {hub_endpoint()} "
            f"({_hub_problem(error, repo, revision)}); "
            "download it once, or pass the path of a local directory holding it"
        ) from None
    return weights.parent


def _hub_problem(error: Exception, repo: str, revision: str | None) -> str:
    """huggingface_hub's error in a few words (its own text runs over several lines of advice)."""
    name = type(error).__name__
    if name == "RevisionNotFoundError":
        return f"{name}: {repo} has no branch, tag or commit {revision}"
    if name == "GatedRepoError":
        return f"{name}: {repo} is gated; accept its terms on the Hub and set HF_TOKEN"
    if name == "RepositoryNotFoundError":
        return f"{name}: no model repo {repo} there (a private one needs HF_TOKEN)"
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    return f"{name}: {first}"


def load_weights(config: Pi05Config, weights: Path, device: torch.device, source: str | None) -> Pi05Policy:
    # Structure on the meta device, then the file's tensors assigned in: no second copy, no init.
    with torch.device("meta"):
        policy = Pi05Policy(config, source=source)
    state = to_policy_state_dict(load_file(str(weights), device=str(device)))
    expected = policy.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ConfigError(
            f"{weights}: does not fit {config.model}: "
            f"{len(missing)} missing tensors {missing[:3]}, {len(unexpected)} unexpected {unexpected[:3]}"
        )
    for key, tensor in state.items():
        if tensor.shape != expected[key].shape:
            raise ConfigError(
                f"{weights}: {key} has shape {tuple(tensor.shape)}, expected {tuple(expected[key].shape)}"
            )
    # The model computes in fp32 (autocast makes bf16 activations on CUDA).
    policy.load_state_dict({k: v.float() for k, v in state.items()}, assign=True)
    materialize_buffers(policy, device)
    return policy


def materialize_buffers(module: nn.Module, device: torch.device) -> None:
    """Non-persistent buffers are not in the file; refill the one kind pi05 has (SigLIP's)."""
    for name, buffer in list(module.named_buffers()):
        if not buffer.is_meta:
            continue
        owner_name, _, attr = name.rpartition(".")
        owner = module.get_submodule(owner_name)
        if attr != "position_ids":
            raise RuntimeError(f"cannot materialize buffer {name}")
        setattr(owner, attr, torch.arange(buffer.shape[-1], device=device).expand(buffer.shape).contiguous())


def to_policy_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A lerobot / openpi-PyTorch / our state dict -> our names."""
    prefixed = {key if key.startswith(_PREFIX) else _PREFIX + key: value for key, value in state.items()}
    out: dict[str, torch.Tensor] = {}
    for key, tensor in prefixed.items():
        if key in (_LM_HEAD, _EXPERT_LM_HEAD) or _DROPPED.match(key):
            continue
        out[key.replace(".action_time_mlp_", ".time_mlp_")] = tensor
    if _EMBED not in out and _LM_HEAD in prefixed:
        out[_EMBED] = prefixed[_LM_HEAD]
    return out


def to_lerobot_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict -> what lerobot's pi05 file holds (the embedding stored as lm_head, and
    the expert's unused lm_head as zeros)."""
    out = {k: v for k, v in state.items() if k != _EMBED}
    out[_LM_HEAD] = state[_EMBED]
    vocab = state[_EMBED].shape[0]
    expert_width = state[_ACTION_IN].shape[0]
    out[_EXPERT_LM_HEAD] = torch.zeros((vocab, expert_width), dtype=torch.bfloat16)
    return out


def exported_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """The policy's weights under their original names, with any LoRA adapters merged in.

    Computed beside the live weights (base + delta), so the model being trained is untouched.
    """
    return {name: pending.make() for name, pending in exported_tensors(module).items()}


def exported_tensors(module: nn.Module) -> dict[str, PendingTensor]:
    """exported_state_dict's tensors, each made only when asked for: a LoRA layer's merged weight
    is computed when it is written, so a save holds one merged weight at a time (save_policy)."""
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    exported: dict[str, PendingTensor] = {}
    lora_prefixes = []
    for name, layer in module.named_modules():
        if isinstance(layer, LoraLayer):
            if not isinstance(layer, LoraLinear):  # Relay puts adapters on linear layers only
                raise TypeError(f"{name}: cannot merge a {type(layer).__name__} adapter")
            base = layer.get_base_layer()
            assert isinstance(base, nn.Linear)
            weight = base.weight.detach()
            exported[f"{name}.weight"] = PendingTensor(
                tuple(weight.shape), weight.dtype, functools.partial(_merged_weight, layer, weight)
            )
            if getattr(base, "bias", None) is not None:
                exported[f"{name}.bias"] = PendingTensor.of(base.bias.detach())
            lora_prefixes.append(name + ".")
    for name, tensor in module.state_dict().items():
        if any(name.startswith(prefix) for prefix in lora_prefixes):
            continue
        exported[name] = PendingTensor.of(tensor.detach())
    return exported


def _merged_weight(layer: Any, weight: torch.Tensor) -> torch.Tensor:
    """A LoRA layer's base weight plus its active adapters' deltas (a new tensor)."""
    for adapter in layer.active_adapters:
        if adapter in layer.lora_A and adapter not in layer.merged_adapters:
            weight = weight + layer.get_delta_weight(adapter).to(weight.dtype)
    return weight


def lerobot_tensors(tensors: dict[str, PendingTensor]) -> dict[str, PendingTensor]:
    """to_lerobot_state_dict on tensors not made yet (the expert's lm_head of zeros included)."""
    out = {k: v for k, v in tensors.items() if k != _EMBED}
    out[_LM_HEAD] = tensors[_EMBED]
    vocab = tensors[_EMBED].shape[0]
    expert_width = tensors[_ACTION_IN].shape[0]
    out[_EXPERT_LM_HEAD] = PendingTensor(
        (vocab, expert_width),
        torch.bfloat16,
        lambda: untouched_zeros((vocab, expert_width), torch.bfloat16),
    )
    return out


def save_policy(policy: Pi05Policy, directory: Path, features: RobotFeatures | None = None) -> None:
    """model.safetensors, Relay's relay_config.json and lerobot's config.json (with the robot's
    cameras, state and action as its features, when they are known)."""
    directory.mkdir(parents=True, exist_ok=True)
    # Streamed: one tensor made and written at a time, so saving costs no copy of the model.
    write_streamed(
        directory / WEIGHTS_FILE, lerobot_tensors(exported_tensors(policy)), metadata={"format": "pt"}
    )
    config = {"format": CONFIG_FORMAT, **policy.config.to_dict()}
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    write_lerobot_config(directory, policy.config, features)
