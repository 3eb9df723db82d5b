"""A fine-tune's model card: the README.md pushed beside its output to a Hub repo (relay.hub_push).

One function writes it (`model_card`) from what the job knows (`CardFacts`): its recipe, what the
engine read (the job's ``dataset`` and ``weights``, relay.events.DatasetEvent and WeightsEvent), the
validation and evaluation figures of its results card (relay.sft.summary) and Relay's version. Two
functions gather those facts: `facts_of_job` from the service's answers (a job and its summary), and
`facts_of_events` from a run's own events (`relay local train`, the engine's run_recipe).

The card opens with the Hub's YAML front matter (`library_name`, `tags`, `base_model`, `datasets`,
`pipeline_tag`). Each value is written as JSON, which is YAML too: no YAML library is needed here,
and no value (a camera name, a dataset name) can break the block. No license is stated: the base's
own terms apply, and Relay cannot tell what a user's data allows.

Nothing here imports torch, huggingface_hub or the engine.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

import relay
from relay import families
from relay.checkpoints import parse_checkpoint
from relay.dataset_mixture import recipe_datasets, sample_shares
from relay.dataset_names import is_hub_repo_id, is_relational_source, local_dataset_path
from relay.events import DatasetEvent, EvalEvent, MetricsEvent, ValidationEvent, WeightsEvent
from relay.sft.config import SFTConfig
from relay.sft.summary import (
    EvalSummary,
    FineTuneSummary,
    ValidationSummary,
    eval_summary,
    validation_summary,
)

CARD_FILE = "README.md"
# The Hub repo each published model's base weights are read from (the engine's
# relay_engine.models.weights.BASE_REPO and relay_engine.families.smolvla.files.BASE_REPO, which a
# test holds equal to these). The tiny models ship inside Relay's engine package: no Hub base.
BASE_REPOS: dict[str, str] = {"pi05": "lerobot/pi05_base", "smolvla": "lerobot/smolvla_base"}
# The recipe's fields a card leaves out: the trackers (a team's internal servers), a relational
# job's tasks directory (a path on the service), the GPU count (how, not what, it trained).
_PRIVATE_FIELDS = frozenset({"integrations", "tasks_dir", "gpus", "hub"})


@dataclass(frozen=True)
class CardFacts:
    """What a model card says about a fine-tune. ``dataset`` and ``weights``: the job's fields of the
    same names (a DatasetEvent's and a WeightsEvent's fields); ``validation`` and ``evaluation``:
    the results card's slots; ``final_loss``: the training loss at ``trained_steps``."""

    config: SFTConfig
    job_id: str | None = None
    dataset: Mapping[str, Any] | None = None
    weights: Mapping[str, Any] | None = None
    validation: ValidationSummary | None = None
    evaluation: EvalSummary | None = None
    trained_steps: int | None = None
    final_loss: float | None = None


def facts_of_job(job: Mapping[str, Any], summary: FineTuneSummary) -> CardFacts:
    """The facts of a service job: its record (``FineTuneJob.to_dict()``, the API's answer) and
    its results card."""
    config = SFTConfig.parse({name: job.get(name) for name in SFTConfig.model_fields if name in job})
    last = summary.loss.last
    return CardFacts(
        config=config,
        job_id=str(job["id"]),
        dataset=job.get("dataset"),
        weights=job.get("weights"),
        validation=summary.validation,
        evaluation=summary.eval,
        trained_steps=summary.step,
        final_loss=last.loss if last is not None else None,
    )


def facts_of_events(
    config: SFTConfig, events: Iterable[Mapping[str, Any]], job_id: str | None = None
) -> CardFacts:
    """The facts of a run from its own events (relay.events objects, oldest first), as a local run
    or the engine's run_recipe reports them."""
    dataset: Mapping[str, Any] | None = None
    weights: Mapping[str, Any] | None = None
    scorings: list[Mapping[str, Any]] = []
    reports: list[Mapping[str, Any]] = []
    step: int | None = None
    loss: float | None = None
    for event in events:
        # A resumed run reports its dataset and weights again: the latest is what trained last.
        if isinstance(event, DatasetEvent):
            dataset = _fields(event)
        elif isinstance(event, WeightsEvent):
            weights = _fields(event)
        elif isinstance(event, ValidationEvent):
            scorings.append(_fields(event))
        elif isinstance(event, EvalEvent):
            reports.append(_fields(event))
        elif isinstance(event, MetricsEvent) and event.get("loss") is not None:
            step, loss = int(event["step"]), float(event["loss"])
    return CardFacts(
        config=config,
        job_id=job_id,
        dataset=dataset,
        weights=weights,
        validation=validation_summary(scorings),
        evaluation=eval_summary(reports),
        trained_steps=step,
        final_loss=loss,
    )


def _fields(event: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in event.items() if key != "event"}


