"""Saving streams: model.safetensors is written one tensor at a time (relay_engine.models.
streamed_safetensors), reads back with safetensors as its own files do, and costs no copy of the
model (a full-size pi05's output once took 15 GiB more than its training)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from relay_engine.models import load_policy
from relay_engine.models.streamed_safetensors import PendingTensor, write_streamed
from relay_engine.models.weights import exported_state_dict, save_policy, to_lerobot_state_dict
from relay_engine.tuning import apply_tuning


def test_a_streamed_file_reads_back_as_safetensors_writes_it(tmp_path: Path) -> None:
    tensors = {
        "weights": torch.randn(3, 5),
        "half": torch.randn(7, dtype=torch.float32).to(torch.bfloat16),
        "fp16": torch.randn(2, 2).to(torch.float16),
        "ids": torch.arange(11, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "bytes": torch.arange(5, dtype=torch.uint8),
    }
    path = tmp_path / "streamed.safetensors"
    write_streamed(path, {k: PendingTensor.of(v) for k, v in tensors.items()}, metadata={"format": "pt"})
    read = load_file(str(path))
    assert set(read) == set(tensors)
    for name, tensor in tensors.items():
        assert read[name].dtype == tensor.dtype and torch.equal(read[name], tensor), name
    with safe_open(str(path), "pt") as opened:
        assert opened.metadata() == {"format": "pt"}


def test_a_tensor_made_unlike_its_announcement_is_refused(tmp_path: Path) -> None:
    pending = PendingTensor((2, 2), torch.float32, lambda: torch.zeros(3))
    try:
        write_streamed(tmp_path / "bad.safetensors", {"x": pending})
    except ValueError as error:
        assert "announced (2, 2)" in str(error)
    else:
        raise AssertionError("a wrong shape was written")


def test_a_lora_policy_saves_its_merged_weights(tmp_path: Path) -> None:
    """save_policy merges each adapter as it writes its layer: the file holds what the merged
    state dict holds, in lerobot's names."""
    policy = load_policy("pi05-tiny")
    apply_tuning(policy, "lora", lora_rank=4)
    for name, parameter in policy.named_parameters():
        if "lora_B" in name:  # non-zero adapters, so that merging shows
            torch.nn.init.normal_(parameter, std=0.1)
    save_policy(policy, tmp_path)
    expected = to_lerobot_state_dict(exported_state_dict(policy))
    read = load_file(str(tmp_path / "model.safetensors"))
    assert set(read) == set(expected)
    for name, tensor in expected.items():
        assert read[name].dtype == tensor.dtype and torch.equal(read[name], tensor), name


def peak_growth_mib(tmp_path: Path, writer: str) -> float:
    """The growth of a fresh process's peak RSS while it writes 24 tensors of 16 MiB, each made
    only when asked for, with `writer` (streamed, or safetensors' save_file); or, streamed, one
    table of zeros of the same size (`untouched zeros` or `torch zeros`)."""
    script = textwrap.dedent(
        f"""
        import sys, torch
        from pathlib import Path
        from safetensors.torch import save_file
        from relay_engine.models.streamed_safetensors import PendingTensor, untouched_zeros, write_streamed

        def resident_kib(field):
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith(field + ":"):
                    return int(line.split()[1])

        shape = (4 * 1024 * 1024,)  # 16 MiB of float32
        def make(i):
            return lambda: torch.full(shape, float(i))
        pending = {{f"t{{i:02d}}": PendingTensor(shape, torch.float32, make(i)) for i in range(24)}}
        table = (96 * 1024 * 1024,)  # one 384 MiB table of zeros instead, made one way or the other
        zeros = {{
            "untouched zeros": lambda: untouched_zeros(table, torch.float32),
            "torch zeros": lambda: torch.zeros(table),
        }}
        if "{writer}" in zeros:
            pending = {{"zeros": PendingTensor(table, torch.float32, zeros["{writer}"])}}
        torch.full(shape, 0.0)  # torch's allocator warmed up before the baseline
        Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from now
        before = resident_kib("VmRSS")
        path = Path(sys.argv[1])
        if "{writer}" != "save_file":
            write_streamed(path, pending)
        else:
            save_file({{name: p.make() for name, p in pending.items()}}, str(path))
        print((resident_kib("VmHWM") - before) / 1024)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / f"{writer.replace(' ', '-')}.safetensors")],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip())


def test_a_streamed_save_holds_about_one_tensor_at_a_time(tmp_path: Path) -> None:
    """384 MiB written: the stream's peak grows by a few tensors' worth at most; making every
    tensor first (as save_file needs) grows by all of them."""
    streamed = peak_growth_mib(tmp_path, "streamed")
    whole = peak_growth_mib(tmp_path, "save_file")
    print(f"\npeak RSS growth writing 384 MiB: streamed {streamed:.0f} MiB, save_file {whole:.0f} MiB")
    assert streamed < 80, streamed
    assert whole > 300, whole  # the measure sees a whole copy when there is one


def test_a_table_of_zeros_is_written_without_resident_memory(tmp_path: Path) -> None:
    """pi05's output holds a 0.5 GiB table of zeros (the expert's lm_head, which lerobot's strict
    load needs): made with untouched_zeros, writing 384 MiB of zeros grows the peak by next to
    nothing; made with torch.zeros, by all of it."""
    untouched = peak_growth_mib(tmp_path, "untouched zeros")
    written = peak_growth_mib(tmp_path, "torch zeros")
    print(
        f"\npeak RSS growth writing 384 MiB of zeros: untouched {untouched:.0f} MiB, "
        f"torch.zeros {written:.0f} MiB"
    )
    assert untouched < 32, untouched
    assert written > 300, written
    assert load_file(str(tmp_path / "untouched-zeros.safetensors"))["zeros"].count_nonzero() == 0
