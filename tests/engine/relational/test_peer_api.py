"""RelativeDB's `relational-transformers` API on our model: the same inputs (its own
RelationalBatch, a mapping of the fields, raw text cells with target=) and the same outputs as
its model, loaded with the same weights."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

# RelativeDB's package (the dev extra installs it): the peer these tests hold us to.
import relational_transformers as peer
import torch
from relational_transformers.checkpoints import load_state as peer_load_state
from relational_transformers.checkpoints import save_checkpoint as peer_save
from safetensors.torch import save_file

from relay_engine.errors import ConfigError
from relay_engine.families.rtj.checkpoint import read_state
from relay_engine.relational import (
    BATCH_FIELDS,
    DEFAULT_ONNX_MODEL,
    OUTPUT_VIEWS,
    BinaryClassificationEvaluator,
    FineTunedHead,
    HeadError,
    ModelOutput,
    RegressionEvaluator,
    RelationalBatch,
    RelationalDataset,
    RelationalExample,
    RelationalTrainer,
    RelationalTrainingArguments,
    RelationalTransformer,
    SequentialEvaluator,
    fit_feature_head,
)
from tests.engine.relational.batches import mixed_batch, our_batch
from tests.engine.relational.test_model import SIZES, TINY, scramble
from tests.hub import FakeHub, Repo


@pytest.fixture
def pair(tmp_path: Path) -> tuple[RelationalTransformer, peer.RelationalTransformer]:
    """Our model and the peer's, loaded from one checkpoint of seeded random weights."""
    weights = peer.RTJModel(**SIZES)
    scramble(weights, seed=11)
    peer_save(weights, tmp_path, SIZES)
    return RelationalTransformer(tmp_path, device="cpu"), peer.RelationalTransformer(
        str(tmp_path), device="cpu"
    )


def assert_same_output(got: ModelOutput, expected: object) -> None:
    for name in ("scores", "token_scores", "target_text", "features", "embeddings"):
        theirs = getattr(expected, name)
        ours = getattr(got, name)
        if theirs is None:
            assert ours is None, name
        else:
            assert ours is not None, name
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0, msg=name)


def text_cells(seed: int, cells: int = 7) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(cells, 2 * TINY.d_text)).astype(np.float32)


@pytest.mark.parametrize("output", OUTPUT_VIEWS)
def test_the_peers_own_batch_gives_the_peers_outputs(
    pair: tuple[RelationalTransformer, peer.RelationalTransformer], output: str
) -> None:
    ours, theirs = pair
    their_batch = peer.RelationalBatch(**mixed_batch(d_text=TINY.d_text, seed=12))
    assert_same_output(ours.forward(their_batch, output=output), theirs.forward(their_batch, output=output))


@pytest.mark.parametrize("output", OUTPUT_VIEWS)
def test_the_model_is_called_as_the_peers_module_is(tmp_path: Path, output: str) -> None:
    """`model(batch)` as RelativeDB's RTJModel (an nn.Module) answers it: its ModelOutput, raw
    scores (a check written that way once fell through to predict, which applies the sigmoid)."""
    module = peer.RTJModel(**SIZES)
    scramble(module, seed=13)
    peer_save(module, tmp_path, SIZES)
    ours = RelationalTransformer(tmp_path, device="cpu")
    batch = peer.RelationalBatch(**mixed_batch(d_text=TINY.d_text, seed=14))
    with torch.no_grad():
        expected = module.eval()(batch) if output == "target_scores" else module.eval()(batch, output)
    assert_same_output(ours(batch) if output == "target_scores" else ours(batch, output), expected)
    assert_same_output(ours(batch, output=output), module(batch, output=output))


def test_a_mapping_of_the_fields_short_names_included(
    pair: tuple[RelationalTransformer, peer.RelationalTransformer],
) -> None:
    ours, theirs = pair
    fields = {name: value.numpy() for name, value in mixed_batch(d_text=TINY.d_text, seed=13).items()}
    expected = theirs.forward(fields).scores
    torch.testing.assert_close(ours.forward(fields).scores, expected, atol=1e-5, rtol=0)
    short = {
        "f2p" if k == "f2p_nbr_idxs" else "number_v" if k == "number_values" else k: v
        for k, v in fields.items()
    }
    torch.testing.assert_close(ours.target_scores(short), expected, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="sem_types"):
        ours.forward({k: v for k, v in fields.items() if k != "sem_types"})


