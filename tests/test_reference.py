"""docs/options.md and docs/records.md are generated from the declarations (cli/reference.py): stale is a failure."""

from __future__ import annotations

from pathlib import Path

from transbench.cli import reference

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_the_option_reference_is_generated_from_the_declarations():
    assert (DOCS / "options.md").read_text() == reference.options_markdown(), \
        "docs/options.md is stale: run `python -m transbench.cli.reference docs`"


def test_the_record_key_table_is_generated_from_the_catalogue():
    assert (DOCS / "records.md").read_text() == reference.records_markdown(), \
        "docs/records.md is stale: run `python -m transbench.cli.reference docs`"


def test_every_exported_key_is_in_the_catalogue():
    from transbench.keys import KEYS
    from transbench.store import export

    assert set(export.RECORD_KEYS) | set(export.TRAINING_KEYS) | set(export.GENERATION_KEYS) <= set(KEYS)
