"""Typed run specs: defaults, validation with one-line messages, and YAML/TOML sweep files."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path

from .declare import LIMITS, MAX_CELLS, declared, is_axis, item_type, old_keys, option_of, whole_fields
from . import boundary
from .errors import SpecError


def check_keys(cls, data: dict, where: str = "") -> None:
    """Spec files and stored specs may only hold the dataclass's fields: a typo is an error, not ignored."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known, key=str)
    if unknown:
        shown = ", ".join(_shown(k) for k in unknown)
        raise SpecError(f"{where}unknown spec key(s) {shown}: known keys are {', '.join(sorted(known))}")


def _shown(key) -> str:
    """A key as the one-line message shows it: its control characters as escapes (a key "\n" broke the line)."""
    return escaped(key)


# --- One typed reading of every spec: RunSpec, TrainSpec and the micro options all go through coerce() ---

_EXPECTED = {int: "a whole number", float: "a number", bool: "true or false", str: "text"}
_PLURAL = {int: "whole numbers", float: "numbers", bool: "true/false values", str: "text values"}
_EXAMPLE = {int: "8", float: "0.5", bool: "true"}


def _field_type(tp) -> tuple[type, bool, bool]:
    """(scalar kind, is a list, may be None) of an annotation such as `list[int] | None`."""
    args = typing.get_args(tp)
    optional = False
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        optional = type(None) in args
        tp = next(a for a in args if a is not type(None))
    if typing.get_origin(tp) is list:
        return typing.get_args(tp)[0], True, optional
    return tp, False, optional


class _WrongType(Exception):
    pass


# The largest integer torch's sizes and seeds and SQLite's INTEGER hold: a larger one stored an OverflowError
# as an `error` cell (`--batch 99999999999999999999999`, `--seed` the same) instead of being refused.
INT_MAX = boundary.INT_MAX


def check_int(value: int, what: str) -> int:
    if abs(value) > INT_MAX:
        raise SpecError(f"{what}{value} is larger than a 64-bit integer holds ({INT_MAX:,})")
    return value


def read_number(text: str, kind: type):
    """`kind(text)` (int or float) with ASCII digits only, as the command line's typed options read numbers (typer):
    Python's int() and float() also take another script's digits, so `--batch ٣` ran batch 3 where `--min-count ٣`
    was refused; and digits grouped by `_` (`--batch 1_000` ran batch 1000 where `1,000` is two values and
    `1e3` is refused). ValueError otherwise."""
    if not text.isascii() or "_" in text:
        raise ValueError(f"not an ASCII number: {text!r}")
    return kind(text)


def _scalar(value, kind: type, text_ok: bool):
    """`value` as `kind`, or _WrongType. Text is read as the command line reads it only inside lists
    (`batches: "1,8"` is the CLI's own spelling); a lone `timeout: "10"` is a quoted number, most likely a
    mistake, and is refused rather than guessed."""
    if isinstance(value, str) and text_ok and kind is not str:
        word = value.strip().lower()
        if kind is bool and word in ("on", "true", "yes", "1", "off", "false", "no", "0"):
            return word in ("on", "true", "yes", "1")
        if kind is not bool:
            try:
                number = read_number(word, kind)
                if boundary.is_number(number):
                    return number + 0 if kind is float else number  # -0 as 0: see the float case below
            except ValueError:
                pass
    elif kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        if not boundary.is_number(value):  # NaN passes every `< 0` check; inf never ends a deadline or a timer loop
            raise _WrongType
        # -0.0 + 0 is 0.0: a cell's key is its settings' JSON, where -0.0 is not 0.0, so `serve --name R
        # --max-wait-ms -0` over a run made with 0 measured its cell again and stored it twice (cells/serve cell.py)
        return float(value) + 0
    elif isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    raise _WrongType


