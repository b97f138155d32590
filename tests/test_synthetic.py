"""The synthetic gaze benchmark: determinism, the flip law, shapes and ranges, domain differences, errors."""

import math
from dataclasses import replace

import pytest
import torch

from alfa.gaze.data.synthetic import (
    DOMAINS,
    FaceParams,
    gaze_labels,
    get_domain,
    list_domains,
    make_domain,
    render_faces,
    sample_persons,
    sample_scenes,
)
from alfa.gaze.data.synthetic.domains import camera_resolution, place_capture, sample_capture
from alfa.gaze.geometry import flip_yaw

DEG = math.pi / 180


def _random_scenes(name: str, n: int, seed: int, size: int) -> tuple[FaceParams, torch.Tensor]:
    cfg = get_domain(name)
    g = torch.Generator().manual_seed(seed)
    persons, capture = sample_persons(cfg, n, g), sample_capture(cfg, n, g)
    params = FaceParams(**persons, **place_capture(sample_scenes(cfg, n, g), capture))
    res = camera_resolution(cfg, size)
    return params, torch.randn(n, 4, res, res, generator=g)


SYMMETRIC = ["eth", "gaze360", "mpii", "eyediap"]
ASYMMETRIC = ["eth-studio", "mpii-window", "eyediap-offcam"]


def test_registry_has_the_four_domains_and_the_asymmetric_controls():
    assert list_domains() == SYMMETRIC + ASYMMETRIC
    assert [DOMAINS[n].role for n in SYMMETRIC] == ["source", "source", "target", "target"]
    assert [DOMAINS[n].role for n in ASYMMETRIC] == ["source", "target", "target"]
    assert [DOMAINS[n].mirror_symmetric for n in list_domains()] == [True] * 4 + [False] * 3
    assert DOMAINS["mpii"].persons["test"] == 15 and DOMAINS["eyediap"].persons["test"] == 14


def test_same_seed_is_bit_identical_and_other_seed_differs():
    a = make_domain("mpii", persons=2, images_per_person=6, workers=2)  # not the suite's one thread (conftest)
    b = make_domain("mpii", persons=2, images_per_person=6, workers=1)
    c = make_domain("mpii", persons=2, images_per_person=6, seed=1)
    assert torch.equal(a.images, b.images) and torch.equal(a.gaze, b.gaze) and torch.equal(a.head, b.head)
    assert not torch.equal(a.images, c.images) and not torch.equal(a.gaze, c.gaze)


def test_person_subsets_and_image_prefixes_are_stable():
    three = make_domain("eth", persons=3, images_per_person=5)
    one = make_domain("eth", persons=1, images_per_person=5)
    assert torch.equal(one.images, three.images[:5]) and torch.equal(one.gaze, three.gaze[:5])
    # Fewer images per person give a prefix: the first images (the personalization ones) do not move.
    longer = make_domain("eth", persons=1, images_per_person=20)
    assert torch.equal(longer.gaze[:5], one.gaze)
    assert (longer.images[:5].int() - one.images.int()).abs().max() <= 1


def test_shapes_dtypes_names_and_order():
    ds = make_domain("eyediap", persons=3, images_per_person=4, size=48)
    assert ds.images.shape == (12, 3, 48, 48) and ds.images.dtype == torch.uint8
    assert ds.gaze.shape == (12, 2) and ds.gaze.dtype == torch.float32 and torch.isfinite(ds.head).all()
    assert ds.persons() == ["p00", "p01", "p02"]
    assert ds.person_indices("p01") == [4, 5, 6, 7]
    item = ds[5]
    assert item["person"] == "p01" and item["image"].dtype == torch.float32
    assert 0.0 <= item["image"].min() and item["image"].max() <= 1.0
    # A person's images vary in gaze and head pose, and all images are distinct.
    idx = ds.person_indices("p00")
    assert ds.gaze[idx].std(0).min() > 0.5 * DEG and ds.head[idx].std(0).min() > 0.5 * DEG
    assert len({bytes(img.numpy()) for img in ds.images}) == 12
    assert ds.name == "eyediap/test"


def test_splits_hold_different_persons():
    train = make_domain("eth", persons=1, images_per_person=3)
    val = make_domain("eth", split="val", persons=1, images_per_person=3)
    assert val.persons() == ["v00"] and train.persons() == ["p00"]
    assert not torch.equal(train.images, val.images)
    assert make_domain("mpii", split="val", persons=1, images_per_person=2).persons() == ["v00"]
    # A target's train split (the within-target yardstick of the benchmark) holds other persons.
    test, extra = (make_domain("mpii", split=s, persons=1, images_per_person=2) for s in ("test", "train"))
    assert not torch.equal(test.images, extra.images)


