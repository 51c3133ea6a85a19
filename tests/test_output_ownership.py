"""An existing file at an output path is replaced only when transbench wrote it there (store/export.py `ours`): a
rerun replaces its previous output, an empty file or a new path is written, and a user's file (text, JSON, a PNG,
a report.md of their own) is refused before any work, one `error:` line, exit 2, the file byte for byte as it was.
`compare --markdown` appends instead ($GITHUB_STEP_SUMMARY holds the job's earlier steps)."""

import fnmatch
import hashlib
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from report_helpers import cell, make_run, ok_result
from test_cli_input import QUICK, invoke, refused
from test_compare import noisy

from transbench.errors import SpecError
from transbench.report import REPORT_FILES
from transbench.spec import load_file
from transbench.store import export

TINY_RUN = ["run", "--model", "bert-tiny", "--batch", "1", "--seq", "8", "--backend", "sdpa", *QUICK]
GEMM = ["micro", "gemm", "--sizes", "64", "--model", "", "--device", "cpu", "--min-time", "0.01"]
FOREIGN = "is not a file transbench wrote"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def matplotlib_png(path: Path) -> Path:
    """A PNG as matplotlib writes it for anyone (its own Software text, no transbench mark)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(2, 2))
    fig.subplots().plot([1, 2], [2, 1])
    fig.savefig(path, format="png")
    return path


# A user's files of each sort the options must not replace.
USER_FILES = {
    "text": lambda p: p.write_text("precious notes\n"),
    "json": lambda p: p.write_text(json.dumps({"config": {"lr": 0.1}, "notes": "mine"}, indent=2)),
    "png": matplotlib_png,
    "report.md": lambda p: p.write_text("# My project\n\nresults I wrote by hand\n"),
}


def users_file(path: Path, kind: str) -> tuple[Path, str]:
    """A user's file of `kind` at `path`, and its digest (to show it unchanged)."""
    USER_FILES[kind](path)
    return path, digest(path)



@pytest.fixture
def runs_db(tmp_path):
    """Two stored inference runs, `a` and `b` (b 20% slower), written as the runner writes cells."""
    db = str(tmp_path / "c.db")
    make_run(db, "a", [(cell("eager", 1), ok_result(noisy(10.0, seed=1), 1)),
                       (cell("eager", 2), ok_result(noisy(15.0, seed=2), 2))])
    make_run(db, "b", [(cell("eager", 1), ok_result(noisy(12.0, seed=11), 1)),
                       (cell("eager", 2), ok_result(noisy(15.0, seed=12), 2))])
    return db


# --- run / micro: --json, --csv, --plot ----------------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(USER_FILES))
@pytest.mark.parametrize("option", ["--json", "--csv"])
def test_an_export_refuses_a_users_file_before_the_run(tmp_path, no_work, option, kind):
    path, before = users_file(tmp_path / f"mine.{kind}", kind)
    refused(invoke(*TINY_RUN, "--db", tmp_path / "r.db", option, path), f"cannot write {path}", FOREIGN,
            f"({option})", "remove it, or give another path")
    assert digest(path) == before and not (tmp_path / "r.db").exists()


@pytest.mark.parametrize("kind", sorted(USER_FILES))
def test_a_plot_refuses_a_users_file_before_the_run(tmp_path, no_work, kind):
    path, before = users_file(tmp_path / "mine.png", kind)
    refused(invoke(*GEMM, "--db", tmp_path / "g.db", "--plot", path), FOREIGN, "(--plot)")
    assert digest(path) == before


def test_export_write_refuses_a_users_file_from_python(tmp_path):
    """api.run and friends write through export.write: the rule holds there too, at write time."""
    path = tmp_path / "notes.json"
    path.write_text('{"mine": true}')
    with pytest.raises(SpecError, match=FOREIGN):
        export.write([{"run_name": "x"}], json_path=str(path))
    assert path.read_text() == '{"mine": true}'


