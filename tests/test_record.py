"""The typed benchmark record and the results' schema: every committed record loads and writes back as it was,
bad keys are refused by name, and the hash schema reproduces the committed hashes it can recompute."""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from alfa.fileio import write_json
from alfa.study.bench import schema
from alfa.study.bench.config import BenchConfig
from alfa.study.bench.plan import plan_records
from alfa.study.bench.record import OPTIONAL, REQUIRED, Record
from alfa.study.bench.results import RESULTS_FILE, ResultsStore, load_results

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = {
    "standard": ROOT / "docs/data/bench-standard/results.json",
    "flip": ROOT / "docs/data/bench-flip/results.json",
}


@pytest.fixture(scope="module", params=sorted(COMMITTED))
def committed(request):
    path = COMMITTED[request.param]
    return request.param, path, json.loads(path.read_text(encoding="utf-8"))


def test_every_committed_record_reads_and_writes_back_as_it_was(committed):
    _, _, data = committed
    assert data["records"]
    for stored in data["records"]:
        record = Record.from_dict(stored)
        again = record.to_dict()
        assert again == stored, stored["id"]
        assert list(again) == list(stored), stored["id"]  # the same key order: the same JSON text


def test_the_committed_file_is_what_the_writer_writes_from_its_records(committed, tmp_path):
    _, path, data = committed
    rewritten = {**data, "records": [Record.from_dict(r).to_dict() for r in data["records"]]}
    write_json(tmp_path / RESULTS_FILE, rewritten)
    assert (tmp_path / RESULTS_FILE).read_bytes() == path.read_bytes()


def test_a_record_with_a_missing_or_an_unknown_key_is_refused_by_name(tmp_path):
    stored = json.loads(COMMITTED["standard"].read_text(encoding="utf-8"))["records"][0]
    with pytest.raises(ValueError, match=r"record 'source-only\|E→M\|seed0': missing required key\(s\) 'wall_s'"):
        Record.from_dict({k: v for k, v in stored.items() if k != "wall_s"})
    with pytest.raises(ValueError, match=r"unknown key\(s\) 'error_dge'"):
        Record.from_dict({**stored, "error_dge": 1.0})
    with pytest.raises(ValueError, match="a record without an id: missing required key"):
        Record.from_dict({})
    data = json.loads(COMMITTED["standard"].read_text(encoding="utf-8"))
    data["records"][3] = {k: v for k, v in data["records"][3].items() if k != "per_person"}
    (tmp_path / RESULTS_FILE).write_text(json.dumps(data))
    with pytest.raises(
        ValueError, match=r"results.json: record 3: record '.*': missing required key\(s\) 'per_person'"
    ):
        load_results(tmp_path)


def test_optional_keys_stay_absent_and_a_stored_null_stays_null():
    stored = json.loads(COMMITTED["flip"].read_text(encoding="utf-8"))["records"][0]
    assert stored["kind"] == "selection" and "per_person_parts" not in stored
    record = Record.from_dict(stored)
    assert record.per_person_parts is None and "per_person_parts" not in record.to_dict()
    nulled = {**stored, "paper_recipe_deg": None}  # a selection whose grid lacks the paper's recipe
    assert Record.from_dict(nulled).to_dict() == nulled
    assert set(REQUIRED) | set(OPTIONAL) == set(Record.__dataclass_fields__) - {"nulls"}


def test_the_hash_schema_reproduces_the_committed_hashes_it_can_recompute(committed, monkeypatch):
    """An in-domain record's hash needs no rendered data (it names its held-out set by its spec), so it is
    recomputed here from the committed source models' cache keys. The standard results were scored with
    SCORING 2 (before what a flip sees was measured); everything else in their hashes is today's."""
    name, _, data = committed
    if name == "standard":
        monkeypatch.setattr(schema, "SCORING", 2)
    config = BenchConfig.first_standard()
    plans = {p.id: p for p in plan_records(config)}
    in_domain = [r for r in data["records"] if r["kind"] == "in-domain"]
    assert len(in_domain) >= 12
    for r in in_domain:
        cache = Path(data["sources"][f"{r['source']}|seed{r['seed']}"]["cache"]).name
        source_model = cache.removeprefix("source-")
        hashed = schema.config_hash(config, plans[r["id"]], source_model, None, torch.device("cpu"))
        assert hashed == r["config_hash"], r["id"]
    other = schema.config_hash(config, plans[in_domain[0]["id"]], "x", None, torch.device("cuda"))
    assert other != schema.config_hash(config, plans[in_domain[0]["id"]], "x", None, torch.device("cpu"))


