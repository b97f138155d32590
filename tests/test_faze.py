"""FAZE (alfa.gaze.faze): DT-ED's rotations and decoder path, one MAML step against a hand-written one (second-order
term included), meta-training against plain training of the same MLP, head poses, and the commands end to end."""

from __future__ import annotations

import copy

import pytest
import torch
from kill_points import Killed, kill_at
from torch import nn
from torch.func import functional_call, grad

from alfa.gaze.data import InMemoryGazeDataset
from alfa.gaze.faze import (
    DTED,
    MamlTask,
    angular_loss,
    apply_gradients,
    dted_losses,
    faze_gaze,
    maml_gradients,
    rotate_code,
    rotation_from_angles,
)
from alfa.gaze.faze_train import fit_mlp_plainly, head_poses, post_adaptation_loss
from alfa.gaze.geometry import pitchyaw_to_vector


def test_rotations_turn_the_forward_axis_into_the_gaze_and_compose():
    angles = torch.tensor([[0.3, -0.2], [-0.5, 0.4], [0.0, 0.0]], dtype=torch.float64)
    r = rotation_from_angles(angles)
    forward = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    torch.testing.assert_close(r @ forward, pitchyaw_to_vector(angles))
    torch.testing.assert_close(r @ r.transpose(1, 2), torch.eye(3, dtype=torch.float64).expand(3, 3, 3))
    relative = r[1] @ r[0].T  # R_ba = R_b R_a⁻¹ takes a's rotation to b's
    torch.testing.assert_close(relative @ r[0], r[1])


def test_the_decoder_path_is_equivariant_to_the_latent_rotation_it_is_given():
    torch.manual_seed(0)
    dted = DTED(image_size=16, appearance=4, gaze_features=2, head_features=2, width=4).eval()
    x = torch.rand(3, 3, 16, 16)
    rg = rotation_from_angles(torch.tensor([[0.4, 0.1], [-0.3, 0.2], [0.2, -0.5]]))
    rh = rotation_from_angles(torch.tensor([[-0.2, 0.3], [0.5, 0.0], [0.1, 0.1]]))
    with torch.no_grad():
        identity = dted.transformed(x, torch.eye(3).expand(3, 3, 3), torch.eye(3).expand(3, 3, 3))
        torch.testing.assert_close(identity, dted.decode(*dted.encode(x)))
        for m in dted.decoder.modules():  # a decoder whose image depends on the codes (at init it hardly does)
            if isinstance(m, nn.ConvTranspose2d):
                nn.init.normal_(m.weight, std=0.5)
        za, zg, zh = torch.randn(3, 4), torch.randn(3, 3, 2), torch.randn(3, 3, 2)
        plain = dted.decode(za, zg, zh)
        turned = dted.decode(za, rotate_code(rg, zg), rotate_code(rh, zh))
        back = dted.decode(za, rotate_code(rg.transpose(1, 2), rotate_code(rg, zg)), rotate_code(rh.mT, rh @ zh))
    torch.testing.assert_close(back, plain, atol=1e-5, rtol=1e-5)  # R then R⁻¹: the reconstruction again
    assert (turned - plain).abs().max() > 0.01  # the rotation reaches the decoder


def test_the_dted_loss_has_its_three_terms_and_trains():
    torch.manual_seed(0)
    model = faze_gaze(image_size=16, appearance=4, width=4)
    x_a, x_b = torch.rand(4, 3, 16, 16), torch.rand(4, 3, 16, 16)
    g = torch.tensor([[0.1, 0.2], [0.3, -0.1], [-0.2, 0.0], [0.0, 0.1]])
    person = torch.tensor([0, 0, 1, 1])
    losses = dted_losses(model, (x_a, x_b, g, g.flip(0), g, g, person), (1.0, 2.0, 0.1))
    assert losses.consistency.item() > 0 and losses.recon.item() > 0 and losses.gaze.item() > 0
    torch.testing.assert_close(losses.total, losses.recon + 2 * losses.consistency + 0.1 * losses.gaze)
    # the frontalized codes of one person pulled together: two images with one code but other gazes differ
    losses.total.backward()
    assert all(p.grad is not None for p in model.dted.to_code.parameters())


