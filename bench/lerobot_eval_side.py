"""lerobot 0.6.1's `lerobot-eval`, run in lerobot's own environment on a `pi05-tiny` output of Relay
(for bench_eval.py):

    python lerobot_eval_side.py --policy.path=OUT --env.type=pusht ...   (lerobot-eval's options)
    python lerobot_eval_side.py --chunk-of OUT INPUTS.npz    (one chunk, to compare with Relay's)

lerobot's pi05 builds two model sizes only (gemma_2b with gemma_300m and SigLIP So400m, PaliGemma's
vocabulary), and the full size does not fit this machine's CPUs for an evaluation. So before
handing over to `lerobot-eval`'s own `main()`, this teaches lerobot's pi05 the sizes Relay wrote in
the output's `relay_config.json` (`pi05-tiny`: openpi's dummy Gemma, a small SigLIP, a byte
vocabulary) and gives its tokenizer step a byte tokenizer (Relay's `bytes`: 0 pad, 1 bos, b + 3),
as the Hub's PaliGemma tokenizer is neither wanted nor reachable. Nothing else changes: lerobot's
config parsing, strict weight load, processors, environment, vector env and rollout loop are its
own. The patches only size modules; the evaluation's code path is lerobot's.

With RELAY_BENCH_COUNTS=PATH it also writes, as JSON, what it measured by wrapping lerobot's
functions from outside: `seconds`, the wall time of `eval_policy_all` (the episodes; process start,
model load and making the environments excluded), `steps` (environment steps of the episodes: each
rollout's steps up to each environment's first `done`) and `executed_steps` (every environment
stepped, those already done included: lerobot steps a batch until its last episode ends).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import lerobot.policies.pi05.modeling_pi05 as modeling
from lerobot.policies.pi05.configuration_pi05 import PI05Config
from lerobot.scripts import lerobot_eval
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

# A variant lerobot knows, stood in during its config validation for Relay's size name.
KNOWN_VARIANT = "gemma_300m"


def policy_path(argv: list[str]) -> Path:
    for arg in argv:
        if arg.startswith("--policy.path="):
            return Path(arg.split("=", 1)[1])
    raise SystemExit("lerobot_eval_side.py needs --policy.path=OUT")


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Relay's byte tokenizer as a Hugging Face one: byte b -> b + 3, a bos (1) first, pad 0."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_chars = sorted(alphabet, key=lambda char: _byte_of(char))
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, **{char: _byte_of(char) + 3 for char in byte_chars}}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<bos>")


_UNICODE_TO_BYTE: dict[str, int] = {}


def _byte_of(char: str) -> int:
    """GPT-2's byte-to-unicode table, inverted (what the ByteLevel pre-tokenizer maps bytes to)."""
    if not _UNICODE_TO_BYTE:
        printable = [
            *range(ord("!"), ord("~") + 1),
            *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1),
        ]
        extra = 0
        for byte in range(256):
            if byte in printable:
                _UNICODE_TO_BYTE[chr(byte)] = byte
            else:
                _UNICODE_TO_BYTE[chr(256 + extra)] = byte
                extra += 1
    return _UNICODE_TO_BYTE[char]


def teach_sizes(relay_config: dict[str, Any]) -> None:
    """lerobot's pi05, built at the sizes of Relay's config (its language model, action expert,
    vision tower and vocabulary), under Relay's model name as the variant."""
    name = relay_config["model"]
    language, expert, vision = relay_config["language"], relay_config["expert"], relay_config["vision"]
    vocab_size = relay_config["vocab_size"]

    def gemma(size: dict[str, int]) -> Any:
        return modeling.GemmaConfig(
            width=size["width"],
            depth=size["depth"],
            mlp_dim=size["mlp_dim"],
            num_heads=size["num_heads"],
            num_kv_heads=size["num_kv_heads"],
            head_dim=size["head_dim"],
        )

    known_sizes = modeling.get_gemma_config

    def get_gemma_config(variant: str) -> Any:
        if variant == f"{name}:language":
            return gemma(language)
        if variant == f"{name}:expert":
            return gemma(expert)
        return known_sizes(variant)

    modeling.get_gemma_config = get_gemma_config

    validate = PI05Config.__post_init__

    def post_init(self: PI05Config) -> None:
        # Relay writes its model name as both variants; validation runs with a known one.
        if self.paligemma_variant == name:
            self.paligemma_variant = self.action_expert_variant = KNOWN_VARIANT
            validate(self)
            self.paligemma_variant, self.action_expert_variant = f"{name}:language", f"{name}:expert"
        else:
            validate(self)

    PI05Config.__post_init__ = post_init

    class SizedPaliGemma(modeling.PaliGemmaForConditionalGenerationWithPiGemma):
        def __init__(self, config: Any) -> None:
            tower = config.vision_config
            tower.hidden_size = vision["width"]
            tower.num_hidden_layers = vision["depth"]
            tower.intermediate_size = vision["mlp_dim"]
            tower.num_attention_heads = vision["num_heads"]
            tower.patch_size = vision["patch_size"]
            tower.image_size = vision["image_size"]
            tower.projection_dim = language["width"]
            config.projection_dim = language["width"]
            config.text_config.vocab_size = vocab_size
            config._vocab_size = vocab_size
            super().__init__(config)

    class SizedExpert(modeling.PiGemmaForCausalLM):
        def __init__(self, config: Any) -> None:
            config.vocab_size = vocab_size
            super().__init__(config)

    modeling.PaliGemmaForConditionalGenerationWithPiGemma = SizedPaliGemma
    modeling.PiGemmaForCausalLM = SizedExpert


