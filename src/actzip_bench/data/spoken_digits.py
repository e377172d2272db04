"""Spoken digits synthesized with espeak-ng, paired with a handwritten digit and a noisy sensor: no download.

Each sample is one digit 0-9 (its label) seen through three streams, in the order of :data:`MODALITIES`:

- ``image``: ``[n, 1, 8, 8]``, an image of that digit drawn from scikit-learn's bundled digits (pixels in
  [0, 1] plus ``pixel_noise``); images are drawn with replacement, so one image may serve several samples;
- ``audio``: ``[n, n_mels, frames]`` log-mel energies of the digit's English name ("zero".."nine") spoken by
  espeak-ng, delayed by up to ``shift_ms`` and buried in white noise at ``snr_db``;
- ``sensor``: ``[n, sensor_dim]``, a per-class code plus noise with a ``corrupt`` share of pure-noise samples
  (as in :mod:`actzip_bench.data.digits_views`).

Why the modalities disagree: the audio is the largest stream (``n_mels * frames`` values, 1,536 by default)
yet, buried in noise and shifted in time, it tells a simple classifier less than the 64-pixel image does; the
sensor is the smallest (8 values) and does well where it works, but fails on a share of samples. So the bytes
a client sends per modality and what each modality is worth to the server pull in different directions, and
``snr_db`` and ``corrupt`` move the audio's and the sensor's worth without changing their size.

The speech: for every digit, ``variants`` recordings are made, each with a voice, speed and pitch drawn by
``seed``; a sample picks one of its digit's recordings, then gets its own delay and noise. espeak-ng runs once
per distinct (word, voice, speed, pitch) in a process, and, with ``cache_dir``, once per machine. Its output
can change between espeak-ng versions, so data is bit-identical across machines only with the same version
(or the same ``cache_dir`` contents); within one machine the same config gives bit-identical tensors.
"""

from __future__ import annotations

import functools
import io
import math
import os
import pathlib
import shutil
import subprocess
import wave
from dataclasses import dataclass

import numpy as np
import torch

from actzip.errors import ConfigError, DataError, MissingDependencyError
from actzip_bench.data.digits_views import CLASSES, digit_images, noisy_sensor

__all__ = ["MODALITIES", "VOICES", "WORDS", "SpokenDigitsConfig", "log_mel", "make_spoken_digits", "speak"]

MODALITIES = ("image", "audio", "sensor")
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")  # label i says WORDS[i]
# English accents and voice variants that sound distinct in espeak-ng 1.51 (some "+variant" suffixes are
# silently ignored on some accents, so each of these was checked to give its own waveform)
VOICES = ("en-us", "en-gb", "en-gb-scotland", "en-029", "en-gb-x-gbclan", "en-us+f2", "en-us+m3", "en-us+klatt2")
WINDOW_MS = 25.0  # the STFT window; the hop is a config field
MEL_FMAX = 8000.0  # the bands' top (espeak-ng speaks at 22.05 kHz; speech above 8 kHz adds little)
SILENCE = 0.02  # a recording's leading and trailing samples below this share of its peak are cut
CHUNK = 256  # samples turned into features at once, to bound memory


