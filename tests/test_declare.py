"""Each setting declared once (declare.py): the commands' options, their help and defaults, the spec files' keys
and the old spellings all come from the fields; the bad-input table below is generated from the same fields."""

from __future__ import annotations

import dataclasses

import pytest
import typer
from typer.testing import CliRunner

from transbench.cli import app
from transbench.cli.app import declared_command
from transbench.cli.options import App
from transbench.declare import declared, item_type, option_of, setting
from transbench.scenarios.inference.spec import RunSpec
from transbench.scenarios.micro.options import BandwidthOptions, BreakdownOptions, GemmOptions, LayerOptions
from transbench.scenarios.serve.spec import ServeSpec
from transbench.scenarios.training.spec import TrainSpec
from transbench.scenarios.tune.spec import TuneSpec
from transbench.spec import coerce

runner = CliRunner()
COMMANDS = {("run",): RunSpec, ("serve",): ServeSpec, ("train",): TrainSpec, ("tune",): TuneSpec,
            ("micro", "gemm"): GemmOptions, ("micro", "bandwidth"): BandwidthOptions,
            ("micro", "layer"): LayerOptions, ("micro", "breakdown"): BreakdownOptions}


def _options(path) -> set[str]:
    cmd = typer.main.get_command(app)
    ctx = None
    for name in path:
        ctx = cmd.make_context(name, ["--help"], resilient_parsing=True) if ctx is None else ctx
        cmd = cmd.get_command(ctx, name)
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}


@pytest.mark.parametrize("path", list(COMMANDS), ids=" ".join)
def test_every_declared_setting_is_an_option_of_its_command(path):
    cls = COMMANDS[path]
    options = _options(path)
    for f, s in declared(cls):
        if s.cli:
            spelled = s.flag.split("/") if s.flag else [option_of(f, s)]
            assert set(spelled) <= options, (path, f.name)


@pytest.mark.parametrize("cls", sorted(set(COMMANDS.values()), key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_every_field_is_declared_with_help(cls):
    names = {f.name for f in dataclasses.fields(cls)}
    assert names == {f.name for f, _ in declared(cls)}, "a field without setting(...)"
    for f, s in declared(cls):
        assert s.help or s.choices, f.name


def test_old_spec_keys_read_as_the_settings_they_now_name():
    assert coerce(TrainSpec, {"precisions": ["bf16"], "attns": "eager"}) == {"dtypes": ["bf16"], "backends": ["eager"]}
    with pytest.raises(Exception, match="name the same setting"):
        coerce(TrainSpec, {"precisions": ["bf16"], "dtypes": ["fp32"]})


def test_a_setting_added_in_one_place_is_an_option_a_spec_key_and_help():
    """What adding a setting costs: its field. The command, its --help default and the spec key follow."""

    @dataclasses.dataclass
    class Toy:
        widths: list[int] = setting([8], "widths to try", option="--width", aliases=("--widths",))
        loud: bool = setting(False, "say more", flag="--loud")

    toy = App()
    seen = {}

    @declared_command(toy, Toy)
    def go(given: dict) -> None:
        seen.update(coerce(Toy, {k: v for k, v in given.items() if v is not None}))

    @toy.command()
    def other() -> None:  # a group of two, so `go` is named on the command line as it is in transbench
        pass

    res = runner.invoke(toy, ["go", "--help"], env={"COLUMNS": "200"})
    assert "--width" in res.output and "widths to try" in res.output and "[default: (8)]" in res.output
    assert runner.invoke(toy, ["go", "--widths", "4,16", "--loud"]).exit_code == 0
    assert seen == {"widths": [4, 16], "loud": True}


def _bad_values(cls, f) -> list[str]:
    """Values that pass as text but not as the setting's type, from the field's declared type alone."""
    kind, is_list = item_type(cls, f.name)
    if kind is int:
        return ["x", "1.5", "٣"] + (["1,,2"] if is_list else [])
    if kind is float:
        return ["x", "nan"] if not is_list else ["x", "1,,2"]
    return []


BAD = [(path, f.name, value) for path, cls in COMMANDS.items() for f, s in declared(cls)
       if s.cli and not s.flag and not s.read for value in _bad_values(cls, f)]


@pytest.mark.parametrize("path,field,value", BAD, ids=[f"{' '.join(p)}-{f}-{v}" for p, f, v in BAD])
def test_a_value_of_the_wrong_type_is_one_line_and_exit_2(tmp_path, path, field, value):
    cls = COMMANDS[path]
    f, s = next((f, s) for f, s in declared(cls) if f.name == field)
    store = ["--db", str(tmp_path / "t.db")] if "--db" in _options(path) else []
    res = runner.invoke(app, [*path, option_of(f, s), value, *store], env={"COLUMNS": "200"})
    assert res.exit_code == 2, (res.output, res.exception)
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.output
    assert not (tmp_path / "t.db").exists()