def give_tokenizer() -> None:
    """lerobot-eval's processors, with the byte tokenizer handed to its tokenizer step."""
    make = lerobot_eval.make_pre_post_processors

    def make_pre_post_processors(**kwargs: Any) -> Any:
        overrides = dict(kwargs.get("preprocessor_overrides") or {})
        overrides["tokenizer_processor"] = {"tokenizer": byte_tokenizer()}
        return make(**{**kwargs, "preprocessor_overrides": overrides})

    lerobot_eval.make_pre_post_processors = make_pre_post_processors


def count_steps(path: Path) -> None:
    """Time the episodes and count their steps, and write both to `path` when lerobot-eval ends."""
    counts = {"seconds": 0.0, "steps": 0, "executed_steps": 0, "rollouts": 0}
    rollout, evaluate_all = lerobot_eval.rollout, lerobot_eval.eval_policy_all

    def counted_rollout(*args: Any, **kwargs: Any) -> Any:
        result = rollout(*args, **kwargs)
        done = result["done"]  # (batch, steps), cumulative: True from each env's first done on
        counts["executed_steps"] += int(done.numel())
        counts["steps"] += int((~done).sum() + done.any(dim=1).sum())
        counts["rollouts"] += 1
        return result

    def timed_eval_policy_all(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return evaluate_all(*args, **kwargs)
        finally:
            counts["seconds"] += time.perf_counter() - started
            path.write_text(json.dumps(counts))

    lerobot_eval.rollout = counted_rollout
    lerobot_eval.eval_policy_all = timed_eval_policy_all


def chunk_of(directory: Path, inputs_path: Path) -> None:
    """One action chunk from lerobot's PI05Policy and processors, for the observation and noise in
    `inputs_path` (an npz Relay wrote); prints the un-normalized chunk as JSON."""
    import numpy as np
    import torch
    from lerobot.policies.pi05.modeling_pi05 import PI05Policy
    from lerobot.processor import (
        PolicyProcessorPipeline,
        policy_action_to_transition,
        transition_to_policy_action,
    )

    inputs = np.load(inputs_path)
    policy = PI05Policy.from_pretrained(directory)
    policy.eval()
    pre = PolicyProcessorPipeline.from_pretrained(
        directory,
        config_filename="policy_preprocessor.json",
        overrides={"tokenizer_processor": {"tokenizer": byte_tokenizer()}},
    )
    post = PolicyProcessorPipeline.from_pretrained(
        directory,
        config_filename="policy_postprocessor.json",
        to_transition=policy_action_to_transition,
        to_output=transition_to_policy_action,
    )
    image = torch.from_numpy(inputs["image"]).permute(2, 0, 1)[None].float() / 255
    observation = {
        "observation.image": image,
        "observation.state": torch.from_numpy(inputs["state"])[None].float(),
        "task": [str(inputs["prompt"])],
    }
    with torch.inference_mode():
        chunk = policy.predict_action_chunk(pre(observation), noise=torch.from_numpy(inputs["noise"]))
        actions = post(chunk)
    print(json.dumps(actions[0].tolist()))


def main() -> None:
    if sys.argv[1] == "--chunk-of":
        teach_sizes(json.loads((Path(sys.argv[2]) / "relay_config.json").read_text()))
        chunk_of(Path(sys.argv[2]), Path(sys.argv[3]))
        return
    directory = policy_path(sys.argv[1:])
    relay_config = json.loads((directory / "relay_config.json").read_text())
    if relay_config.get("tokenizer") != "bytes":
        raise SystemExit(f"{directory}: lerobot_eval_side.py runs byte-tokenizer models (pi05-tiny)")
    teach_sizes(relay_config)
    give_tokenizer()
    if os.environ.get("RELAY_BENCH_COUNTS"):
        count_steps(Path(os.environ["RELAY_BENCH_COUNTS"]))
    lerobot_eval.main()


if __name__ == "__main__":
    main()