@dataclass
class SpokenDigitsConfig:
    """How many samples, how the digits are spoken, and how noisy each stream is."""

    n: int = 2000  # samples
    variants: int = 6  # recordings per digit, each with its own voice, speed and pitch
    voices: tuple[str, ...] = VOICES  # espeak-ng voices the recordings draw from (``espeak-ng --voices=en``)
    speed: tuple[int, int] = (130, 210)  # words per minute, drawn uniformly from this inclusive range
    pitch: tuple[int, int] = (20, 80)  # espeak-ng's pitch (0..99), drawn uniformly from this inclusive range
    snr_db: float = 0.0  # signal-to-noise ratio of the white noise added to every sample, in dB
    shift_ms: float = 250.0  # each sample's word starts after a delay drawn uniformly from [0, shift_ms]
    n_mels: int = 32  # mel bands of the audio stream
    frames: int = 48  # audio frames kept (the clip is zero-padded or cut to fit before the noise)
    hop_ms: float = 20.0  # time between audio frames
    pixel_noise: float = 0.1  # std of Gaussian noise on the image (pixels are in [0, 1])
    sensor_dim: int = 8  # features of the sensor stream
    sensor_noise: float = 1.0  # std of the noise on the sensor's unit-variance class code
    corrupt: float = 0.2  # share of samples whose sensor stream is pure noise
    cache_dir: str | pathlib.Path | None = None  # keep espeak-ng's recordings here as WAV files; None: memory only
    seed: int = 0  # the recordings' voices, the labels, the pairing and every noise draw

    def __post_init__(self) -> None:
        for name, minimum in (("n", 1), ("variants", 1), ("n_mels", 1), ("frames", 1), ("sensor_dim", 1),
                              ("seed", 0)):
            value = getattr(self, name)
            if not _is_int(value) or value < minimum:
                raise ConfigError(f"spoken_digits: {name} must be an int >= {minimum}, got {value!r}")
        if not self.voices or isinstance(self.voices, str) or not all(isinstance(v, str) and v for v in self.voices):
            raise ConfigError(f"spoken_digits: voices must be a non-empty tuple of voice names, got {self.voices!r}")
        self.voices = tuple(self.voices)
        for name, low, high in (("speed", 80, 450), ("pitch", 0, 99)):  # espeak-ng's own limits
            value = getattr(self, name)
            if (not isinstance(value, (tuple, list)) or len(value) != 2 or not all(_is_int(v) for v in value)
                    or not low <= value[0] <= value[1] <= high):
                raise ConfigError(f"spoken_digits: {name} must be a (low, high) pair of ints with "
                                  f"{low} <= low <= high <= {high}, got {value!r}")
            setattr(self, name, tuple(value))
        if not _is_real(self.snr_db) or not math.isfinite(self.snr_db):
            raise ConfigError(f"spoken_digits: snr_db must be a finite number of dB, got {self.snr_db!r}")
        if not _is_real(self.hop_ms) or not 1.0 <= self.hop_ms < 1e4:
            raise ConfigError(f"spoken_digits: hop_ms must be a number of ms in [1, 10000), got {self.hop_ms!r}")
        if not _is_real(self.shift_ms) or not 0.0 <= self.shift_ms < self.duration_ms():
            raise ConfigError(f"spoken_digits: shift_ms must be in [0, {self.duration_ms():g}) (the audio kept, "
                              f"from frames and hop_ms), got {self.shift_ms!r}")
        for name in ("pixel_noise", "sensor_noise"):
            if not _is_real(getattr(self, name)) or not 0.0 <= getattr(self, name) < math.inf:
                raise ConfigError(f"spoken_digits: {name} is a noise std, a finite number >= 0, "
                                  f"got {getattr(self, name)!r}")
        if not _is_real(self.corrupt) or not 0.0 <= self.corrupt <= 1.0:
            raise ConfigError(f"spoken_digits: corrupt is a share of samples in [0, 1], got {self.corrupt!r}")

    def duration_ms(self) -> float:
        """The audio each sample keeps: ``frames`` windows ``hop_ms`` apart."""
        return (self.frames - 1) * self.hop_ms + WINDOW_MS

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Each stream's shape, in the order of :data:`MODALITIES`."""
        return {"image": (self.n, 1, 8, 8), "audio": (self.n, self.n_mels, self.frames),
                "sensor": (self.n, self.sensor_dim)}