@pytest.mark.slow
def test_a_rerun_replaces_its_own_exports_and_an_empty_file_is_written(tmp_path):
    db, js, cs = tmp_path / "r.db", tmp_path / "r.json", tmp_path / "r.csv"
    js.touch()  # empty: written as a new path is
    res = invoke(*TINY_RUN, "--db", db, "--name", "a", "--json", js, "--csv", cs)
    assert res.exit_code == 0, res.output
    first_json, first_csv = js.read_text(), cs.read_text()
    assert json.loads(first_json)["kind"] == "record" and export.ours(js, "json") and export.ours(cs, "csv")
    # Still ours with something added at the end: the rerun (a resume, nothing measured again) replaces it whole.
    js.write_text(first_json + "\n\n")
    cs.write_text(first_csv + "a row of my own\n")
    res = invoke(*TINY_RUN, "--db", db, "--name", "a", "--json", js, "--csv", cs)
    assert res.exit_code == 0, res.output
    assert js.read_text() == first_json and cs.read_text() == first_csv
    # Each is ours only at its own option: the record is no CSV, the CSV no record.
    refused(invoke(*TINY_RUN, "--db", db, "--name", "a", "--json", cs), FOREIGN, "(--json)")
    refused(invoke(*TINY_RUN, "--db", db, "--name", "a", "--csv", js), FOREIGN, "(--csv)")
    assert js.read_text() == first_json and cs.read_text() == first_csv


@pytest.mark.slow
def test_a_rerun_replaces_its_own_plot_in_the_suffixs_format(tmp_path):
    db = tmp_path / "g.db"
    for name, start in (("roof.png", b"\x89PNG"), ("roof.svg", b"<?xml")):
        plot = tmp_path / name
        for _ in range(2):  # the second run's plot replaces the first's
            res = invoke(*GEMM, "--db", db, "--name", "g", "--plot", plot)
            assert res.exit_code == 0, res.output
            assert plot.read_bytes().startswith(start) and export.ours(plot, "plot")


# --- compare: --json, --github-benchmark, --markdown ------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(USER_FILES))
@pytest.mark.parametrize("option", ["--json", "--github-benchmark"])
def test_compare_refuses_a_users_file(runs_db, tmp_path, option, kind):
    path, before = users_file(tmp_path / f"precious.{kind}", kind)
    refused(invoke("compare", "a", "b", "--db", runs_db, option, path), f"cannot write {path}", FOREIGN,
            f"({option})")
    assert digest(path) == before


def test_compare_replaces_its_own_outputs_and_writes_an_empty_file(runs_db, tmp_path):
    js, bench = tmp_path / "compare.json", tmp_path / "bench.json"
    bench.touch()
    args = ["compare", "a", "b", "--db", runs_db, "--json", js, "--github-benchmark", bench]
    assert invoke(*args).exit_code == 1  # b is slower: the gate's exit code, the files written
    first_js, first_bench = js.read_text(), bench.read_text()
    assert json.loads(first_js)["kind"] == "comparison" and json.loads(first_bench)[0]["unit"] == "ms"
    js.write_text(first_js + "\n")
    bench.write_text(first_bench + " ")
    assert invoke(*args).exit_code == 1
    assert js.read_text() == first_js and bench.read_text() == first_bench
    # A record of `runs --out` is a versioned JSON document of ours too; the benchmark list is not one.
    record = tmp_path / "record.json"
    assert invoke("runs", "--db", runs_db, "--out", record).exit_code == 0
    assert invoke("compare", "a", "b", "--db", runs_db, "--json", record).exit_code == 1
    assert json.loads(record.read_text())["kind"] == "comparison"
    refused(invoke("compare", "a", "b", "--db", runs_db, "--json", bench), FOREIGN, "(--json)")
    refused(invoke("compare", "a", "b", "--db", runs_db, "--github-benchmark", js), FOREIGN, "(--github-benchmark)")
    assert js.read_text() == first_js and bench.read_text() == first_bench


def test_compare_markdown_appends(runs_db, tmp_path):
    """GitHub's $GITHUB_STEP_SUMMARY: what the earlier steps wrote stays, and each compare adds its table."""
    summary = tmp_path / "step_summary.md"
    summary.write_text("## Build\nall green")  # no newline at the end
    for _ in range(2):
        res = invoke("compare", "a", "b", "--db", runs_db, "--markdown", summary)
        assert res.exit_code == 1, res.output
    text = summary.read_text()
    assert text.startswith("## Build\nall green\n\n**transbench compare: ")
    assert text.count("**transbench compare: 1 regression(s)** (exit 1)") == 2
    assert text.count("| A ms | B ms | B/A |") == 2
    # each block after a blank line: the first table's last row is not continued by the second's heading
    assert re.search(r"\|\n\n\*\*transbench compare", text)
    new = tmp_path / "new.md"
    assert invoke("compare", "a", "b", "--db", runs_db, "--markdown", new).exit_code == 1
    assert new.read_text().startswith("**transbench compare")


