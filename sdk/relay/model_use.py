"""What a job's results card says about using its output, family by family (`FamilySpec.use_text`):
the Python that loads the downloaded output, lerobot's code where lerobot opens it, the command that
scores it, and what its deployment answers. Pure text, no engine."""

from __future__ import annotations

from dataclasses import dataclass

ENGINE_EXTRA = "# the engine extra: pip install 'relay-intelligence[engine]'\n"


@dataclass(frozen=True)
class UseText:
    """The family's part of a results card's "use this model" block. `python` follows the lines
    that download the output into `directory`; `lerobot` is None where lerobot cannot open it, and
    `lerobot_note` then says why."""

    python: str
    score: str
    served_as: str
    lerobot: str | None = None
    lerobot_note: str | None = None


def robot_policy_use(model: str, directory: str, dataset_name: str, task: str | None) -> UseText:
    """A pi05 policy's: Relay's loader, lerobot's PI05Policy (its real sizes only), `relay local eval`."""
    python = (
        ENGINE_EXTRA + "from relay_engine.models import load_policy\n\n"
        f'policy = load_policy("{directory}")  # a Pi05Policy: sample_actions(batch) gives action chunks'
    )
    score = f"relay local eval --model {directory} --dataset {dataset_name}"
    served_as = "action chunks over HTTP and openpi's websocket"
    if model == "pi05-tiny":
        note = (
            "lerobot builds only pi05's real sizes, so it refuses a pi05-tiny output "
            "(Invalid paligemma_variant: pi05-tiny); load it with Relay's engine (above)"
        )
        return UseText(python, score, served_as, lerobot_note=note)
    lerobot = (
        "# in lerobot's environment (lerobot 0.6.1 opens Relay's output as it is)\n"
        "from lerobot.policies.pi05.modeling_pi05 import PI05Policy\n"
        "from lerobot.processor import (\n"
        "    PolicyProcessorPipeline,\n"
        "    policy_action_to_transition,\n"
        "    transition_to_policy_action,\n"
        ")\n\n"
        f'policy = PI05Policy.from_pretrained("{directory}")\n'
        "preprocess = PolicyProcessorPipeline.from_pretrained(\n"
        f'    "{directory}", config_filename="policy_preprocessor.json"\n'
        ")\n"
        "postprocess = PolicyProcessorPipeline.from_pretrained(\n"
        f'    "{directory}",\n'
        '    config_filename="policy_postprocessor.json",\n'
        "    to_transition=policy_action_to_transition,\n"
        "    to_output=transition_to_policy_action,\n"
        ")\n"
        "# observation: the dataset's cameras, state and task; the action comes back in robot units\n"
        "action = postprocess(policy.select_action(preprocess(observation)))"
    )
    return UseText(python, score, served_as, lerobot=lerobot)


def relational_use(model: str, directory: str, dataset_name: str, task: str | None) -> UseText:
    """An RT-J's: Relay's RelationalTransformer, its task's evaluation; lerobot has no such model."""
    python = (
        ENGINE_EXTRA + "from relay_engine.relational import RelationalTransformer\n\n"
        f'model = RelationalTransformer("{directory}")  # model.predict(batch, task_head="task")'
    )
    return UseText(
        python,
        score=f"relay local eval --model {directory} --dataset {dataset_name} --task {task or 'TASK'}",
        served_as="POST /predictions",
        lerobot_note="an RT-J model reads databases, not cameras: lerobot has no policy for it",
    )


def any_model_use(model: str, directory: str, dataset_name: str, task: str | None) -> UseText:
    """A family that says nothing of its own (one a test registers): its engine's loader."""
    python = (
        ENGINE_EXTRA + "from relay_engine.families import family_owning\n\n"
        f'model = family_owning("{directory}").load_model("{directory}")'
    )
    return UseText(
        python,
        score=f"relay local eval --model {directory} --dataset {dataset_name}",
        served_as="what its family serves",
        lerobot_note=f"Relay knows no lerobot policy for {model}",
    )


def smolvla_use(model: str, directory: str, dataset_name: str, task: str | None) -> UseText:
    """A SmolVLA policy's: lerobot's own files (config.json, model.safetensors and its processors),
    which lerobot's SmolVLAPolicy opens; Relay's loader."""
    python = (
        ENGINE_EXTRA + "from pathlib import Path\n\n"
        "from relay_engine.families.smolvla.policy import SmolVLAPolicy\n\n"
        f'policy = SmolVLAPolicy.from_lerobot(Path("{directory}"), backbone_dir=Path("{directory}/vlm"))'
    )
    lerobot = (
        "# in lerobot's environment (the backbone's config.json where config.json's vlm_model_name says)\n"
        "from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy\n\n"
        f'policy = SmolVLAPolicy.from_pretrained("{directory}")'
    )
    return UseText(
        python,
        score=f"relay local eval --model {directory} --dataset {dataset_name}",
        served_as="action chunks over HTTP and openpi's websocket",
        lerobot=lerobot,
    )
