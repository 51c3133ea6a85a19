"""How long requests are: fixed, normal or lognormal with a mean and a max, a file of token counts, or a
text file tokenized with the model's tokenizer (one request per line). Parsed once in the parent process
into a `Lengths` (a draw rule, or a histogram of the file's counts), which cells carry and workers draw
from."""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from ...boundary import ascii_int, link_nowhere, user_path
from ...errors import SpecError
from ...spec import read_number
from .load import MAX_REQUESTS

FORMS = "fixed:N, normal:MEAN:MAX[:STDEV], lognormal:MEAN:MAX[:SIGMA], counts:FILE or text:FILE"
LOGNORMAL_SIGMA = 0.5  # a spread typical of chat/query lengths; MEAN and MAX are what users quote
NORMAL_STDEV_SHARE = 0.25
# A spread this large already clips nearly every draw to 1 or MAX (a lognormal's median is MEAN e^(-SIGMA^2/2)); far
# larger finite ones overflow the draw itself (lognormal past ~1e154, normal near 1e308): an error cell, not a refusal.
MAX_SPREAD = 1e6
# The largest number a counts or trace file may hold: past it a whole number is no longer exact as a float, and far
# past it (hundreds of digits) converting it to one (a mean, a time) overflows. No model has nearly this many positions.
MAX_FILE_NUMBER = 2**53


@dataclass(frozen=True)
class Lengths:
    kind: str  # fixed | normal | lognormal | counts
    mean: float = 0.0
    max: int = 0
    spread: float = 0.0  # stdev (normal) or sigma of the log (lognormal)
    # counts / text: the file's distinct token counts and how many requests have each. A histogram, not every
    # line: draws are with replacement, so it is the same distribution, and a cell carries (to its worker and into
    # the store) at most one entry per position: a 3,000,000-line file stored 11 MB in each cell.
    counts: tuple[int, ...] = ()
    weights: tuple[int, ...] = ()
    source: str = ""  # counts / text: the file's name and digest (the cell's key names the data it ran)

    @property
    def label(self) -> str:
        if self.kind == "fixed":
            return f"fixed:{self.max}"
        if self.kind in ("normal", "lognormal"):
            return f"{self.kind}:{self.mean:g}:{self.max}:{self.spread:g}"
        return f"{self.kind}:{self.source}"

    @property
    def shortest(self) -> int:
        """The shortest length a draw can give."""
        if self.kind == "fixed":
            return self.max
        return min(self.max, max(1, min(self.counts))) if self.counts else 1

    def draw(self, n: int, seed: int) -> list[int]:
        """n request lengths, each in [1, max], reproducible from the seed."""
        rng = random.Random(seed)
        if self.kind == "fixed":
            return [self.max] * n
        if self.kind == "normal":
            raw = (rng.gauss(self.mean, self.spread) for _ in range(n))
        elif self.kind == "lognormal":  # mu chosen so the mean of the (unclipped) distribution is `mean`
            mu = math.log(self.mean) - self.spread ** 2 / 2
            raw = (rng.lognormvariate(mu, self.spread) for _ in range(n))
        else:  # a file's requests, drawn with replacement so any duration has enough of them
            raw = rng.choices(self.counts, weights=self.weights, k=n)
        return [min(self.max, max(1, round(x))) for x in raw]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "mean": self.mean, "max": self.max, "spread": self.spread,
                "counts": list(self.counts), "weights": list(self.weights), "source": self.source}

    @classmethod
    def from_dict(cls, d: dict) -> Lengths:
        counts = tuple(d["counts"])  # a cell stored before the histogram listed every request: a weight of 1 each
        return cls(d["kind"], d["mean"], d["max"], d["spread"], counts, tuple(d.get("weights", (1,) * len(counts))),
                   d["source"])


def _number(text: str, what: str, spec: str) -> float:
    try:
        value = read_number(text, float)  # ASCII digits, as every option's numbers
    except ValueError:
        raise SpecError(f"--lengths {spec}: {what} '{text}' is not a number; use {FORMS}") from None
    if not math.isfinite(value):  # inf (1e400 reads as inf) can be neither rounded to a length nor drawn from
        raise SpecError(f"--lengths {spec}: {what} '{text}' is not a finite number; use {FORMS}")
    if not value > 0:
        raise SpecError(f"--lengths {spec}: {what} must be positive")
    return value