def test_renders_at_224():
    ds = make_domain("gaze360", persons=1, images_per_person=2, size=224)
    assert ds.images.shape == (2, 3, 224, 224) and ds.images.float().std() > 10


@pytest.mark.parametrize("name", list_domains(None))
def test_flip_law(name):
    """Rendering the mirrored scene gives the horizontally flipped image, with the FlipYaw label."""
    params, noise = _random_scenes(name, 6, seed=11, size=64)
    image = render_faces(params, noise, 64)
    mirrored = render_faces(params.mirrored(), noise.flip(-1), 64)
    assert (image - mirrored.flip(-1)).abs().max() < 1e-4
    pixels = lambda x: x.mul(255).round()  # noqa: E731
    assert (pixels(image) - pixels(mirrored).flip(-1)).abs().max() <= 1
    torch.testing.assert_close(gaze_labels(params.mirrored()), flip_yaw(gaze_labels(params)), rtol=0, atol=1e-6)
    # The law is not vacuous: the images are far from left/right symmetric themselves.
    assert (image - image.flip(-1)).abs().mean() > 0.02


def test_flip_law_breaks_without_the_mirrored_person():
    """Only mirroring the pose (not the person's asymmetries, light and noise) does not give the flip."""
    params, noise = _random_scenes("eth", 4, seed=3, size=64)
    pose_only = FaceParams(**{**vars(params), **{k: -getattr(params, k) for k in ("head_yaw", "eye_yaw", "head_roll")}})
    image = render_faces(params, noise, 64)
    assert (image - render_faces(pose_only, noise, 64).flip(-1)).abs().max() > 0.05


def test_asymmetric_worlds_are_not_their_own_mirror_image():
    """The capture asymmetries are in the distributions: eth-studio's key light is always on the image's
    left, each mpii-window person has one light side, each eyediap-offcam person one camera side."""
    g = torch.Generator().manual_seed(0)
    assert (sample_scenes(get_domain("eth-studio"), 200, g)["light_az"] > 0).all()
    assert (sample_scenes(get_domain("eth"), 200, g)["light_az"] > 0).float().mean().sub(0.5).abs() < 0.1
    for name, key in (("mpii-window", "light_az"), ("eyediap-offcam", "head_yaw")):
        person = make_domain(name, persons=4, images_per_person=2)  # renders, so the capture is applied
        assert len(person.persons()) == 4
        cfg = get_domain(name)
        g = torch.Generator().manual_seed(1)
        capture = sample_capture(cfg, 1, g)
        scenes = place_capture(sample_scenes(cfg, 64, g), {k: v.expand(64) for k, v in capture.items()})
        if key == "light_az":  # one side for all of the person's images
            assert (scenes[key].sign() == capture["light_side"]).all()
        else:  # the person's head yaw is shifted by the camera's offset, about 12 degrees
            assert 4 * DEG < capture["camera_yaw"].abs().item() < 24 * DEG
            plain = sample_scenes(cfg, 64, torch.Generator().manual_seed(1))
            assert abs(scenes[key].mean() - plain[key].mean()) > 2 * DEG


@pytest.mark.parametrize(
    "name,unmirrored", [("eth-studio", "light"), ("mpii-window", "light"), ("eyediap-offcam", "camera")]
)
def test_flip_law_needs_the_mirrored_light_and_camera(name, unmirrored):
    """Mirroring the person and pose but leaving the light (or the camera) where it was does not give the
    flipped image: the flip law of the asymmetric worlds rests on mirroring the capture too."""
    params, noise = _random_scenes(name, 6, seed=4, size=64)
    mirrored = params.mirrored()
    if unmirrored == "light":
        broken = FaceParams(**{**vars(mirrored), "light_az": params.light_az})
    else:  # the camera offset stays on its side: head yaw -(h - δ) + δ instead of -h
        g = torch.Generator().manual_seed(4)
        sample_persons(get_domain(name), 6, g)
        offset = sample_capture(get_domain(name), 6, g)["camera_yaw"]
        assert offset.abs().min() > 0
        broken = FaceParams(**{**vars(mirrored), "head_yaw": mirrored.head_yaw + 2 * offset})
    image = render_faces(params, noise, 64)
    assert (image - render_faces(mirrored, noise.flip(-1), 64).flip(-1)).abs().max() < 1e-4
    assert (image - render_faces(broken, noise.flip(-1), 64).flip(-1)).abs().max() > 0.05


