"""RT-J figures on this machine, measured in one run (not a test):

1. context sampling: contexts/s on one core (the sampler's arrays memory-mapped), alone and with
   collate, against reading the same rows' cells with pyarrow (`Table.take` of every sampled row of
   every table, then to numpy);
2. a training step (forward, backward, AdamW) of rt-j at 256-cell contexts: its FLOP/s (counted
   by torch's FlopCounterMode) against this machine's fp32 matmul rate;
3. our forward against RelativeDB's `relational-transformers` on the same batch and weights.

    python bench/bench_relational.py [--threads 1] [--contexts 200] [--model rt-j] [--batch-size 4]
    python bench/bench_relational.py --sampling-only --context-length 1024   (part 1 alone)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_model import matmul_rate, median_seconds, step_flops

from relay_engine.families.rtj.database import open_database
from relay_engine.families.rtj.encoding import HashEmbedder
from relay_engine.families.rtj.learner import per_context_loss
from relay_engine.families.rtj.sampling import ContextSampler
from relay_engine.families.rtj.synth import write_fake_shop
from relay_engine.relational import NAMED_CONFIGS, RelationalTransformer, collate


def sampling(root: Path, contexts: int, context_length: int, batch_size: int = 32) -> None:
    """Contexts/s of the sampler (its arrays and the tables memory-mapped from files, as in jobs),
    alone and with collate (where the text and column-name embeddings are gathered), against pyarrow
    reading the same rows; the median of 3 alternating rounds, so that a busy moment of the machine
    hits both."""
    with tempfile.TemporaryDirectory() as cache:
        database = open_database(root, cache_dir=cache)  # tables memory-mapped, as in jobs
        sampler = ContextSampler(
            database,
            "user-churn",
            HashEmbedder(384),
            context_length=context_length,
            max_children=32,
            cache_dir=Path(cache),
        )
        rows = sampler.splits["train"]
        count = min(contexts, rows.num_rows)
        # The same rows, read with pyarrow: per context, take each visited row of each table.
        orders = [_walk(sampler, rows, i) for i in range(count)]
        tables = {name: table.data for name, table in database.tables.items()}

        def sample() -> list:
            return sampler.examples("train", limit=count)

        def collated() -> None:
            examples = sample()
            for first in range(0, count, batch_size):
                collate([e.input for e in examples[first : first + batch_size]])

        def read() -> None:
            for order in orders:
                for name, indices in order.items():
                    taken = tables[name].take(pa.array(indices, pa.int64()))
                    for column in taken.columns:
                        column.to_numpy(zero_copy_only=False)

        rounds = [(_seconds(sample), _seconds(collated), _seconds(read)) for _ in range(3)]
        cells = sum(e.input.sequence_length for e in sample())
    sample_s, collated_s, read_s = (statistics.median(r[k] for r in rounds) for k in range(3))
    print(
        f"context sampling ({count} contexts of up to {context_length} cells, "
        f"{cells / count:.0f} on average; median of 3 rounds):"
    )
    print(f"  sampled:       {count / sample_s:8.1f} contexts/s ({cells / sample_s:,.0f} cells/s)")
    print(
        f"  and collated:  {count / collated_s:8.1f} contexts/s "
        f"(batches of {batch_size}, embeddings gathered)"
    )
    print(f"  pyarrow reads: {count / read_s:8.1f} contexts/s of the same rows")
    print(
        f"  ratio:         sampling runs at {read_s / sample_s:.2f}x a pyarrow read of its rows "
        f"({read_s / collated_s:.2f}x with collate)"
    )


def _seconds(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def _walk(sampler: ContextSampler, rows: pa.Table, i: int) -> dict[str, list[int]]:
    """The rows a context visits, per database table (the sampler's own walk)."""
    entity = sampler.pk_rows[sampler.spec.entity_table].get(
        rows.column(sampler.spec.entity_column)[i].as_py(), -1
    )
    seed_time = float(rows.column(sampler.spec.time_column)[i].value) / 1e6
    recorded: dict[str, list[int]] = {}
    for table, row in sampler.visited_rows(entity, seed_time, (sampler.seed, 0, i)):
        if table in sampler.database.tables:  # (not the task's own rows)
            recorded.setdefault(table, []).append(row)
    return recorded


def training_step(model_name: str, batch_size: int, examples: list) -> None:
    model = RelationalTransformer(model_name, device="cpu")
    network = model.model
    batch = collate([e.input for e in examples[:batch_size]])
    labels = torch.as_tensor([e.label for e in examples[:batch_size]], dtype=torch.float32)
    optimizer = torch.optim.AdamW(network.parameters(), lr=1e-5)
    network.train()

    def step() -> None:
        loss = per_context_loss(network(batch), labels, "binary").mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    flops = step_flops(step)
    rate_before = matmul_rate()
    seconds = median_seconds(step, repeats=5)
    rate_after = matmul_rate()
    machine = (rate_before + rate_after) / 2
    params = sum(p.numel() for p in network.parameters())
    print(
        f"{model_name} training step ({params:,} weights, "
        f"batch {batch_size} x {batch.sequence_length} cells):"
    )
    print(
        f"  step:   {seconds:.3f} s median, {flops / 1e9:.1f} GFLOP counted, "
        f"{flops / seconds / 1e9:.1f} GFLOP/s"
    )
    print(
        f"  matmul: {machine / 1e9:.1f} GFLOP/s (2048^2 fp32, "
        f"before {rate_before / 1e9:.1f}, after {rate_after / 1e9:.1f})"
    )
    print(f"  ratio:  the step runs at {flops / seconds / machine:.1%} of the matmul rate")


def against_peer(model_name: str, batch_size: int, examples: list) -> None:
    import relational_transformers as peer

    ours = RelationalTransformer(model_name, device="cpu")
    with torch.no_grad():
        for parameter in ours.model.parameters():
            parameter.normal_(0, 0.05)
    with tempfile.TemporaryDirectory() as directory:
        ours.save_pretrained(directory)
        theirs = peer.RelationalTransformer(directory, device="cpu")
    batch = collate([e.input for e in examples[:batch_size]])
    their_batch = peer.RelationalBatch(**batch.as_dict())
    rounds = []
    for _ in range(3):  # alternate, so that a busy moment of the machine hits both
        ours_s = median_seconds(lambda: ours.forward(batch), repeats=3, warmup=1)
        theirs_s = median_seconds(lambda: theirs.forward(their_batch), repeats=3, warmup=1)
        rounds.append((ours_s, theirs_s))
    ours_median = statistics.median(r[0] for r in rounds)
    theirs_median = statistics.median(r[1] for r in rounds)
    difference = float((ours.target_scores(batch) - theirs.forward(their_batch).scores).abs().max())
    print(
        f"forward of {model_name} on batch {batch_size} x {batch.sequence_length} cells (median of 3 rounds):"
    )
    print(
        f"  ours {ours_median * 1e3:.1f} ms, relational-transformers {theirs_median * 1e3:.1f} ms: "
        f"ours takes {ours_median / theirs_median:.2f}x theirs; largest score difference {difference:.2e}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads [default: 1]")
    parser.add_argument("--contexts", type=int, default=200)
    parser.add_argument("--context-length", type=int, default=256)
    parser.add_argument("--model", default="rt-j", choices=sorted(NAMED_CONFIGS))
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--sampling-only", action="store_true", help="context sampling alone (part 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    with tempfile.TemporaryDirectory() as directory:
        root = write_fake_shop(Path(directory) / "shop", customers=300, reviews=3000)
        sampling(root, args.contexts, args.context_length)
        if args.sampling_only:
            return
        sampler = ContextSampler(
            open_database(root),
            "user-churn",
            HashEmbedder(384),
            context_length=args.context_length,
            max_children=32,
        )
        examples = sampler.examples("train", limit=max(args.batch_size, 8))
    training_step(args.model, args.batch_size, examples)
    against_peer(args.model, args.batch_size, examples)


if __name__ == "__main__":
    main()
