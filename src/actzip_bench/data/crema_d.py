"""CREMA-D read from a local copy: a clip's voice (``audio``) and face (``visual``), six acted emotions.

CREMA-D (Crowd-sourced Emotional Multimodal Actors Dataset; Cao et al., IEEE Transactions on Affective
Computing, 2014) holds 7,442 clips of 91 actors speaking sentences in one of six emotions. Its home is the
GitHub repository ``CheyneyComputerScience/CREMA-D`` (https://github.com/CheyneyComputerScience/CREMA-D); the
media files are stored with Git LFS, so fetch it with ``git lfs clone`` (a plain zip download holds only LFS
pointers). A clip's name is ``ACTOR_SENTENCE_EMOTION_LEVEL``, e.g. ``1001_DFA_ANG_XX``: the actor's id, the
sentence, the emotion (one of :data:`CLASSES`) and its level.

Expected layout under ``root``::

    AudioWAV/<clip>.wav          as distributed (PCM WAV; any rate, mono or stereo)
    <frames_dir>/<clip>/*.jpg    frames you extract from VideoFlash/<clip>.flv (or *.png), one folder per clip

The repository ships video only as Flash video, so the frames are made once by the user, one folder per clip
as multimodal-learning code such as OGM-GE reads them; e.g. one frame a second with ffmpeg::

    mkdir -p visual
    for f in VideoFlash/*.flv; do c=$(basename "$f" .flv); mkdir -p "visual/$c";
        ffmpeg -loglevel error -i "$f" -vf fps=1 "visual/$c/%04d.jpg"; done

Streams, in the order of :data:`MODALITIES`:

- ``audio``: ``[n, n_mels, audio_frames]`` log-mel energies (25 ms Hann windows every ``hop_ms``, ``n_mels``
  triangular bands from 0 to 8 kHz) of the first ``seconds`` of the clip, zero-padded when shorter;
- ``visual``: ``[n, C * frames_per_clip, image_size, image_size]`` in [0, 1]: ``frames_per_clip`` frames chosen
  evenly over the clip's folder (in natural name order), each cut to its central square and resized, stacked
  frame by frame along the channels (channel ``f * C + c`` is channel ``c`` of frame ``f``; ``C`` is 3 for RGB,
  1 for grayscale), so a 2-D convolution sees every frame at once.

A clip whose frame folder is missing or empty is left out, with one warning that counts such clips; the count
and the names are in the returned :class:`CremaDInfo`. Clips are shuffled by ``seed`` before ``limit`` is
taken, so a cut by index is a random split; :func:`actor_split` gives a speaker-independent one instead.
"""

from __future__ import annotations

import math
import pathlib
import re
import warnings
import wave
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from actzip.errors import ConfigError, DataError
from actzip_bench.data.images import read_square_image

__all__ = ["CLASSES", "MODALITIES", "CremaD", "CremaDConfig", "CremaDInfo", "actor_split", "load_crema_d"]

MODALITIES = ("audio", "visual")
CLASSES = ("ANG", "DIS", "FEA", "HAP", "NEU", "SAD")  # label i is CLASSES[i]
AUDIO_DIR = "AudioWAV"
FRAME_SUFFIXES = (".jpg", ".jpeg", ".png")
WINDOW_MS = 25.0  # the STFT window; the hop is a config field
MEL_FMAX = 8000.0  # the bands' top: Nyquist at 16 kHz, so a file at another rate gets the same bands