def coerce(cls, data: dict, where: str = "", whole: frozenset[str] = frozenset(),
           labels: dict[str, str] | None = None) -> dict:
    """Check `data` against the dataclass `cls` field by field, from its type annotations: unknown keys and
    values of the wrong type are one-line SpecErrors naming the key and the type expected (`where` names
    the file). A list field also takes one value or comma-separated text, as on the command line; fields in
    `whole` keep a text value in one piece (their values may hold commas)."""
    if not isinstance(data, dict):  # RunSpec.from_dict(None) was a TypeError, and from_dict("seed") 4 unknown keys
        raise SpecError(f"{where}{cls.__name__} is built from a mapping of settings (key: value), not "
                        f"{type(data).__name__}: e.g. {cls.__name__}.from_dict({{'seed': 1}})")
    data = _today_keys(cls, data, where)
    whole = whole | whole_fields(cls)
    check_keys(cls, data, where)
    hints = typing.get_type_hints(cls)
    # Each count's limit comes from its option's spelling (declare.LIMITS), as --help states it: every command's
    # spec is read here, so `train --nproc 2000` or `micro gemm --warmup 200000` is refused like `run --batch`.
    limited = {f.name: option_of(f, s) for f, s in declared(cls) if option_of(f, s) in LIMITS}
    # A setting that declares its own reader (sizes: 2^20, 1KiB..1GiB) has a file's text read by it, as its option's
    # is (cli/options.read): one parser for both, so a file took exactly what the command line takes. `sizes: "2^6"`
    # was refused in a file where `--sizes 2^6` ran.
    readers = {f.name: s.read for f, s in declared(cls) if s.read is not None}
    out = {}
    for key, value in data.items():
        if key in readers:
            value = _read_text(readers[key], value, f"{where}{key}: ")
        kind, is_list, optional = _field_type(hints[key])
        expected = f"a list of {_PLURAL.get(kind, kind.__name__)}" if is_list else _EXPECTED.get(kind, kind.__name__)
        if value is None:
            if not optional:
                raise SpecError(f"{where}{key}: expected {expected}, got nothing: give a value or leave the key out")
            out[key] = None
            continue
        if not is_list:
            items = [value]
        elif isinstance(value, str):
            items = [value] if key in whole else _comma_items(value, f"{where}{key}: ")
        else:
            items = list(value) if isinstance(value, (list, tuple)) else [value]
        typed = []
        for item in items:
            try:
                typed.append(_scalar(item, kind, text_ok=is_list))
                if kind is str and not boundary.is_utf8(typed[-1]):
                    # A path typed in bytes that are not UTF-8 (--trace, a model folder) measured, and the run's spec
                    # stored it as a lone surrogate that `runs --spec`'s TOML could not read back, nor safetensors open.
                    named = labels[key] if labels and key in labels else f"{where}{key}:"
                    # Not only paths: `--rdzv-endpoint` of such bytes was told to rename a file.
                    raise SpecError(f"{named} {item!r} is not UTF-8 text (bytes the terminal could not decode): a run "
                                    "stores its settings as UTF-8; give it in UTF-8 (a file or folder: rename it, or "
                                    "link to it, with a UTF-8 name)")
                if kind is int:
                    check_int(typed[-1], f"{where}{key}: ")
                    if key in limited:
                        check_limit(limited[key], typed[-1])
            except _WrongType:
                if labels and key in labels and kind is float and _not_finite(item):
                    # the command line's own words: `--rate nan` names the option as the user typed it
                    raise SpecError(f"{labels[key]} {item}: give a finite number ({where}{key}: expected {expected}, "
                                    f"got {item!r})") from None
                # The value itself makes the best example where it can be one: quoted text for a text
                # field, the number without its quotes for `timeout: "10"`.
                example = json.dumps(str(item)) if kind is str else _EXAMPLE.get(kind, "...")
                if isinstance(item, str) and kind is not str:
                    try:
                        example = str(_scalar(item, kind, text_ok=True)).lower()
                    except _WrongType:
                        pass
                if labels and key in labels:  # given on the command line: named as typed (`--grad-ckpt maybe`)
                    raise SpecError(f"{labels[key]} {item!r}: expected {expected}, e.g. {labels[key]} {example}"
                                    ) from None
                raise SpecError(f"{where}{key}: expected {expected}, got {item!r}: write e.g. {key}: "
                                f"{f'[{example}]' if is_list else example}") from None
        out[key] = typed if is_list else typed[0]
    return out