def _whole(text: str, what: str, spec: str) -> int:
    """A token count: `fixed:0.5` was truncated to requests of 0 tokens (an error cell), `fixed:1.5` to 1."""
    _number(text, what, spec)  # a finite number above 0
    # read exactly as written, not as its float: `fixed:99999999999999999999999` was refused as "max
    # 99999999999999991611392 is above the model's 128 positions", a number never given, and `fixed:8.99999999999999999`
    # (9.0 as a float) read as a whole 9
    value = Decimal(text.strip())
    if value != value.to_integral_value():
        raise SpecError(f"--lengths {spec}: {what} '{text}' is not a whole number of tokens")
    return int(value)


def parse(spec: str, model_max: int, tokenizer_dir: str | None = None, room: str | None = None) -> Lengths:
    """`--lengths` as given; lengths above `model_max` are refused, not silently clipped. `room` says what that
    limit is where it is not the model's positions (generation: what the new tokens leave of them)."""
    room = room or f"the model's {model_max} positions"
    kind, _, rest = spec.partition(":")
    parts = rest.split(":") if rest else []
    if kind == "fixed" and len(parts) == 1:
        n = _whole(parts[0], "length", spec)
        out = Lengths("fixed", n, n)
    elif kind in ("normal", "lognormal") and len(parts) in (2, 3):
        mean, top = _number(parts[0], "mean", spec), _whole(parts[1], "max", spec)
        if mean > top:
            raise SpecError(f"--lengths {spec}: the mean {mean:g} is above the max {top}")
        default = NORMAL_STDEV_SHARE * mean if kind == "normal" else LOGNORMAL_SIGMA
        spread = _number(parts[2], "spread", spec) if len(parts) == 3 else default
        if spread > MAX_SPREAD:
            raise SpecError(f"--lengths {spec}: spread {spread:g} is above {MAX_SPREAD:g}, where nearly every draw is "
                            "1 or the max: give a smaller one (defaults: stdev MEAN/4, sigma 0.5)")
        out = Lengths(kind, mean, top, spread)
    elif kind in ("counts", "text") and rest:
        out = _from_file(kind, rest, tokenizer_dir)
        if out.max > model_max:
            raise SpecError(f"--lengths {spec}: a request of {out.max} tokens is above {room}; shorten or drop it")
    else:
        raise SpecError(f"--lengths '{spec}' is not understood: use {FORMS}")
    if out.max > model_max:
        raise SpecError(f"--lengths {spec}: max {out.max} is above {room}; lower it to {model_max} or less")
    return out


# Read line by line into a histogram, so memory stays flat; this many bytes (tens of millions of requests) already
# pin the distribution, and reading takes seconds. Past it, a file pointed at by mistake (a disk image, a log) would
# be read for minutes: refused by its size, before a byte is read.
MAX_FILE_BYTES = 256 * 2**20


def _from_file(kind: str, name: str, tokenizer_dir: str | None) -> Lengths:
    label = f"--lengths {kind}:{name}"
    path = user_path(name, label)
    try:  # stat too: pathlib before Python 3.13 raises for a name too long (ENAMETOOLONG), a traceback
        if path.exists() and not path.is_dir() and not path.is_file():  # a FIFO blocks the read, a device never ends
            raise SpecError(f"{label}: is not a regular file (a pipe, a device or a socket); give a text file")
        if path.is_dir():
            raise SpecError(f"{label}: is a folder; give a file with one "
                            f"{'token count' if kind == 'counts' else 'request'} a line")
        if not path.is_file():
            raise SpecError(f"{label}: {link_nowhere(path) or 'no such file'}")  # a loop of links named as one
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise SpecError(f"{label}: {size / 2**20:,.0f} MiB is above the {MAX_FILE_BYTES // 2**20} MiB read for a "
                            "length file: give a sample of its lines (shuf -n 1000000)")
        with path.open("rb") as f:
            if b"\0" in f.read(8192):
                raise SpecError(f"{label}: is a binary file; give a text file, one request a line")
        # utf-8-sig: a file saved by Notepad or Excel starts with a byte-order mark, which int() refused
        with path.open(encoding="utf-8-sig", errors="replace") as f:
            if kind == "counts":
                counts, digest = _histogram(_parse_counts(f, label, name))
            else:
                counts, digest = _histogram(_token_counts(f, label, tokenizer_dir, name))
    except OSError as exc:  # unreadable (permissions, a device): bad input, not a traceback
        raise SpecError(f"{label}: cannot be read ({exc.strerror or exc})") from None
    if not counts:
        raise SpecError(f"{label}: the file holds no requests (one per line)")
    values = tuple(sorted(counts))
    weights = tuple(counts[v] for v in values)
    mean = sum(v * w for v, w in zip(values, weights)) / sum(weights)
    return Lengths(kind, mean, values[-1], 0.0, values, weights, f"{path.name}@{digest}")