def test_raw_cells_with_a_target(pair: tuple[RelationalTransformer, peer.RelationalTransformer]) -> None:
    ours, theirs = pair
    one, two = text_cells(14), text_cells(15, cells=5)
    assert isinstance(ours.predict(one, target=3), float)
    assert ours.predict(one, target=3) == pytest.approx(theirs.predict(one, target=3), abs=1e-6)
    for output in ("target_scores", "target_features", "embeddings"):
        assert_same_output(
            ours.forward(one, target=[2, 3], output=output), theirs.forward(one, target=[2, 3], output=output)
        )
    # A sequence of contexts is padded to the longest and scored together.
    together = ours.predict([one, two], target=1, activation="identity")
    np.testing.assert_allclose(
        together, theirs.predict([one, two], target=1, activation="identity"), atol=1e-5
    )
    np.testing.assert_allclose(
        ours.encode(two, target=0, output_value="target_features"),
        theirs.encode(two, target=0, output_value="target_features"),
        atol=1e-5,
    )
    with pytest.raises(ValueError, match="target"):
        ours.forward(one)
    with pytest.raises(ValueError, match="target"):
        ours.forward(one, target=7)


def test_predict_activations_and_bad_views(
    pair: tuple[RelationalTransformer, peer.RelationalTransformer],
) -> None:
    ours, theirs = pair
    batch = peer.RelationalBatch(**mixed_batch(d_text=TINY.d_text, seed=16))
    for activation in (None, "identity", "sigmoid"):
        np.testing.assert_allclose(
            ours.predict(batch, activation=activation),
            theirs.predict(batch, activation=activation),
            atol=1e-6,
        )
    tensor = ours.predict(batch, convert_to_numpy=False)
    assert isinstance(tensor, torch.Tensor) and tensor.shape == (3,)
    with pytest.raises(ValueError, match="activation"):
        ours.predict(batch, activation="relu")
    with pytest.raises(ValueError, match="output"):
        ours.forward(batch, output="logits")
    with pytest.raises(TypeError, match="inputs"):
        ours.forward(42)


def labelled(
    seed: int, count: int, labels: list[float]
) -> tuple[list[RelationalExample], list[peer.RelationalExample]]:
    """The same contexts as our examples and the peer's: raw text cells (target 1) for the even
    ones, a one-context batch for the odd ones."""
    ours: list[RelationalExample] = []
    theirs: list[peer.RelationalExample] = []
    for i, label in zip(range(count), labels, strict=True):
        if i % 2:
            fields = mixed_batch(d_text=TINY.d_text, seed=seed + i, batch=1)
            ours.append(RelationalExample(fields, label))
            theirs.append(peer.RelationalExample(peer.RelationalBatch(**fields), label))
        else:
            cells = text_cells(seed + i, cells=4 + i % 5)
            ours.append(RelationalExample(cells, label, target=1))
            theirs.append(peer.RelationalExample(cells, label, target=1))
    return ours, theirs


def test_evaluators_give_the_peers_metrics(
    pair: tuple[RelationalTransformer, peer.RelationalTransformer],
) -> None:
    model, their_model = pair
    rng = np.random.default_rng(20)
    binary = [float(x) for x in rng.integers(0, 2, 12)]
    ours, theirs = labelled(100, 12, binary)
    # A threshold at the median probability, so both classes are predicted.
    threshold = float(np.median([model.predict(e.input, target=e.target) for e in ours]))
    got = BinaryClassificationEvaluator(ours, threshold=threshold)(model)
    expected = peer.BinaryClassificationEvaluator(theirs, threshold=threshold)(their_model)
    assert set(got) == {"accuracy", "precision", "recall", "f1"} == set(expected)
    assert 0 < got["precision"] < 1 and 0 < got["recall"] < 1
    assert got == pytest.approx(expected, abs=1e-9)

    values = [float(x) for x in rng.normal(size=10)]
    ours_r, theirs_r = labelled(200, 10, values)
    got = RegressionEvaluator(ours_r)(model)
    assert got == pytest.approx(peer.RegressionEvaluator(theirs_r)(their_model), abs=1e-5)
    assert set(got) == {"mae", "rmse", "r2"}

    both = SequentialEvaluator(
        [BinaryClassificationEvaluator(ours, threshold=threshold), RegressionEvaluator(ours_r)]
    )
    expected_both = peer.SequentialEvaluator(
        [peer.BinaryClassificationEvaluator(theirs, threshold=threshold), peer.RegressionEvaluator(theirs_r)]
    )(their_model)
    assert both(model) == pytest.approx(expected_both, abs=1e-5)