def make_spoken_digits(cfg: SpokenDigitsConfig) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """``(streams, labels)``: float32 streams shaped as :meth:`SpokenDigitsConfig.shapes`, int64 labels ``[n]``.

    Raises :class:`MissingDependencyError` when ``espeak-ng`` is not on ``PATH``, and :class:`ConfigError` when
    it refuses one of ``cfg.voices``.
    """
    exe = _espeak()
    g = torch.Generator().manual_seed(cfg.seed)
    # the recordings are drawn first, so that n changes the samples but not the voices they hear
    recordings = [[_recording(cfg, g, word) for _ in range(cfg.variants)] for word in WORDS]
    clips = [[_clip(exe, word, voice, speed, pitch, _cache_key(cfg.cache_dir)) for voice, speed, pitch in row]
             for word, row in zip(WORDS, recordings)]
    rate = clips[0][0][0]
    if any(r != rate for row in clips for r, _ in row):
        raise DataError(f"spoken_digits: espeak-ng spoke at several sample rates; expected {rate} Hz throughout")
    waves = [[torch.from_numpy(pcm.copy()) for _, pcm in row] for row in clips]  # the cached arrays are read-only

    y = torch.randint(0, CLASSES, (cfg.n,), generator=g)
    images, image_labels = digit_images()
    by_class = [torch.nonzero(image_labels == c).flatten() for c in range(CLASSES)]
    counts = torch.tensor([len(ix) for ix in by_class])
    pick = (torch.rand(cfg.n, generator=g) * counts[y]).long()  # uniform among the images of the sample's digit
    image = torch.stack([images[by_class[int(c)][int(i)]] for c, i in zip(y, pick)])[:, None]
    image = image + torch.randn(image.shape, generator=g) * cfg.pixel_noise

    win = round(WINDOW_MS * rate / 1000)
    hop = max(1, round(cfg.hop_ms * rate / 1000))
    length = (cfg.frames - 1) * hop + win  # exactly `frames` windows without centring
    variant = torch.randint(0, cfg.variants, (cfg.n,), generator=g)
    delay = (torch.rand(cfg.n, generator=g) * (cfg.shift_ms * rate / 1000 + 1)).long().clamp(max=length - 1)
    noise_std = 10.0 ** (-cfg.snr_db / 20.0)  # every recording is scaled to unit RMS, so this is the SNR
    audio = torch.empty(cfg.n, cfg.n_mels, cfg.frames)
    for start in range(0, cfg.n, CHUNK):
        stop = min(start + CHUNK, cfg.n)
        batch = torch.randn(stop - start, length, generator=g) * noise_std
        for row, i in enumerate(range(start, stop)):
            clip = waves[int(y[i])][int(variant[i])]
            at = int(delay[i])
            kept = min(len(clip), length - at)  # a word running past the window is cut
            batch[row, at:at + kept] += clip[:kept]
        audio[start:stop] = log_mel(batch, rate, cfg.n_mels, hop, win)

    sensor = noisy_sensor(y, cfg.sensor_dim, cfg.sensor_noise, cfg.corrupt, g)
    return {"image": image, "audio": audio, "sensor": sensor}, y


def speak(word: str, voice: str = "en-us", speed: int = 175, pitch: int = 50,
          cache_dir: str | pathlib.Path | None = None) -> tuple[int, np.ndarray]:
    """``(rate, samples)``: ``word`` spoken by espeak-ng, float32 mono, silence cut, scaled to unit RMS.

    The result is cached per process (and in ``cache_dir`` when given) and read-only; copy it to change it.
    """
    return _clip(_espeak(), word, voice, int(speed), int(pitch), _cache_key(cache_dir))