def _read_text(read, value, what: str):
    """`value` with its text read by the setting's own reader: one text, or each text of a list (a list item may be a
    range, 1KiB..1MiB, that reads as several); numbers and anything else are left to coerce's typed checks. A
    refusal names the file and the key, as coerce's own do."""
    try:
        if isinstance(value, str):
            return read(value)
        if isinstance(value, (list, tuple)) and any(isinstance(v, str) for v in value):
            out = []
            for v in value:
                got = read(v) if isinstance(v, str) else v
                out.extend(got) if isinstance(got, list) else out.append(got)
            return out
    except SpecError as exc:
        raise SpecError(f"{what}{exc}") from None
    return value


def _not_finite(item) -> bool:
    try:
        return not math.isfinite(float(item))
    except (TypeError, ValueError):
        return False
    except OverflowError:  # an int past any float: not finite as a number of ours
        return True


def _today_keys(cls, data: dict, where: str) -> dict:
    """Older keys read as the settings they now name (declare.py aliases: `precisions` is `dtypes`)."""
    old = old_keys(cls)
    if not any(k in old for k in data):
        return data
    out = {}
    for key, value in data.items():
        new = old.get(key, key)
        if new in out:
            raise SpecError(f"{where}{key} and {new} name the same setting: keep {new}")
        out[new] = value
    return out


def _comma_items(text: str, what: str) -> list[str]:
    """'1,8,64' -> ['1', '8', '64']. An empty item between commas ('8,', '1,,8') is refused, not dropped: it is
    most often a value left out by mistake, and so are commas alone (','). Empty text is left to the axis's own check
    (scenarios/inference/cells.py)."""
    parts = [p.strip() for p in text.split(",")]
    if any(parts) and not all(parts):
        raise SpecError(f"{what}{text!r} has an empty item between commas: write e.g. {','.join(p for p in parts if p)}")
    if len(parts) > 1 and not any(parts):  # commas alone: `micro gemm --model ,` measured no model, as `--model ''`
        raise SpecError(f"{what}{text!r} has only empty items between commas: give a value, or leave the option out")
    return [p for p in parts if p]


def split_list(value, kind=str) -> list:
    """'1,8,64' or 8 or [1, 8] -> a list of `kind`; a clear error for anything else."""
    if isinstance(value, list):
        items = value
    else:
        items = _comma_items(str(value), "")
    try:
        out = [x if kind is str else read_number(x, kind) for x in items]
    except ValueError:
        raise SpecError(f"cannot read '{value}' as a list of {kind.__name__}s (use commas: 1,8,64)") from None
    return [check_int(x, "") for x in out] if kind is int else out


# C0 and C1 control characters (ESC, BEL, newline, ...) and DEL. Rich prints ESC as it is, so a stored name
# or an error message holding `\x1b[2J` would clear the terminal of whoever lists it. Also the bidirectional
# overrides and isolates (U+202A-202E, U+2066-2069) and marks (U+200E, U+200F): they reorder the text shown
# after them, so a name could display as another. And the line and paragraph separators (U+2028, U+2029), which
# str.splitlines, JavaScript and log viewers break lines at: a one-line error holding one read as two.
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def escaped(text, keep: str = "") -> str:
    """`text` with its CONTROL characters written as escapes (`\x1b`, `\u202e`), those in `keep` left as they are: how
    the terminal's tables, the one-line messages and the reports show a name."""
    text = str(text)
    return CONTROL.sub(lambda m: m.group() if m.group() in keep else repr(m.group())[1:-1], text) \
        if CONTROL.search(text) else text