def test_a_compare_that_refuses_its_runs_says_why_in_the_step_summary(runs_db, tmp_path):
    # a refused gate (exit 2) left $GITHUB_STEP_SUMMARY silent, its reason in the job's log alone
    summary, js = tmp_path / "step_summary.md", tmp_path / "c.json"
    summary.write_text("## Build\n")
    res = invoke("compare", "a", "nosuch", "--db", runs_db, "--markdown", summary, "--json", js)
    assert res.exit_code == 2
    line = res.output.strip().splitlines()[-1].removeprefix("error: ")
    assert summary.read_text() == f"## Build\n\n**transbench compare: refused** (exit 2): {line}\n"
    assert not js.exists()  # no comparison to write


def test_a_refused_compare_leaves_an_earlier_output_as_it_was_and_says_so(runs_db, tmp_path):
    """A CI step that reads --json after a refusal (`compare ... || true`) found the last job's comparison there, of
    other runs, with nothing to tell it apart: the refusal names the files it left, each byte for byte as it was."""
    js, bench, summary = tmp_path / "c.json", tmp_path / "bench.json", tmp_path / "summary.md"
    assert invoke("compare", "a", "b", "--db", runs_db, "--json", js, "--github-benchmark", bench).exit_code == 1
    before = {p: (digest(p), p.stat().st_mtime_ns) for p in (js, bench)}
    res = invoke("compare", "a", "nosuch", "--db", runs_db, "--json", js, "--github-benchmark", bench,
                 "--markdown", summary)
    line = refused(res, "nosuch", f"(nothing was written: --json {js} and --github-benchmark {bench} still hold an "
                   "earlier compare's output)")
    assert {p: (digest(p), p.stat().st_mtime_ns) for p in (js, bench)} == before
    assert line.removeprefix("error: ") in summary.read_text()  # the step summary says it too
    js.unlink()
    line = refused(invoke("compare", "a", "nosuch", "--db", runs_db, "--json", js, "--github-benchmark", bench),
                   f"(nothing was written: --github-benchmark {bench} still holds an earlier compare's output)")
    assert "--json" not in line and not js.exists()
    # refused before the comparison (an output of the user's at --markdown): the earlier file is named too, and a
    # file at --json that compare did not write is not said to be an earlier compare's
    png = matplotlib_png(tmp_path / "plot.png")
    line = refused(invoke("compare", "a", "b", "--db", runs_db, "--github-benchmark", bench, "--markdown", png),
                   "not a text file", f"(nothing was written: --github-benchmark {bench} still holds")
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": 1}')
    line = refused(invoke("compare", "a", "nosuch", "--db", runs_db, "--json", notes), "is not a file transbench wrote")
    assert "earlier compare" not in line and notes.read_text() == '{"mine": 1}'


def test_an_output_that_links_into_a_missing_folder_is_refused_before_the_work(runs_db, tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "gone" / "c.json")
    for args in (["compare", "a", "b", "--db", runs_db, "--json", link], ["runs", "--db", runs_db, "--out", link],
                 ["runs", "--db", runs_db, "--spec", "a", "--out", link]):
        refused(invoke(*args), f"cannot write {link}: it is a symbolic link to {tmp_path / 'gone' / 'c.json'}, and "
                f"folder {tmp_path / 'gone'} does not exist")
    assert link.is_symlink() and not (tmp_path / "gone").exists()


def test_compare_markdown_refuses_a_file_that_is_not_text(runs_db, tmp_path):
    png = matplotlib_png(tmp_path / "plot.png")
    before = digest(png)
    refused(invoke("compare", "a", "b", "--db", runs_db, "--markdown", png), "not a text file", "--markdown")
    assert digest(png) == before


