"""Model families, as the SDK knows them: which models each holds and the rules a recipe or a
session on one of them follows. Pure data, no torch.

A family is pi05's or SmolVLA's (robot policies trained on LeRobot datasets), RT-J's (relational
transformers trained on a database's task), one an installed package names under the entry-point
group `relay.family_specs` (found in every process, the API's included), or one added with
`register_family_spec` (the engine's `relay_engine.families.register_family` registers the spec of
the family it adds). Which models exist is this registry's answer alone (`model_names`). The
SDK's validation (SFTConfig, SessionConfig), the memory plan, the API's admission checks and the
CLI ask the spec of a model's family (`family_of`) instead of testing the model's name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Literal, TypeVar

from relay import catalog
from relay.dataset_names import is_relational_source
from relay.model_use import UseText, relational_use, robot_policy_use, smolvla_use

# How a datum of the family's sessions is written on the wire: (its place in the call, the datum)
# -> the message; None where the datum type does not belong to the family.
DatumEncoder = Callable[[int, Any], dict[str, Any]]


# The recipe fields (SFTConfig's) that belong to some families, not to every one: a family takes
# those its spec names in `recipe_fields`. The rest of a recipe (model, dataset_name, steps,
# batch_size, learning_rate, name, gpus) is every family's; `task` follows `FamilySpec.task`.
FAMILY_RECIPE_FIELDS: tuple[str, ...] = (
    "dataset_revision",
    "datasets",
    "finetune",
    "lora_rank",
    "lora_alpha",
    "targets",
    "cameras",
    "tasks_dir",
    "validation_episodes",
    "eval",
    "from_checkpoint",
    "normalization",
)
ROBOT_RECIPE_FIELDS = frozenset(FAMILY_RECIPE_FIELDS) - {"tasks_dir"}


@dataclass(frozen=True)
class FamilySpec:
    """What the SDK, the API and the CLI need to know of a family, without its engine."""

    name: str
    models: tuple[str, ...]
    # The models that need a GPU: the API refuses them where only CPU workers are alive.
    gpu_sized_models: tuple[str, ...] = ()
    # A model's own defaults, where SFTConfig's field defaults (pi05's) would not train it.
    model_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # Whether a recipe names a task (a relational database's task table): required or refused.
    task: Literal["required", "refused"] = "refused"
    # The way the family tunes where a recipe or session names none, and the one way its sessions
    # tune; None: any, LoRA by default.
    finetune: str | None = None
    # The ways its recipes may tune, where more than `finetune`'s (SmolVLA's recipes take LoRA
    # too); None: `finetune`'s alone.
    recipe_finetunes: tuple[str, ...] | None = None
    # The most processes (GPUs) one job runs on; None: as many as the job asks.
    max_gpus: int | None = None
    # How a dataset name of the family's own kind of data is told from a LeRobot dataset (RT-J's: a
    # relational database directory, schema.json + tables/, or a SQL database's URL); it is given
    # the name as written. None: the family trains on LeRobot datasets.
    recognizes_data: Callable[[str], bool] | None = None
    # How `relay datasets check` and `stats` show that own kind of data: "module:attribute" of a
    # relay.cli.datasets.OwnDataChecker, imported when such data is checked (the CLI's modules import
    # this one). None: the family trains on LeRobot datasets, which `relay datasets` reads itself.
    data_checker: str | None = None
    # The model a checkpoint directory holding only a bare model.safetensors is read as, with no
    # config beside it to say (lerobot's and openpi's pi05 exports); one family at most claims it.
    bare_weights_model: str | None = None
    # How `relay models list` names its models ("relational models: rt-j, rt-j-tiny").
    list_label: str = "models"
    # Whether its recipes choose where training goes (targets, LoRA): `relay models info` then
    # reports what those settings train; otherwise the family's engine describes the model.
    tunes_targets: bool = False
    # The recipe fields of FAMILY_RECIPE_FIELDS the family takes. Every other one is refused for
    # it (SFTConfig), so a field added for one family is refused by the others until they say they
    # take it.
    recipe_fields: frozenset[str] = frozenset()
    # Why it refuses some of the fields it does not take ("cameras": "RT-J reads the tables of a
    # database"); a refusal without a reason here names the models that take the field.
    refused_fields: Mapping[str, str] = field(default_factory=dict)
    # Where relay.memory_plan finds its named models' sizes, "module:attribute" of a
    # relay.memory_plan.MemoryLayout (the API then plans its jobs' memory); None: not planned.
    memory_layout: str | None = None
    # Session fields that only this family takes, with their defaults (RT-J's problem_type).
    session_fields: Mapping[str, Any] = field(default_factory=dict)
    # The built-in losses its sessions compute in forward_backward.
    loss_names: tuple[str, ...] = ()
    # The SDK datum class of its sessions and the function that encodes one (a DatumEncoder), each
    # named "module:attribute" and imported when a datum is sent: a spec is read while the SDK's
    # modules are still importing; None: the generic `types.Datum`.
    datum_type: str | None = None
    encode_datum: str | None = None
    # What deployments serve of it: "base_or_tuned" (a base model by name, or a tuned one),
    # "tuned_only" (a fine-tune's output, which names what it is for: RT-J's task and database,
    # SmolVLA's robot's cameras), None: nothing.
    deployments: Literal["base_or_tuned", "tuned_only"] | None = None
    # Whether a session's saved weights are served as a fine-tune's output is: they name what
    # they are for (SmolVLA's: the cameras the session trained on; RT-J's name no task).
    serves_session_weights: bool = False
    # A job's results card's "use this model" text: (model, directory, dataset, task) -> UseText
    # (relay.model_use).
    use_text: Callable[[str, str, str, str | None], UseText] | None = None

    @property
    def memory_planned(self) -> bool:
        return self.memory_layout is not None

    @property
    def one_process(self) -> bool:
        return self.max_gpus == 1

    @property
    def recipe_ways(self) -> tuple[str, ...] | None:
        """The ways its recipes may tune; None: any."""
        if self.recipe_finetunes is not None:
            return self.recipe_finetunes
        return None if self.finetune is None else (self.finetune,)


_SPECS: dict[str, FamilySpec] = {}


def register_family_spec(spec: FamilySpec) -> None:
    """Add a family; its models must be new (a family registered again replaces itself)."""
    _builtins()
    _add(spec)


def forget_family_spec(name: str) -> None:
    """Remove a family added with register_family_spec (a test's, once it is done)."""
    _SPECS.pop(name, None)


def family_specs() -> tuple[FamilySpec, ...]:
    """Every registered family, the built-in ones first."""
    _builtins()
    return tuple(_SPECS.values())


def family_spec(name: str) -> FamilySpec:
    """A family's spec by the family's name (KeyError for one not registered)."""
    _builtins()
    return _SPECS[name]


def family_of(model: object) -> FamilySpec | None:
    """The family of a named base model; None for a name no family holds (a directory, a typo)."""
    if not isinstance(model, str):
        return None
    for spec in family_specs():
        if model in spec.models:
            return spec
    return None


def model_names() -> tuple[str, ...]:
    """Every model a recipe job or a session can name."""
    return tuple(model for spec in family_specs() for model in spec.models)


def models_where(test: Callable[[FamilySpec], bool]) -> tuple[str, ...]:
    """The models of the families that pass `test` (for messages: "for rt-j, rt-j-tiny")."""
    return tuple(model for spec in family_specs() if test(spec) for model in spec.models)


def model_defaults(model: object) -> dict[str, Any]:
    """The settings whose default is the model's own; empty where the spec's defaults hold."""
    spec = family_of(model)
    if spec is None:
        return {}
    fixed = {"finetune": spec.finetune} if spec.finetune is not None else {}  # RT-J's "full"
    return {**fixed, **spec.model_defaults.get(str(model), {})}


def family_of_data(name: str | Path) -> FamilySpec | None:
    """The family whose own kind of data a dataset name means (an RT-J database directory or a SQL
    database's URL); None for anything else (a LeRobot dataset, a Hub repo id)."""
    for spec in family_specs():
        if spec.recognizes_data is not None and spec.recognizes_data(str(name)):
            return spec
    return None


def _is_database(name: str) -> bool:
    if is_relational_source(name):
        return True
    path = Path(name).expanduser()
    return (path / "schema.json").is_file() and (path / "tables").is_dir()


def bare_weights_model() -> str | None:
    """The model a bare model.safetensors, with no config beside it, is read as (FamilySpec)."""
    return next((spec.bare_weights_model for spec in family_specs() if spec.bare_weights_model), None)


def is_gpu_sized(model: str) -> bool:
    spec = family_of(model)
    return spec is not None and model in spec.gpu_sized_models


def _builtins() -> None:
    # Built on first use, not on import, with the families packages add (`discovered_specs`).
    if _SPECS:
        return
    for spec in (_pi05_spec(), _smolvla_spec(), _rtj_spec()):
        _SPECS[spec.name] = spec
    for spec in discovered_specs():
        _add(spec)


# The entry-point group under which an installed package names its families' specs: each entry is
# a FamilySpec, or a function of no arguments that returns one, from a module that imports nothing
# of Relay's but this one (its specs are read while Relay's own modules import). Every process
# finds them: the API, which never imports the engine, knows a package's models as the engine does.
SPEC_ENTRY_POINTS = "relay.family_specs"


def discovered_specs() -> list[FamilySpec]:
    """The specs installed packages name under SPEC_ENTRY_POINTS; a broken one is an error naming it."""
    return installed(SPEC_ENTRY_POINTS, FamilySpec)


Installed = TypeVar("Installed")


def installed(group: str, kind: type[Installed]) -> list[Installed]:
    """What installed packages name under the entry-point `group`: each entry a `kind`, or a class or
    function of no arguments that makes one. A broken entry is an error naming it (a process that
    half knows a family is worse than one that stops)."""
    found = []
    for entry in entry_points(group=group):
        try:
            named = entry.load()
            made = named if isinstance(named, kind) else named()
        except Exception as error:
            raise RuntimeError(
                f"the model family {entry.name!r} ({entry.value}, entry point group {group}) "
                f"could not be loaded: {type(error).__name__}: {error}"
            ) from error
        if not isinstance(made, kind):
            raise RuntimeError(
                f"the model family {entry.name!r} ({entry.value}) is a {type(made).__name__}, "
                f"not a {kind.__name__}"
            )
        found.append(made)
    return found


def _add(spec: FamilySpec) -> None:
    taken = {
        model: other.name for other in _SPECS.values() if other.name != spec.name for model in other.models
    }
    clashes = [model for model in spec.models if model in taken]
    if clashes:
        raise ValueError(f"family {spec.name}: model {clashes[0]} is already {taken[clashes[0]]}'s")
    claimed = [
        other.name for other in _SPECS.values() if other.name != spec.name and other.bare_weights_model
    ]
    if spec.bare_weights_model is not None and claimed:
        raise ValueError(f"family {spec.name}: bare weights files are already read as {claimed[0]}'s")
    _SPECS[spec.name] = spec


def _pi05_spec() -> FamilySpec:
    return FamilySpec(
        name=PI05,
        models=catalog.MODELS,
        gpu_sized_models=catalog.GPU_SIZED_MODELS,
        # pi05-tiny's: LoRA on the action expert cannot teach the tiny base's vision tower what it
        # never saw, and pi05's 2.5e-5, right for 3 billion weights, barely moves its 512,000.
        # Every weight at 1e-3: of 1e-3 and 2e-3 swept over five seeds and two dataset shapes no
        # test uses (bench/bench_tiny_defaults.py), the one that beats the blind baseline on every
        # run (docs/benchmarks.md). 16 samples a step is what a CPU trains in a fraction of a
        # second; 128 is a GPU's batch.
        model_defaults={"pi05-tiny": {"finetune": "full", "learning_rate": 1e-3, "batch_size": 16}},
        recipe_fields=ROBOT_RECIPE_FIELDS,
        refused_fields={"tasks_dir": "tasks_dir holds a relational database's tasks, for rt-j models"},
        memory_layout="relay.memory_plan:PI05_LAYOUT",
        tunes_targets=True,
        bare_weights_model="pi05",
        loss_names=("flow_matching",),
        deployments="base_or_tuned",
        use_text=robot_policy_use,
    )


def _smolvla_spec() -> FamilySpec:
    return FamilySpec(
        name=SMOLVLA,
        models=catalog.SMOLVLA_MODELS,
        gpu_sized_models=("smolvla",),
        list_label="SmolVLA models",
        # smolvla: lerobot's own (optimizer_lr 1e-4; 64 samples a step, its training example's
        # batch). smolvla-tiny: pi05-tiny's CPU-sized step and rate.
        model_defaults={
            "smolvla": {"learning_rate": 1e-4, "batch_size": 64},
            "smolvla-tiny": {"learning_rate": 1e-3, "batch_size": 16},
        },
        # "full" is what lerobot trains by default: the action expert and the state, action and time
        # projections, the backbone as it is (train_expert_only, freeze_vision_encoder). "lora"
        # adapts where lerobot's PEFT option does by default (relay_engine.families.smolvla.tuning).
        finetune="full",
        recipe_finetunes=("full", "lora"),
        max_gpus=1,
        recipe_fields=ROBOT_RECIPE_FIELDS - {"cameras", "targets", "datasets"},
        refused_fields={
            "datasets": "a mixture of datasets is trained by pi05 models; SmolVLA reads one dataset, "
            "under its own camera names",
            "tasks_dir": "tasks_dir holds a relational database's tasks, for rt-j models",
            "cameras": "SmolVLA reads every camera of the dataset, under the dataset's own names",
            "targets": "SmolVLA trains what lerobot trains by default: the action expert and the "
            "state, action and time projections",
        },
        # relay.smolvla_layout holds both models' sizes: the API refuses a job no live GPU holds.
        memory_layout="relay.memory_plan:SMOLVLA_LAYOUT",
        loss_names=("flow_matching",),
        # A base acts for no robot's cameras yet: deployments serve a fine-tune's output.
        deployments="tuned_only",
        serves_session_weights=True,
        use_text=smolvla_use,
    )


def _rtj_spec() -> FamilySpec:
    return FamilySpec(
        name=RTJ,
        models=catalog.RELATIONAL_MODELS,
        list_label="relational models",
        recognizes_data=_is_database,
        data_checker="relay.cli.datasets:DATABASE_CHECKER",
        task="required",
        finetune="full",
        # (lora_rank and lora_alpha, as for any finetune="full" recipe, are ignored; a config read
        # back from a job holds them filled in.)
        recipe_fields=frozenset({"finetune", "lora_rank", "lora_alpha", "tasks_dir"}),
        refused_fields={
            "cameras": "RT-J reads the tables of a database, not camera images",
            "dataset_revision": "RT-J reads a database directory or a SQL database, which have no revisions",
            "datasets": "RT-J reads one relational database; a mixture is of LeRobot datasets, for "
            "pi05 models",
            "targets": 'RT-J is tuned in full: every weight trains, targets ["all"]',
            "validation_episodes": "RT-J's tasks have a validation split of their own, the task's val "
            "rows; episodes are a robot dataset's",
            "eval": "closed-loop evaluation runs a robot policy in a simulator; RT-J predicts a "
            "database's task",
            "from_checkpoint": "RT-J starts from its own base; starting from other weights is pi05's",
            "normalization": "RT-J normalizes each column of the database itself; normalization "
            "chooses a robot dataset's statistics",
        },
        # pi05's 2.5e-5 at 128 contexts leaves RT-J's loss at ln 2 (0.6931) for every step. rt-j:
        # the rate its authors fine-tune a task at (1e-4); rt-j-tiny: 1e-3 at 16 contexts, the best
        # of 3e-4, 1e-3 and 3e-3 over two synthetic shops and two seeds (docs/relational.md).
        model_defaults={
            "rt-j": {"learning_rate": 1e-4, "batch_size": 32},
            "rt-j-tiny": {"learning_rate": 1e-3, "batch_size": 16},
        },
        max_gpus=1,
        session_fields={"problem_type": "binary"},
        loss_names=("bce", "huber"),
        datum_type="relay.training.types:RelationalDatum",
        encode_datum="relay.training.types:relational_datum_message",
        deployments="tuned_only",
        use_text=relational_use,
    )


PI05 = "pi05"
SMOLVLA = "smolvla"
RTJ = "rt-j"