def test_the_committed_results_open_for_their_preset(tmp_path):
    """A run of the preset may write to a copy of the committed results: the stored configuration compares
    equal although it predates the training option ``precision`` (left out at its default)."""
    shutil.copy(COMMITTED["standard"], tmp_path / RESULTS_FILE)
    store = ResultsStore(tmp_path, BenchConfig.first_standard())
    done = store.done()
    assert len(done) == 684 and all(len(h) == 16 for h in done.values())
    data = json.loads((tmp_path / RESULTS_FILE).read_text())
    data["config"]["pretrain"]["precision"] = "fp32"  # the default spelled out compares equal too
    (tmp_path / RESULTS_FILE).write_text(json.dumps(data))
    ResultsStore(tmp_path, BenchConfig.first_standard())
    data["config"]["pretrain"]["precision"] = "bf16"
    (tmp_path / RESULTS_FILE).write_text(json.dumps(data))
    with pytest.raises(ValueError, match="the folder's vs this run's: pretrain.precision 'bf16' vs its default"):
        ResultsStore(tmp_path, BenchConfig.first_standard())


def test_a_results_file_is_written_one_record_per_line_and_reads_back_equal(committed, tmp_path):
    """The store's layout (``write_json(..., compact_list="records")``): the same JSON value as the indented
    file, each record on one line of its own, NaN as null, and an empty list still a valid file."""
    _, path, data = committed
    write_json(tmp_path / "a.json", data, compact_list="records")
    text = (tmp_path / "a.json").read_text(encoding="utf-8")
    assert json.loads(text) == data and len(text) < 0.8 * path.stat().st_size
    lines = text.splitlines()
    start = lines.index('"records":[')
    assert [json.loads(line.rstrip(",")) for line in lines[start + 1 : -1]] == data["records"]
    write_json(tmp_path / "b.json", {"format": "x", "records": [{"v": float("nan")}], "n": 1}, compact_list="records")
    assert json.loads((tmp_path / "b.json").read_text()) == {"format": "x", "n": 1, "records": [{"v": None}]}
    write_json(tmp_path / "c.json", {"records": []}, compact_list="records")
    assert json.loads((tmp_path / "c.json").read_text()) == {"records": []}
    write_json(tmp_path / "d.json", {'a "b"': [1], "x": 2}, compact_list='a "b"')  # a key JSON must escape
    assert json.loads((tmp_path / "d.json").read_text()) == {'a "b"': [1], "x": 2}
    with pytest.raises(TypeError, match="'records' must name a list"):
        write_json(tmp_path / "e.json", {"records": {"id": 1}}, compact_list="records")
    assert not (tmp_path / "e.json").exists()


def test_the_exported_copy_is_the_same_results_in_the_one_record_per_line_layout(committed, tmp_path, capsys):
    from alfa.study.bench.results import export_results

    _, path, data = committed
    (tmp_path / "run").mkdir()
    shutil.copy(path, tmp_path / "run" / RESULTS_FILE)
    export_results(tmp_path / "run", tmp_path / "all")
    everything = (tmp_path / "all" / RESULTS_FILE).read_text(encoding="utf-8")
    assert json.loads(everything) == data and '\n"records":[\n{"id":' in everything
    # keeping a kept copy does not depend on how many records it holds: the first three of them (each of the
    # five exports below would read and write all of a file of megabytes)
    data = {**data, "records": data["records"][:3]}
    write_json(tmp_path / "run" / RESULTS_FILE, data)
    export_results(tmp_path / "run", tmp_path / "kept")
    kept = (tmp_path / "kept" / RESULTS_FILE).read_text(encoding="utf-8")
    assert json.loads(kept) == data
    # a run started afresh (fewer records than are kept) does not replace the kept copy, when asked to keep it
    fewer = {**data, "records": data["records"][1:]}
    (tmp_path / "run" / RESULTS_FILE).write_text(json.dumps(fewer))
    with pytest.raises(ValueError, match=f"lacks 1 of the records kept in .*{re.escape(data['records'][0]['id'])}"):
        export_results(tmp_path / "run", tmp_path / "kept", keep_kept=True)
    assert (tmp_path / "kept" / RESULTS_FILE).read_text(encoding="utf-8") == kept
    # `alfa report --data-to` keeps them too: one line, a non-zero status, the kept copy as it was
    from alfa.cli import main

    export_results(tmp_path / "run", tmp_path / "first")  # a kept copy with every record, then the run loses one
    (tmp_path / "first" / RESULTS_FILE).write_text(kept, encoding="utf-8")
    argv = ["report", "--results", str(tmp_path / "run"), "--out", str(tmp_path / "p.md")]
    capsys.readouterr()
    assert main([*argv, "--data-to", str(tmp_path / "first")]) != 0
    err = capsys.readouterr().err.strip()
    assert "lacks 1 of the records kept in" in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert (tmp_path / "first" / RESULTS_FILE).read_text(encoding="utf-8") == kept
    assert not (tmp_path / "p.md").exists()
    export_results(tmp_path / "run", tmp_path / "kept")  # not asked to: replaced
    assert json.loads((tmp_path / "kept" / RESULTS_FILE).read_text()) == fewer
