"""The library works with its own dependencies alone (torch, numpy, safetensors).

A child interpreter is started with an import hook that makes the gaze application's and the study's
packages, and every package only they need, unimportable; the library then runs its whole life cycle
on a model: truncate, attach, one training step, save the adapter, load it into a fresh copy, merge.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

try:  # the standard library from Python 3.11; tomli (the dev extra's, on 3.10) is the same parser
    import tomllib
except ModuleNotFoundError:
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent

# Everything the library must do without: the application's and the study's dependencies, the optional
# extras, and the packages above the library.
BLOCKED = (
    "matplotlib",
    "h5py",
    "kornia",
    "PIL",
    "tqdm",
    "transformers",
    "peft",
    "onnx",
    "onnxruntime",
    "alfa.gaze",
    "alfa.study",
    "alfa.cli",
)

# None in sys.modules is Python's own "not installed": import raises ModuleNotFoundError and
# importlib.util.find_spec answers None, so optional-dependency probes (torch's among them) see it absent.
HOOK = f"""
import sys
BLOCKED = {BLOCKED!r}
for name in BLOCKED:
    assert name not in sys.modules, name
    sys.modules[name] = None
"""

LIFE_CYCLE = """
import tempfile, torch, alfa
from pathlib import Path
for name in ("tqdm", "matplotlib", "alfa.gaze"):
    try:
        __import__(name)
    except ModuleNotFoundError:
        pass
    else:
        raise SystemExit(f"{name} was importable: the hook does not hold")
torch.manual_seed(0)
model = alfa.models.resnet18_gaze()
# the first stage and the head: the whole life cycle, without the SVDs of every layer (the suite's time)
TARGET = "layer1|fc"
alfa.truncate(model, rank=16, target=TARGET)
alfa.attach(model, alfa.AlfaConfig(heads=2, rank=4))
x = torch.randn(2, 3, 32, 32)
opt = torch.optim.SGD(alfa.param_groups(model, lr=0.1), lr=0.1)
model.eval()  # BatchNorm keeps the base's statistics: the adapter file does not hold them
loss = model(x).square().mean()
loss.backward()
opt.step()
with torch.no_grad():
    want = model(x)
with tempfile.TemporaryDirectory() as d:
    path = Path(d) / "user.safetensors"
    alfa.save_adapter(model, path)
    torch.manual_seed(0)
    fresh = alfa.models.resnet18_gaze()
    alfa.truncate(fresh, rank=16, target=TARGET)
    fresh.load_state_dict({k: v for k, v in model.state_dict().items() if "adapter" not in k}, strict=False)
    alfa.load_adapter(fresh, path)
fresh.eval()
with torch.no_grad():
    loaded = fresh(x)
    alfa.merge(fresh)
    merged = fresh(x)
assert torch.allclose(loaded, want, atol=1e-5), (loaded - want).abs().max()
assert torch.allclose(merged, want, atol=1e-4), (merged - want).abs().max()
loaded = [m for m in sys.modules if sys.modules[m] is not None and m.startswith(BLOCKED)]
assert not loaded, loaded
print("library alone: ok")
"""


def _run(body: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    # this checkout's alfa wherever the child runs (a relative PYTHONPATH would name another folder's)
    paths = [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    command = [sys.executable, "-c", HOOK + textwrap.dedent(body)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


# The packages of the gaze extra (``pip install -e ".[gaze]"``, which the study extra installs too).
EXTRA_PACKAGES = ("kornia", "tqdm", "matplotlib", "h5py", "PIL")

COMMANDS_WITHOUT_EXTRAS = """
import contextlib, io, sys
from alfa.cli import main

assert main(["summary", "--rank", "0"]) == 0
listing = io.StringIO()
with contextlib.redirect_stdout(listing), contextlib.suppress(SystemExit):
    main(["--help"])
assert all(name in listing.getvalue() for name in ("summary", "personalize", "bench", "crate")), listing.getvalue()
for argv in (
    ["personalize", "--checkpoint", "base.safetensors", "--data", "synthetic:mpii"],
    ["evaluate", "--checkpoint", "base.safetensors", "--data", "synthetic:mpii", "--json", "e.json"],
    ["tpgaze", "personalize", "--checkpoint", "base.safetensors", "--data", "synthetic:mpii"],
    ["bench", "--quick"],
    ["costs"],
    ["crate", "gaze", "--out", "crate"],
):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(argv) == 2, argv
    print(err.getvalue(), end="")