def test_a_refused_compare_output_writes_none_of_the_others(runs_db, tmp_path):
    summary, js = tmp_path / "summary.md", tmp_path / "c.json"
    summary.write_text("kept\n")
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    refused(invoke("compare", "a", "b", "--db", runs_db, "--markdown", summary, "--json", js,
                   "--github-benchmark", notes), FOREIGN)
    assert summary.read_text() == "kept\n" and not js.exists() and notes.read_text() == "mine"


# --- report --out -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,kind", [("report.md", "report.md"), ("report.md", "text"), ("report.html", "text"),
                                       ("report.html", "json"), ("latency_throughput_mine.png", "png"),
                                       ("serve_0.png", "text")])
def test_report_refuses_a_folder_with_a_users_file_of_its_names(runs_db, tmp_path, name, kind):
    out = tmp_path / "myproj"
    out.mkdir()
    path, before = users_file(out / name, kind)
    refused(invoke("report", "a", "--db", runs_db, "--out", out), f"cannot write {path}", FOREIGN, "(--out)",
            "give another folder")
    assert digest(path) == before and [p.name for p in out.iterdir()] == [name]  # nothing written beside it


def test_report_replaces_its_own_files_and_leaves_others_alone(runs_db, tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    diagram = matplotlib_png(out / "diagram.png")  # a user's image under a name no report writes
    kept = digest(diagram)
    (out / "report.md").touch()  # empty: written
    res = invoke("report", "a", "--db", runs_db, "--out", out)
    assert res.exit_code == 0, res.output
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    assert md.startswith(export.REPORT_MARK + "\n# transbench report: a\n")
    assert page.startswith("<!DOCTYPE html>\n" + export.REPORT_MARK + "\n<html")
    plots = sorted(p for p in out.glob("*.png") if p != diagram)
    assert plots and all(export.ours(p, "plot") for p in plots)
    (out / "report.md").write_text(md + "a line I added\n")
    res = invoke("report", "a", "b", "--db", runs_db, "--out", out)
    assert res.exit_code == 0, res.output
    assert "a line I added" not in (out / "report.md").read_text()
    assert "## Comparison: b vs a" in (out / "report.md").read_text() and digest(diagram) == kept


def test_report_replaces_an_older_report_without_the_mark(runs_db, tmp_path):
    """Reports written before the mark: report.md and report.html by the start they always had, their plots
    (matplotlib's PNG, unmarked) by the report beside them."""
    out = tmp_path / "old"
    assert invoke("report", "a", "--db", runs_db, "--out", out).exit_code == 0
    for name in ("report.md", "report.html"):
        path = out / name
        path.write_text(path.read_text().replace(export.REPORT_MARK + "\n", "", 1))
        assert not path.read_text().startswith(export.REPORT_MARK)
    plot = next(out.glob("latency_throughput_*.png"))
    matplotlib_png(plot)
    assert export.ours(out / "report.md", "report.md") and export.ours(out / "report.html", "report.html")
    assert export.ours(plot, "plot")
    res = invoke("report", "a", "--db", runs_db, "--out", out)
    assert res.exit_code == 0, res.output
    assert (out / "report.md").read_text().startswith(export.REPORT_MARK)
    # the same unmarked PNG beside a report.md of the user's is not ours
    (out / "report.md").write_text("# my notes\n")
    matplotlib_png(plot)
    assert not export.ours(plot, "plot")


def test_report_files_name_every_plot_a_report_writes():
    """REPORT_FILES lists what check_folder checks: every plot file name plots.py and serve.py build."""
    import transbench.report.plots as plots_module
    import transbench.report.serve as serve_module

    names = []
    for module in (plots_module, serve_module):
        source = Path(module.__file__).read_text()
        names += [re.sub(r"\{[^}]*\}", "x", n) for n in re.findall(r'f?"([^"\n]*\.png)"', source)]
    assert names
    for name in names:
        assert any(fnmatch.fnmatch(name, pattern) for pattern in REPORT_FILES), name


# --- runs --out ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["spec.yaml", "spec.toml", "spec.json", "all.json"])
def test_runs_out_refuses_a_users_file(runs_db, tmp_path, name):
    path = tmp_path / name
    path.write_text({"spec.yaml": "models: [bert-tiny]\n", "spec.toml": 'models = ["bert-tiny"]\n',
                     "spec.json": '{"models": ["bert-tiny"]}\n', "all.json": '[{"mine": 1}]'}[name])
    before = digest(path)
    spec = [] if name == "all.json" else ["--spec", "a"]
    refused(invoke("runs", "--db", runs_db, *spec, "--out", path), FOREIGN, "(--out)")
    assert digest(path) == before


@pytest.mark.parametrize("suffix", [".yaml", ".toml", ".json"])
def test_runs_out_replaces_its_own_spec(runs_db, tmp_path, suffix):
    path = tmp_path / f"spec{suffix}"
    assert invoke("runs", "--db", runs_db, "--spec", "a", "--out", path).exit_code == 0
    first = path.read_text()
    if suffix != ".json":
        assert first.startswith(export.SPEC_MARK)
    assert export.ours(path, "spec") and load_file(str(path)) is not None  # the mark is a comment: it reads back
    assert invoke("runs", "--db", runs_db, "--spec", "b", "--out", path).exit_code == 0
    assert path.read_text() == first.replace("'a'", "'b'")  # the same options: replaced, not refused
    if suffix == ".json":  # the record `runs --out` writes there is ours too, and the other way round
        assert invoke("runs", "--db", runs_db, "--out", path).exit_code == 0
        assert json.loads(path.read_text())["kind"] == "record"
        assert invoke("runs", "--db", runs_db, "--spec", "a", "--out", path).exit_code == 0


# --- what `ours` recognises ------------------------------------------------------------------------------------

def test_ours_by_kind(tmp_path):
    def file(name, data):
        path = tmp_path / name
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
        return path

    assert export.RECORD_KEYS[:len(export.CSV_HEAD)] == export.CSV_HEAD
    assert export.ours(file("old.json", '[\n {\n  "run_id": "x", "run_name": "a"}]'), "json")  # before the record
    assert export.ours(file("none.json", "[]\n"), "json") and export.ours(tmp_path / "none.json", "benchmark")
    assert export.ours(file("old.csv", "run_id,run_name,scenario,model,task,backend,dtype\r\n"), "csv")
    assert not export.ours(file("other.csv", "run_id,name\n"), "csv")
    assert not export.ours(file("list.json", '[{"value": 1, "name": "x", "unit": "ms"}]'), "benchmark")
    assert not export.ours(file("obj.json", '{"kind": "record", "schema_version": 1}'), "json")
    assert not export.ours(file("hand.json", '{\n  "models": ["bert-tiny"]\n}\n'), "spec")
    assert export.ours(file("dumped.json", json.dumps({"models": ["bert-tiny"]}, indent=1) + "\n"), "spec")
    assert not export.ours(file("report.md", "# transbench report: a\n\nmy own text\n"), "report.md")
    missing = tmp_path / "missing.json"
    assert not export.ours(missing, "json")
    with pytest.raises(ValueError, match="unknown output kind"):
        export.ours(missing, "yaml")


@pytest.mark.parametrize("fmt", ["png", "svg", "svgz", "pdf", "eps", "ps", "jpg", "gif", "tif", "webp"])
def test_each_plot_format_carries_the_mark(tmp_path, fmt):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(2, 2))
    fig.subplots().plot([1, 2], [2, 1])
    ours, theirs = tmp_path / f"ours.{fmt}", tmp_path / f"theirs.{fmt}"
    export.save_figure(fig, ours)
    fig.savefig(theirs, format=fmt)
    assert export.ours(ours, "plot") and not export.ours(theirs, "plot")
    export.save_figure(fig, ours)  # over its own: replaced
    before = digest(theirs)
    with pytest.raises(SpecError, match=FOREIGN):
        export.save_figure(fig, theirs)
    assert digest(theirs) == before


