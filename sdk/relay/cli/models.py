"""`relay models`: the base models, and what a recipe would train on one.

`info` builds the model on PyTorch's meta device (shapes only: no weights, no download, no
memory), applies the tuning settings and counts. It needs the engine extra, except `--memory` on
a named model: the memory plan is arithmetic on the model's sizes (relay.memory_plan).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn

import typer
from rich.markup import escape
from rich.table import Table

from relay import families
from relay.catalog import (
    DEFAULT_LORA_TARGETS,
    FINETUNE_METHODS,
    LORA_RANK_DEFAULT,
    LORA_RANK_MAX,
    STRATEGIES,
    TARGETS,
)
from relay.cli._common import console
from relay.cli._extras import require
from relay.errors import ConfigError
from relay.memory_plan import plan_named, weight_count
from relay.sft.config import BATCH_SIZE_MAX, GPUS_MAX, SFTConfig

app = typer.Typer(help="Base models, and what a recipe trains on them.", no_args_is_help=True)

_out = console()
_err = console(stderr=True)


@app.command("list")
def list_models() -> None:
    """The base models and the training targets."""
    for spec in families.family_specs():
        _out.print(f"{spec.list_label}: " + ", ".join(spec.models))
    table = Table("target", "where", box=None)
    for target, description in TARGETS.items():
        table.add_row(target, description)
    _out.print(table)
    _out.print(f"default LoRA targets: {', '.join(DEFAULT_LORA_TARGETS)}; default full targets: all")


@app.command()
def info(
    name: Annotated[
        str, typer.Argument(help=f"{', '.join(families.model_names())}, or an output directory.")
    ],
    finetune: Annotated[
        str | None, typer.Option(help="lora or full [default: the model's recipe default].")
    ] = None,
    lora_rank: Annotated[int, typer.Option(help=f"LoRA rank, 1 to {LORA_RANK_MAX}.")] = LORA_RANK_DEFAULT,
    lora_alpha: Annotated[float | None, typer.Option(help="LoRA alpha [default: the rank].")] = None,
    targets: Annotated[
        list[str] | None,
        typer.Option(help="Where training goes; repeat or separate with commas [default: per finetune]."),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    keys: Annotated[bool, typer.Option("--keys", help="List every tensor with its shape.")] = False,
    memory: Annotated[
        bool, typer.Option("--memory", help="The per-GPU memory plan at --batch-size on --gpus.")
    ] = False,
    batch_size: Annotated[int, typer.Option(help="The global batch, for --memory.")] = 32,
    gpus: Annotated[int, typer.Option(help="GPUs (one process each) sharing the batch, for --memory.")] = 1,
    strategy: Annotated[str, typer.Option(help="auto (fsdp for full, ddp for lora), ddp or fsdp.")] = "auto",
    device: Annotated[
        str,
        typer.Option(help="cuda (bf16 compute, per GPU) or cpu (fp32, one process's memory), for --memory."),
    ] = "cuda",
) -> None:
    """Parameter counts per module and what these settings train, without loading weights."""
    spec = families.family_of(name)
    if spec is not None and not spec.tunes_targets:
        # --keys and --targets read pi05's layout of targets, --memory a layout the plan knows
        # (FamilySpec.memory_planned); saying so beats printing the description as if they held.
        targeted = families.models_where(lambda other: other.tunes_targets)
        planned = families.models_where(lambda other: other.memory_planned)
        for flag, given, models in (
            ("--keys", keys, targeted),
            ("--targets", bool(targets), targeted),
            ("--memory", memory and (not spec.memory_planned or weight_count(name) is None), planned),
        ):
            if given:
                _fail(f"{flag} is for {', '.join(models)}; {name} has no such layout here (leave {flag} out)")
        if not memory:
            _print_description(name, json_output)
            return
    finetune = finetune or SFTConfig.default("finetune", name)
    if finetune not in FINETUNE_METHODS:
        _fail(f"--finetune must be one of {', '.join(FINETUNE_METHODS)}, got {finetune!r}")
    if memory:
        problem = _memory_flag_problem(batch_size, gpus, strategy, device)
        if problem:
            _fail(problem)
    chosen = [t.strip() for item in targets for t in item.split(",") if t.strip()] if targets else None
    tuning = Tuning(finetune, chosen, lora_rank, lora_alpha)
    if memory and weight_count(name) is not None:
        # Pure arithmetic on the named model's sizes: no engine needed (the API plans the same way).
        _print_plan(_named_plan(name, tuning, batch_size, gpus, strategy, device).to_dict(), json_output)
        return
    policy = _tuned_policy(name, tuning)
    if memory:
        plan = require("relay_engine.families.pi05.memory").plan_memory(
            policy, batch_size=batch_size, gpus=gpus, strategy=strategy, device=device
        )
        _print_plan(plan.to_dict(), json_output)
    elif keys:
        _print_keys(policy, json_output)
    else:
        _print_counts(policy, chosen is None, json_output)


MEMORY_DEVICES = ("cuda", "cpu")


@dataclass(frozen=True)
class Tuning:
    """The tuning options of `relay models info`."""

    finetune: str
    targets: list[str] | None
    lora_rank: int
    lora_alpha: float | None


def _named_plan(name: str, tuning: Tuning, batch_size: int, gpus: int, strategy: str, device: str) -> Any:
    try:
        named = plan_named(
            name,
            finetune=tuning.finetune,
            targets=tuning.targets,
            lora_rank=tuning.lora_rank,
            batch_size=batch_size,
            gpus=gpus,
            strategy=strategy,
            device=device,
        )
    except ValueError as error:
        _fail(str(error))
    assert named is not None
    return named


def _tuned_policy(name: str, tuning: Tuning) -> Any:
    """The model on PyTorch's meta device, tuned as asked."""
    models = require("relay_engine.models")
    tuning_module = require("relay_engine.tuning")
    errors = require("relay_engine.errors")
    try:
        policy = models.build_policy(name, device="meta")
        return tuning_module.apply_tuning(
            policy, tuning.finetune, tuning.targets, tuning.lora_rank, tuning.lora_alpha
        )
    except errors.EngineError as error:
        _fail(str(error))