def _tiny_mlp() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()


def _task(seed: int) -> MamlTask:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(8, 3, generator=g, dtype=torch.float64)
    gaze = 0.3 * torch.randn(8, 2, generator=g, dtype=torch.float64)
    return MamlTask(z[:4], gaze[:4], z[4:], gaze[4:])


@pytest.mark.parametrize("first_order", [False, True])
def test_one_maml_step_equals_a_hand_written_one(first_order):
    mlp, tasks, alpha, eta = _tiny_mlp(), [_task(0), _task(1)], 0.3, 0.05
    start = {n: p.detach().clone() for n, p in mlp.named_parameters()}

    def support(params, t):
        return angular_loss(functional_call(mlp, params, (t.z_c,)), t.g_c)

    def query(params, t):
        return angular_loss(functional_call(mlp, params, (t.z_v,)), t.g_v)

    def after_inner(params, t):  # θ' = θ − α ∇L_c(θ), written out with torch.func
        step = grad(support)(params, t)
        return {n: params[n] - alpha * step[n] for n in params}

    def outer(params, t):
        return query(after_inner(params, t), t)

    expected = {n: torch.zeros_like(p) for n, p in start.items()}
    for t in tasks:
        g = grad(query)(after_inner(start, t), t) if first_order else grad(outer)(start, t)
        for n in expected:
            expected[n] += g[n] / len(tasks)
    grads, loss = maml_gradients(mlp, tasks, alpha, 1, first_order)
    for n in expected:
        torch.testing.assert_close(grads[n], expected[n])
    assert loss == pytest.approx(sum(float(outer(start, t)) for t in tasks) / len(tasks))
    if not first_order:  # the second-order term, checked once more by central differences on one weight
        name, eps = "0.weight", 1e-6
        bumped = [{**start, name: start[name] + s * eps * torch.eye(4, 3, dtype=torch.float64)} for s in (1, -1)]
        numeric = sum(float(outer(bumped[0], t) - outer(bumped[1], t)) / (2 * eps) for t in tasks) / len(tasks)
        analytic = sum(float(grads[name][i, i]) for i in range(3))
        assert analytic == pytest.approx(numeric, rel=1e-5, abs=1e-8)
        first = maml_gradients(mlp, tasks, alpha, 1, True)[0]
        assert (first[name] - grads[name]).abs().max() > 1e-6  # the term is there, and it matters
    apply_gradients(mlp, grads, torch.optim.SGD(mlp.parameters(), lr=eta))  # meta-training's outer step, "sgd"
    for n, p in mlp.named_parameters():
        torch.testing.assert_close(p.detach(), start[n] - eta * grads[n])


def test_meta_training_lowers_the_loss_after_adaptation_on_held_out_persons():
    # Toy persons: one map of the gaze codes plus a per-person offset (std ~17°), which k = 4 images must find in
    # one inner step. Deterministic (seeded); a wrong outer gradient (sign, missing term) does not pass.
    g = torch.Generator().manual_seed(0)
    mix = torch.randn(6, 2, generator=g) * 0.3

    def person() -> tuple[torch.Tensor, torch.Tensor]:
        z = torch.randn(16, 6, generator=g)
        return z, torch.tanh(z @ mix) * 0.3 + torch.randn(1, 2, generator=g) * 0.3

    source, held_out = [person() for _ in range(16)], [person() for _ in range(12)]
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(6, 16), nn.SELU(), nn.Linear(16, 2))
    fit_mlp_plainly(plain, source, steps=100, lr=1e-2)
    meta = copy.deepcopy(plain)  # FAZE's order: the MLP trained with DT-ED, then meta-learned
    adam = torch.optim.Adam(meta.parameters(), lr=2e-2)
    alpha, steps = 0.05, 1
    for step in range(30):
        tasks = [MamlTask(z[:4], y[:4], z[4:12], y[4:12]) for z, y in (source[(4 * step + i) % 16] for i in range(4))]
        grads, _ = maml_gradients(meta, tasks, alpha, steps)
        for n, p in meta.named_parameters():
            p.grad = grads[n]
        adam.step()
    tests = [MamlTask(z[:4], y[:4], z[4:], y[4:]) for z, y in held_out]
    after_meta = post_adaptation_loss(meta, tests, alpha, steps)
    after_plain = post_adaptation_loss(plain, tests, alpha, steps)
    assert after_meta < 0.9 * after_plain  # measured: 0.81 of it