def test_a_raw_plot_has_no_mark_so_an_existing_one_is_refused(tmp_path):
    from matplotlib.figure import Figure

    path = tmp_path / "p.rgba"
    export.save_figure(Figure(figsize=(1, 1)), path)  # a new path: written
    with pytest.raises(SpecError, match=FOREIGN):
        export.check_output(str(path), "--plot")


@pytest.mark.parametrize("name", ["nightly", "a (b) c", "x'y", ""])
def test_a_spec_file_tells_the_kind_of_run_it_was_written_from(tmp_path, name):
    """store/export.spec_kind reads back what spec_mark wrote, whatever the run's name; a file without the mark (JSON,
    the user's own) or no file at all tells nothing."""
    from transbench.store import db, export

    for kind in db.RUN_KINDS:
        f = tmp_path / "s.yaml"
        f.write_text(export.spec_mark(name, kind) + "\nmodel: bert-tiny\n")
        assert export.spec_kind(str(f)) == kind
    f.write_text('{\n "model": "bert-tiny"\n}')
    assert export.spec_kind(str(f)) is None and export.spec_kind(str(tmp_path / "missing.yaml")) is None
    assert export.spec_kind(str(tmp_path)) is None  # a folder


def test_a_named_pipe_as_a_spec_file_tells_nothing_at_once(tmp_path):
    """spec_kind is read before the spec file is checked: opening a named pipe with no writer blocked for ever."""
    import os
    import threading

    from transbench.store import export

    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    got: list = []
    t = threading.Thread(target=lambda: got.append(export.spec_kind(str(fifo))), daemon=True)
    t.start()
    t.join(10)
    assert got == [None]