def test_evaluator_edge_cases(pair: tuple[RelationalTransformer, peer.RelationalTransformer]) -> None:
    model, their_model = pair
    same, same_theirs = labelled(300, 4, [2.0] * 4)
    got = RegressionEvaluator(same)(model)
    assert np.isnan(got["r2"]) and np.isnan(peer.RegressionEvaluator(same_theirs)(their_model)["r2"])
    # Nothing predicted positive: precision, recall and F1 are 0, as the peer gives them.
    ours, theirs = labelled(400, 4, [1.0, 0.0, 1.0, 0.0])
    got = BinaryClassificationEvaluator(ours, threshold=2.0)(model)
    assert got == peer.BinaryClassificationEvaluator(theirs, threshold=2.0)(their_model)
    assert got["f1"] == 0.0 and got["accuracy"] == 0.5
    with pytest.raises(ValueError, match="examples"):
        RegressionEvaluator([])(model)
    with pytest.raises(ValueError, match="evaluators"):
        SequentialEvaluator([])
    with pytest.raises(ValueError, match="mae"):
        SequentialEvaluator([RegressionEvaluator(same), RegressionEvaluator(same)])(model)


@pytest.mark.parametrize(
    ("problem_type", "num_labels", "labels"),
    [("binary", 1, [0, 1, 1, 0, 1, 0]), ("multiclass", 3, [0, 2, 1, 1, 0, 2])],
)
def test_fit_head_fits_the_peers_head(
    pair: tuple[RelationalTransformer, peer.RelationalTransformer],
    problem_type: str,
    num_labels: int,
    labels: list[int],
) -> None:
    model, their_model = pair
    ours, theirs = labelled(500, 6, [float(x) if problem_type == "binary" else x for x in labels])
    torch.manual_seed(5)  # the head's starting weights
    head = model.fit_head(ours, task="churn", num_labels=num_labels, problem_type=problem_type, epochs=30)
    torch.manual_seed(5)
    their_head = their_model.fit_head(
        theirs, task="churn", num_labels=num_labels, problem_type=problem_type, epochs=30
    )
    assert model.heads["churn"] is head and head.problem_type == problem_type
    torch.testing.assert_close(head.projection.weight, their_head.projection.weight, atol=1e-5, rtol=0)
    torch.testing.assert_close(head.projection.bias, their_head.projection.bias, atol=1e-5, rtol=0)
    context = mixed_batch(d_text=TINY.d_text, seed=501)
    np.testing.assert_allclose(
        model.predict(context, task_head="churn"), their_model.predict(context, task_head="churn"), atol=1e-5
    )
    with pytest.raises(ValueError, match="examples"):
        model.fit_head([], task="x")


def feature_head_cases() -> list[tuple[str, dict[str, object]]]:
    rng = np.random.default_rng(30)
    decoder = torch.nn.Linear(16, 8)
    return [
        ("binary", {"labels": rng.integers(0, 2, 12).astype(float)}),
        ("regression", {"labels": rng.normal(size=12)}),
        ("multiclass", {"labels": rng.integers(0, 3, 12), "classes": ("a", "b", "c")}),
        (
            "multiclass",
            {
                "labels": rng.integers(0, 3, 12),
                "classes": ("a", "b", "c"),
                "class_embeddings": rng.normal(size=(3, 8)),
                "text_decoder": decoder,
            },
        ),
        (
            "ranking",
            {"labels": np.tile([1.0, 0.0, 0.0, 1.0], 3), "group_offsets": [0, 4, 8, 12], "n_groups": 3},
        ),
    ]


@pytest.mark.parametrize(("task", "options"), feature_head_cases())
def test_fit_feature_head_fits_the_peers_head(task: str, options: dict[str, object]) -> None:
    features = np.random.default_rng(31).normal(size=(12, 16)) * 0.01 + 1.0  # a narrow cone
    kwargs = {k: v for k, v in options.items() if k != "labels"}
    torch.manual_seed(6)
    ours = fit_feature_head(features, options["labels"], task, epochs=25, learning_rate=1e-2, **kwargs)
    torch.manual_seed(6)
    theirs = peer.fit_feature_head(features, options["labels"], task, epochs=25, learning_rate=1e-2, **kwargs)
    for name in ("weight", "bias", "feat_mu", "feat_sd"):
        np.testing.assert_allclose(getattr(ours, name), getattr(theirs, name), atol=1e-5, err_msg=name)
    assert ours.initial_loss == pytest.approx(theirs.initial_loss, abs=1e-6)
    assert ours.final_loss == pytest.approx(theirs.final_loss, abs=1e-6)
    assert ours.final_loss < ours.initial_loss
    np.testing.assert_allclose(ours.predict(features), theirs.predict(features), atol=1e-5)
    assert (ours.n_outputs, ours.d_model, ours.n_examples) == (
        theirs.n_outputs,
        theirs.d_model,
        theirs.n_examples,
    )