def check_name(name: str) -> str:
    """Run names are refused when they hold control characters: printed raw, an escape sequence would
    clear or recolour the terminal of whoever lists the store (`transbench runs`), and a newline would
    break the one-row-per-run tables and reports. Markup characters such as `[/bold]` are fine: the CLI
    prints every user text literally."""
    bad = CONTROL.search(name)
    if bad:
        raise SpecError(f"run name {name!r} holds the control character {bad.group()!r}: "
                        "use letters, digits, spaces and punctuation")
    if not name.strip():
        raise SpecError("run name is empty: give --name a visible name, or leave it out for a generated one")
    if not boundary.is_utf8(name):  # bytes the terminal could not decode: lone surrogates, invisible to visible_text
        raise SpecError(f"run name {name!r} is not UTF-8 text (bytes the terminal could not decode): "
                        "use letters, digits, spaces and punctuation")
    if not boundary.visible_text(name):  # a zero-width space, a word joiner, a byte-order mark: a name no one sees
        raise SpecError(f"run name '{name.encode('unicode_escape').decode()}' holds only invisible characters: give "
                        "--name a visible name, or leave it out for a generated one")
    if name.strip() == "last":  # `runs`, `report` and `compare` read it as the latest run
        raise SpecError("run name 'last' stands for the latest run: choose another name")
    if len(name) > MAX_NAME:  # a name of 100,000 characters took a minute to lay out in each table it titles
        raise SpecError(f"run name is {len(name):,} characters, above the {MAX_NAME:,} a name may have: give a "
                        "shorter one")
    return name


MAX_NAME = 1_000


# Seconds a serve load runs or warms up for: a day, at most.
MAX_SECONDS = 86_400


def check_limit(option: str, value: int) -> None:
    """A count against its option's limit (declare.LIMITS)."""
    if value > LIMITS[option]:
        raise SpecError(f"{option} {value:,} is above its limit of {LIMITS[option]:,}: give a smaller value")


def check_once(values, option: str, same=None) -> None:
    """A value listed twice on one axis (`--batch 1,1`, micro's `--sizes 4096,2^12`) is refused: the grid keeps one
    cell of it (or measures the point again), so the run held fewer cells than asked, or lost the time. `same`: what
    makes two values the same point where their spellings differ (`--grad-ckpt on,true`)."""
    keys = [same(v) for v in values] if same else list(values)
    i = next((i for i, k in enumerate(keys) if k in keys[:i]), None)
    if i is not None:
        v = values[i]
        shown = ("on" if v else "off") if isinstance(v, bool) else f"{v:g}" if isinstance(v, float) else v
        raise SpecError(f"{option} lists {shown} twice: give each value once")


def checked(cls, spec, whole: frozenset[str] = frozenset()):
    """A spec built in Python (`api.run(RunSpec(batches="1,8"))`) read as a spec file is: every field through
    coerce(), and the run name through the CLI's check. A dataclass does not check its fields' types, so
    `batches=["8"]`, `min_time=float("nan")` or `name=5` reached the checks as they were and ended in a
    TypeError deep inside, a NaN run, or a store created before the failure."""
    if not isinstance(spec, cls):
        raise SpecError(f"expected a {cls.__name__}, got {type(spec).__name__}: build it as "
                        f"{cls.__name__}(...) or {cls.__name__}.from_dict(...)" if hasattr(cls, "from_dict") else
                        f"expected a {cls.__name__}, got {type(spec).__name__}")
    out = cls(**coerce(cls, {f.name: getattr(spec, f.name) for f in fields(cls)}, "", whole))
    if getattr(out, "name", None) is not None:
        check_name(out.name)  # control characters, an empty name, 'last': refused as on the CLI
    check_grid_size(cls, out)
    return out


def check_grid_size(cls, spec) -> None:
    """The grid's cells (the product of its axes' lengths, an upper bound where a scenario does not cross two of
    them) are at most declare.MAX_CELLS: each axis within its own limit, the product was not bounded."""
    sizes = [(option_of(f, s), len(v)) for f, s in declared(cls)
             if is_axis(s, item_type(cls, f.name)[1]) and isinstance(v := getattr(spec, f.name), list) and len(v) > 1]
    if math.prod(n for _, n in sizes) > MAX_CELLS:
        shown = " x ".join(f"{n:,} {option}" for option, n in sizes)
        raise SpecError(f"the grid has {math.prod(n for _, n in sizes):,} cells ({shown}), above the {MAX_CELLS:,} "
                        "one run takes: give fewer values, or split the grid into several runs")


# Shards of one grid: far more than any cluster's job array, and far below what stored a run of no cells for
# `--shard 1/100000000000000000000000`.
MAX_SHARDS = 1_000_000
# A shard's index or count, typed or set by a scheduler, has at most a 64-bit integer's digits: no cluster's array
# comes near that, and a longer one (a TRANSBENCH_SHARD_COUNT of 100,000 digits) was echoed whole by the refusals
# that name it, a line as long as the value.
SHARD_DIGITS = 19


