"""micro collectives: sizes as nccl-tests writes them, the options' refusals, nccl-tests' bandwidth figures, and the
benchmark over 2 CPU processes (torchrun, gloo) checked against exact sums; DDP's all-reduce spans (training/comm.py)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from transbench.cli import app
from transbench.errors import SpecError
from transbench.scenarios import micro
from transbench.scenarios.micro.collectives import BUS_FACTOR
from transbench.scenarios.micro.options import buffer_elements as _elements
from transbench.scenarios.training.comm import union_ms


def test_sizes_read_units_and_doubling_ranges():
    assert micro.parse_byte_sizes("1KiB..8KiB") == [1024, 2048, 4096, 8192]
    assert micro.parse_byte_sizes("64MiB,1GiB,2^20,4096,4k") == [2**26, 2**30, 2**20, 4096, 4096]
    for bad in ("1XB", "..", "8KiB..1KiB", "0..4", "1.5GiB"):
        with pytest.raises(SpecError):
            micro.parse_byte_sizes(bad)


def test_bus_factors_are_nccl_tests():
    assert BUS_FACTOR["all-reduce"](4) == pytest.approx(1.5)
    assert BUS_FACTOR["all-gather"](4) == BUS_FACTOR["reduce-scatter"](4) == pytest.approx(0.75)
    assert BUS_FACTOR["all-reduce"](2) == 1.0
    # split ops take a multiple of the ranks: 1 KiB of fp32 over 3 ranks is 255 elements
    assert _elements("all-gather", 1024, 4, 3) == 255 and _elements("all-reduce", 1024, 4, 3) == 256


@pytest.mark.parametrize("args, says", [
    (["--nproc", "1"], "2 or more processes"),
    (["--op", "broadcast"], "unknown op"),
    (["--dtype", "fp8"], "unknown dtype"),
    (["--sizes", "2^50"], "over 1 TiB"),
    (["--sizes", ""], "--sizes is empty"),
    (["--op", "all-reduce,all-reduce"], "twice"),
    # sizes round down to whole elements: 1, 3 and 4 bytes were three cells of one 4-byte buffer, one table row
    (["--op", "all-reduce", "--sizes", "1,3"], "--sizes 1 and 3 are one 4-byte all-reduce of fp32 over 2 ranks"),
    (["--op", "reduce-scatter", "--sizes", "8,12"], "--sizes 8 and 12 are one 8-byte reduce-scatter"),
])
def test_bad_options_are_one_line_and_exit_2(tmp_path, args, says):
    db = tmp_path / "c.db"
    r = CliRunner().invoke(app, ["micro", "collectives", "--device", "cpu", "--db", str(db), *args])
    assert r.exit_code == 2, r.output
    assert says in r.output and "Traceback" not in r.output
    assert not db.exists()


def test_union_of_bucket_spans():
    assert union_ms([(0, 2), (1, 3), (5, 6)]) == pytest.approx(4)
    assert union_ms([(5, 6), (0, 1)]) == pytest.approx(2)
    assert union_ms([(0, 4), (1, 2)]) == pytest.approx(4)


@pytest.mark.slow
def test_collectives_over_two_cpu_processes(tmp_path):
    out = micro.run_micro("collectives", micro.CollectivesOptions(
        device="cpu", sizes=[1024, 2**16], min_time=0.02, nproc=2, name="coll"), str(tmp_path / "c.db"))
    recs = {(r["op"], r["bytes"]): r for r in out.records}
    assert set(recs) == {(op, s) for op in ("all-reduce", "all-gather", "reduce-scatter") for s in (1024, 2**16)}
    for (op, nbytes), r in recs.items():
        # ok means every rank found the exact sum (or the gathered chunks) before timing
        assert r["status"] == "ok", r["error"]
        assert r["scenario"] == "micro-collectives" and r["world_size"] == 2 and r["dtype"] == "fp32"
        assert r["latency_ms"] > 0 and r["n_samples"] >= 10
        assert r["algbw_gbs"] == pytest.approx(nbytes / (r["latency_ms"] / 1e3) / 1e9)
        assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * (1.0 if op == "all-reduce" else 0.5))
        assert 0 < r["busbw_gbs"] < 1000  # gloo over loopback: far below any link
    from transbench.store import Store

    store = Store(tmp_path / "c.db")
    (run,) = store.runs()
    cell = store.cells(run["run_id"])[0]
    store.close()
    assert run["kind"] == "micro" and cell["info"]["dist_backend"] == "gloo"
    assert cell["info"]["nccl_env"]["NCCL_NVLS_ENABLE"] == "0"  # multicast stays off in every rank