def test_fine_tuned_heads_move_both_ways(tmp_path: Path) -> None:
    features = np.random.default_rng(40).normal(size=(10, 16))
    labels = (features[:, 0] > 0).astype(float)
    ours = fit_feature_head(features, labels, "binary", epochs=5, column_stats={"age": [30.0, 5.0]})
    ours.save(tmp_path / "ours.safetensors")
    loaded_by_peer = peer.FineTunedHead.load(tmp_path / "ours.safetensors")
    np.testing.assert_allclose(loaded_by_peer.predict(features), ours.predict(features), atol=1e-6)
    assert loaded_by_peer.column_stats == {"age": [30.0, 5.0]}
    theirs = peer.fit_feature_head(features, labels, "regression", epochs=5)
    theirs.save(tmp_path / "theirs.safetensors")
    loaded = FineTunedHead.load(tmp_path / "theirs.safetensors")
    assert loaded.task == "regression" and loaded.normalization_mode == "zero_shot"
    np.testing.assert_allclose(loaded.predict(features), theirs.predict(features), atol=1e-6)
    with pytest.raises(HeadError, match=r"features must have shape \[N, 16\]"):
        loaded.predict(features[:, :4])
    FineTunedHead.sidecar_path(tmp_path / "theirs.safetensors").unlink()
    with pytest.raises(HeadError, match=r"preproc\.json is missing"):
        FineTunedHead.load(tmp_path / "theirs.safetensors")
    with pytest.raises(HeadError, match="cannot load"):
        FineTunedHead.load(tmp_path / "nothing.safetensors")
    with pytest.raises(ValueError, match="task"):
        fit_feature_head(features, labels, "multilabel")


def test_onnx_export_runs_in_onnx_runtime_with_the_torch_scores(
    pair: tuple[RelationalTransformer, peer.RelationalTransformer], tmp_path: Path
) -> None:
    import onnxruntime

    model, their_model = pair
    example = mixed_batch(d_text=TINY.d_text, seed=50)
    path = model.export_onnx(tmp_path / "onnx" / "model.onnx", example)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == list(BATCH_FIELDS)
    # Another batch size and context length than the example's: both axes are free.
    for batch in (
        our_batch(d_text=TINY.d_text, seed=51, batch=2, cells=13),
        our_batch(d_text=TINY.d_text, seed=52, batch=1, cells=40),
    ):
        (scores,) = session.run(["target_scores"], batch.numpy())
        np.testing.assert_allclose(scores, model.target_scores(batch).numpy(), atol=1e-5, rtol=0)
    # The peer's ONNX backend runs our file with its own feeding, to the same scores.
    theirs = peer.RelationalTransformer(str(path), backend="onnx", providers=["CPUExecutionProvider"])
    batch = peer.RelationalBatch(**mixed_batch(d_text=TINY.d_text, seed=53))
    np.testing.assert_allclose(
        theirs.forward(batch).scores.numpy(), their_model.forward(batch).scores.numpy(), atol=1e-5
    )
    with pytest.raises(RuntimeError, match="torch backend"):
        RelationalTransformer("rt-j-tiny", backend="meta").export_onnx(tmp_path / "x.onnx", example)


def test_the_triton_backend_needs_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the rule is for machines without it")
    with pytest.raises(RuntimeError, match="backend='triton' needs a CUDA GPU"):
        RelationalTransformer("rt-j-tiny", backend="triton")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        RelationalTransformer("rt-j-tiny", backend="triton", device="cpu")
    with pytest.raises(ValueError, match="backend must be one of torch, triton, onnx, meta"):
        RelationalTransformer("rt-j-tiny", backend="tensorrt")


