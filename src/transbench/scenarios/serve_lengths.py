"""How long requests are: fixed, normal or lognormal with a mean and a max, a file of token counts, or a
text file tokenized with the model's tokenizer (one request per line). Parsed once in the parent process
into a `Lengths` (a draw rule, or the list of counts), which cells carry and workers draw from."""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecError

FORMS = "fixed:N, normal:MEAN:MAX[:STDEV], lognormal:MEAN:MAX[:SIGMA], counts:FILE or text:FILE"
LOGNORMAL_SIGMA = 0.5  # a spread typical of chat/query lengths; MEAN and MAX are what users quote
NORMAL_STDEV_SHARE = 0.25
# A spread this large already clips nearly every draw to 1 or MAX (a lognormal's median is MEAN e^(-SIGMA^2/2)); far
# larger finite ones overflow the draw itself (lognormal past ~1e154, normal near 1e308): an error cell, not a refusal.
MAX_SPREAD = 1e6


@dataclass(frozen=True)
class Lengths:
    kind: str  # fixed | normal | lognormal | counts
    mean: float = 0.0
    max: int = 0
    spread: float = 0.0  # stdev (normal) or sigma of the log (lognormal)
    counts: tuple[int, ...] = ()  # counts / text: every request's token count, in file order
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
            raw = (rng.choice(self.counts) for _ in range(n))
        return [min(self.max, max(1, round(x))) for x in raw]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "mean": self.mean, "max": self.max, "spread": self.spread,
                "counts": list(self.counts), "source": self.source}

    @classmethod
    def from_dict(cls, d: dict) -> Lengths:
        return cls(d["kind"], d["mean"], d["max"], d["spread"], tuple(d["counts"]), d["source"])


def _number(text: str, what: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SpecError(f"--lengths {spec}: {what} '{text}' is not a number; use {FORMS}") from None
    if not math.isfinite(value):  # inf (1e400 reads as inf) can be neither rounded to a length nor drawn from
        raise SpecError(f"--lengths {spec}: {what} '{text}' is not a finite number; use {FORMS}")
    if not value > 0:
        raise SpecError(f"--lengths {spec}: {what} must be positive")
    return value


def parse(spec: str, model_max: int, tokenizer_dir: str | None = None) -> Lengths:
    """`--lengths` as given; lengths above the model's positions are refused, not silently clipped."""
    kind, _, rest = spec.partition(":")
    parts = rest.split(":") if rest else []
    if kind == "fixed" and len(parts) == 1:
        n = int(_number(parts[0], "length", spec))
        out = Lengths("fixed", n, n)
    elif kind in ("normal", "lognormal") and len(parts) in (2, 3):
        mean, top = _number(parts[0], "mean", spec), int(_number(parts[1], "max", spec))
        if mean > top:
            raise SpecError(f"--lengths {spec}: the mean {mean:g} is above the max {top}")
        default = NORMAL_STDEV_SHARE * mean if kind == "normal" else LOGNORMAL_SIGMA
        spread = _number(parts[2], "spread", spec) if len(parts) == 3 else default
        if spread > MAX_SPREAD:
            raise SpecError(f"--lengths {spec}: spread {spread:g} is above {MAX_SPREAD:g}, where nearly every draw is "
                            "1 or the max: give a smaller one (defaults: stdev MEAN/4, sigma 0.5)")
        out = Lengths(kind, mean, top, spread)
    elif kind in ("counts", "text") and rest:
        out = _from_file(kind, rest, model_max, tokenizer_dir)
    else:
        raise SpecError(f"--lengths '{spec}' is not understood: use {FORMS}")
    if out.max > model_max:
        raise SpecError(f"--lengths {spec}: max {out.max} is above the model's {model_max} positions; "
                        f"lower it to {model_max} or less")
    return out


def _from_file(kind: str, name: str, model_max: int, tokenizer_dir: str | None) -> Lengths:
    path = Path(name).expanduser()
    if not path.is_file():
        raise SpecError(f"--lengths {kind}:{name}: no such file")
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise SpecError(f"--lengths {kind}:{name}: the file holds no requests (one per line)")
    if kind == "counts":
        try:
            counts = [int(line) for line in lines]
        except ValueError:
            raise SpecError(f"--lengths counts:{name}: every line must be a token count; for text use "
                            f"--lengths text:{name}") from None
        if min(counts) < 1:
            raise SpecError(f"--lengths counts:{name}: token counts must be at least 1")
    else:
        counts = [len(ids) for ids in _tokenizer(tokenizer_dir, name)(lines)["input_ids"]]
    top = max(counts)
    if top > model_max:
        raise SpecError(f"--lengths {kind}:{name}: a request of {top} tokens is above the model's "
                        f"{model_max} positions; shorten or drop it")
    digest = hashlib.sha256("\n".join(map(str, counts)).encode()).hexdigest()[:12]
    return Lengths(kind, sum(counts) / len(counts), top, 0.0, tuple(counts), f"{path.name}@{digest}")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model",
                   "tokenizer.model")


def _tokenizer(model_dir: str | None, name: str):
    """The model's own tokenizer: only a checkpoint folder has one (presets are random weights)."""
    if model_dir is None:
        raise SpecError(f"--lengths text:{name} needs the model's tokenizer: point --model at a checkpoint "
                        "folder with tokenizer files, or give token counts with --lengths counts:FILE")
    if not any((Path(model_dir) / f).is_file() for f in TOKENIZER_FILES):
        raise SpecError(f"--lengths text:{name}: folder {model_dir} has no tokenizer files "
                        f"({', '.join(TOKENIZER_FILES[:4])}, ...): add them, or use --lengths counts:FILE")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError) as exc:
        raise SpecError(f"--lengths text:{name}: the tokenizer in {model_dir} does not load "
                        f"({str(exc).splitlines()[0][:120]})") from None