@dataclass
class CremaDConfig:
    """Where the copy is and how each clip becomes tensors."""

    root: str | pathlib.Path = ""  # the folder holding AudioWAV/ and the frames folder
    frames_dir: str = "visual"  # the frames folder under root: one subfolder of *.jpg / *.png per clip
    seconds: float = 3.0  # audio kept per clip: longer clips are cut, shorter ones zero-padded
    n_mels: int = 40  # mel bands of the audio stream
    hop_ms: float = 20.0  # time between audio frames
    frames_per_clip: int = 3  # video frames per clip, chosen evenly over the clip's frames
    image_size: int = 32  # frames are resized to image_size x image_size
    rgb: bool = True  # 3 channels per frame; False: 1 (grayscale)
    limit: int | None = None  # at most this many clips (after shuffling); None: all
    seed: int = 0  # the order of the clips

    def __post_init__(self) -> None:
        for name in ("n_mels", "frames_per_clip", "image_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"crema_d: {name} must be a positive int, got {value!r}")
        if not self.seconds > 0 or not self.hop_ms > 0:
            raise ConfigError(f"crema_d: seconds and hop_ms must be > 0, got {self.seconds!r} and {self.hop_ms!r}")
        if self.limit is not None and (not isinstance(self.limit, int) or self.limit < 1):
            raise ConfigError(f"crema_d: limit must be a positive int or None, got {self.limit!r}")

    @property
    def audio_frames(self) -> int:
        """Time steps of the audio stream (a centred STFT: one frame per hop, plus one)."""
        return 1 + int(round(self.seconds * 1000.0 / self.hop_ms))

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Each modality's per-sample shape."""
        channels = (3 if self.rgb else 1) * self.frames_per_clip
        return {"audio": (self.n_mels, self.audio_frames),
                "visual": (channels, self.image_size, self.image_size)}


@dataclass
class CremaDInfo:
    """What the loader found, beside the tensors."""

    clips: tuple[str, ...]  # clip names, in sample order
    actors: torch.Tensor  # [n] int64 actor id of each sample (1001..1091 in CREMA-D)
    skipped: int  # clips left out because their frame folder is missing or empty
    skipped_clips: tuple[str, ...]  # their names


class CremaD(NamedTuple):
    """``(streams, labels, info)``: unpacks like ``(streams, labels)`` plus the notes."""

    streams: dict[str, torch.Tensor]  # modality -> float32 [n, ...], in MODALITIES order
    labels: torch.Tensor  # [n] int64 indices into CLASSES
    info: CremaDInfo


def load_crema_d(cfg: CremaDConfig) -> CremaD:
    """Read the copy under ``cfg.root``: see the module's docstring for the layout and the streams."""
    root = pathlib.Path(cfg.root)
    if not root.is_dir():
        raise DataError(f"crema_d: root {str(root)!r} is not a directory")
    audio_dir = root / AUDIO_DIR
    wavs = sorted(audio_dir.glob("*.wav")) if audio_dir.is_dir() else []
    if not wavs:
        raise DataError(f"crema_d: no .wav files under {str(audio_dir)!r} (expected CREMA-D's AudioWAV folder)")
    frames_root = root / cfg.frames_dir
    if not frames_root.is_dir():
        raise DataError(f"crema_d: frames folder {str(frames_root)!r} does not exist; extract frames from "
                        "VideoFlash/*.flv into one subfolder per clip (see this module's docstring)")
    parsed = [(wav, *_parse_name(wav)) for wav in wavs]  # names first: a stray file fails before any decoding
    usable, skipped = [], []
    for wav, actor, label in parsed:
        frames = _frame_files(frames_root / wav.stem)
        (usable if frames else skipped).append((wav, actor, label, frames))
    if skipped:
        warnings.warn(f"crema_d: {len(skipped)} of {len(parsed)} clips have no frames under {str(frames_root)!r} "
                      "and are left out", stacklevel=2)
    if not usable:
        raise DataError(f"crema_d: no clip under {str(audio_dir)!r} has frames under {str(frames_root)!r}")
    order = torch.randperm(len(usable), generator=torch.Generator().manual_seed(cfg.seed)).tolist()
    chosen = [usable[i] for i in order[:cfg.limit]]
    audio = torch.stack([_audio_features(_read_wav(wav), cfg) for wav, *_ in chosen])
    visual = torch.stack([_clip_frames(frames, cfg) for *_, frames in chosen])
    labels = torch.tensor([label for _, _, label, _ in chosen], dtype=torch.int64)
    info = CremaDInfo(clips=tuple(wav.stem for wav, *_ in chosen),
                      actors=torch.tensor([actor for _, actor, _, _ in chosen], dtype=torch.int64),
                      skipped=len(skipped), skipped_clips=tuple(wav.stem for wav, *_ in skipped))
    return CremaD({"audio": audio, "visual": visual}, labels, info)


def actor_split(actors: torch.Tensor, test_share: float = 0.2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(train, test)`` sample indices with no actor on both sides (a speaker-independent split).

    ``actors``: :attr:`CremaDInfo.actors`. ``round(test_share * actors)`` actors, at least one and at most all
    but one, are drawn by ``seed`` for the test side; indices come sorted."""
    if not 0.0 < test_share < 1.0:
        raise ConfigError(f"actor_split: test_share must be in (0, 1), got {test_share!r}")
    ids = torch.unique(actors)
    if len(ids) < 2:
        raise DataError(f"actor_split: needs at least 2 actors, got {len(ids)}")
    k = min(max(1, round(test_share * len(ids))), len(ids) - 1)
    test_ids = ids[torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed))[:k]]
    is_test = torch.isin(actors, test_ids)
    return torch.nonzero(~is_test).flatten(), torch.nonzero(is_test).flatten()


# -- names and files -----------------------------------------------------------------------------------------


def _parse_name(wav: pathlib.Path) -> tuple[int, int]:
    """``(actor, label)`` from ``ACTOR_SENTENCE_EMOTION_LEVEL``."""
    parts = wav.stem.split("_")
    if len(parts) != 4 or not parts[0].isdigit() or parts[2] not in CLASSES:
        raise DataError(f"crema_d: {str(wav)!r} is not named ACTOR_SENTENCE_EMOTION_LEVEL with an emotion in "
                        f"{CLASSES}")
    return int(parts[0]), CLASSES.index(parts[2])


def _natural_key(path: pathlib.Path) -> list:
    # ffmpeg's %d names are not zero-padded unless asked: order 2.jpg before 10.jpg
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def _frame_files(folder: pathlib.Path) -> list[pathlib.Path]:
    if not folder.is_dir():
        return []
    return sorted((p for p in folder.iterdir() if p.suffix.lower() in FRAME_SUFFIXES), key=_natural_key)


# -- audio ---------------------------------------------------------------------------------------------------


def _read_wav(path: pathlib.Path) -> tuple[torch.Tensor, int]:
    """``(samples in [-1, 1] as float32 [t], rate)``; channels are averaged."""
    try:
        with wave.open(str(path), "rb") as w:
            width, channels, rate = w.getsampwidth(), w.getnchannels(), w.getframerate()
            raw = w.readframes(w.getnframes())
    except (wave.Error, EOFError, OSError) as exc:
        raise DataError(f"crema_d: {str(path)!r} cannot be read as PCM WAV: {exc}") from None
    if width == 1:  # 8-bit WAV is unsigned
        x = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 2:
        x = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
    elif width == 3:  # little-endian 24-bit: widen each sample to 32 bits
        b = np.frombuffer(raw[:len(raw) - len(raw) % 3], dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        x = ((b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)) << 8 >> 8).astype(np.float32) / 8388608.0
    elif width == 4:
        x = np.frombuffer(raw, dtype="<i4").astype(np.float32) / 2147483648.0
    else:
        raise DataError(f"crema_d: {str(path)!r} has {width}-byte samples; expected 1 to 4")
    x = x[:len(x) - len(x) % channels].reshape(-1, channels).mean(1)
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), rate


_MEL_BANKS: dict[tuple[int, int, int], torch.Tensor] = {}


def _mel_bank(rate: int, n_fft: int, n_mels: int) -> torch.Tensor:
    """``[n_mels, n_fft // 2 + 1]`` triangular filters evenly spaced on the HTK mel scale up to 8 kHz."""
    key = (rate, n_fft, n_mels)
    if key not in _MEL_BANKS:
        def mel(f):
            return 2595.0 * torch.log10(1.0 + f / 700.0)

        edges_mel = torch.linspace(0.0, float(mel(torch.tensor(MEL_FMAX))), n_mels + 2, dtype=torch.float64)
        edges = 700.0 * (10.0 ** (edges_mel / 2595.0) - 1.0)
        freqs = torch.arange(n_fft // 2 + 1, dtype=torch.float64) * rate / n_fft
        lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
        rise, fall = (freqs - lo) / (mid - lo), (hi - freqs) / (hi - mid)
        _MEL_BANKS[key] = torch.clamp(torch.minimum(rise, fall), min=0.0).float()
    return _MEL_BANKS[key]


def _audio_features(wav: tuple[torch.Tensor, int], cfg: CremaDConfig) -> torch.Tensor:
    """``[n_mels, audio_frames]`` log-mel energies of the first ``seconds`` (zero-padded)."""
    x, rate = wav
    length = int(round(cfg.seconds * rate))
    x = torch.nn.functional.pad(x[:length], (0, max(0, length - len(x))))
    win = max(2, int(round(WINDOW_MS * rate / 1000.0)))
    hop = max(1, int(round(cfg.hop_ms * rate / 1000.0)))
    n_fft = 1 << (win - 1).bit_length()  # the window, zero-padded to a power of two
    spec = torch.stft(x, n_fft, hop_length=hop, win_length=win, window=torch.hann_window(win),
                      center=True, return_complex=True).abs().pow(2)
    mel = _mel_bank(rate, n_fft, cfg.n_mels) @ spec
    mel = torch.log(mel + 1e-6)  # the floor keeps silence (and padding) finite
    frames = cfg.audio_frames  # rounding the hop at odd rates can give one frame more or less
    if mel.shape[1] < frames:
        mel = torch.nn.functional.pad(mel, (0, frames - mel.shape[1]), value=math.log(1e-6))
    return mel[:, :frames].contiguous()


# -- frames --------------------------------------------------------------------------------------------------


def _clip_frames(frames: list[pathlib.Path], cfg: CremaDConfig) -> torch.Tensor:
    """``[C * frames_per_clip, S, S]``: frames chosen evenly from first to last (repeated if too few)."""
    picks = torch.linspace(0, len(frames) - 1, cfg.frames_per_clip).round().long().tolist()
    return torch.cat([read_square_image(frames[i], cfg.image_size, cfg.rgb, "crema_d") for i in picks])
