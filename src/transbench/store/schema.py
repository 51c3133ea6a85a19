"""The versioned JSON record every `--json` export writes, and its JSON Schema.

A record: `{schema_version, transbench_version, kind: "record", spec, environment, runs, cells}`: `cells` the flat
records (the contract's keys, export.RECORD_KEYS first), `runs` each run's id, name, kind, creation time, spec and
environment, `spec` / `environment` those of the run when the record holds one (None for several). `compare
--json` writes `kind: "comparison"` (report/compare.py comparison_document). One schema validates both:
`record_schema()`, generated from the declared result keys' JSON types; `python -m transbench.store.schema`
prints it (record.schema.json beside this module is that output, shipped with the package).

SCHEMA_VERSION rises when a key changes meaning or type, or leaves; new keys do not raise it (a reader ignores
keys it does not know; the schema allows them)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

SCHEMA_VERSION = 1
SCHEMA_ID = "https://github.com/transbench/transbench/record.schema.json"

_LISTS = {"repeat_medians_ms": {"type": "array", "items": {"type": "number"}},
          "busy_processes": {"type": "array", "items": {
              "type": "object", "required": ["pid", "name", "cores"],
              "properties": {"pid": {"type": "integer"}, "name": {"type": "string"}, "cores": {"type": "number"}}}}}


_JSON_TYPES = {"number": (int, float), "integer": (int,), "string": (str,), "object": (dict,)}


def list_problem(key: str, value) -> str | None:
    """What in a stored list-valued key breaks its declared schema (_LISTS), or None: the store's readers check it
    (store/db.py), so an export never writes a record its own schema refuses. Numbers must be finite and not
    below 0 (repeat medians are times)."""
    item = _LISTS[key]["items"]

    def fits(v, t: str) -> bool:
        return isinstance(v, _JSON_TYPES[t]) and not isinstance(v, bool) and (
            t not in ("number", "integer") or (math.isfinite(v) and v >= 0))

    if not isinstance(value, list):
        return f"{type(value).__name__}, not a list"
    for v in value:
        if not fits(v, item["type"]):
            return f"a list that holds {str(v)[:40]!r}, not a {item['type']}" + (
                " of 0 or more" if item["type"] in ("number", "integer") else "")
        for name in item.get("required", ()):
            if name not in v or not fits(v[name], item["properties"][name]["type"]):
                return f"a list whose entry {str(v)[:60]!r} has no {name} of type {item['properties'][name]['type']}"
    return None


def derived_types() -> dict[str, object]:
    """key -> JSON type of every declared result key, from the catalogue (keys.py); list-valued keys as a schema."""
    from ..keys import CATALOGUE

    return {k.name: _LISTS.get(k.name, k.type) for k in CATALOGUE}


def _nullable(t: object) -> dict:
    """A key's schema: its type, or null (a key that does not apply, or a figure the device cannot measure)."""
    if isinstance(t, dict):
        return {"anyOf": [t, {"type": "null"}]}
    return {"type": [t, "null"]}


