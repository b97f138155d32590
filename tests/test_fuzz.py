"""Fuzzing the parsers a user's files and strings reach: GazeHub label files and dataset specs. Whatever the
bytes, only the project's own clear errors may come out (a ``ValueError`` naming the spec or the file and line,
or ``FileNotFoundError``), never a ``TypeError``, ``IndexError``, ``UnicodeDecodeError`` or a traceback from
deep inside a library."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from alfa.gaze.data.fixtures import write_gazehub_fixture  # noqa: E402
from alfa.gaze.data.gazehub import GazeHubDataset  # noqa: E402
from alfa.gaze.data.registry import open_dataset  # noqa: E402

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

_CLEAR = (ValueError, FileNotFoundError)


@pytest.fixture(scope="module")
def gazehub_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gazehub")
    write_gazehub_fixture(root, "mpiifacegaze", persons=["p00", "p01"], images_per_person=3)
    return root


def _open_with_label(root: Path, tmp: Path, label: bytes) -> None:
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(root, tmp)
    (tmp / "Label" / "p01.label").write_bytes(label)
    GazeHubDataset(tmp, "mpiifacegaze", check_files=False)


def _names_the_culprit(error: Exception) -> bool:
    text = str(error)
    return "p01.label" in text or "Label" in text or "label" in text.lower()


huge_or_odd = st.sampled_from(["nan", "inf", "-inf", "1e309", "-1e400", "0x1f", "1,2,3", "", " ", "é", "\x00"])


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_a_mangled_label_file_gives_a_clear_error_or_loads(gazehub_root, tmp_path, data):
    good = (gazehub_root / "Label" / "p01.label").read_bytes()
    lines = good.split(b"\n")
    how = data.draw(st.sampled_from(["bytes", "cut", "line", "cell", "encoding"]))
    if how == "bytes":
        label = data.draw(st.binary(max_size=400))
    elif how == "cut":
        label = good[: data.draw(st.integers(0, len(good)))]
    elif how == "line":
        i = data.draw(st.integers(0, len(lines) - 1))
        lines[i] = data.draw(st.text(max_size=120)).encode("utf-8", "surrogatepass")
        label = b"\n".join(lines)
    elif how == "cell":
        i = data.draw(st.integers(1, len(lines) - 2))
        cells = lines[i].split(b" ")
        j = data.draw(st.integers(0, len(cells) - 1))
        cells[j] = data.draw(huge_or_odd).encode()
        lines[i] = b" ".join(cells)
        label = b"\n".join(lines)
    else:
        label = good.decode().encode(data.draw(st.sampled_from(["utf-16", "utf-32", "latin-1", "cp1252"])))
    try:
        _open_with_label(gazehub_root, tmp_path / "copy", label)
    except _CLEAR as e:
        assert _names_the_culprit(e), f"{how}: {e}"


spec_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=60)


@FUZZ
@given(kind=st.sampled_from(["synthetic", "gazehub", "xgaze", "toy", ""]), rest=spec_text, query=spec_text)
def test_any_dataset_spec_gives_a_clear_error(kind, rest, query):
    spec = f"{kind}:{rest}?{query}" if query else f"{kind}:{rest}"
    try:
        open_dataset(spec)
    except _CLEAR as e:
        assert spec in str(e) or "dataset" in str(e) or "domain" in str(e), str(e)
    except MemoryError:  # a generated world of absurd size: refused by the system, not a parser bug
        pass
