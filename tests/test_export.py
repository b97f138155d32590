"""Export of a personalized model: ONNX checked against onnxruntime (≤ 1e-5 relative), torch.export, the CLI."""

from __future__ import annotations

import copy
import logging
import warnings
from types import SimpleNamespace

import pytest
import torch
from tiny_models import MicroGazeNet, TinyGazeNet, truncated_structure

import alfa
from alfa.adapters import adapter_parameters

pytest.importorskip("onnxscript")
onnxruntime = pytest.importorskip("onnxruntime")


def _personalized(config, seed=1, model="resnet18", std=0.2):
    """A truncated base and a copy with ``config``'s adapter from a non-trivial init (normal, ``std``: large enough
    that a dropped adapter moves the outputs far beyond the checks' 1e-5; at 0.02 Alfa moved ResNet-18's by 2e-5).
    ``model``: ResNet-18 (the first test's: the real model exports), the small registered "tiny" net (several
    adapted layers) or the "micro" one (one adapted layer: the fewest operators, so the quickest export, for tests
    of what happens around an export, whose path does not depend on the model)."""
    torch.manual_seed(0)
    if model == "resnet18":  # truncate's structure with random factors: an export does not read the weights' values
        model = truncated_structure(alfa.models.resnet18_gaze().eval(), 16)
    else:
        model = {"tiny": TinyGazeNet, "micro": MicroGazeNet}[model]().eval()
        alfa.truncate(model, 4)
    base = copy.deepcopy(model)
    torch.manual_seed(seed)
    alfa.attach(model, config)
    with torch.no_grad():
        for p in adapter_parameters(model).values():
            p.normal_(0, std)
    return base, model