def record_schema(types: Mapping[str, object] | None = None) -> dict:
    """The JSON Schema of every export (records and comparisons), from `types`: result key -> JSON type name
    ('number', 'integer', 'string', 'boolean') or a schema object; default derived_types()."""
    from ..keys import record_keys

    types = dict(derived_types() if types is None else types)
    cell = {"type": "object", "required": list(record_keys()),
            "properties": {k: _nullable(t) for k, t in types.items()}}
    gpu = {"type": "object", "properties": {
        "index": {"type": "integer"}, "name": {"type": "string"}, "uuid": {"type": ["string", "null"]},
        "memory_gb": {"type": "number"}}}
    environment = {"type": "object", "properties": {
        "python": {"type": "string"}, "platform": {"type": "string"}, "hostname": {"type": "string"},
        "git_commit": {"type": ["string", "null"]}, "cpu_model": {"type": ["string", "null"]},
        "cpu_count": {"type": ["integer", "null"]}, "cpu_threads": {"type": ["integer", "null"]},
        "load_avg": {"type": ["number", "null"]},
        "packages": {"type": "object", "additionalProperties": {"type": "string"}},
        "transbench": {"type": "string"}, "torch": {"type": "string"},
        "gpus": {"type": "array", "items": gpu}}}
    run = {"type": "object", "required": ["run_id", "name", "kind", "created", "spec", "environment"],
           "properties": {"run_id": {"type": "string"}, "name": {"type": "string"}, "kind": {"type": "string"},
                          "created": {"type": "string"}, "spec": {"type": "object"}, "environment": environment}}
    head = {"schema_version": {"const": SCHEMA_VERSION}, "transbench_version": {"type": "string"}}
    record = {"type": "object",
              "required": ["schema_version", "transbench_version", "kind", "spec", "environment", "runs", "cells"],
              "properties": {**head, "kind": {"const": "record"}, "spec": {"type": ["object", "null"]},
                             "environment": {"anyOf": [environment, {"type": "null"}]},
                             "runs": {"type": "array", "items": run}, "cells": {"type": "array", "items": cell}}}
    interval = {"anyOf": [{"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2},
                          {"type": "null"}]}
    number = {"type": ["number", "null"]}
    verdicts = ["faster", "slower", "same", "broken", "fixed", "n/a"]
    compared = {"type": "object",
                "required": ["scenario", "settings", "status_a", "status_b", "median_a_ms", "median_b_ms", "ratio",
                             "interval", "method", "verdict", "note", "n_a", "n_b"],
                "properties": {"scenario": {"type": ["string", "null"]}, "settings": {"type": "object"},
                               "status_a": {"type": "string"}, "status_b": {"type": "string"},
                               "median_a_ms": number, "median_b_ms": number, "ratio": number, "interval": interval,
                               "method": {"enum": ["blocks", "ranks", "repeats", None]},
                               "verdict": {"enum": verdicts}, "note": {"type": "string"},
                               "n_a": {"type": "integer"}, "n_b": {"type": "integer"},
                               "repeats_a": {"type": ["array", "null"], "items": {"type": "number"}},
                               "repeats_b": {"type": ["array", "null"], "items": {"type": "number"}}}}
    unmatched = {"type": "object", "required": ["side", "scenario", "settings", "status", "why"],
                 "properties": {"side": {"enum": ["A", "B"]}, "scenario": {"type": ["string", "null"]},
                                "settings": {"type": "object"}, "status": {"type": "string"},
                                "why": {"type": "string"}}}
    side = {"type": "object", "required": ["run_id", "name", "kind"],
            "properties": {"run_id": {"type": "string"}, "name": {"type": "string"}, "kind": {"type": "string"}}}
    comparison = {"type": "object",
                  "required": ["schema_version", "transbench_version", "kind", "run_a", "run_b", "alpha",
                               "min_effect", "counts", "regressions", "cells", "unmatched", "summary"],
                  "properties": {**head, "kind": {"const": "comparison"}, "run_a": side, "run_b": side,
                                 "alpha": {"type": "number"}, "min_effect": {"type": "number"},
                                 "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
                                 "regressions": {"type": "integer"}, "summary": {"type": "string"},
                                 "cells": {"type": "array", "items": compared},
                                 "unmatched": {"type": "array", "items": unmatched}}}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
            "title": "transbench record",
            "description": "What transbench's --json exports write: a versioned record of stored runs and their "
                           "cells (kind: record), or a comparison of two runs (kind: comparison).",
            "oneOf": [{"$ref": "#/$defs/record"}, {"$ref": "#/$defs/comparison"}],
            "$defs": {"record": record, "comparison": comparison, "cell": cell, "environment": environment}}


def version() -> str:
    from .. import __version__

    return __version__


def record_document(recs: list[dict], runs: list[dict], columns: list[str]) -> dict:
    """The versioned record of `recs` (each cut to `columns`), whose runs are `runs` (store rows: run_id, name,
    kind, created, spec, env)."""
    listed = [{"run_id": r["run_id"], "name": r["name"], "kind": r["kind"], "created": r["created"],
               "spec": r["spec"], "environment": r["env"]} for r in runs]
    one = listed[0] if len(listed) == 1 else None
    return {"schema_version": SCHEMA_VERSION, "transbench_version": version(), "kind": "record",
            "spec": one and one["spec"], "environment": one and one["environment"], "runs": listed,
            "cells": [{k: r.get(k) for k in columns} for r in recs]}


def main() -> None:
    print(json.dumps(record_schema(), indent=1))


if __name__ == "__main__":
    import os
    import sys

    try:
        main()
        sys.stdout.flush()
    except BrokenPipeError:  # `| head` read what it wanted: no traceback; fd 1 to /dev/null so the exit's flush is quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