def test_every_kind_of_run_names_the_command_that_repeats_it():
    from transbench.cli.options import COMMAND_OF_KIND
    from transbench.store.db import RUN_KINDS

    assert set(COMMAND_OF_KIND) == set(RUN_KINDS)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(side=st.sampled_from([".db-wal", ".db-shm", ".db-journal"]), there=st.sampled_from([None, b"", b"x" * 40]),
       option=st.sampled_from(["--json", "--markdown", "--github-benchmark", "run --json", "run --csv"]))
def test_a_side_file_of_another_database_is_refused_as_an_output(runs_db, tmp_path, side, there, option):
    other = tmp_path / "other.db"  # a store beside, maybe in a sweep: its -wal file absent, empty between checkpoints
    other.write_bytes(Path(runs_db).read_bytes())
    target = tmp_path / f"other{side}"
    target.unlink(missing_ok=True)
    if there is not None:
        target.write_bytes(there)
    before = {p.name: digest(p) for p in tmp_path.iterdir() if p.is_file()}
    args = ([*TINY_RUN, "--db", tmp_path / "new.db", option.split()[1], target] if option.startswith("run")
            else ["compare", "a", "b", "--db", runs_db, option, target])
    refused(invoke(*args), "named as SQLite names a side file", str(other))
    assert {p.name: digest(p) for p in tmp_path.iterdir() if p.is_file()} == before


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(target=st.text(st.characters(whitelist_categories=("L", "N")), min_size=1, max_size=12), loop=st.integers(0, 3))
def test_report_out_as_a_link_to_no_folder_says_so(runs_db, tmp_path_factory, target, loop):
    """A link to a missing name, or a loop of `loop` links: mkdir said only "File exists"."""
    here = tmp_path_factory.mktemp("out")
    out = here / "out"
    chain = [out, *(here / f"link{i}" for i in range(loop))]
    for link, to in zip(chain, [*chain[1:], here / target] if not loop else [*chain[1:], out]):
        link.symlink_to(to)
    before = sorted(p.name for p in here.iterdir())
    refused(invoke("report", "a", "--db", runs_db, "--out", out), f"--out {out} is a symbolic link to ", "no folder")
    assert sorted(p.name for p in here.iterdir()) == before


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(depth=st.integers(0, 2), option=st.sampled_from(["--json", "--markdown", "--github-benchmark"]))
def test_an_output_inside_a_file_is_said_as_such(runs_db, tmp_path_factory, depth, option):
    here = tmp_path_factory.mktemp("inside")
    notes = here / "notes.txt"
    notes.write_text("mine\n")
    target = notes.joinpath(*["sub"] * depth, "out.json")
    refused(invoke("compare", "a", "b", "--db", runs_db, option, target), f"inside {notes}, which is a file")
    refused(invoke("report", "a", "--db", runs_db, "--out", target.parent / "report"), f"inside {notes}, which is a")
    assert notes.read_text() == "mine\n" and sorted(here.iterdir()) == [notes]