def base_of(facts: CardFacts) -> tuple[str | None, str]:
    """The Hub repo the training started from (None: not a Hub repo) and a line saying what it was
    and at which revision."""
    model = facts.config.model
    weights = facts.weights
    if weights and weights.get("repo"):
        revision = weights.get("revision") or "the default branch"
        sha = f" (commit {weights['sha']})" if weights.get("sha") else ""
        return str(weights["repo"]), f"{model} weights of {weights['repo']} at {revision}{sha}"
    if weights and weights.get("job"):
        return None, f"{model} weights of the Relay fine-tune {weights['job']}"
    if facts.config.from_checkpoint is not None:
        source = parse_checkpoint(facts.config.from_checkpoint)
        if source.kind == "hub" and source.repo is not None:
            revision = source.revision or "the default branch"
            return source.repo, f"{model} weights of {source.repo} at {revision}"
        if source.kind == "job":
            return None, f"{model} weights of the Relay fine-tune {source.job}"
        return None, f"{model} weights of a local directory ({_last_part(facts.config.from_checkpoint)})"
    repo = BASE_REPOS.get(model)
    if repo is None:
        return None, f"{model}, the base shipped with Relay {relay.__version__}"
    # The engine reads a base at the Hub's default branch: no revision is pinned.
    return repo, f"{model}, the base weights of {repo} at the default branch"


def dataset_of(facts: CardFacts) -> tuple[str | None, str]:
    """The Hub dataset repo trained on (None: not a Hub dataset) and a line saying what was read; of a
    mixture, its first dataset's (`datasets_of` gives each)."""
    return datasets_of(facts)[0]


def datasets_of(facts: CardFacts) -> list[tuple[str | None, str]]:
    """Each dataset trained on: its Hub repo (None: not a Hub dataset) and a line saying what was
    read; a mixture's with its share of the samples."""
    config = facts.config
    sources = recipe_datasets(config)
    read = facts.dataset or {}
    reads: list[Mapping[str, Any] | None] = list(read.get("mixture") or [read or None])
    reads += [None] * (len(sources) - len(reads))
    shares = sample_shares([source.weight for source in sources])
    found = []
    for source, what, share in zip(sources, reads, shares, strict=False):
        repo, line = _dataset_line(source.name, source.revision, what)
        found.append((repo, line if len(sources) == 1 else f"{line}; {share:.0%} of samples"))
    return found


def _dataset_line(name: str, revision: str | None, read: Mapping[str, Any] | None) -> tuple[str | None, str]:
    if read and read.get("repo"):
        sha = f" (commit {read['sha']})" if read.get("sha") else ""
        fmt = f", LeRobot {read['format']}" if read.get("format") else ""
        size = f", {int(read.get('episodes') or 0):,} episodes, {int(read.get('frames') or 0):,} frames"
        return str(
            read["repo"]
        ), f"{read['repo']} at {read.get('revision') or 'the default branch'}{sha}{fmt}{size}"
    if not is_relational_source(name):
        if is_hub_repo_id(name):
            return name, f"{name} at {revision or 'the revision the engine chose'}"
        return None, f"a local LeRobot dataset ({_last_part(name)})"
    # A relational database's URL may hold a password, and a path on the service means nothing elsewhere.
    return None, "a relational database (not named here)"


def _last_part(path: str) -> str:
    return PurePath(path.rstrip("/")).name or path


def recipe_of(config: SFTConfig) -> dict[str, Any]:
    """The recipe's settings as the card shows them: no trackers, no service paths; a local
    directory by its last part."""
    shown = config.model_dump(mode="json", exclude_none=True)
    for name in _PRIVATE_FIELDS:
        shown.pop(name, None)
    if config.finetune != "lora":
        shown.pop("lora_rank", None)
        shown.pop("lora_alpha", None)
    for name in ("dataset_name", "from_checkpoint"):
        value = shown.get(name)
        if isinstance(value, str) and local_dataset_path(value) is not None:
            shown[name] = f"(local) {_last_part(value)}"
    if is_relational_source(config.dataset_name):
        shown["dataset_name"] = "(a relational database)"
    for entry in shown.get("datasets") or ():
        if local_dataset_path(entry["name"]) is not None:
            entry["name"] = f"(local) {_last_part(entry['name'])}"
    return shown


def front_matter(facts: CardFacts) -> dict[str, Any]:
    """The Hub's card metadata: what the Hub indexes the repo by."""
    family = families.family_of(facts.config.model)
    family_name = family.name if family is not None else facts.config.model
    robot = family is not None and family.recognizes_data is None  # trains on LeRobot datasets
    base, _ = base_of(facts)
    repos = [repo for repo, _ in datasets_of(facts) if repo is not None]
    meta: dict[str, Any] = {}
    if robot:
        meta["library_name"] = "lerobot"
        meta["pipeline_tag"] = "robotics"
    tags = ["relay", family_name] + (["lerobot", "robotics"] if robot else [])
    meta["tags"] = list(dict.fromkeys(tags))
    if base is not None:
        meta["base_model"] = base
    if repos:
        meta["datasets"] = repos
    return meta