def test_head_poses_are_required_with_a_clear_error():
    images = torch.zeros(4, 3, 16, 16, dtype=torch.uint8)
    gaze = torch.zeros(4, 2)
    ids = torch.tensor([0, 0, 1, 1])
    with_head = InMemoryGazeDataset(images, gaze, ids, ["a", "b"], head=torch.ones(4, 2), name="posed")
    torch.testing.assert_close(head_poses(with_head, [0, 3]), torch.ones(2, 2))
    without = InMemoryGazeDataset(images, gaze, ids, ["a", "b"], name="gaze360-like")
    with pytest.raises(ValueError, match=r"gaze360-like: 2 of 2 images have no head pose .*needs the head pose"):
        head_poses(without, [1, 2])


def test_faze_trains_meta_trains_and_calibrates_from_the_cli(tmp_path, capsys):
    from alfa.checkpoint import load_model, read_checkpoint
    from alfa.cli import main
    from alfa.gaze.data.fixtures import write_gazehub_fixture

    torch.set_num_threads(1)
    spec = "synthetic:eth?persons=4&images_per_person=12&size=16"
    small = ["--appearance", "4", "--quiet"]
    assert main(["faze", "train", "--data", spec, "--out", str(tmp_path / "t"), "--steps", "1", *small]) == 0
    # more steps extend the finished run, and say so: its model file is replaced
    with pytest.warns(UserWarning, match="holds a finished run's model.safetensors of fewer steps: this run goes on"):
        assert main(["faze", "train", "--data", spec, "--out", str(tmp_path / "t"), "--steps", "2", *small]) == 0
    meta = ["--k", "3", "--l", "3", "--tasks", "2", "--steps", "2", "--quiet"]
    trained = str(tmp_path / "t" / "model.safetensors")
    # without meta-training PS-GEN has no rate and steps: one line before any work, no folder made
    no_meta = ["calibrate", "--checkpoint", trained, "--data", spec, "--method", "faze", "--k", "3", "--pool", "6"]
    assert main([*no_meta, "--out", str(tmp_path / "x"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "records no meta-training (alfa faze meta-train)" in err
    assert not (tmp_path / "x").exists()
    too_many = ["faze", "meta-train", "--checkpoint", trained, "--data", spec, "--out", str(tmp_path / "y")]
    assert main([*too_many, *meta[:4], "--tasks", "5", "--steps", "1", "--quiet"]) == 2
    assert "fewer than the 5 tasks (persons) each outer step draws: lower --tasks" in capsys.readouterr().err
    bigger = spec.replace("size=16", "size=24")  # its gaze MLP reads a code sized for 16×16: refused in one line
    assert main(["faze", "meta-train", "--checkpoint", trained, "--data", bigger, "--out", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "16×16" in err and "24×24" in err and not (tmp_path / "y").exists()
    assert (
        main(["faze", "meta-train", "--checkpoint", trained, "--data", spec, "--out", str(tmp_path / "m"), *meta]) == 0
    )
    again = ["faze", "meta-train", "--checkpoint", trained, "--data", spec, "--out", str(tmp_path / "m"), *meta]
    before = read_checkpoint(tmp_path / "m" / "model.safetensors")[1]  # its config and the tensors' checksum
    assert main(again) == 0 and read_checkpoint(tmp_path / "m" / "model.safetensors")[1] == before  # found complete
    bytes_before = (tmp_path / "m" / "model.safetensors").read_bytes()
    assert main([*again, "--first-order"]) == 2  # another recipe: refused in one line, nothing overwritten
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the state of another run" in err and "first_order" in err
    assert (tmp_path / "m" / "model.safetensors").read_bytes() == bytes_before
    model, saved = load_model(tmp_path / "m" / "model.safetensors")
    assert saved["extra"]["maml"]["config"]["inner_steps"] == 5 and "faze" in saved["extra"]
    target = "synthetic:mpii?persons=2&images_per_person=12&size=16"
    calibrated = str(tmp_path / "c")
    argv = ["calibrate", "--checkpoint", str(tmp_path / "m" / "model.safetensors"), "--data", target]
    assert main([*argv, "--method", "faze", "--k", "3", "--pool", "6", "--out", calibrated, "--quiet"]) == 0
    assert "faze user calibration of mpii/test at k = 3" in capsys.readouterr().out
    ckpt = str(tmp_path / "m" / "model.safetensors")
    assert main(["evaluate", "--checkpoint", ckpt, "--data", target, "--adapters", calibrated, "--quiet"]) == 0
    assert "6 adaptation images excluded" in capsys.readouterr().out
    # alfa serve's model: the dense FAZE base, a calibrated user answered as their own model
    import io

    from PIL import Image

    import alfa
    from alfa.gaze.service.model import GazeService

    png = io.BytesIO()
    Image.new("RGB", (16, 16), (40, 90, 200)).save(png, "PNG")
    answer = GazeService(ckpt, calibrated).predict("p00", png.getvalue())
    own, _ = load_model(ckpt)
    alfa.load_adapter(own, tmp_path / "c" / "p00.safetensors")
    pixels = torch.tensor([40 / 255, 90 / 255, 200 / 255]).view(1, 3, 1, 1).expand(1, 3, 16, 16)
    with torch.no_grad():
        yaw, pitch = own.eval()(pixels)[0].tolist()
    assert answer["yaw"] == pytest.approx(yaw, abs=1e-5) and answer["pitch"] == pytest.approx(pitch, abs=1e-5)
    # The real layouts: MPIIFaceGaze's labels carry the head pose, Gaze360's do not (one line, exit 2).
    write_gazehub_fixture(tmp_path / "mpii", "mpiifacegaze", persons=["p00", "p01"], images_per_person=4)
    real = f"gazehub:mpiifacegaze:{tmp_path / 'mpii'}"
    assert main(["faze", "train", "--data", real, "--out", str(tmp_path / "r"), "--steps", "1", *small]) == 0
    write_gazehub_fixture(tmp_path / "g360", "gaze360", images_per_person=3)
    g360 = f"gazehub:gaze360:{tmp_path / 'g360'}"
    assert main(["faze", "train", "--data", g360, "--out", str(tmp_path / "n"), "--steps", "1", *small]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "have no head pose" in err and not (tmp_path / "n" / "model.safetensors").exists()
    assert isinstance(model, nn.Module)


def _posed(persons: int = 3, images: int = 8) -> InMemoryGazeDataset:
    g = torch.Generator().manual_seed(0)
    n = persons * images
    pixels = torch.randint(0, 256, (n, 3, 16, 16), generator=g, dtype=torch.uint8)
    gaze, head = (torch.rand(n, 2, generator=g) - 0.5) * 0.6, (torch.rand(n, 2, generator=g) - 0.5) * 0.4
    ids = torch.arange(persons).repeat_interleave(images)
    return InMemoryGazeDataset(pixels, gaze, ids, [f"p{i}" for i in range(persons)], head=head, name="posed")


def _same_weights(a: nn.Module, b: nn.Module) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name


@pytest.mark.parametrize("kill", ["mid-run", "before-model"])
def test_faze_training_and_meta_training_killed_and_resumed_end_as_uninterrupted_ones(tmp_path, monkeypatch, kill):
    """Killed between two saved states (the steps after the last are redone) or after the last state but before the
    model file: the rerun of the same call ends with the same weights, bit for bit, as a run never killed."""
    from alfa.checkpoint import load_model
    from alfa.gaze import faze_train
    from alfa.gaze.faze_train import FazeTrainConfig, MetaTrainConfig, meta_train_faze, train_faze

    torch.set_num_threads(1)
    data, small = _posed(), {"appearance": 4, "width": 4}
    config = FazeTrainConfig(steps=5, batch_size=4, checkpoint_every=2)
    straight, _ = train_faze(data, config, tmp_path / "straight", model_kwargs=small, progress=False)
    meta = MetaTrainConfig(steps=5, k=2, l=2, tasks=2, inner_steps=1, checkpoint_every=2)
    start, saved = load_model(tmp_path / "straight" / "model.safetensors")
    meta_train_faze(start, saved, data, meta, tmp_path / "meta-straight", progress=False)
    with monkeypatch.context() as m:  # training: killed in step 4 (states after 2) or in writing the model
        kill_at(m, faze_train, *(("dted_losses", 4) if kill == "mid-run" else ("save_model", 1)))
        with pytest.raises(Killed):
            train_faze(data, config, tmp_path / "run", model_kwargs=small, progress=False)
    assert not (tmp_path / "run" / "model.safetensors").exists()
    resumed, _ = train_faze(data, config, tmp_path / "run", model_kwargs=small, progress=False)
    _same_weights(straight, resumed)
    with monkeypatch.context() as m:  # meta-training alike
        kill_at(m, faze_train, *(("maml_gradients", 4) if kill == "mid-run" else ("save_model", 1)))
        with pytest.raises(Killed):
            meta_train_faze(*load_model(tmp_path / "run" / "model.safetensors"), data, meta, tmp_path / "meta")
    again, saved = load_model(tmp_path / "run" / "model.safetensors")
    meta_train_faze(again, saved, data, meta, tmp_path / "meta", progress=False)
    _same_weights(load_model(tmp_path / "meta-straight" / "model.safetensors")[0], again)
    assert not any(p.name.endswith(".tmp.safetensors") for p in tmp_path.rglob("*"))  # no half-written file left


def test_a_resumed_faze_run_records_the_time_of_all_its_sessions(tmp_path, monkeypatch):
    """The seconds a FAZE model records (its cost) add up the sessions of a resumed run: those of the earlier ones,
    kept in the state up to its last save, and the resumed one's; not the resumed session's alone (meta-training
    runs the same loop, faze_train._run_steps)."""
    from types import SimpleNamespace

    from alfa.checkpoint import read_checkpoint
    from alfa.gaze import faze_train
    from alfa.gaze.faze_train import FazeTrainConfig, train_faze

    clock = [0.0]

    def tick() -> float:  # each reading of the clock is 10 s after the one before
        clock[0] += 10.0
        return clock[0]

    monkeypatch.setattr(faze_train, "time", SimpleNamespace(time=tick))
    torch.set_num_threads(1)
    data, small = _posed(), {"appearance": 4, "width": 4}
    config = FazeTrainConfig(steps=4, batch_size=4, checkpoint_every=2)
    assert train_faze(data, config, tmp_path / "straight", model_kwargs=small, progress=False)[1]["seconds"] == 20
    with monkeypatch.context() as m:  # 10 s to step 2's state, then killed in step 4
        kill_at(m, faze_train, "dted_losses", 4)
        with pytest.raises(Killed):
            train_faze(data, config, tmp_path / "run", model_kwargs=small, progress=False)
    clock[0] += 1000.0  # the time between the sessions is no training time
    assert train_faze(data, config, tmp_path / "run", model_kwargs=small, progress=False)[1]["seconds"] == 20
    assert (
        read_checkpoint(tmp_path / "run" / "model.safetensors", header_only=True)[1]["extra"]["faze"]["seconds"] == 20
    )


def test_faze_resume_refuses_another_run_and_a_model_it_did_not_write(tmp_path):
    from alfa.checkpoint import CheckpointError
    from alfa.gaze.faze_train import FazeTrainConfig, train_faze

    torch.set_num_threads(1)
    data, small = _posed(), {"appearance": 4, "width": 4}
    train_faze(data, FazeTrainConfig(steps=2, batch_size=4), tmp_path / "a", model_kwargs=small, progress=False)
    before = (tmp_path / "a" / "model.safetensors").read_bytes()
    with pytest.raises(
        CheckpointError, match=r"state of another run \(config \(the checkpoint's vs this run's\): lr 0.001 vs 0.01\)"
    ):
        train_faze(data, FazeTrainConfig(steps=2, batch_size=4, lr=1e-2), tmp_path / "a", model_kwargs=small)
    with pytest.raises(CheckpointError, match="more than the 1 asked"):
        train_faze(data, FazeTrainConfig(steps=1, batch_size=4), tmp_path / "a", model_kwargs=small)
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == before
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "model.safetensors").write_bytes(b"someone else's")
    with pytest.raises(CheckpointError, match="no run of this command wrote it"):
        train_faze(data, FazeTrainConfig(steps=2, batch_size=4), tmp_path / "b", model_kwargs=small)
    assert (tmp_path / "b" / "model.safetensors").read_bytes() == b"someone else's"


def test_a_faze_user_is_the_adapted_mlp_and_is_served_per_sample_on_the_dense_base(tmp_path):
    """PS-GEN's file is a correction of each linear layer of the gaze MLP: attached, it is the MLP adapted by the
    inner loop (up to round-off); served from a shared FAZE base in a mixed batch, and merged, it is the same."""
    import alfa
    from alfa.export import merged_copy
    from alfa.gaze.faze import adapt_mlp, personalize_faze
    from alfa.serve import MultiUserModel

    torch.manual_seed(0)
    base = faze_gaze(image_size=16, appearance=4, width=4).eval()
    images, gaze = torch.rand(5, 3, 16, 16), (torch.rand(5, 2) - 0.5) * 0.6
    user = copy.deepcopy(base)
    personalize_faze(user, images, gaze, lr=0.1, steps=3)
    assert alfa.adapter_state(user).config.method == "correction"
    bare = copy.deepcopy(base.gaze_mlp)
    with torch.no_grad():
        adapt_mlp(bare, base.gaze_code(images), gaze, 0.1, 3)
        other = torch.rand(4, 3, 16, 16)
        expected = bare(base.gaze_code(other))
        assert (expected - base(other)).abs().max() > 1e-4  # the adaptation changed the predictions
        torch.testing.assert_close(user(other), expected, atol=1e-6, rtol=1e-5)
    served = MultiUserModel(base)
    served.add_user("p", alfa.save_adapter(user, tmp_path / "p.safetensors"))
    with torch.no_grad():
        mixed = served(other, ["p", None, "p", None])
        torch.testing.assert_close(mixed[0::2], expected[0::2], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(mixed[1::2], base(other)[1::2])
        torch.testing.assert_close(merged_copy(user)(other), expected, atol=1e-6, rtol=1e-5)


def test_calibrate_refuses_the_faze_method_on_another_model_up_front(tmp_path, capsys):
    """On a ResNet every person failed in turn, the first with the advice to give --faze-lr and --faze-steps."""
    from tiny_models import TinyGazeNet

    from alfa.checkpoint import save_model
    from alfa.cli import main

    base = save_model(tmp_path / "m.safetensors", TinyGazeNet(), "tiny_gaze_net", input_size=(16, 16))
    out = tmp_path / "c"
    argv = ["calibrate", "--checkpoint", str(base), "--data", "synthetic:mpii?persons=2&images_per_person=12&size=16"]
    assert main([*argv, "--method", "faze", "--k", "3", "--pool", "6", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"{base} is a TinyGazeNet: choose another --method") and "\n" not in err
    assert not out.exists()