def _print_counts(policy: Any, defaulted: bool, json_output: bool) -> None:
    counts = require("relay_engine.tuning").parameter_counts(policy)
    report: dict[str, Any] = {
        "model": policy.config.model,
        **policy.config.tuning,
        "total_params": counts["all"]["params"],
        "trainable_params": counts["all"]["trainable"],
        "modules": {target: row for target, row in counts.items() if target != "all"},
        "recipe_defaults": recipe_defaults(policy.config.model),
    }
    if json_output:
        _out.print_json(json.dumps(report))
        return
    _print_report(report, defaulted)


def recipe_defaults(model: str) -> dict[str, Any]:
    """What a recipe on `model` trains with when it gives none of these (SFTConfig.default)."""
    return {field: SFTConfig.default(field, model) for field in RECIPE_DEFAULT_FIELDS}


RECIPE_DEFAULT_FIELDS = ("finetune", "learning_rate", "batch_size", "steps")


def _print_report(report: dict[str, Any], defaulted: bool) -> None:
    method = report["finetune"]
    if method == "lora":
        alpha = report["lora_alpha"]
        method += f" rank {report['lora_rank']}, alpha {alpha:g} (scale {alpha / report['lora_rank']:g})"
    targets = ", ".join(report["targets"]) + (" (default)" if defaulted else "")
    _out.print(f"[bold]{report['model']}[/bold]: {method}; targets {targets}")
    table = Table("module", "params", "LoRA params", "trainable", box=None)
    for target, row in report["modules"].items():
        # Sub-modules (vision.attn) are indented under their module (vision).
        label = ("  " + target) if "." in target else target
        table.add_row(label, f"{row['params']:,}", f"{row['adapter_params']:,}", f"{row['trainable']:,}")
    _out.print(table)
    share = report["trainable_params"] / report["total_params"]
    _out.print(
        f"trainable: [bold]{report['trainable_params']:,}[/bold] of {report['total_params']:,} weights "
        f"({share:.2%})"
    )
    defaults = ", ".join(f"{field} {value}" for field, value in report["recipe_defaults"].items())
    _out.print(f"a recipe's defaults on {report['model']}: {defaults}")