def test_the_mirrored_studio_is_the_studio_with_its_light_on_the_other_side():
    """The constructed positive control's target (docs/flip-premise.md §7.4): the same draws as the studio's
    except the key light's side, so the flip of a mirrored-studio scene is a studio scene; a target of the
    MPII-like world's size."""
    studio, mirrored = get_domain("eth-studio-v2"), get_domain("eth-studio-mirrored-v2")
    assert mirrored.role == "target" and mirrored.persons == get_domain("mpii-v2").persons
    a = sample_scenes(studio, 300, torch.Generator().manual_seed(5))
    b = sample_scenes(mirrored, 300, torch.Generator().manual_seed(5))
    assert (a["light_az"] > 0).all() and torch.equal(b["light_az"], -a["light_az"])
    assert all(torch.equal(a[k], b[k]) for k in a if k != "light_az")
    # the check can fail: with the sides drawn per image (the symmetric world's way) the draws are not mirrored
    c = sample_scenes(replace(mirrored, light_side="image"), 300, torch.Generator().manual_seed(5))
    assert not torch.equal(c["light_az"], -a["light_az"])


def test_eye_windows_change_nothing():
    """The eyes are computed in windows for speed; at extreme poses, glasses and asymmetries the
    windows still hold every eye feature: the image equals the whole-crop computation bit for bit."""
    params, noise = _random_scenes("gaze360", 24, seed=7, size=64)
    g = torch.Generator().manual_seed(8)
    extreme = {
        "head_yaw": 80 * DEG,
        "head_pitch": 40 * DEG,
        "head_roll": 25 * DEG,
        "eye_yaw": 45 * DEG,
        "eye_pitch": 35 * DEG,
    }
    changes = {k: (2 * torch.rand(24, generator=g) - 1) * v for k, v in extreme.items()}
    changes["glasses"] = torch.ones(24)
    for k in ("eye_sep_asym", "eye_w_asym", "eye_open_asym", "brow_asym", "lid_skew", "eye_tilt"):
        changes[k] = 3 * getattr(params, k)
    params = FaceParams(**{**vars(params), **changes})
    windowed = render_faces(params, noise, 64)
    assert torch.equal(windowed, render_faces(params, noise, 64, eye_windows=False))


def test_label_ranges_follow_the_domains():
    stds, pitch_means = {}, {}
    for name in list_domains():
        cfg = get_domain(name)
        scenes = sample_scenes(cfg, 4000, torch.Generator().manual_seed(0))
        persons = {k: v.expand(4000, *v.shape[1:]) for k, v in sample_persons(cfg, 1, torch.Generator()).items()}
        labels = gaze_labels(FaceParams(**persons, **scenes)) / DEG
        bound_yaw = cfg.gaze_yaw[2] + 5 * cfg.label_noise_deg
        bound_pitch = abs(cfg.gaze_pitch[0]) + cfg.gaze_pitch[2] + 5 * cfg.label_noise_deg
        assert labels[:, 0].abs().max() <= bound_yaw and labels[:, 1].abs().max() <= bound_pitch
        stds[name] = labels.std(0)
        pitch_means[name] = labels[:, 1].mean()
    # Sources are wide (gaze360 widest in yaw), targets narrow; MPII users look down at a laptop screen.
    assert stds["gaze360"][0] > stds["eth"][0] > 2 * max(stds["mpii"][0], stds["eyediap"][0])
    assert pitch_means["mpii"] < -5 and abs(pitch_means["eth"]) < 2


def _image_stats(name: str) -> dict[str, float]:
    x = make_domain(name, persons=3, images_per_person=16).images.float() / 255
    mean = x.mean((0, 2, 3))
    lap = 4 * x[..., 1:-1, 1:-1] - x[..., :-2, 1:-1] - x[..., 2:, 1:-1] - x[..., 1:-1, :-2] - x[..., 1:-1, 2:]
    return {"brightness": x.mean().item(), "blue_green": (mean[2] / mean[1]).item(), "detail": lap.abs().mean().item()}


def _sensor_noise(name: str) -> float:
    params, noise = _random_scenes(name, 8, seed=5, size=64)
    return (render_faces(params, noise, 64) - render_faces(params, torch.zeros_like(noise), 64)).std().item()