def shard_number(text: str) -> int:
    """An index or count of a shard (`--shard I/N`, a scheduler's variable): ASCII digits, at most SHARD_DIGITS of
    them. ValueError otherwise."""
    text = text.strip()
    if len(text) > SHARD_DIGITS:
        raise ValueError(f"more than {SHARD_DIGITS} digits")
    return read_number(text, int)


def parse_shard(shard: str | None) -> tuple[int, int] | None:
    if shard is None:
        return None
    shown = boundary.one_line(shard, 40)
    try:
        i, n = (shard_number(x) for x in shard.split("/"))
    except ValueError:
        raise SpecError(f"bad --shard '{shown}': write I/N, two whole numbers of at most {SHARD_DIGITS} digits, "
                        "e.g. 1/4") from None
    return check_shard(i, n, f"--shard '{shown}'")


def check_shard(i: int, n: int, what: str) -> tuple[int, int]:
    if not (n >= 1 and 1 <= i <= n):
        raise SpecError(f"bad {what}: need 1 <= I <= N")
    if n > MAX_SHARDS:
        raise SpecError(f"bad {what}: {n:,} shards is above the limit of {MAX_SHARDS:,}")
    return i, n


def load_file(path: str, cls=None, whole: frozenset[str] = frozenset()) -> dict:
    """A YAML, TOML or JSON sweep file as a dict; with `cls`, checked against that dataclass (coerce).
    Every problem is one SpecError naming the file (and the line and column of a syntax error)."""
    if not str(path).strip():
        raise SpecError("--spec is empty: give a .yaml, .toml or .json file")
    p = Path(path)
    try:
        folder, present = p.is_dir(), p.exists()
    except OSError as exc:  # pathlib before Python 3.13 raises for a name too long (ENAMETOOLONG) or a folder
        # that cannot be searched (EACCES): `run --spec` of a 10,000-character name was a traceback
        raise SpecError(f"spec file {path} cannot be read ({exc.strerror}): check the path") from None
    if folder:
        raise SpecError(f"spec file {path} is a folder: give a .yaml, .toml or .json file")
    if not present:
        raise SpecError(f"spec file {path} {boundary.link_nowhere(p) or 'not found'}")
    if p.suffix not in (".yaml", ".yml", ".toml", ".json"):
        raise SpecError(f"spec file {path}: use .yaml, .yml, .toml or .json")
    text = boundary.read_text(p, f"spec file {path}", limit=boundary.SPEC_BYTES,
                              fix="a sweep file is a short list of options: check the path")
    try:
        data = _parse(path, p.suffix, text)
    except SpecError:
        raise
    except ValueError as exc:
        # A value the parser fails to build raises a plain ValueError, not the parser's own error (a traceback): an
        # integer of over 4,300 digits (int()'s limit, in each format), a YAML date such as 2024-13-01.
        raise SpecError(f"spec file {path}: a value there cannot be read ({str(exc).split(';')[0]}): fix it") from None
    if data is None or data == {}:  # most likely the wrong file: running the default grid instead would take minutes
        raise SpecError(f"spec file {path} holds no options: give at least one (e.g. models: [bert-base-uncased])")
    if not isinstance(data, dict):
        raise SpecError(f"spec file {path} must hold a mapping of options (key: value), "
                        f"not a {type(data).__name__}")
    if "schema_version" in data and data.get("kind") in ("record", "comparison"):
        # An export given for the spec it holds (run --json, runs --out, compare --json): its keys were listed as
        # unknown spec keys beside every known one, which did not say what the file is or where a spec comes from.
        # Each kind named with what writes it: a comparison was said to come from `--json, runs --out`.
        writer = "compare --json" if data["kind"] == "comparison" else "--json, runs --out"
        raise SpecError(f"spec file {path} is a {data['kind']} transbench exports ({writer}), not a spec: "
                        "`transbench runs --spec RUN --out spec.yaml` writes a stored run's spec")
    return coerce(cls, data, f"spec file {path}: ", whole) if cls is not None else data