def _parse_counts(lines, label: str, name: str):
    for i, line in enumerate(lines, 1):
        text = line.strip()
        if not text:
            continue
        try:
            n = ascii_int(text)  # int('٣') is 3: counts are ASCII digits, as every number transbench reads
        except ValueError:
            raise SpecError(f"{label} line {i}: every line must be a token count; for text use --lengths "
                            f"text:{name}") from None
        if n < 1:
            raise SpecError(f"{label} line {i}: token counts must be at least 1")
        if n > MAX_FILE_NUMBER:
            raise SpecError(f"{label} line {i}: a count of {len(text)} digits is past {MAX_FILE_NUMBER:,}, the "
                            "largest a counts file may hold")
        yield n


# A text file is tokenized TEXT_CHUNK lines at a time, keeping only each line's count: tokenized whole, 2 million
# short lines (39 MB) held 5.8 GB and took 2.5 minutes; a file near MAX_FILE_BYTES would have held tens of GB.
# Requests are capped as a trace's are (MAX_REQUESTS: each is tokenized, not counted), and so is a line: tokenizing
# one line of 20 MB held 3.4 GB, and a line of over TEXT_LINE_CHARS characters is longer than any model's positions
# at a few characters a token.
TEXT_CHUNK = 1000
TEXT_LINE_CHARS = 2**20


def _token_counts(f, label: str, tokenizer_dir: str | None, name: str):
    """Each non-blank line's token count, in file order. Lines as str.splitlines splits them (form feeds, U+2028
    too), as the whole text was split before: a counts' digest names the cell. The file is read through once first,
    so a file past the caps is refused in seconds, before any line is tokenized."""
    lines = 0
    for i, physical in enumerate(f, 1):
        if len(physical) > TEXT_LINE_CHARS:
            raise SpecError(f"{label} line {i}: {len(physical):,} characters, above the {TEXT_LINE_CHARS:,} a request "
                            "may hold (more tokens than any model's positions): shorten or drop it")
        lines += sum(1 for line in physical.splitlines() if line.strip())
        if lines > MAX_REQUESTS:
            raise SpecError(f"{label}: more than {MAX_REQUESTS:,} requests; give a sample of its lines "
                            f"(shuf -n {MAX_REQUESTS})")
    if not lines:
        return
    tokenize = _tokenizer(tokenizer_dir, name)
    f.seek(0)
    chunk = []
    for physical in f:
        chunk += [line for line in physical.splitlines() if line.strip()]
        if len(chunk) >= TEXT_CHUNK:
            yield from (len(ids) for ids in tokenize(chunk)["input_ids"])
            chunk = []
    if chunk:
        yield from (len(ids) for ids in tokenize(chunk)["input_ids"])


def _histogram(counts) -> tuple[Counter, str]:
    """How many requests have each token count, and the digest of the counts in file order (the cell's key)."""
    out, digest = Counter(), hashlib.sha256()
    for i, n in enumerate(counts):
        out[n] += 1
        digest.update(f"{chr(10) if i else ''}{n}".encode())
    return out, digest.hexdigest()[:12]


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model",
                   "tokenizer.model")


def _tokenizer(model_dir: str | None, name: str):
    """The model's own tokenizer: only a checkpoint folder has one (presets are random weights)."""
    if model_dir is None:
        # --url refuses --model: its tokenizer is --tokenizer's (or --reference-model's)
        raise SpecError(f"--lengths text:{name} needs the model's tokenizer: point --model at a checkpoint "
                        "folder with tokenizer files (with --url: give --tokenizer FOLDER), or give token counts with "
                        "--lengths counts:FILE")
    if not any((Path(model_dir) / f).is_file() for f in TOKENIZER_FILES):
        raise SpecError(f"--lengths text:{name}: folder {model_dir} has no tokenizer files "
                        f"({', '.join(TOKENIZER_FILES[:4])}, ...): add them, or use --lengths counts:FILE")
    from transformers import AutoTokenizer

    from ...models.build import read_tokenizer_json

    read_tokenizer_json(Path(model_dir) / "tokenizer.json")  # through the input boundary first: bounded, its fields
    try:
        return AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - a broken file: transformers and tokenizers raise many kinds
        raise SpecError(f"--lengths text:{name}: the tokenizer in {model_dir} does not load "
                        f"({str(exc).splitlines()[0][:120]})") from None