"""

COMMANDS = "---- the commands without the extras ----"

# One interpreter makes both checks (each start costs seconds of imports): the life cycle under HOOK, whose failure
# is reported and does not stop the rest (alfa is then imported again); then, with only the gaze extra's packages
# still absent (nothing of what HOOK blocked was imported, so this is the state a fresh interpreter with those
# packages blocked starts in), the commands, whose failure is the interpreter's exit status.
BOTH = f"""
import traceback
try:
    exec({LIFE_CYCLE!r})
except BaseException:
    traceback.print_exc()
    for name in [m for m, module in sys.modules.items() if module and (m + ".").startswith("alfa.")]:
        del sys.modules[name]  # what a failed import left: the commands import alfa afresh
print({COMMANDS!r}, flush=True)
for name in BLOCKED:
    if name not in {EXTRA_PACKAGES!r}:
        assert sys.modules.pop(name) is None, name
exec({COMMANDS_WITHOUT_EXTRAS!r})
"""


@pytest.mark.slow
def test_the_library_runs_alone_and_without_the_extras_each_command_works_or_names_its_extra(tmp_path):
    """Both checks of one launch, in one test (two tests of one module fixture ran it in each of the suite's two
    workers now and then): the life cycle under the hook, then each command without the extras' packages."""
    assert set(EXTRA_PACKAGES) <= set(BLOCKED)  # still blocked in the second part
    done = _run(BOTH, cwd=tmp_path)
    life_cycle, _, commands = done.stdout.partition(COMMANDS + "\n")
    assert "library alone: ok\n" in life_cycle, done.stderr[-3000:]

    assert done.returncode == 0 and COMMANDS in done.stdout, done.stderr[-3000:]
    assert "truncated at rank" not in commands and "resnet18_gaze (dense)" in commands
    lines = commands.splitlines()[-6:]
    extras = ["gaze", "gaze", "gaze", "study", "study", "study"]
    names = ["personalize", "evaluate", "tpgaze personalize", "bench", "costs", "crate gaze"]
    for line, name, extra in zip(lines, names, extras):
        assert line.startswith(f"alfa {name}: error: this command needs "), line
        assert (
            f'which is not installed: install alfa\'s {extra} extra (in the alfa folder: pip install -e ".[{extra}]"'
            in line
        ), line
        assert any(f"needs {p}," in line for p in EXTRA_PACKAGES), line
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written


def test_the_hook_blocks_the_application_so_the_check_can_fail():
    """The library imported, then its own code reaching for the application (an import run in alfa's namespace, as
    a library module's would): it fails, so the life cycle's check fails where the library needs the application.
    (A bare ``import alfa.gaze.train`` proved less: it fails on the blocked parent without importing alfa.)"""
    done = _run("import alfa\nassert 'torch' in sys.modules\nexec('from . import gaze', vars(alfa))\n")
    assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr, done.stderr[-2000:]
    assert "import of alfa.gaze halted; None in sys.modules" in done.stderr


def test_installing_the_library_alone_asks_for_torch_numpy_and_safetensors_only():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = {req.split(">")[0].split("=")[0].split("[")[0].strip().lower() for req in project["dependencies"]}
    assert names == {"torch", "numpy", "safetensors"}
    extras = project["optional-dependencies"]
    assert {"gaze", "study", "hf", "export"} <= set(extras)
    gaze = {req.split(">")[0].lower() for req in extras["gaze"]}
    assert {"matplotlib", "h5py", "kornia", "pillow", "tqdm"} <= gaze


def test_the_cli_knows_the_extra_of_every_optional_package():
    from alfa.cli.registry import PACKAGE_EXTRAS

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    import_names = {"pillow": "PIL"}
    for extra in ("gaze", "hf", "export"):
        for requirement in extras[extra]:
            name = requirement.split(">")[0].split("=")[0].split("[")[0].strip()
            assert PACKAGE_EXTRAS[import_names.get(name, name)] == extra, name
