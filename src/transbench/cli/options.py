"""What every command shares about its options: one spelling per concept (old spellings still read, with a
notice), on/off axes that accept what users type, help without bare type placeholders, and specs built the
same way from a --spec file and the options given, with run names checked at input."""

from __future__ import annotations

import inspect
import sys
import typing
from typing import List, Optional

import typer
from typer.core import TyperCommand, TyperGroup

from ..boundary import shortened
from ..errors import SpecError
from ..declare import (CommandOptions, declared, default_of, help_text, item_type, option_of,
                       shown_default)
from ..spec import check_name, coerce, load_file, read_number, split_list
from ..api import export
from .tables import visible

# Old spelling -> today's, and the value of an option given alone, both from the settings' declarations
# (declare.py) of each command: filled by declared_command. Old spellings stay readable so scripts written
# against earlier versions keep working; each use prints one notice.
ALIASES: dict[str, str] = {}
OPTIONAL_VALUE: dict[str, str] = {}


class Command(TyperCommand):
    """A typer command that reads old option spellings and value-less on/off axes before click parses."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        param_of = {o: p for p in self.params if p.param_type_name == "option" for o in (*p.opts, *p.secondary_opts)}
        takes_value = {o for p in self.params if not getattr(p, "is_flag", False) and p.param_type_name == "option"
                       for o in p.opts}
        out: list[str] = []
        given: dict[str, str] = {}  # a parameter's name -> the spelling it was first given as
        noted: set[str] = set()
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "--":
                out += args[i:]
                break
            name, eq, value = arg.partition("=")
            typed = name  # as the user spelled it: `--precision fp32 --dtype fp32` was "--dtype was given twice"
            if name in ALIASES and name not in param_of and ALIASES[name] in param_of:
                if name not in noted:  # one notice a spelling: `--batches 1 --batches 2` printed it twice
                    typer.echo(f"note: {name} is now {ALIASES[name]}", err=True)
                    noted.add(name)
                name = ALIASES[name]
                arg = name + eq + value
            out.append(arg)
            if name in param_of:
                _once(ctx, param_of[name], typed, given)
            if name in OPTIONAL_VALUE and name in param_of and not eq:
                nxt = args[i + 1] if i + 1 < len(args) else None
                if nxt is None or nxt.startswith("-"):
                    out.append(OPTIONAL_VALUE[name])
            elif name in takes_value and not eq and i + 1 < len(args):
                value = args[i + 1]
                out.append(value)  # the option's value, never read as an option name
                i += 1
            if name in takes_value and (eq or i < len(args)):
                _ascii_number(ctx, param_of[name], typed, value)
            i += 1
        return super().parse_args(ctx, out)

    def get_params(self, ctx):
        return _no_bool_placeholder(super().get_params(ctx))


class Group(TyperGroup):
    def get_params(self, ctx):
        return _no_bool_placeholder(super().get_params(ctx))

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        """click's own errors (an option's value of the wrong type, an unknown option, a missing argument) as
        one line and exit 2, like every other refusal: typer would draw a usage box of five or six lines."""
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except Exception as exc:  # noqa: BLE001 - typer >= 0.22 raises its own copy of click's classes
            if type(exc).__name__ == "Abort":
                typer.echo("aborted", err=True)
                sys.exit(1)
            if not (callable(getattr(exc, "format_message", None)) and isinstance(getattr(exc, "exit_code", None), int)):
                raise
            ctx = getattr(exc, "ctx", None)
            where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
            # No command (`transbench`, `transbench micro`): click prints the help and has no words of its own,
            # which left `error:  (see ...)`, a line that said nothing.
            message = " ".join(exc.format_message().split()) or "no command given: choose one of the commands listed"
            typer.echo(f"error: {shortened(visible(message))}{where}", err=True)  # as app.fail
            sys.exit(exc.exit_code)
        sys.exit(rv if isinstance(rv, int) else 0)  # an Exit's code comes back instead of exiting with it


def _once(ctx, param, spelling: str, given: dict[str, str]) -> None:
    """An option of one value given twice is refused: click keeps the last, so `runs --spec a --spec b` showed b
    alone and `run --min-time 5 ... --min-time 1` (an alias that adds options, then the user's own) ran 1 s
    without a word. A repeatable option (`train --nccl-env`, one value a point) is the exception, as declared."""
    if getattr(param, "multiple", False) or getattr(param, "count", False):
        return
    if param.name in given:
        first = given[param.name]
        twice = f"{spelling} was given twice" if first == spelling else f"{first} and {spelling} were both given"
        ctx.fail(f"{twice}: give it once")
    given[param.name] = spelling


def _ascii_number(ctx, param, spelling: str, value: str) -> None:
    """A typed number as the list axes read it (spec.read_number): click's int() and float() take digits grouped
    by `_` (`--min-time 0_5` ran 5 s) and other scripts' digits."""
    kind = _number_kind(param)
    if kind is None:
        return
    try:
        read_number(value.strip(), kind)
    except ValueError:
        what = "an integer (as 1000)" if kind is int else "a number (as 0.5)"
        how = ", in ASCII digits without `_`" if "_" in value or not value.isascii() else ""
        ctx.fail(f"{spelling} {value!r}: expected {what}{how}")


def _number_kind(param) -> type | None:
    """int or float where the option reads a number: click's copies in typer < 0.22 keep a ParamType in `type`,
    typer >= 0.22 the annotation in `type_descriptor`."""
    named = {"integer": int, "float": float}.get(getattr(getattr(param, "type", None), "name", ""))
    if named is not None:
        return named
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    kinds = [k for k in (annotation, *typing.get_args(annotation)) if k in (int, float)]
    return kinds[0] if kinds else None


def _no_bool_placeholder(params):
    # Flags take no value: typer's help would show a bare `<bool>` in their type column.
    for p in params:
        if getattr(p, "is_flag", False):
            p.metavar = ""
    return params


class App(typer.Typer):
    """typer.Typer whose commands are all `Command`s."""

    def __init__(self, **kwargs):
        super().__init__(cls=Group, **kwargs)

    def command(self, *args, **kwargs):
        kwargs.setdefault("cls", Command)
        return super().command(*args, **kwargs)


# The command whose --spec repeats a stored run of each kind (store.db.RUN_KINDS).
COMMAND_OF_KIND = {"inference": "run", "training": "train", "serve": "serve", "micro": "micro KIND"}


def build_spec(cls, spec_file: str | None, given: dict, whole: frozenset[str] = frozenset(),
               command: tuple[str, str] | None = None, kind: str | None = None):
    """The spec of a command: the --spec file (checked against `cls`, errors naming the file), overridden
    by the options given on the command line (None = not given). `command` = (key, value): a key of the
    file that names the sub-command the spec belongs to (a micro run's stored spec holds `micro: gemm`). `kind`: the
    kind of run the command stores; a file `runs --spec` wrote from a run of another kind is refused naming the
    command it belongs to (it was refused, listing every key that command does not know)."""
    made = export.spec_kind(spec_file) if spec_file is not None and kind is not None else None
    if made in COMMAND_OF_KIND and made != kind:  # a mark naming no kind of ours (edited by hand) tells nothing
        article = "an" if made[0] in "aeiou" else "a"
        target = COMMAND_OF_KIND[made]
        if made == "micro":  # its `micro: gemm` key names the sub-command (where the file reads and names one)
            try:
                sub = load_file(spec_file).get("micro")
            except SpecError:
                sub = None
            target = f"micro {sub}" if isinstance(sub, str) and sub.isidentifier() else target
        raise SpecError(f"spec file {spec_file} was written from {article} {made} run (its first line says so): give "
                        f"it to `transbench {target} --spec`")
    if spec_file is not None and command is not None:
        # `transbench runs --spec RUN --out f.yaml` writes a micro run's spec with its `micro: gemm` key, and
        # `micro gemm --spec f.yaml` refused that key as unknown: the file it wrote could not be read back.
        # The key's own value is dropped; another sub-command's spec is refused, naming the command to use.
        key, value = command
        data = load_file(spec_file)
        if key in data:
            if data[key] != value:
                raise SpecError(f"spec file {spec_file} is the spec of `transbench {key} {data[key]}` ({key}: "
                                f"{data[key]}), not of `{key} {value}`: give it to `transbench {key} {data[key]} "
                                "--spec`, or drop that key")
            data = {k: v for k, v in data.items() if k != key}
            if not data:  # as load_file: a file of no options is most likely the wrong file
                raise SpecError(f"spec file {spec_file} holds no options besides {key}: {value}: give at least one")
        base = coerce(cls, data, f"spec file {spec_file}: ", whole)
    else:
        base = load_file(spec_file, cls, whole) if spec_file is not None else {}
    merged = {**base, **{k: v for k, v in given.items() if v is not None}}
    if merged.get("name") is not None:
        check_name(merged["name"])
    labels = {f.name: option_of(f, s) for f, s in declared(cls) if given.get(f.name) is not None}
    return cls(**coerce(cls, merged, whole=whole, labels=labels))


def parameter(cls, f, s, default_none: bool = True) -> inspect.Parameter:
    """The typer option of one declared setting. Options default to None, 'not given', so that a --spec file's
    value is not overridden; --help shows the setting's own default."""
    kind, is_list = item_type(cls, f.name)
    names = [s.flag] if s.flag else [option_of(f, s)]
    if s.short:
        names.append(s.short)
    if s.repeat:
        annotation = Optional[List[str]]
    elif is_list or s.read is not None:
        annotation = Optional[str]  # comma text: read into the field's type by coerce(), as a spec file's is
    else:
        annotation = Optional[kind]
    text = help_text(f, s, is_list, kind)
    if "[" in text:  # help is rich markup: a bare [liger] would be read as a tag and dropped
        text = text.replace("[", "\\[")
    default = None if default_none else default_of(f)
    show = False if s.flag and "/" not in s.flag else s.shown if s.shown is not None else \
        False if default_of(f) is None else True if not default_none else shown_default(f, s)
    option = typer.Option(default, *names, help=text, show_default=show)
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)


def read(cls, name: str, value):
    """A typed option's value as coerce() takes it: numbers of a list axis split and read here, so that a bad
    item names the option (`--batch x`); text and on/off lists go through coerce() whole."""
    if value is None:
        return None
    f, s = next((f, s) for f, s in declared(cls) if f.name == name)
    kind, is_list = item_type(cls, name)
    if isinstance(value, (list, tuple)) and s.read is None:  # a repeated option: each whole; none given is not given
        return list(value) or None
    try:
        if s.read is not None:
            return s.read(value)
        return split_list(value, kind) if is_list and kind in (int, float) else value
    except SpecError as exc:  # `--sizes x` said "cannot read size 'x'" without naming the option
        raise SpecError(f"{option_of(f, s)}: {exc}") from None
