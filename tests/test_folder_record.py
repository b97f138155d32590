"""personalization.json has one owner (alfa.gaze.folder_record): it writes the record atomically with its version,
reads back what it wrote and the records written before the version existed, and refuses a damaged record or one
of another version in one line naming the file."""

import json

import pytest

from alfa.gaze.calibrate import earlier_run
from alfa.gaze.folder_record import RECORD_FILE, RECORD_VERSION, read_record, write_record
from alfa.gaze.personalize import PersonalizationRun, PersonOutcome, foreign_adapters, listed_files


def _run() -> dict:
    """A personalization run's record as PersonalizationRun writes it."""
    outcome = PersonOutcome("p0", "ok", adapter="p0.safetensors", losses=[0.5, 0.25], final_loss=0.25, seconds=1.0)
    run = PersonalizationRun("mpii", "alfa", {"rank": 2}, {"n_adapt": 3, "lr": 0.01}, {"p0": outcome})
    run.written = {"p0.safetensors", "p0.json"}
    return run.to_dict()


def test_a_record_reads_back_as_written_with_its_version(tmp_path):
    path = write_record(tmp_path, _run())
    assert path == tmp_path / RECORD_FILE and [p.name for p in tmp_path.iterdir()] == [RECORD_FILE]  # no temporary
    assert json.loads(path.read_text(encoding="utf-8"))["version"] == RECORD_VERSION == 1
    assert read_record(tmp_path) == {"version": 1, **_run()}
    assert listed_files(tmp_path) == {"p0.safetensors", "p0.json", RECORD_FILE}
    assert read_record(tmp_path / "none") is None and listed_files(tmp_path / "none") == set()


def test_records_written_before_the_version_still_read(tmp_path):
    """The two formats the writers used until now, written as they wrote them (json.dumps, indent 2, no version)."""
    personalization, calibration = tmp_path / "p", tmp_path / "c"
    personalization.mkdir(), calibration.mkdir()
    (personalization / RECORD_FILE).write_text(json.dumps(_run(), indent=2) + "\n", encoding="utf-8")
    old = {"dataset": "mpii", "method": "calibrate:bias", "persons": {"p0": {"status": "ok", "labelled": [1, 2]}}}
    old["config"] = {"n_adapt": 4, "k": 2}
    (calibration / RECORD_FILE).write_text(json.dumps(old, indent=2) + "\n", encoding="utf-8")
    assert read_record(personalization) == _run() and read_record(calibration) == old
    assert listed_files(personalization) == {"p0.safetensors", "p0.json", RECORD_FILE}
    assert listed_files(calibration) == {"p0.safetensors", "p0.json", RECORD_FILE}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{not json", "Expecting property name"),
        ("[1, 2]", "a JSON list, not an object"),
        ('{"my": "notes"}', "it lists no persons"),
        ('{"persons": {"p0": 3}}', "its persons are not a mapping of person to entry"),
        ('{"persons": {}, "config": [1]}', "its config is not a mapping"),
        ('{"persons": {}, "written": "p0.json"}', "its written files are not a list of names"),
    ],
)
def test_a_damaged_record_is_one_line_naming_the_file(tmp_path, text, why):
    (tmp_path / RECORD_FILE).write_text(text, encoding="utf-8")
    with pytest.raises(ValueError) as e:
        read_record(tmp_path)
    message = str(e.value)
    assert message.startswith(f"{tmp_path / RECORD_FILE} is not a personalization record alfa wrote (")
    assert why in message and "\n" not in message
    with pytest.raises(ValueError, match="is not a personalization record alfa wrote .*; move it away$"):
        listed_files(tmp_path)  # what --replace would remove: nothing, the user moves the file


@pytest.mark.parametrize("version", [2, "1", True, 1.0, None])
def test_a_record_of_another_version_is_refused_by_its_readers(tmp_path, version):
    (tmp_path / RECORD_FILE).write_text(json.dumps({**_run(), "version": version}), encoding="utf-8")
    said = f"{tmp_path / RECORD_FILE} is a personalization record of version {json.dumps(version)}, which this alfa "
    with pytest.raises(ValueError, match="^" + said.replace(".", r"\.").replace("(", r"\(")):
        read_record(tmp_path)
    # the readers that say why a folder is not for this run: they refuse before they look at the data or the model
    assert earlier_run(tmp_path, None, None).startswith(said)
    assert foreign_adapters(None, None, None, None, tmp_path).startswith(said)


def test_a_reader_of_the_recipe_alone_takes_a_record_without_persons(tmp_path):
    (tmp_path / RECORD_FILE).write_text('{"config": {"n_adapt": 3}}', encoding="utf-8")
    assert read_record(tmp_path, need_persons=False) == {"config": {"n_adapt": 3}}
    with pytest.raises(ValueError, match="it lists no persons"):
        read_record(tmp_path)