def _unique_keys(path: str, keys) -> None:
    """A key given twice is refused (TOML's own rule): YAML and JSON keep the last one without a word."""
    seen = set()
    for key, where in keys:
        if key in seen:
            raise SpecError(f"spec file {path}: {key!r} is given twice{where}: keep one")  # repr: one line
        seen.add(key)


def _yaml_loader(path: str):
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                _unique_keys(path, [(k.value, f" (line {k.start_mark.line + 1})") for k, _ in node.value
                                    if isinstance(k, yaml.ScalarNode) and k.value != "<<"])
            return super().construct_mapping(node, deep)

    # Numbers as the command line reads them (YAML 1.2's decimal forms): PyYAML's YAML 1.1 read `min_time: 0_2` as
    # 2.0, `batches: [1:30]` as 90 (base 60), 0x10 as 16 and 010 as 8, where `--min-time 0_2` is refused. Any
    # other spelling stays text, which the setting's type check refuses in one line.
    Loader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in (_YAML_INT, _YAML_FLOAT)]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    Loader.add_implicit_resolver(_YAML_INT, re.compile(r"^[-+]?[0-9]+$"), list("-+0123456789"))
    Loader.add_implicit_resolver(_YAML_FLOAT, re.compile(
        r"^[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+(?=[eE]))(?:[eE][-+]?[0-9]+)?$"), list("-+.0123456789"))
    Loader.add_constructor(_YAML_INT, lambda loader, node: int(loader.construct_scalar(node)))
    Loader.add_constructor(_YAML_FLOAT, lambda loader, node: float(loader.construct_scalar(node)))
    return Loader


_YAML_INT, _YAML_FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"


def _parse(path: str, suffix: str, text: str):
    """Parse through the input boundary (bounded depth, node count and alias expansion; text keys only); a syntax
    error becomes 'line L, column C: what'."""
    where = f"spec file {path}"
    if suffix in (".yaml", ".yml"):
        return boundary.loads_yaml(text, where, loader=_yaml_loader(path))
    if suffix == ".toml":
        return boundary.loads_toml(text, where)

    def pairs(items):
        _unique_keys(path, [(k, "") for k, _ in items])
        return dict(items)

    return boundary.loads_json(text, where, pairs_hook=pairs, fix="fix it")


def dump_text(spec, suffix: str = ".yaml") -> str:
    """The spec (or a stored spec's dict, of any kind of run) as a file `load_file` reads back: TOML for a ".toml"
    suffix, JSON for ".json" (it got YAML, which `run --spec` then refused as invalid JSON), else YAML."""
    data = {k: v for k, v in (spec if isinstance(spec, dict) else spec.to_dict()).items() if v is not None}
    if suffix == ".toml":
        return _toml(data)
    if suffix == ".json":
        return json.dumps(data, indent=1) + "\n"
    import yaml

    return yaml.safe_dump(data, sort_keys=False)


def dump_file(spec, path: str) -> None:
    Path(path).write_text(dump_text(spec, Path(path).suffix))


def _toml(data: dict) -> str:
    """Flat TOML writer: specs are flat mappings of scalars and lists of scalars."""
    return "".join(f"{_toml_key(k)} = {_toml_value(v)}\n" for k, v in data.items())


def _toml_key(key) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", str(key)) else _toml_value(str(key))


def _toml_value(v) -> str:
    """A value in TOML's own spelling. json.dumps wrote a stored spec's NaN or infinity as NaN / Infinity, a character
    past U+FFFF (a model folder named with an emoji) as a surrogate pair of escapes, None in a list as null and a
    mapping as a JSON object: `runs --spec RUN --out s.toml` wrote a file its own `--spec` refused as invalid TOML."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else "inf" if v > 0 else "-inf"
    if v is None:  # a key of no value is left out (dump_text, and below); TOML has no null to hold its place
        raise SpecError("this spec holds null inside a list, which TOML cannot write: write it as .yaml or .json")
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items() if x is not None) + "}"
    if isinstance(v, str):  # control characters escaped (JSON's escapes are TOML's; DEL is not JSON's), the rest raw
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    return json.dumps(v)