def test_domains_differ_in_the_documented_directions():
    stats = {name: _image_stats(name) for name in list_domains()}
    # ETH-like studio light is the brightest; the EyeDiap-like camera has a yellow-green cast.
    assert all(stats["eth"]["brightness"] > stats[n]["brightness"] + 0.05 for n in ("gaze360", "mpii", "eyediap"))
    assert stats["eyediap"]["blue_green"] < min(stats[n]["blue_green"] for n in ("eth", "gaze360", "mpii")) - 0.05
    # Low-resolution cameras (gaze360, eyediap) give softer images than the sharp studio camera.
    assert stats["eth"]["detail"] > 1.5 * max(stats["gaze360"]["detail"], stats["eyediap"]["detail"])
    # The MPII-like webcam is the noisiest sensor.
    noise = {name: _sensor_noise(name) for name in list_domains()}
    assert noise["mpii"] > max(2 * noise["eth"], 1.2 * noise["eyediap"])


def test_bad_requests_fail_clearly():
    with pytest.raises(ValueError, match="unknown synthetic domain 'xgaze'.*eth"):
        make_domain("xgaze")
    with pytest.raises(ValueError, match="no split 'test'"):
        make_domain("eth", split="test")
    for bad in ({"persons": 0}, {"images_per_person": -3}, {"size": 8}, {"size": 64.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            make_domain("eth", **bad)
    params, noise = _random_scenes("eth", 2, seed=0, size=32)
    with pytest.raises(ValueError, match="noise must be"):
        render_faces(params, noise[:, :3], 32)


def test_domain_configs_are_checked():
    from dataclasses import replace

    with pytest.raises(ValueError, match="blur must be"):
        replace(DOMAINS["eth"], blur=(0.5, 2.0))
    with pytest.raises(ValueError, match="role must be"):
        replace(DOMAINS["eth"], role="both")


def test_the_first_worlds_answer_to_versioned_names_and_the_second_are_their_own():
    """``eth-v1`` is ``eth`` (the same persons, bit for bit); ``eth-v2`` is another world with other persons,
    and each version lists its own worlds (v2's
    seven and the studio source's one-sided stand-in)."""
    assert get_domain("eth-v1") is get_domain("eth")
    a = make_domain("eth-v1", persons=1, images_per_person=2, size=16)
    b = make_domain("eth", persons=1, images_per_person=2, size=16)
    assert torch.equal(a.images, b.images) and a.name == b.name
    v2 = make_domain("eth-v2", persons=1, images_per_person=2, size=16)
    assert not torch.equal(v2.images, b.images) and v2.name == "eth-v2/train"
    assert list_domains("v2") == [f"{n}-v2" for n in list_domains()] + ["gaze360-window-v2", "eth-studio-mirrored-v2"]
    assert all(get_domain(n).version == "v2" for n in list_domains("v2"))
    with pytest.raises(ValueError, match="unknown synthetic domain"):
        get_domain("eth-v2-v1")


def test_the_label_convention_moves_the_pitch_label_only():
    """A world whose labels come from the face centre (``label_origin_pitch_deg``) renders the same images and
    the same yaw labels as the same world labelled from the eyes; every pitch label is up by the offset."""
    from dataclasses import replace

    from alfa.gaze.data.synthetic import render_person

    cfg = get_domain("mpii-v2")
    assert cfg.label_origin_pitch_deg > 0
    eyes = replace(cfg, label_origin_pitch_deg=0.0)
    pixels, labels, _, _ = render_person(cfg, 0, "test", 3, 5, 32)
    same, plain, _, _ = render_person(eyes, 0, "test", 3, 5, 32)
    assert torch.equal(pixels, same) and torch.equal(labels[:, 0], plain[:, 0])
    assert torch.allclose(labels[:, 1] - plain[:, 1], torch.full((5,), math.radians(cfg.label_origin_pitch_deg)))


def test_the_committed_samples_of_the_figure_are_what_the_worlds_render(tmp_path):
    """docs/synthetic.md's sample grid is drawn from committed samples (another kind of CPU renders a few bits
    differently); they must be what the worlds' code renders now, within one level of 255, and the check fails on
    a changed pixel or label."""
    from pathlib import Path

    from alfa.gaze.data.synthetic.preview import (
        load_preview_samples,
        preview_samples,
        samples_differences,
        save_preview_samples,
    )
    from alfa.study.pages import SYNTHETIC_SAMPLES

    saved = load_preview_samples(Path(__file__).resolve().parent.parent / SYNTHETIC_SAMPLES)
    now = preview_samples(saved.seed, saved.size)
    for world in now.worlds:  # the worlds' own pixels: the grid showed every face in inverted colours
        rendered = make_domain(world, seed=saved.seed, persons=4, images_per_person=3, size=saved.size).images
        assert rendered.dtype == torch.uint8 and torch.equal(now.images[world], rendered), world
    assert samples_differences(saved, now) == [], (
        "run: python -m alfa.gaze.data.synthetic --replace --samples-to " + SYNTHETIC_SAMPLES
    )
    again = load_preview_samples(save_preview_samples(now, tmp_path / "s.safetensors"))
    assert samples_differences(again, now, levels=0) == [] and again.persons == now.persons
    world = now.worlds[0]
    now.images[world][0, 0, 10, 10] ^= 8  # one pixel, 8 levels
    now.gaze[world][1, 0] += 1e-3
    assert samples_differences(saved, now) == [
        f"{world}: a pixel differs by 8 of 255",
        f"{world}: the gaze labels differ",
    ]


def test_the_preview_command_overwrites_nothing_unasked_and_writes_atomically(tmp_path, capsys, monkeypatch):
    """``python -m alfa.gaze.data.synthetic``: an existing ``--preview`` or ``--samples-to`` file is refused in
    one line (exit 2; it was argparse's whole usage block, then the error) and kept; ``--replace`` overwrites it,
    leaving no temporary file behind."""
    import functools

    import alfa.gaze.data.synthetic.__main__ as command
    from alfa.gaze.data.synthetic import preview

    # one image per world: the grid's 84 panels took seconds to draw, and what is tested is around the drawing
    fewer = functools.partial(preview.preview_samples, persons=1, images_per_person=1)
    monkeypatch.setattr(preview, "preview_samples", fewer)
    monkeypatch.setattr(command, "preview_samples", fewer)
    main = command.main
    prog = "python -m alfa.gaze.data.synthetic"
    for flag, name in (("--preview", "grid.png"), ("--samples-to", "samples.safetensors")):
        target = tmp_path / name
        target.write_bytes(b"mine")
        with pytest.raises(SystemExit) as e:
            main([flag, str(target), "--size", "16"])
        said = f"{flag} {target}: exists; name another file, or add --replace to overwrite it (see {prog} --help)"
        assert e.value.code == 2 and capsys.readouterr().err == f"{prog}: error: {said}\n"
        assert target.read_bytes() == b"mine"
        main([flag, str(target), "--size", "16", "--replace"])
        assert target.read_bytes() != b"mine" and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    for argv, said in (
        ([], "nothing to do: give --preview PNG"),
        (["--size", "x"], "argument --size: invalid int"),
        (["--size", "0", "--preview", str(tmp_path / "g.png")], "argument --size: must be at least 16, got 0"),
        (["--threads", "-1", "--tables"], "argument --threads: must be at least 1, got -1"),
        (["--preview", "/proc/g.png", "--size", "16"], "--preview /proc/g.png cannot be written"),  # before rendering
        (["--prev", str(tmp_path / "g.png")], "unrecognized arguments: --prev"),  # options are written whole
    ):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith(f"{prog}: error: {said}") and err.count("\n") == 1, err


def test_a_world_larger_than_memory_is_refused_before_rendering(monkeypatch):
    """A world's float32 images beyond this machine's memory (a mistyped size) is one clear line, before any
    rendering; one that fits renders as before."""
    from alfa.gaze.data.registry import open_dataset
    from alfa.gaze.data.synthetic import domains

    room = 2 * 2 * 3 * 16 * 16  # two 16×16 uint8 images, twice while the persons are joined
    monkeypatch.setattr(domains, "_physical_memory", lambda: room)
    monkeypatch.setattr(domains, "render_person", lambda *a: pytest.fail("rendered before refusing"))
    with pytest.raises(ValueError, match=r"mpii/test at size 16: 1 persons × 3 images would take .* GiB"):
        open_dataset("synthetic:mpii?size=16&persons=1&images_per_person=3")
    monkeypatch.undo()
    monkeypatch.setattr(domains, "_physical_memory", lambda: room)
    assert len(open_dataset("synthetic:mpii?size=16&persons=1&images_per_person=2")) == 2
