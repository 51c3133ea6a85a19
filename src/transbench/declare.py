"""Each setting declared once: a spec dataclass field made with `setting()` carries its default, help text, option
spelling (with the older spellings still read), and how --help shows a default that depends on the device.

Everything else is generated from these fields: the commands' options (cli/options.py `declared_command`), the spec
files' keys and their type checks (spec.py `coerce`), and the option reference in docs/options.md
(cli/reference.py). Adding a setting touches its field and the code that uses it, nothing else."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field


# The largest count each option takes: far above any useful value, and low enough that a slip (a warm-up of 1e9
# calls, a batcher of 1e8 requests) is refused before it runs for days or allocates for ever. Stated in --help
# (help_text) and checked where every spec is read (spec.coerce).
LIMITS = {"--batch": 1_048_576, "--seq": 1_048_576, "--warmup": 100_000, "--min-count": 1_000_000,
          "--new-tokens": 1_000_000, "--nproc": 1024, "--max-batch-size": 65_536,
          "--concurrency": 1_000_000,  # serve's MAX_REQUESTS: requests queued at once
          "--steps": 10_000_000,
          "--grad-accum": 1024,  # micro-batches a step: 1e11 ran until the cell's timeout
          "--pad-vocab": 65_536,  # a multiple past any vocabulary: 1e8 sized embeddings until the OS killed the worker
          "--tokens": 1_048_576,  # micro gemm's layer rows: 1e18 stored `error` cells (storage size overflowed), exit 0
          # The largest-batch search's cap (train's option, run's spec key): it doubles the batch up to this, and
          # `train --ladder --max-batch-limit 99999999999` probed batches past --batch's own limit (2^21, 2^22, ...)
          # until one ran out of memory, which on a CPU is the host's (runner/sweep.find_max_batch).
          "--max-batch-limit": 1_048_576,
          # hosts: the ranks take a world size of at most 2^20 (runner/rank.py), and
          # `train --nnodes 9223372036854775807` launched a cell every rank refused, stored as an `error`, exit 0
          "--nnodes": 1_048_576}
# The most cells one run's grid may have (the product of its axes' lengths): a spec file of 60,000 batches x 128 seqs
# (7.7 million cells, each axis within its limit) held 4.5 GB before a cell ran. At a second a cell this is a day.
MAX_CELLS = 100_000


@dataclass(frozen=True)
class Setting:
    help: str
    option: str = ""  # the option's spelling; "" = "--" + the field's name with dashes
    short: str = ""  # a one-letter spelling ("-m")
    aliases: tuple[str, ...] = ()  # older spellings still read: options ("--precision") and spec keys ("precisions")
    shown: str | None = None  # --help's default, where it depends on the device ("fp16 on GPU, fp32 on CPU")
    flag: str = ""  # a switch: "--offline" (on only) or "--embeddings/--encoders-only" (on and off)
    bare: str | None = None  # the value of the option given with none (`--grad-ckpt` alone is `--grad-ckpt on`)
    repeat: bool = False  # the option may be given several times, each a whole value (a point of the axis)
    whole: bool = False  # text kept in one piece, never split at commas (its values may hold commas)
    cli: bool = True  # False: a spec-file and Python key only
    axis: bool | None = None  # a list that is a sweep axis (None: every list but a repeated option's)
    read: typing.Callable | None = None  # reads the option's text where the type's own reading is not enough
    choices: tuple[str, ...] = ()  # the values allowed, named first in --help ("fp32|fp16|bf16: ...")


def setting(default=None, help: str = "", **kw):
    """A dataclass field declaring one setting (see Setting); a list default is copied for each instance."""
    meta = {"setting": Setting(help, **kw)}
    if isinstance(default, list):
        return field(default_factory=lambda d=tuple(default): list(d), metadata=meta)
    return field(default=default, metadata=meta)


def declared(cls) -> list[tuple[dataclasses.Field, Setting]]:
    """The fields of `cls` that declare a setting, in declaration order (base classes first)."""
    return [(f, f.metadata["setting"]) for f in dataclasses.fields(cls) if "setting" in f.metadata]


def option_of(f: dataclasses.Field, s: Setting) -> str:
    return s.option or "--" + f.name.replace("_", "-")


def default_of(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def words(value) -> str:
    """A value in the options' own words: on/off for switches, comma lists, `none`, numbers as typed."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)):
        return ",".join(words(v) for v in value)
    if value is None:
        return "none"
    return f"{value:g}" if isinstance(value, float) else str(value)


def help_text(f: dataclasses.Field, s: Setting, is_list: bool, item_kind: type = str) -> str:
    """--help's text: the choices, the help, and for a list that it is a sweep axis."""
    text = f"{'|'.join(s.choices)}{': ' if s.help else ''}{s.help}" if s.choices else s.help
    limit = LIMITS.get(option_of(f, s))
    if limit is not None and item_kind is int:  # counts; a seconds option of the same spelling is not one
        text = f"{text} (at most {limit:,})"
    if is_axis(s, is_list):
        return f"{text} (comma-separated; a sweep axis)"
    return f"{text} (comma-separated)" if is_list and not s.repeat else text


def is_axis(s: Setting, is_list: bool) -> bool:
    """Whether a setting is a sweep axis: each of its values a point of the grid."""
    return s.axis if s.axis is not None else is_list and not s.repeat


def shown_default(f: dataclasses.Field, s: Setting) -> str:
    return s.shown if s.shown is not None else words(default_of(f))


def old_keys(cls) -> dict[str, str]:
    """Older spec-file keys -> the field they now name (`precisions: [bf16]` in a file written earlier)."""
    return {a: f.name for f, s in declared(cls) for a in s.aliases if not a.startswith("-")}


def old_options(cls) -> dict[str, str]:
    """Older option spellings -> today's (`--precision` -> `--dtype`)."""
    return {a: option_of(f, s) for f, s in declared(cls) for a in s.aliases if a.startswith("-")}


def whole_fields(cls) -> frozenset[str]:
    return frozenset(f.name for f, s in declared(cls) if s.whole)


def item_type(cls, name: str) -> tuple[type, bool]:
    """(scalar type, is a list) of a field, from its annotation (`list[int] | None` -> (int, True))."""
    tp = typing.get_type_hints(cls)[name]
    if typing.get_origin(tp) is typing.Union or type(tp).__name__ == "UnionType":
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    if typing.get_origin(tp) is list:
        return typing.get_args(tp)[0], True
    return tp, False


@dataclass
class CommandOptions:
    """Options of the commands themselves, not of what they measure (they are not stored with a run's spec)."""

    spec: str | None = setting(None, "YAML/TOML/JSON sweep file; options given here override it")
    db: str = setting("transbench.db", "SQLite store")
    json_path: str | None = setting(None, "also write the records as JSON", option="--json")
    csv_path: str | None = setting(None, "also write the records as CSV", option="--csv")
    resume: bool = setting(False, "skip finished cells of the named (or newest) run", flag="--resume")
    wide: bool = setting(False, "print every table column that holds a figure (p99, tokens/s, memory, ...)",
                         flag="--wide")