@pytest.mark.slow
def test_onnx_of_a_personalized_model_matches_pytorch_and_onnxruntime(tmp_path):
    from alfa.export import export_onnx, export_program

    base, model = _personalized(alfa.AlfaConfig(heads=2, rank=2))
    check = export_onnx(model, tmp_path / "user.onnx", (32, 32), batch_sizes=(1, 3))
    assert check.relative_difference is not None and check.relative_difference <= 1e-5
    session = onnxruntime.InferenceSession(str(tmp_path / "user.onnx"), providers=["CPUExecutionProvider"])
    x = torch.rand(5, 3, 32, 32)  # another batch size than exported with: the batch axis is dynamic
    with torch.no_grad():
        ours = model(x)  # the unmerged model: the export merged a copy
        assert float((ours - base(x)).norm() / ours.norm()) > 1e-3  # an export without the adapter fails below
    theirs = torch.from_numpy(session.run(None, {"images": x.numpy()})[0])
    assert float((theirs - ours).norm() / ours.norm()) < 1e-5
    assert alfa.adapter_state(model) is not None  # the user's model itself was not merged
    program = export_program(model, (32, 32))  # same bytes under any name: test_alfa_export_program_is_the_same_…
    assert torch.allclose(program.module()(x), ours, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_lora_needs_a_merge_form_and_a_bad_export_leaves_nothing(tmp_path):
    from alfa.export import export_onnx

    _, model = _personalized(alfa.LoraConfig(rank=2), model="micro")
    with pytest.raises(ValueError, match="choose a form, 'extend'"):
        export_onnx(model, tmp_path / "a.onnx", (32, 32))
    assert not (tmp_path / "a.onnx").exists()
    assert export_onnx(model, tmp_path / "a.onnx", (32, 32), form="extend").relative_difference <= 1e-5
    assert "alfa export --merge extend|densify" in _export_error(tmp_path, model, [])
    for adapter in ("alfa", None):  # a --merge that would be ignored (it was: the file was not what was asked)
        alfa_user = _personalized(alfa.AlfaConfig(heads=2, rank=2), model="micro")[1] if adapter else None
        err = _export_error(tmp_path, alfa_user or model, ["--merge", "densify"], adapter=adapter is not None)
        merge = "factorized (rank d)" if adapter else "none: no --adapter"
        assert "--merge densify is for an adapter on a truncated base whose merge cannot keep the base's rank" in err
        assert f"this one merges without it ({merge}): leave --merge out" in err
    with pytest.raises(RuntimeError, match="differs from PyTorch's .* > -1; .*b.onnx was not written"):
        export_onnx(model, tmp_path / "b.onnx", (32, 32), form="extend", tolerance=-1)
    assert not (tmp_path / "b.onnx").exists() and not list(tmp_path.glob(".*tmp*"))


def _export_error(tmp_path, user, options, adapter=True) -> str:
    """The one line ``alfa export`` of ``user`` (its base and adapter saved) with ``options`` ends in."""
    import contextlib
    import io

    from alfa.checkpoint import save_model
    from alfa.cli import main

    base = copy.deepcopy(user)
    alfa.detach(base)
    save_model(tmp_path / "e-base.safetensors", base, "micro_gaze_net")
    alfa.save_adapter(user, tmp_path / "e-user.safetensors")
    argv = ["export", "--checkpoint", str(tmp_path / "e-base.safetensors"), "--image-size", "32", "32"]
    argv += ["--adapter", str(tmp_path / "e-user.safetensors")] * adapter + ["--out", str(tmp_path / "e.onnx")]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main([*argv, *options]) == 2
    assert not (tmp_path / "e.onnx").exists() and err.getvalue().count("\n") == 1
    return err.getvalue()


def _export_argv(tmp_path) -> tuple[list[str], torch.nn.Module]:
    """``alfa export`` of a saved base (no recorded input size) with one user's Alfa adapter, without ``--out``;
    and the personalized model it should equal."""
    from alfa.checkpoint import save_model

    base, model = _personalized(alfa.AlfaConfig(heads=2, rank=2), model="micro")
    save_model(tmp_path / "base.safetensors", base, "micro_gaze_net")
    alfa.save_adapter(model, tmp_path / "u.safetensors")
    argv = ["export", "--checkpoint", str(tmp_path / "base.safetensors"), "--adapter", str(tmp_path / "u.safetensors")]
    return argv, model


def test_alfa_export_asks_for_the_input_size_a_checkpoint_does_not_record(tmp_path, capsys):
    """(The export itself, with ``--image-size``, is the next test's.)"""
    from alfa.cli import main

    argv, _ = _export_argv(tmp_path)
    assert main([*argv, "--out", str(tmp_path / "u.onnx")]) == 2
    assert "pass --image-size H W" in capsys.readouterr().err
    assert not (tmp_path / "u.onnx").exists()


class _Records(logging.Handler):
    """Every log line of WARNING or above from torch's loggers (what their handlers show a person; each of torch's
    loggers that keeps its records to itself gets this handler too), as text."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []
        self.loggers = [logging.getLogger("torch")] + [
            logger
            for name, logger in logging.root.manager.loggerDict.items()
            if name.startswith(("torch.", "onnx")) and isinstance(logger, logging.Logger) and not logger.propagate
        ]

    def emit(self, record):
        self.lines.append(record.getMessage())

    def __enter__(self):
        for logger in self.loggers:
            logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        for logger in self.loggers:
            logger.removeHandler(self)


def _exporter_noise(argv):
    """Run ``alfa`` on ``argv``: its exit status, its stdout and stderr, and what the exporter said through
    Python's warnings and torch's loggers."""
    import contextlib
    import io

    from alfa.cli import main

    out, err = io.StringIO(), io.StringIO()
    with warnings.catch_warnings(record=True) as said, _Records() as logged:
        warnings.simplefilter("always")  # every warning, each time, so that none hides behind an earlier test's
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(argv)
    return status, out.getvalue(), err.getvalue(), [f"{w.category.__name__}: {w.message}" for w in said] + logged.lines


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """One user's model through ``alfa export --program`` twice, under two names: "a" as a person runs it, "b"
    with --verbose (which changes what is shown, not what is written). The next two tests read these runs (an
    export is seconds): each run's status, stdout, stderr and exporter noise; torch's log level before and after."""
    folder = tmp_path_factory.mktemp("export")
    argv, model = _export_argv(folder)
    argv += ["--image-size", "32", "32"]
    levels = [logging.getLogger("torch").level]
    runs = {}
    for name, options in (("a", []), ("b", ["--verbose"])):
        outputs = ["--out", str(folder / f"{name}.onnx"), "--program", str(folder / f"{name}.pt2")]
        runs[name] = _exporter_noise([*argv, *outputs, *options])
    levels.append(logging.getLogger("torch").level)
    return SimpleNamespace(folder=folder, model=model, runs=runs, torch_levels=levels)


@pytest.mark.slow
def test_alfa_export_prints_its_outcome_and_not_the_exporters_warnings(exported):
    folder = exported.folder
    # The premise, so that the check below can fail: this exporter does warn (deprecations, log lines), and
    # --verbose lets it.
    status, out, err, noise = exported.runs["b"]
    assert status == 0 and noise, (out, err)

    status, out, err, noise = exported.runs["a"]  # (the ONNX export and the program's, both quiet)
    # the base records no input size: the one line on stderr is alfa's note that --image-size was not checked
    assert status == 0 and noise == [] and err.startswith("alfa export: note: ") and err.count("\n") == 1, (noise, err)
    assert out.startswith(f"wrote {folder / 'a.onnx'}; onnxruntime vs PyTorch on batches of 1, 7:")
    assert out.count("\n") == 2 and out.endswith(f"\nwrote {folder / 'a.pt2'} (torch.export; dynamic batch)\n")
    assert exported.torch_levels[0] == exported.torch_levels[1]  # the loggers are as they were
    session = onnxruntime.InferenceSession(str(folder / "a.onnx"), providers=["CPUExecutionProvider"])
    x = torch.rand(3, 3, 32, 32)
    with torch.no_grad():
        ours = exported.model(x)
    theirs = torch.from_numpy(session.run(None, {"images": x.numpy()})[0])
    assert float((theirs - ours).norm() / ours.norm()) < 1e-5


class _DataDependent(torch.nn.Module):
    """A model torch.export cannot capture: its branch depends on the values of its input."""

    def forward(self, x):
        return x.mean((2, 3))[:, :2] if x.sum() > 0 else -x.mean((2, 3))[:, :2]


@pytest.mark.slow
def test_a_failed_export_is_one_line_and_a_non_zero_status(tmp_path, monkeypatch):
    from alfa.checkpoint import save_model

    save_model(tmp_path / "base.safetensors", MicroGazeNet(), "micro_gaze_net")  # any base: its merge is replaced
    monkeypatch.setattr("alfa.export.merged_copy", lambda model, form=None: _DataDependent().eval())
    argv = ["export", "--checkpoint", str(tmp_path / "base.safetensors"), "--image-size", "32", "32"]
    status, out, err, noise = _exporter_noise([*argv, "--out", str(tmp_path / "u.onnx")])
    assert status == 2 and out == "" and noise == []
    assert err.startswith(
        "alfa export: error: the model could not be exported to ONNX: Could not guard on data-dependent expression"
    )
    assert err.endswith("(--verbose shows the exporter's own log)\n") and err.count("\n") == 1, err
    assert "\x1b[" not in err and sorted(p.name for p in tmp_path.iterdir()) == ["base.safetensors"]


@pytest.mark.slow
def test_a_module_of_two_named_inputs_exports_and_every_submodule_keeps_its_mode(tmp_path):
    """export_onnx_with_inputs took any module's inputs as MixedBatchModel's (images, *mixes): forward(x, y) was
    refused by torch's dynamic shapes. And a train-mode wrapper's eval-mode model came back in train mode."""
    from alfa.export import export_onnx_with_inputs

    class Two(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Dropout(0.5)).eval()

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return self.inner(x) * y

    two = Two()  # the wrapper in train mode, the model it holds in eval mode
    inputs = (torch.rand(2, 4), torch.rand(2, 3))
    export_onnx_with_inputs(two, tmp_path / "two.onnx", inputs, ["x", "y"])
    assert two.training and not two.inner.training and not two.inner[1].training
    session = onnxruntime.InferenceSession(str(tmp_path / "two.onnx"), providers=["CPUExecutionProvider"])
    x, y = torch.rand(5, 4), torch.rand(5, 3)  # another batch size: both axes dynamic
    theirs = torch.from_numpy(session.run(None, {"x": x.numpy(), "y": y.numpy()})[0])
    with torch.no_grad():
        torch.testing.assert_close(theirs, two.inner(x) * y, rtol=1e-5, atol=1e-6)


def test_the_multi_user_model_exports_with_each_layers_mix_as_an_input(tmp_path):
    """Dictionary users only: the per-sample mixes are inputs, so one ONNX graph serves any mix of users."""
    from alfa.export import export_onnx_with_inputs
    from alfa.serve import MixedBatchModel

    base, _ = _personalized(alfa.AlfaConfig(heads=2, rank=2), model="tiny")
    served = alfa.MultiUserModel(base)
    for i in range(3):  # std 0.5: each user moves the tiny net's outputs well beyond the checks' 1e-5
        served.add_user(f"u{i}", _personalized(alfa.AlfaConfig(heads=2, rank=2), 10 + i, "tiny", std=0.5)[1])
    mixed = MixedBatchModel(base)
    users = ["u0", "u2", None, "u1"]
    x = torch.rand(4, 3, 32, 32)
    inputs = (x, *mixed.mixes(served, users))
    with torch.no_grad():
        assert torch.allclose(mixed(*inputs), served(x, users), rtol=1e-6, atol=1e-7)
        alone = served(x, [None] * len(users))
        for i, user in enumerate(users):  # a user's mix left out would show
            moved = float((served(x, users)[i] - alone[i]).norm() / alone[i].norm())
            assert moved > 2e-5 if user is not None else moved < 1e-7, (user, moved)
    assert all(layer.mix is None for layer in mixed._layers.values())  # no batch's mix kept past its call
    # strict torch.export traces the call without the lock threads share it by (a Python lock it would refuse)
    program = torch.export.export(mixed, inputs, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(program.module()(*inputs), mixed(*inputs))
    names = ["images", *[f"mix_{i}" for i in range(len(inputs) - 1)]]
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        export_onnx_with_inputs(mixed, tmp_path / "all.onnx", inputs, names)
    # torch warned that the mixes, set on the layers as attributes, "must be registered as buffers"
    assert not [w for w in said if "assigned during export" in str(w.message)]
    session = onnxruntime.InferenceSession(str(tmp_path / "all.onnx"), providers=["CPUExecutionProvider"])
    later = ["u1", "u1", "u0", None, "u2", "u0", "u2"]  # another batch, other users: the same graph
    x2 = torch.rand(len(later), 3, 32, 32)
    feed = dict(zip(names, [t.numpy() for t in (x2, *mixed.mixes(served, later))]))
    theirs = torch.from_numpy(session.run(None, feed)[0])
    with torch.no_grad():
        ours = served(x2, later)
    assert float((theirs - ours).norm() / ours.norm()) < 1e-5
    plain = torch.nn.Sequential(torch.nn.Linear(4, 2)).train()
    export_onnx_with_inputs(plain, tmp_path / "plain.onnx", (torch.rand(2, 4),), ["x"])
    assert plain.training  # exported in eval mode, given back in the mode it came in
    low_rank = _personalized(alfa.LoraConfig(rank=2), seed=20, model="tiny")[1]
    served.add_user("lr", low_rank)
    with pytest.raises(ValueError, match="user 'lr' has a low-rank update or a correction on"):
        mixed.mixes(served, ["lr"])


@pytest.mark.parametrize("cast", [torch.float64, torch.bfloat16])
def test_a_model_that_is_not_float32_on_the_cpu_is_refused_in_one_sentence(tmp_path, cast):
    from alfa.export import export_onnx

    model = TinyGazeNet().eval().to(cast)
    with pytest.raises(ValueError, match=rf"takes a float32 model on the CPU; this one is {str(cast)[6:]} on cpu"):
        export_onnx(model, tmp_path / "m.onnx", (16, 16))
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.slow
def test_alfa_export_program_is_the_same_bytes_whatever_its_file_is_called(exported):
    """The .pt2 archive is named inside by a fixed name, not by the file (nor by the temporary file it is first
    written to): one model, two exports under two names, the same bytes."""
    folder = exported.folder
    assert [run[0] for run in exported.runs.values()] == [0, 0]
    assert (folder / "a.pt2").read_bytes() == (folder / "b.pt2").read_bytes()
    assert (folder / "a.onnx").read_bytes() == (folder / "b.onnx").read_bytes()
    program = torch.export.load(str(folder / "a.pt2"))
    assert program.module()(torch.zeros(3, 3, 32, 32)).shape == (3, 2)
    # any batch size (the program was capped at 4096 images, the ONNX file was not)
    assert program.module()(torch.zeros(4097, 3, 32, 32)).shape == (4097, 2)


def test_alfa_export_keeps_no_file_it_could_not_check(tmp_path, capsys, monkeypatch):
    """Without onnxruntime the command refuses (its --help promises the check); the library function says so."""
    import importlib.util

    from alfa.cli import main
    from alfa.export import export_onnx

    argv, model = _export_argv(tmp_path)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "onnxruntime" else find_spec(n, *a))
    assert main([*argv, "--image-size", "32", "32", "--out", str(tmp_path / "u.onnx")]) == 2
    err = capsys.readouterr().err
    assert "needs onnxruntime, which is not installed: install alfa's export extra" in err and err.count("\n") == 1
    assert not (tmp_path / "u.onnx").exists()
    check = export_onnx(model, tmp_path / "lib.onnx", (32, 32))
    assert check.relative_difference is None and "not checked: onnxruntime is not installed" in check.describe()
    for sizes in ((), (0,), (2, -1), (1.5,), 3):  # a check of nothing is refused, not reported as a difference of 0
        with pytest.raises(ValueError, match="batch_sizes must be one or more positive whole numbers"):
            export_onnx(model, tmp_path / "none.onnx", (32, 32), batch_sizes=sizes)
    assert not (tmp_path / "none.onnx").exists()


def test_a_model_that_takes_no_image_batch_is_refused_in_one_line_before_the_export(tmp_path):
    from alfa.export import export_onnx, export_program

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    alfa.attach(mlp, alfa.LoraConfig(rank=2))
    for export in (
        lambda: export_onnx(mlp, tmp_path / "mlp.onnx", (8, 8)),
        lambda: export_program(mlp, (8, 8)),
    ):
        with pytest.raises(ValueError) as refused:
            export()
        message = str(refused.value)
        assert "\n" not in message and refused.value.__cause__ is None and refused.value.__suppress_context__
        assert "exports a model of images (input N×3×H×W); this model fails on a 2×3×8×8 batch" in message
        assert "mat1 and mat2 shapes cannot be multiplied" in message  # the model's own reason, its first line
        assert "export_onnx_with_inputs" in message
    assert not list(tmp_path.iterdir())

    class TwoOutputs(torch.nn.Module):  # one named output: a tuple (or a transformers ModelOutput) has several
        def forward(self, x):
            return x.mean((1, 2, 3)), x.amax((1, 2, 3))

    with pytest.raises(ValueError, match="returns one tensor with the batch first; .* this model returns a tuple"):
        export_onnx(TwoOutputs(), tmp_path / "two.onnx", (8, 8))
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_the_onnx_output_is_named_by_the_caller_gaze_by_default(tmp_path):
    from alfa.export import export_onnx

    _, model = _personalized(alfa.AlfaConfig(heads=2, rank=2), model="micro")
    for name, expected in ((None, "gaze"), ("logits", "logits")):
        path = tmp_path / f"{expected}.onnx"
        kwargs = {} if name is None else {"output_name": name}
        assert export_onnx(model, path, (16, 16), **kwargs).relative_difference <= 1e-5
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        assert [o.name for o in session.get_outputs()] == [expected]
    with pytest.raises(ValueError, match="output_name must be a non-empty str"):
        export_onnx(model, tmp_path / "bad.onnx", (16, 16), output_name="")


@pytest.mark.parametrize("state", ["truncated", "adapted dense", "adapted truncated", "served"])
def test_torch_jit_script_is_refused_in_one_line_that_names_what_works(state):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).eval()
    if state != "adapted dense":
        alfa.truncate(model, 4)
    if state.startswith("adapted"):
        alfa.attach(model, alfa.LoraConfig(rank=2))
    x = torch.randn(3, 16)
    if state != "served":  # what the message points to works
        assert torch.allclose(torch.jit.trace(model, (x,))(x), model(x))
    else:
        model = alfa.MultiUserModel(model)
    with pytest.raises(RuntimeError, match="^torch.jit.script does not support alfa's layers") as refused:
        torch.jit.script(model)
    message = str(refused.value)
    assert "\n" not in message
    assert ("torch.compile" in message) and ("torch.jit.trace" in message) == (state != "served")
    if state.startswith("adapted"):  # merged densely, the model holds plain layers: they script
        alfa.merge(model, densify=True)
        assert torch.allclose(torch.jit.script(model)(x), model(x))