def model_card(facts: CardFacts, repo_id: str | None = None) -> str:
    """The README.md text: YAML front matter, then what was trained, on what, how, and how well.
    `repo_id`: the repo it is pushed to, which the card's "use" snippet names."""
    config = facts.config
    meta = front_matter(facts)
    _, base_line = base_of(facts)
    read = datasets_of(facts)
    title = config.name or (
        f"Relay fine-tune {facts.job_id}" if facts.job_id else f"Relay fine-tune of {config.model}"
    )
    lines = ["---", *(f"{key}: {json.dumps(value)}" for key, value in meta.items()), "---", ""]
    trained = facts.trained_steps if facts.trained_steps is not None else config.steps
    pace = (
        f"{trained} of {config.steps}, batch size {config.batch_size}, learning rate {config.learning_rate:g}"
    )
    lines += [f"# {title}", ""]
    lines += [
        f"A {config.model} policy fine-tuned with Relay {relay.__version__}"
        + (f" (job `{facts.job_id}`)." if facts.job_id else "."),
        "",
        "| | |",
        "|---|---|",
        f"| base | {_cell(base_line)} |",
        *(
            f"| dataset{'' if len(read) == 1 else f' {index}'} | {_cell(line)} |"
            for index, (_, line) in enumerate(read, start=1)
        ),
        f"| fine-tuning | {_cell(_method(config))} |",
        f"| steps | {pace} |",
    ]
    if facts.final_loss is not None:
        lines.append(f"| final training loss | {facts.final_loss:.4g} (10-step mean) |")
    lines.append(f"| Relay | {relay.__version__} |")
    lines += ["", "## Validation", ""]
    lines += _validation(facts.validation)
    lines += ["", "## Evaluation", ""]
    lines += _evaluation(facts.evaluation)
    lines += [
        "",
        "## Recipe",
        "",
        "```json",
        json.dumps(recipe_of(config), indent=2, sort_keys=True),
        "```",
        "",
    ]
    lines += ["## Use", "", *_use(config.model, meta, repo_id or "OWNER/REPO"), ""]
    return "\n".join(lines)


def _method(config: SFTConfig) -> str:
    if config.finetune == "lora":
        alpha = f", alpha {config.lora_alpha:g}" if config.lora_alpha is not None else ""
        targets = f" on {', '.join(config.targets)}" if config.targets else ""
        return f"LoRA rank {config.lora_rank}{alpha}{targets} (adapters merged into the weights)"
    targets = f" of {', '.join(config.targets)}" if config.targets else ""
    return f"{config.finetune}{targets}"


def _validation(summary: ValidationSummary | None) -> list[str]:
    if summary is None:
        return ["No held-out episodes were scored (the recipe named no `validation_episodes`)."]
    rows = [
        "| | step | validation loss | mean action MSE | action MSE | blind MSE | episodes |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, figures in (("best", summary.best), ("last", summary.last)):
        rows.append(
            f"| {label} | {figures.step} | {_number(figures.validation_loss)} | "
            f"{_number(figures.mean_action_mse)} | {_number(figures.action_mse)} | "
            f"{_number(figures.blind_mse)} | {figures.episodes if figures.episodes is not None else '-'} |"
        )
    rows += ["", f"Scored {summary.scored} time(s), in normalized units (lower is better)."]
    return rows


def _evaluation(summary: EvalSummary | None) -> list[str]:
    if summary is None:
        return ["No closed-loop evaluation was run (the recipe had no `eval` block)."]
    rows = ["| | step | environment | success rate | episodes |", "|---|---|---|---|---|"]
    for label, figures in (("best", summary.best), ("last", summary.last)):
        extra = figures.model_dump()
        rate = "-" if figures.success_rate is None else f"{figures.success_rate:.0%}"
        rows.append(
            f"| {label} | {figures.step} | {extra.get('env', '-')} | {rate} | {extra.get('episodes', '-')} |"
        )
    rows += ["", f"Evaluated {summary.evaluated} time(s)."]
    return rows


def _use(model: str, meta: Mapping[str, Any], repo_id: str) -> list[str]:
    lines = [
        "As the weights of a new Relay job (`from_checkpoint`):",
        "",
        "```python",
        "from relay.sft import SFTConfig",
        f'config = SFTConfig(model="{model}", dataset_name="...", from_checkpoint="{repo_id}")',
        "```",
    ]
    if meta.get("library_name") == "lerobot":
        lines += [
            "",
            "The folder is lerobot's too: `config.json`, `model.safetensors` and the processors' files.",
        ]
    return lines


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