def quantize_q8(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """Symmetric int8, one fp16 scale per output row."""
    scale = (weight.abs().amax(1) / 127).clamp_min(1e-8)
    values = (weight / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
    return {"": values, ".q_scale": scale.half()}


def quantize_q4(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """Asymmetric 4-bit in groups of 32 values, an fp16 (scale, minimum) per group, two values a
    byte with the even one in the low nibble."""
    rows, width = weight.shape
    groups = weight.reshape(rows, width // 32, 32)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = ((high - low) / 15).clamp_min(1e-8)
    codes = (
        ((groups - low[..., None]) / scale[..., None])
        .round()
        .clamp(0, 15)
        .to(torch.uint8)
        .reshape(rows, width)
    )
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return {"": packed, ".q4_scale": torch.stack((scale, low), dim=-1).half().reshape(rows, -1)}


@pytest.mark.parametrize("layout", ["fp8", "q8", "q4"])
def test_quantized_checkpoints_load_as_the_peer_loads_them(tmp_path: Path, layout: str) -> None:
    weights = peer.RTJModel(**SIZES)
    scramble(weights, seed=60)
    peer_save(weights, tmp_path, SIZES)
    stored: dict[str, torch.Tensor] = {}
    quantized = 0
    for key, value in weights.state_dict().items():
        linear = key.endswith(".weight") and value.ndim == 2
        if layout == "fp8":
            stored[key] = value.to(torch.float8_e4m3fn)
        elif linear and (layout == "q8" or value.shape[1] % 32 == 0):
            parts = quantize_q8(value) if layout == "q8" else quantize_q4(value)
            stored.update({key + suffix: tensor for suffix, tensor in parts.items()})
            quantized += 1
        else:
            stored[key] = value
    assert layout == "fp8" or quantized > 10
    save_file(stored, str(tmp_path / "model.safetensors"))

    expected = peer_load_state(tmp_path / "model.safetensors")
    got = read_state(tmp_path / "model.safetensors")
    assert set(got) == set(expected)
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value.float(), atol=0, rtol=0, msg=key)
    # The dequantized weights differ from the originals, and both models score alike with them.
    assert not torch.equal(got["blocks.0.ffn.w1.weight"], weights.state_dict()["blocks.0.ffn.w1.weight"])
    ours, theirs = (
        RelationalTransformer(tmp_path, device="cpu"),
        peer.RelationalTransformer(str(tmp_path), device="cpu"),
    )
    batch = peer.RelationalBatch(**mixed_batch(d_text=TINY.d_text, seed=61))
    torch.testing.assert_close(ours.target_scores(batch), theirs.forward(batch).scores, atol=1e-5, rtol=0)


def test_a_bad_q4_weight_is_named(tmp_path: Path) -> None:
    weights = peer.RTJModel(**SIZES)
    peer_save(weights, tmp_path, SIZES)
    stored = dict(weights.state_dict())
    parts = quantize_q4(stored.pop("blocks.0.ffn.w1.weight"))
    stored["blocks.0.ffn.w1.weight"] = parts[""][:, :-16].contiguous()  # one group's bytes short
    stored["blocks.0.ffn.w1.weight.q4_scale"] = parts[".q4_scale"]
    save_file(stored, str(tmp_path / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"Q4 weight blocks\.0\.ffn\.w1\.weight has 16 bytes a row"):
        RelationalTransformer(tmp_path, device="cpu")


def test_ablation_validation_and_sizes(
    pair: tuple[RelationalTransformer, peer.RelationalTransformer],
) -> None:
    model, their_model = pair
    fields = mixed_batch(d_text=TINY.d_text, seed=70)
    ablated = RelationalBatch(**fields).ablate([0, 5, 9])
    their_ablated = peer.RelationalBatch(**fields).ablate([0, 5, 9])
    assert torch.equal(ablated.is_padding, their_ablated.is_padding)
    torch.testing.assert_close(
        model.target_scores(ablated), their_model.forward(their_ablated).scores, atol=1e-5, rtol=0
    )
    assert not torch.equal(model.target_scores(ablated), model.target_scores(fields))
    with pytest.raises(ValueError, match="target"):
        RelationalBatch(**fields).ablate([1])
    batch = RelationalBatch(**fields)
    assert batch.validate() is batch
    batch.sem_types[0, 0] = 9
    with pytest.raises(ValueError, match="sem_types"):
        batch.validate()
    assert model.get_model_kwargs() == their_model.get_model_kwargs() == SIZES
    assert RelationalTransformer("rt-j-tiny", backend="meta").get_model_kwargs() == SIZES


def test_relational_dataset_as_the_peers() -> None:
    cells = [text_cells(80), text_cells(81)]
    dataset = RelationalDataset.from_inputs(cells, [0.0, 1.0])
    theirs = peer.RelationalDataset.from_inputs(cells, [0.0, 1.0])
    assert len(dataset) == len(theirs) == 2
    assert [e.label for e in dataset] == [e.label for e in theirs] and dataset[1].input is cells[1]
    with pytest.raises(ValueError, match="same length"):
        RelationalDataset.from_inputs(cells, [0.0])
    with pytest.raises(ValueError, match="at least one"):
        RelationalDataset([])
    with pytest.raises(TypeError, match="RelationalExample, got tuple"):
        RelationalDataset([(cells[0], 1.0)])  # type: ignore[list-item]


CPU = ["CPUExecutionProvider"]


def test_the_onnx_backend_scores_as_the_torch_backend_and_the_peers(
    pair: tuple[RelationalTransformer, peer.RelationalTransformer], tmp_path: Path
) -> None:
    model, _ = pair
    path = model.export_onnx(tmp_path / "graph" / "model.onnx", mixed_batch(d_text=TINY.d_text, seed=90))
    by_file = RelationalTransformer(path, backend="onnx", providers=CPU)
    by_directory = RelationalTransformer(path.parent, backend="onnx", providers=CPU)
    their_onnx = peer.RelationalTransformer(str(path), backend="onnx", providers=CPU)
    # Other batch sizes and lengths than the example's; ours and the peer's batch of each.
    for fields in (
        mixed_batch(d_text=TINY.d_text, seed=91, batch=2, cells=13),
        mixed_batch(d_text=TINY.d_text, seed=92, batch=1, cells=40),
    ):
        batch, their_batch = RelationalBatch(**fields), peer.RelationalBatch(**fields)
        expected = model.target_scores(batch)
        assert not torch.allclose(expected, torch.zeros_like(expected))  # scores to compare
        for onnx_model in (by_file, by_directory):
            torch.testing.assert_close(onnx_model.target_scores(batch), expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(by_file.target_scores(their_batch), expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(their_onnx.forward(their_batch).scores, expected, atol=1e-5, rtol=0)
        np.testing.assert_allclose(by_file.predict(batch), model.predict(batch), atol=1e-5)
    cells = text_cells(94)
    assert by_file.predict(cells, target=3) == pytest.approx(their_onnx.predict(cells, target=3), abs=1e-5)
    regression = RelationalTransformer(path, backend="onnx", task="regression", providers=CPU)
    assert regression.predict(cells, target=3) == pytest.approx(
        model.target_scores(cells, target=3).item(), abs=1e-5
    )  # no sigmoid for a regression task


def test_the_onnx_backend_refuses_what_it_cannot_do(
    pair: tuple[RelationalTransformer, peer.RelationalTransformer], tmp_path: Path
) -> None:
    model, _ = pair
    example = mixed_batch(d_text=TINY.d_text, seed=95)
    path = model.export_onnx(tmp_path / "model.onnx", example)
    onnx_model = RelationalTransformer(path, backend="onnx")  # onnxruntime's default providers
    with pytest.raises(ValueError, match="backend='onnx' serves output='target_scores' only"):
        onnx_model.encode(example, output_value="target_features")
    with pytest.raises(ValueError, match="output must be one of"):
        onnx_model.forward(example, output="logits")
    with pytest.raises(ValueError, match=f"d_text {TINY.d_text}, the batch has 4"):
        onnx_model.target_scores(our_batch(d_text=4, seed=96))
    args = RelationalTrainingArguments(output_dir=str(tmp_path / "out"), save_strategy="no")
    examples = [RelationalExample(mixed_batch(d_text=TINY.d_text, seed=97, batch=1), 1.0)]
    with pytest.raises(RuntimeError, match="fine-tuning requires the torch backend, not 'onnx'"):
        RelationalTrainer(model=onnx_model, args=args, train_dataset=examples)
    with pytest.raises(RuntimeError, match="fit_head requires the torch backend"):
        onnx_model.fit_head(examples, task="churn")
    for refused in (
        lambda: onnx_model.save_pretrained(tmp_path / "copy"),
        lambda: onnx_model.export_onnx(tmp_path / "again.onnx", example),
        lambda: onnx_model.model,
    ):
        with pytest.raises(RuntimeError, match="torch"):
            refused()
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"holds no model\.onnx"):
        RelationalTransformer(tmp_path / "empty", backend="onnx")
    with pytest.raises(ConfigError, match="no ONNX file or directory"):
        RelationalTransformer(tmp_path / "missing.onnx", backend="onnx")
    with pytest.raises(ConfigError, match="rt-j-tiny has no ONNX graph"):
        RelationalTransformer("rt-j-tiny", backend="onnx")
    with pytest.raises(ConfigError, match="providers: this onnxruntime has no NoSuchExecutionProvider"):
        RelationalTransformer(path, backend="onnx", providers=["NoSuchExecutionProvider"])
    (tmp_path / "not-a-graph.onnx").write_bytes(b"not protobuf")
    with pytest.raises(ConfigError, match="ONNX Runtime cannot open"):
        RelationalTransformer(tmp_path / "not-a-graph.onnx", backend="onnx")
    with pytest.raises(ValueError, match=r"providers: .* apply to backend='onnx', not 'torch'"):
        RelationalTransformer("rt-j-tiny", providers=CPU)
    with pytest.raises(ValueError, match="compile=True compiles the torch network; backend='onnx'"):
        RelationalTransformer(path, backend="onnx", compile=True)
    with pytest.raises(ValueError, match="device: with backend='onnx' the providers choose"):
        RelationalTransformer(path, backend="onnx", device="cuda")


def point_the_peer_at(hub: FakeHub, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub reads HF_ENDPOINT and HF_HUB_CACHE once, at import; the peer passes no
    endpoint or cache of its own, so its downloads go where these say."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)
    monkeypatch.setattr(
        constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    )
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with FakeHub() as served:
        monkeypatch.setenv("HF_ENDPOINT", served.endpoint)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
        point_the_peer_at(served, tmp_path / "peer-hub-cache", monkeypatch)
        yield served


def two_revisions(root: Path, write: Callable[[torch.nn.Module, Path], None]) -> Repo:
    """A model repository whose main branch and tag v2 hold different weights (seeds 1 and 2)."""
    repo = Repo()
    for seed, where in ((1, {"branch": "main"}), (2, {"tag": "v2"})):  # where: add_commit's ref
        weights = peer.RTJModel(**SIZES)
        scramble(weights, seed=seed)
        directory = root / f"seed-{seed}"
        write(weights, directory)
        repo.add_commit(directory, **where)
    return repo


def test_revision_picks_the_hub_commit_as_the_peers_does(hub: FakeHub, tmp_path: Path) -> None:
    def both_parts(weights: torch.nn.Module, directory: Path) -> None:
        # Laid out as RelativeDB's repositories: a classification and a regression part.
        for part in ("classification", "regression"):
            peer_save(weights, directory / part, SIZES)

    hub.models["acme/rt-j"] = two_revisions(tmp_path / "repo", both_parts)
    batch = peer.RelationalBatch(**mixed_batch(d_text=TINY.d_text, seed=98))
    main = RelationalTransformer("acme/rt-j", device="cpu").target_scores(batch)
    v2 = RelationalTransformer("acme/rt-j", device="cpu", revision="v2").target_scores(batch)
    assert not torch.allclose(main, v2, atol=1e-3)
    local_v2 = RelationalTransformer(tmp_path / "repo" / "seed-2", device="cpu").target_scores(batch)
    torch.testing.assert_close(v2, local_v2, atol=0, rtol=0)
    theirs = peer.RelationalTransformer("acme/rt-j", device="cpu", revision="v2")
    torch.testing.assert_close(v2, theirs.forward(batch).scores, atol=1e-5, rtol=0)
    assert any("/acme/rt-j/resolve/v2/" in path for _, path in hub.requests)
    with pytest.raises(ConfigError, match=r"acme/rt-j at revision 'v9'.*RevisionNotFound"):
        RelationalTransformer("acme/rt-j", device="cpu", revision="v9")
    with pytest.raises(ConfigError, match=r"revision: .* is a local checkpoint directory"):
        RelationalTransformer(tmp_path / "repo" / "seed-2", revision="v2")
    with pytest.raises(ConfigError, match="revision: rt-j-tiny is built from fresh weights"):
        RelationalTransformer("rt-j-tiny", revision="v2")


def test_the_onnx_backend_fetches_its_graph_from_the_hub(hub: FakeHub, tmp_path: Path) -> None:
    example = mixed_batch(d_text=TINY.d_text, seed=99)

    def export(weights: torch.nn.Module, directory: Path) -> None:
        peer_save(weights, directory / "torch", SIZES)
        RelationalTransformer(directory / "torch", device="cpu").export_onnx(
            directory / "model.onnx", example
        )

    hub.models[DEFAULT_ONNX_MODEL] = two_revisions(tmp_path / "repo", export)
    batch = peer.RelationalBatch(**mixed_batch(d_text=TINY.d_text, seed=100, batch=2, cells=20))
    for revision, seed in ((None, 1), ("v2", 2)):
        got = RelationalTransformer(backend="onnx", revision=revision, providers=CPU).target_scores(batch)
        expected = RelationalTransformer(tmp_path / "repo" / f"seed-{seed}" / "torch", device="cpu")
        torch.testing.assert_close(got, expected.target_scores(batch), atol=1e-5, rtol=0)
        theirs = peer.RelationalTransformer(backend="onnx", revision=revision, providers=CPU)
        torch.testing.assert_close(got, theirs.forward(batch).scores, atol=1e-5, rtol=0)
    with pytest.raises(ConfigError, match=r"model\.onnx of RelativeDB/rt-j-onnx at revision 'v9'"):
        RelationalTransformer(backend="onnx", revision="v9")


def test_compile_runs_every_view_through_torch_compile(
    pair: tuple[RelationalTransformer, peer.RelationalTransformer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The wiring, with a backend that records the graphs dynamo captures and runs them as they
    are (Inductor's code generation would take minutes on this CPU; it is torch's to test)."""
    eager, theirs = pair
    graphs: list[torch.fx.GraphModule] = []

    def recording_backend(graph: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> object:
        graphs.append(graph)
        return graph.forward

    compile_calls: list[dict[str, object]] = []
    real_compile = torch.compile

    def compile_recorded(model: Callable[..., object], *, dynamic: bool) -> Callable[..., object]:
        compile_calls.append({"dynamic": dynamic})
        return real_compile(model, dynamic=dynamic, backend=recording_backend)

    monkeypatch.setattr(torch, "compile", compile_recorded)
    torch._dynamo.reset()
    compiled = RelationalTransformer(tmp_path, device="cpu", compile=True)
    assert compile_calls == [{"dynamic": True}]
    batch = peer.RelationalBatch(**mixed_batch(d_text=TINY.d_text, seed=101))
    for output in ("target_scores", "embeddings"):
        assert_same_output(compiled.forward(batch, output=output), theirs.forward(batch, output=output))
        assert_same_output(compiled.forward(batch, output=output), eager.forward(batch, output=output))
    assert graphs, "nothing went through torch.compile"
    with pytest.raises(ValueError, match="compile=True compiles the torch network; backend='meta'"):
        RelationalTransformer("rt-j-tiny", backend="meta", compile=True)


def test_the_trainers_task_is_kept_and_names_a_tuned_head(
    pair: tuple[RelationalTransformer, peer.RelationalTransformer], tmp_path: Path
) -> None:
    model, their_model = pair
    ours, theirs = labelled(600, 6, [0.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    args = RelationalTrainingArguments(output_dir=str(tmp_path / "unused"), save_strategy="no")
    their_args = peer.RelationalTrainingArguments(output_dir=str(tmp_path / "unused"), save_strategy="no")
    assert (
        RelationalTrainer(model=model, args=args, train_dataset=ours, task="churn").task
        == peer.RelationalTrainer(model=their_model, args=their_args, train_dataset=theirs, task="churn").task
        == "churn"
    )
    assert (
        RelationalTrainer(model=model, args=args, train_dataset=ours).task
        is peer.RelationalTrainer(model=their_model, args=their_args, train_dataset=theirs).task
        is None
    )
    # A head-tuned task's head is served, and saved, under the task's name.
    segments, _ = labelled(700, 6, [0.0, 2.0, 1.0, 1.0, 0.0, 2.0])
    output_dir = tmp_path / "segments"
    tuned = RelationalTrainingArguments(
        output_dir=str(output_dir), problem_type="multiclass", learning_rate=1e-2
    )
    RelationalTrainer(model=model, args=tuned, train_dataset=segments, task="segment").train()
    assert set(model.heads) == {"segment"}
    assert (output_dir / "heads" / "segment" / "head_config.json").is_file()
    probabilities = model.predict(mixed_batch(d_text=TINY.d_text, seed=701), task_head="segment")
    assert isinstance(probabilities, np.ndarray) and probabilities.shape == (3, 3)
    np.testing.assert_allclose(probabilities.sum(-1), 1.0, atol=1e-6)
    assert set(RelationalTransformer(output_dir, device="cpu").heads) == {"segment"}
    for bad in ("", "../elsewhere", "a/b", ".hidden"):
        with pytest.raises(ValueError, match="task must be None or a name"):
            RelationalTrainer(model=model, args=args, train_dataset=ours, task=bad)
