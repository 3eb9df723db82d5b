"""Video cameras: decode one frame at a timestamp, probe a file's codec, encode frames into an mp4.

Decoding follows lerobot 0.6.1's rule: the frame whose presentation time is nearest the query
timestamp, accepted only within `TOLERANCE_S` of it. `VideoFrames` keeps one PyAV container open per
file (per process: a forked or unpickled copy opens its own) and, for each query, seeks to the
keyframe at or before the timestamp and decodes forward to it, so a sample costs the frames between
the keyframe and the one wanted, never the whole file; a query a few frames ahead of the last one
decodes on without a seek. That is the path of a dataset too large to decode into the cache;
`decode_in_order` is what fills the cache (relay_engine.datasets.decoded_frames).

Both convert frames to RGB with a reformatter kept per open file (`_Rgb`): PyAV's
`frame.to_ndarray(format=...)` builds a new FFmpeg scaling context for every frame, which cost
more than decoding the frame (1.2 ms against 0.06 ms for a 224x224 AV1 frame, on this project's
machine); the pixels are the same.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

# lerobot's default `tolerance_s` for video frames.
TOLERANCE_S = 1e-4
# The codecs `relay datasets synth --video` can write, by name; PyAV picks the encoder.
ENCODERS = {"h264": "libx264", "av1": "libsvtav1", "hevc": "libx265"}


# Decoders a forked process inherited from its parent: never used, never freed.
_INHERITED: list[object] = []


class VideoError(Exception):
    """A video file that cannot be opened or decoded, or a frame that is not within the tolerance."""


def _av() -> Any:
    import av

    return av


@dataclass(frozen=True)
class Probe:
    codec: str
    height: int
    width: int
    pix_fmt: str
    fps: float


def _single_threaded(stream: Any) -> Any:
    """Decode on the calling thread only. FFmpeg's decoding threads (libdav1d's for AV1, frame and
    slice threads for the others) do not survive a fork: a DataLoader worker forked after its parent
    decoded segfaulted in the next decode. Processes, not threads, spread the decoding."""
    stream.thread_type = "NONE"
    stream.codec_context.thread_count = 1
    return stream


def probe(path: Path) -> Probe:
    """The video stream's codec, size and rate, after decoding its first frame (so a codec this
    FFmpeg has no decoder for, or a broken file, fails here, before training)."""
    av = _av()
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise VideoError(f"{path.name} has no video stream")
            stream = _single_threaded(container.streams.video[0])
            codec = stream.codec_context.codec.canonical_name
            try:
                frame = next(container.decode(stream), None)
            except av.FFmpegError as error:
                raise VideoError(f"its {codec} stream cannot be decoded: {error}") from None
            if frame is None:
                raise VideoError(f"its {codec} stream holds no frame this FFmpeg can decode")
            rate = stream.average_rate or stream.guessed_rate or 0
            return Probe(codec, frame.height, frame.width, str(stream.codec_context.pix_fmt), float(rate))
    except av.FFmpegError as error:
        raise VideoError(f"cannot be opened as a video: {error}") from None


def decoder_available(codec: str) -> bool:
    """Whether the bundled FFmpeg has a decoder for `codec` (its FFmpeg name: h264, hevc, av1...)."""
    av = _av()
    try:
        av.codec.Codec(codec, "r")
    except (av.FFmpegError, ValueError):
        return False
    return True


@dataclass(frozen=True)
class DecodedSpan:
    """The frames of a file from `start` to `stop` (seconds), each one decoded whole."""

    times: np.ndarray  # float64: the time of each frame within the tolerance of [start, stop]
    # Whether the file ends before `stop` (plus the tolerance), and then the time of its last
    # decodable frame (None: none from the keyframe before `start` on).
    ends_early: bool = False
    last: float | None = None


def decoded_times(path: Path, start: float, stop: float, tolerance_s: float = TOLERANCE_S) -> np.ndarray:
    """The times (seconds) of every frame of `path` from `start` to `stop`, each one decoded whole."""
    return decoded_span(path, start, stop, tolerance_s).times


def decoded_span(path: Path, start: float, stop: float, tolerance_s: float = TOLERANCE_S) -> DecodedSpan:
    """Every frame of `path` from `start` to `stop`, each one decoded whole, and where the file ends
    if that is before `stop`: what `relay datasets check` compares with the times an episode asks for."""
    av = _av()
    times = []
    last: float | None = None
    ended = True
    try:
        with av.open(str(path)) as container:
            stream = _single_threaded(container.streams.video[0])
            time_base = stream.time_base
            container.seek(max(0, int((start - tolerance_s) / time_base) - 1), stream=stream, backward=True)
            for frame in container.decode(stream):
                if frame.pts is None:
                    continue
                time = float(frame.pts * time_base)
                if time > stop + tolerance_s:
                    ended = False
                    break
                last = time
                if time >= start - tolerance_s:
                    times.append(time)
    except (av.FFmpegError, OSError, IndexError) as error:
        raise VideoError(f"{path.name}: decoding from {start:.6g} s failed: {error}") from None
    return DecodedSpan(np.array(times, dtype=np.float64), ended, last if ended else None)


# How far ahead of the decoder's last frame a query may be and still be decoded forward, without a
# seek (which flushes the decoder and starts again at a keyframe): a few frames' worth.
FORWARD_WINDOW_S = 0.25


def video_decoders() -> list[str]:
    """The names (h264, hevc, av1, ...: what meta/info.json's `video.codec` holds) of every video
    codec the bundled FFmpeg can decode: what a worker tells the API it reads."""
    av = _av()
    names = set()
    for name in av.codecs_available:
        try:
            codec = av.codec.Codec(name, "r")
        except (av.FFmpegError, ValueError):
            continue  # an encoder only
        if codec.type == "video":
            names.add(codec.canonical_name)
    return sorted(names)


class _Rgb:
    """Frames to uint8 (H, W, 3) RGB through one kept FFmpeg scaling context (PyAV's reformatter,
    which rebuilds it only when a frame's size or format changes). One per decoder: not shared
    between threads."""

    def __init__(self) -> None:
        self._reformatter = _av().video.reformatter.VideoReformatter()

    def __call__(self, frame: Any) -> np.ndarray:
        return np.asarray(self._reformatter.reformat(frame, format="rgb24").to_ndarray())


def decode_in_order(path: Path, start: float) -> Iterator[tuple[float, np.ndarray]]:
    """Every frame of `path` from the keyframe at or before `start` (seconds) to the end, in order:
    (its time in seconds, uint8 (H, W, 3) RGB). One decoder on the calling thread."""
    av = _av()
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise VideoError("it has no video stream")
            stream = _single_threaded(container.streams.video[0])
            time_base = stream.time_base
            rgb = _Rgb()
            if start > 0:
                container.seek(max(0, int(start / time_base) - 1), stream=stream, backward=True)
            for frame in container.decode(stream):
                if frame.pts is not None:
                    yield float(frame.pts * time_base), rgb(frame)
    except (av.FFmpegError, OSError) as error:
        raise VideoError(f"decoding failed: {error}") from None


@dataclass
class _Open:
    container: Any
    stream: Any
    frames: Any = None  # the decoding generator, positioned after `last_time`
    last_time: float | None = None
    rgb: _Rgb = field(default_factory=_Rgb)

    def can_reach(self, timestamp: float, tolerance_s: float) -> bool:
        """Whether the next frames decoded in order reach `timestamp` soon (a query just ahead)."""
        if self.frames is None or self.last_time is None:
            return False
        return self.last_time + tolerance_s < timestamp <= self.last_time + FORWARD_WINDOW_S


@dataclass
class VideoFrames:
    """Decodes frames of video files, keeping each file's decoder open. Picklable."""

    tolerance_s: float = TOLERANCE_S
    _open: dict[Path, _Open] = field(default_factory=dict, repr=False)
    _pid: int = field(default_factory=os.getpid, repr=False)

    def frame(self, path: Path, timestamp: float) -> np.ndarray:
        """uint8 (H, W, 3) RGB: the frame of `path` nearest `timestamp` (seconds in the file)."""
        av = _av()
        opened = self._opened(path)
        stream = opened.stream
        time_base: Fraction = stream.time_base
        try:
            if not opened.can_reach(timestamp, self.tolerance_s):
                # The keyframe at or before the timestamp (a little before, for rounding), then forward.
                target = max(0, int((timestamp - self.tolerance_s) / time_base) - 1)
                opened.container.seek(target, stream=stream, backward=True, any_frame=False)
                opened.frames = opened.container.decode(stream)
                opened.last_time = None
            best: Any = None
            best_gap = float("inf")
            assert opened.frames is not None
            for frame in opened.frames:
                if frame.pts is None:
                    continue
                time = float(frame.pts * time_base)
                opened.last_time = time
                gap = abs(time - timestamp)
                if gap < best_gap:
                    best, best_gap = frame, gap
                # Frames come in time order, 1/fps apart: the first one within the tolerance is
                # the nearest, so the decoder stops there (one frame sooner than waiting for a later one).
                if gap <= self.tolerance_s or time >= timestamp + self.tolerance_s:
                    break
        except av.FFmpegError as error:
            self._close(path)
            raise VideoError(f"{path.name}: decoding at {timestamp:.6g} s failed: {error}") from None
        if best is None or best_gap > self.tolerance_s:
            opened.last_time = None  # the decoder may be anywhere now: seek next time
            found = "no frame" if best is None else f"the nearest frame is {best_gap:.6g} s away"
            raise VideoError(
                f"{path.name}: no frame at {timestamp:.6g} s within {self.tolerance_s:g} s ({found})"
            )
        return opened.rgb(best)

    def _opened(self, path: Path) -> _Open:
        if self._pid != os.getpid():
            # A forked copy: the parent's decoders are not ours to use, nor to close (freeing one
            # waits for its decoding threads, which did not come across the fork), so they are kept.
            _INHERITED.append(self._open)
            self._open = {}
            self._pid = os.getpid()
        opened = self._open.get(path)
        if opened is None:
            av = _av()
            try:
                container = av.open(str(path))
            except (av.FFmpegError, OSError) as error:
                raise VideoError(f"{path.name} cannot be opened: {error}") from None
            if not container.streams.video:
                container.close()
                raise VideoError(f"{path.name} has no video stream")
            opened = self._open[path] = _Open(container, _single_threaded(container.streams.video[0]))
        return opened

    def _close(self, path: Path) -> None:
        opened = self._open.pop(path, None)
        if opened is not None:
            opened.container.close()

    def close(self) -> None:
        for path in list(self._open):
            self._close(path)

    def __getstate__(self) -> dict[str, object]:
        return {"tolerance_s": self.tolerance_s}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.tolerance_s = float(state["tolerance_s"])  # type: ignore[arg-type]
        self._open = {}
        self._pid = os.getpid()


@dataclass(frozen=True)
class VideoSettings:
    """How `DatasetWriter` encodes video cameras: a codec name (h264, av1, hevc), the pixel format,
    the keyframe interval and the encoder's options (crf, qp, preset...)."""

    codec: str = "h264"
    pix_fmt: str = "yuv420p"
    g: int = 2
    options: tuple[tuple[str, str], ...] = (("crf", "23"),)

    @property
    def encoder(self) -> str:
        return ENCODERS.get(self.codec, self.codec)


LOSSLESS_H264 = VideoSettings(codec="h264", pix_fmt="yuv444p", options=(("qp", "0"),))


def encoder_available(name: str) -> bool:
    av = _av()
    try:
        av.codec.Codec(name, "w")
    except (av.FFmpegError, ValueError):
        return False
    return True


def realtime_threads() -> set[int]:
    """This process's threads (their ids) that run at a real-time scheduling policy (FIFO or RR);
    empty where the system does not say (no /proc)."""
    found: set[int] = set()
    try:
        entries = list(os.scandir("/proc/self/task"))
    except OSError:
        return found
    for entry in entries:
        try:
            if os.sched_getscheduler(int(entry.name)) in (os.SCHED_FIFO, os.SCHED_RR):
                found.add(int(entry.name))
        except (OSError, ValueError):  # a thread that ended meanwhile
            continue
    return found


class VideoEncoder:
    """Frames appended one by one to one mp4 file; frame i is shown at i / fps.

    SVT-AV1 (libsvtav1), when it runs as root, moves the thread that starts it and the ~40 threads
    it starts to SCHED_FIFO at priority 99. A process or thread started from them afterwards
    inherits that: a test run's workers and browser, spinning at real-time priority, starved the
    whole machine for minutes. So the encoder's new real-time threads go back to the normal policy
    as soon as the encoder has started them (its output is the same: priority is not an input)."""

    def __init__(self, path: Path, fps: int, size: tuple[int, int], settings: VideoSettings) -> None:
        av = _av()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.frames = 0
        self._container = av.open(str(path), mode="w")
        options = {"g": str(settings.g), **dict(settings.options)}
        if settings.encoder in ("libx264", "libx264rgb"):
            options.setdefault("bf", "0")
        self._stream = self._container.add_stream(settings.encoder, rate=fps, options=options)
        self._stream.height, self._stream.width = size
        self._stream.pix_fmt = settings.pix_fmt
        self._av = av
        self._realtime_before = realtime_threads()

    def add(self, image: np.ndarray) -> None:
        frame = self._av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
        frame.pts = self.frames
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        if self.frames == 0:  # the encoder starts its threads with the first frame
            self._back_to_normal_scheduling()
        self.frames += 1

    def close(self) -> Probe:
        for packet in self._stream.encode():
            self._container.mux(packet)
        self._container.close()
        self._back_to_normal_scheduling()
        return probe(self.path)

    def _back_to_normal_scheduling(self) -> None:
        for thread in realtime_threads() - self._realtime_before:
            try:
                os.sched_setscheduler(thread, os.SCHED_OTHER, os.sched_param(0))
            except OSError:  # it ended meanwhile
                continue