def _print_description(name: str, json_output: bool) -> None:
    """A model whose every weight trains (RT-J): its family's report of its sizes and parts."""
    try:
        description = require("relay_engine.families").family_for(name).describe(name)
    except ConfigError as error:  # a base that cannot be read here (smolvla's, off the Hub): say so
        _fail(escape(str(error)))
    if json_output:
        _out.print_json(json.dumps({**description.report, "recipe_defaults": recipe_defaults(name)}))
        return
    _out.print(description.headline)
    table = Table("part", "params", box=None)
    for part, count in description.parts.items():
        table.add_row(part, f"{count:,}")
    _out.print(table)
    for note in description.notes:
        _out.print(note)
    defaults = recipe_defaults(name)
    _out.print(
        f"a recipe's defaults on {name}: "
        + ", ".join(f"{field} {value}" for field, value in defaults.items())
    )


def _memory_flag_problem(batch_size: int, gpus: int, strategy: str, device: str) -> str | None:
    if device not in MEMORY_DEVICES:
        return f"bad --device: {device!r} (must be one of {', '.join(MEMORY_DEVICES)})"
    if not 1 <= batch_size <= BATCH_SIZE_MAX:
        return f"bad --batch-size: {batch_size} (must be an integer from 1 to {BATCH_SIZE_MAX})"
    if not 1 <= gpus <= GPUS_MAX:
        return f"bad --gpus: {gpus} (must be an integer from 1 to {GPUS_MAX})"
    if gpus > batch_size:
        return f"bad --gpus: {gpus} (must be at most --batch-size, {batch_size}: each GPU needs a sample)"
    if strategy not in STRATEGIES:
        return f"bad --strategy: {strategy!r} (must be one of {', '.join(STRATEGIES)})"
    return None


def _print_plan(plan: dict[str, Any], json_output: bool) -> None:
    if json_output:
        _out.print_json(json.dumps(plan))
        return
    on_cpu = plan["device"] == "cpu"
    where = "process(es) on the CPU" if on_cpu else "GPU(s)"
    sharing = "one process" if plan["strategy"] == "none" else plan["strategy"].upper()
    _out.print(
        f"[bold]{plan['model']}[/bold] {plan['finetune']}: batch {plan['batch_size']} "
        f"on {plan['gpus']} {where}, {plan['per_gpu_batch']} samples each, "
        f"{sharing}, {plan['compute_dtype']} compute"
    )
    table = Table("per process" if on_cpu else "per GPU", "bytes", "GiB", box=None)
    for part in ("weights", "gradients", "optimizer", "activations", "overhead", "total"):
        table.add_row(part, f"{plan[part]:,}", f"{plan[part] / 2**30:.2f}")
    _out.print(table)
    # The output is written tensor by tensor (relay_engine.models.streamed_safetensors): saving
    # adds one merged weight at a time, never a copy of the model.
    if on_cpu:
        _out.print("of this machine's memory; writing the output adds no copy of the model (it streams)")
        return
    smallest = plan["smallest_gpu"]
    _out.print(
        f"fits: {smallest}"
        if smallest
        else "fits no single GPU listed: use more GPUs, LoRA or a smaller batch"
    )


def _print_keys(policy: Any, json_output: bool) -> None:
    rows = [
        {"name": name, "shape": list(p.shape), "trainable": p.requires_grad}
        for name, p in policy.named_parameters()
    ]
    if json_output:
        _out.print_json(json.dumps(rows))
        return
    for row in rows:
        mark = "  trainable" if row["trainable"] else ""
        _out.print(
            f"{row['name']}\t{tuple(row['shape'])}{mark}", markup=False, highlight=False, soft_wrap=True
        )


def _fail(message: str) -> NoReturn:
    _err.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(1)