def log_mel(x: torch.Tensor, rate: int, n_mels: int, hop: int, win: int) -> torch.Tensor:
    """Log-mel energies ``[batch, n_mels, frames]`` of float waveforms ``[batch, samples]``.

    Hann windows of ``win`` samples every ``hop`` samples, no centring (so frames = 1 + (samples - win) // hop),
    each zero-padded to a power of two so that the low mel bands, which are narrow, still catch a frequency bin;
    ``n_mels`` triangular bands evenly spaced on the HTK mel scale (``2595 * log10(1 + f / 700)``) from 0 Hz to
    8 kHz (or to ``rate / 2`` when that is lower); the log's floor is 1e-6.
    """
    n_fft = 1 << (win - 1).bit_length()
    # torch.stft puts a short window in the middle of each n_fft frame; padding by the difference lines the
    # windows up with samples [t * hop, t * hop + win) of x
    extra = n_fft - win
    x = torch.nn.functional.pad(x, (extra // 2, extra - extra // 2))
    spec = torch.stft(x, n_fft=n_fft, hop_length=hop, win_length=win, window=torch.hann_window(win),
                      center=False, return_complex=True)
    power = spec.real ** 2 + spec.imag ** 2
    bands = _mel_filters(n_mels, n_fft // 2 + 1, rate) @ power
    return torch.log(bands + 1e-6)  # the floor sits well below any noise the samples carry


@functools.lru_cache(maxsize=16)
def _mel_filters(n_mels: int, n_freqs: int, rate: int) -> torch.Tensor:
    """``[n_mels, n_freqs]`` triangular bands evenly spaced on the mel scale from 0 Hz to ``MEL_FMAX``."""
    top = min(MEL_FMAX, rate / 2)
    mel_top = 2595.0 * math.log10(1.0 + top / 700.0)
    edges = 700.0 * (10.0 ** (torch.linspace(0.0, mel_top, n_mels + 2, dtype=torch.float64) / 2595.0) - 1.0)
    freqs = torch.linspace(0.0, rate / 2, n_freqs, dtype=torch.float64)
    low, mid, high = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (freqs - low) / (mid - low)
    falling = (high - freqs) / (high - mid)
    return torch.minimum(rising, falling).clamp(min=0.0).float()


def _recording(cfg: SpokenDigitsConfig, g: torch.Generator, word: str) -> tuple[str, int, int]:
    """One (voice, speed, pitch) drawn for ``word`` (the word itself only names the row)."""
    voice = cfg.voices[int(torch.randint(0, len(cfg.voices), (1,), generator=g))]
    speed = int(torch.randint(cfg.speed[0], cfg.speed[1] + 1, (1,), generator=g))
    pitch = int(torch.randint(cfg.pitch[0], cfg.pitch[1] + 1, (1,), generator=g))
    return voice, speed, pitch


def _espeak() -> str:
    """The espeak-ng executable's path."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise MissingDependencyError("spoken_digits: espeak-ng is not on PATH; install the Debian package "
                                     "espeak-ng (apt-get install espeak-ng)")
    return exe


def _cache_key(cache_dir) -> str | None:
    return None if cache_dir is None else os.fspath(pathlib.Path(cache_dir).expanduser().resolve())


@functools.lru_cache(maxsize=None)
def _clip(exe: str, word: str, voice: str, speed: int, pitch: int, cache_dir: str | None) -> tuple[int, np.ndarray]:
    """One recording, trimmed and scaled (cached: synthesis is the slow step, and recordings repeat)."""
    name = f"{word}_{voice.replace(os.sep, '-')}_s{speed}_p{pitch}.wav"  # a voice may be given as a file path
    path = None if cache_dir is None else pathlib.Path(cache_dir) / name
    if path is not None and path.is_file():
        rate, pcm = _read_wav(path.read_bytes(), str(path))
    else:
        rate, pcm = _read_wav(_synthesize(exe, word, voice, speed, pitch), f"espeak-ng's output for {word!r}")
        if path is not None:
            _write_wav(path, rate, pcm)
    x = pcm.astype(np.float32) / 32768.0
    loud = np.nonzero(np.abs(x) >= SILENCE * np.abs(x).max())[0] if x.size and x.any() else []
    if len(loud) == 0:
        raise DataError(f"spoken_digits: espeak-ng produced silence for {word!r} (voice {voice!r})")
    x = x[loud[0]:loud[-1] + 1]
    x = x / np.sqrt(np.mean(x.astype(np.float64) ** 2))  # unit RMS, so snr_db sets the noise alone
    x = x.astype(np.float32)
    x.setflags(write=False)  # shared by every caller through the cache
    return rate, x


def _synthesize(exe: str, word: str, voice: str, speed: int, pitch: int) -> bytes:
    """espeak-ng's WAV bytes for ``word``."""
    done = subprocess.run([exe, "-v", voice, "-s", str(speed), "-p", str(pitch), "--stdout", word],
                          capture_output=True, timeout=60, check=False)
    if done.returncode != 0 or not done.stdout:
        reason = done.stderr.decode(errors="replace").strip() or f"exit status {done.returncode}"
        raise ConfigError(f"spoken_digits: espeak-ng cannot speak with voice {voice!r} "
                          f"(speed {speed}, pitch {pitch}): {reason}")
    return done.stdout


def _read_wav(data: bytes, what: str) -> tuple[int, np.ndarray]:
    """``(rate, int16 mono samples)`` of 16-bit PCM WAV bytes."""
    try:
        with wave.open(io.BytesIO(data)) as w:
            if w.getsampwidth() != 2:
                raise DataError(f"spoken_digits: {what} is not 16-bit PCM (sample width {w.getsampwidth()})")
            channels, rate = w.getnchannels(), w.getframerate()
            # espeak-ng writes to a pipe and cannot know the length up front, so its header claims a huge
            # frame count; readframes stops at the end of the data anyway
            raw = w.readframes(w.getnframes())
    except (wave.Error, EOFError) as e:
        raise DataError(f"spoken_digits: {what} is not a readable WAV: {e}") from e
    pcm = np.frombuffer(raw[:len(raw) // (2 * channels) * 2 * channels], dtype="<i2")
    return rate, pcm.reshape(-1, channels)[:, 0].copy()  # the first channel (espeak-ng speaks mono)


def _write_wav(path: pathlib.Path, rate: int, pcm: np.ndarray) -> None:
    """Keep a recording, written under a temporary name first so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.part")
    with wave.open(str(partial), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.astype("<i2").tobytes())
    os.replace(partial, path)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
