"""``photos:`` specs: a person's calibration photos as labelled images. Each label is the direction from the face
centre to the screen pixel looked at, in the normalized frame; the images are what a prediction reads; and the loop
closes: calibrated on a photo with ``alfa calibrate``, ``alfa predict`` of that photo lands on its screen pixel."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_models import TinyGazeNet

import alfa
from alfa.checkpoint import save_model
from alfa.cli import main

pytest.importorskip("cv2")
pytest.importorskip("skimage")

SIZE = 32
SCREEN = {"width_mm": 344, "height_mm": 194, "width_px": 1920, "height_px": 1080, "top_left_mm": [172, 8, 0]}
PIXELS = [[160, 90], [1760, 90], [960, 540], [160, 990], [1760, 990]]


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """A 5-point session (the astronaut's photo at each point: the face, and so its normalization, is the same, the
    labels differ by the point), its screen, and a truncated tiny base at SIZE."""
    from alfa.gaze.camera import read_photo

    folder = tmp_path_factory.mktemp("session")
    pixels = read_photo("skimage:astronaut")[0]
    points = []
    for i, px in enumerate(PIXELS, start=1):
        Image.fromarray(pixels).save(folder / f"p{i}.png", compress_level=1)
        points.append({"photo": f"p{i}.png", "screen_px": px})
    (folder / "points.json").write_text(json.dumps({"points": points}))
    (folder / "screen.json").write_text(json.dumps(SCREEN))
    torch.manual_seed(0)
    model = TinyGazeNet().eval()
    alfa.truncate(model, 8)
    save_model(folder / "base.safetensors", model, "tiny_gaze_net", input_size=(SIZE, SIZE))
    return folder, model


def _spec(folder, **more) -> str:
    query = "&".join(f"{k}={v}" for k, v in {"screen": folder / "screen.json", "size": SIZE, **more}.items())
    return f"photos:{folder / 'points.json'}?{query}"


def test_each_label_points_from_the_face_to_its_screen_pixel(session):
    from alfa.gaze.camera import PhotoOptions, angles_to_gaze_vector, load_screen, normalized_faces, read_photo
    from alfa.gaze.pipeline import open_data

    folder, _ = session
    data = open_data(_spec(folder, person="ann"))
    assert data.persons() == ["ann"] and len(data) == len(PIXELS) and data.name == "photos:points"
    face = normalized_faces(read_photo(folder / "p1.png")[0], PhotoOptions())[1][0]
    # the face is off the camera's axis: a label left in the camera frame (or turned the wrong way) misses below
    assert not np.allclose(face.normalization.rotation, np.eye(3), atol=0.05)
    screen = load_screen(folder / "screen.json")
    for i, px in enumerate(PIXELS):
        label = data.gaze[i].double().numpy()
        gaze_camera = face.normalization.to_camera(angles_to_gaze_vector(label))
        hit = screen.point(face.normalization.face_centre_mm, gaze_camera)
        assert hit["x_px"] == pytest.approx(px[0], abs=0.06) and hit["y_px"] == pytest.approx(px[1], abs=0.06), i
    assert len({tuple(g.tolist()) for g in data.gaze}) == len(PIXELS)
    assert torch.isfinite(data.head).all()  # the normalized head directions, as the datasets' head labels


def test_the_images_are_what_a_prediction_of_the_photo_reads(session):
    """Bit for bit the input ``alfa predict`` and ``/predict/photo`` give the model for the photo (resized alike,
    never rounded to 8 bits), so a correction fitted on them is fitted to what those compute."""
    from alfa.gaze.camera import PhotoOptions, analyse_photo, model_predictor, read_photo
    from alfa.gaze.pipeline import open_data

    class Reading(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.anchor, self.read = torch.nn.Parameter(torch.zeros(())), []

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            self.read.append(images.clone())
            return torch.zeros(len(images), 2)

    folder, _ = session
    data = open_data(_spec(folder))
    assert data.persons() == ["points"]  # no ?person=: the points file's name
    reading = Reading()
    analyse_photo(read_photo(folder / "p2.png")[0], model_predictor(reading, (SIZE, SIZE)), PhotoOptions())
    assert torch.equal(reading.read[0], data.images[1:2])


def test_calibrated_on_a_photo_the_prediction_of_that_photo_lands_on_its_screen_pixel(session, tmp_path, capsys):
    folder, _ = session
    cal, out = tmp_path / "cal", tmp_path / "out.json"
    assert main(["calibrate", "--checkpoint", str(folder / "base.safetensors"), "--data", _spec(folder, person="ann"),
                 "--method", "offset", "--k", "1", "--pool", "1", "--out", str(cal), "--quiet"]) == 0  # fmt: skip
    assert (cal / "ann.safetensors").is_file()
    capsys.readouterr()
    # scored on the 4 photos after the pool; the column named as what the folder holds (not "personalized")
    assert main(["evaluate", "--checkpoint", str(folder / "base.safetensors"), "--data", _spec(folder, person="ann"),
                 "--adapters", str(cal), "--quiet"]) == 0  # fmt: skip
    table = capsys.readouterr().out
    assert "1 adaptation image excluded" in table and "Δ calibrated" in table and "personalized" not in table
    predict = ["predict", str(folder / "p1.png"), "--checkpoint", str(folder / "base.safetensors"), "--screen",
               str(folder / "screen.json"), "--json", str(out), "--quiet"]  # fmt: skip
    assert main(predict) == 0
    uncalibrated = json.loads(out.read_text())["photos"][0]["faces"][0]["screen"]
    assert abs(uncalibrated["x_px"] - PIXELS[0][0]) + abs(uncalibrated["y_px"] - PIXELS[0][1]) > 50
    assert main([*predict, "--adapter", str(cal / "ann.safetensors"), "--replace"]) == 0
    screen = json.loads(out.read_text())["photos"][0]["faces"][0]["screen"]
    assert screen["x_px"] == pytest.approx(PIXELS[0][0], abs=0.2) and screen["y_px"] == pytest.approx(
        PIXELS[0][1], abs=0.2
    )


def test_k_all_fits_every_photo_of_the_session_and_evaluate_says_none_is_left(session, tmp_path, capsys):
    """A user's 9-point session is fitted on all of its points (--k all), not on all but the one a measurement would
    keep. Every photo here is the same face, so one offset fitted to all of them makes each prediction the mean of
    the labels: a fit that left one out would not."""
    from alfa.gaze.pipeline import open_data

    folder, model = session
    cal, base, spec = tmp_path / "cal", str(folder / "base.safetensors"), _spec(folder, person="ann")
    calibrate = ["calibrate", "--checkpoint", base, "--data", spec, "--method", "offset", "--out", str(cal)]
    assert main([*calibrate, "--k", "all"]) == 0
    assert "on every image of each person (none is left to score): 1 done" in capsys.readouterr().out
    data = open_data(spec)
    alfa.load_adapter(model, cal / "ann.safetensors")
    try:
        with torch.no_grad():
            predicted = model(data.images)
    finally:
        alfa.detach(model)
    assert alfa.read_adapter_metadata(cal / "ann.safetensors")["about"]["labelled"] == list(range(len(PIXELS)))
    torch.testing.assert_close(predicted, data.gaze.mean(0).expand_as(predicted), atol=1e-6, rtol=0)
    assert main(["evaluate", "--checkpoint", base, "--data", spec, "--adapters", str(cal)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fitted to every image of each person (alfa calibrate --k all)" in err
    for flag in ("--pool", "--draw"):  # they choose among the images: with all of them, a mistake to name
        value = "spread" if flag == "--draw" else "3"
        assert main([*calibrate, "--k", "all", flag, value, "--replace"]) == 2
        assert f"{flag} chooses the k among a person's images" in capsys.readouterr().err
    assert main([*calibrate, "--k", "2", "--pool", "4"]) == 2  # one that keeps one to score is another: not mixed
    said = "(its files were made with other settings, the folder's vs this run's: config.user_calibration.draw not set"
    assert said in capsys.readouterr().err


def test_what_no_labelled_image_comes_from_is_one_line(session, tmp_path, capsys):
    folder, _ = session
    base = str(folder / "base.safetensors")

    def refused(spec: str) -> str:
        code = main(["calibrate", "--checkpoint", base, "--data", spec, "--k", "1", "--out", str(tmp_path / "c")])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        return err

    assert "?screen=<screen file> is needed" in refused(f"photos:{folder / 'points.json'}?size={SIZE}")
    assert "no such file" in refused(_spec(folder).replace("points.json", "nothing.json"))
    (tmp_path / "taken").mkdir()  # a folder was said to be no such file
    said = f"the points file {tmp_path / 'taken'} is a folder, not a file"
    assert said in refused(_spec(folder).replace(str(folder / "points.json"), str(tmp_path / "taken")))
    # an id whose file alfa serve takes for no user: accepted, and written as .._x.safetensors
    assert "?person=../x: its file would be .._x.safetensors, which alfa serve takes for no user" in refused(
        _spec(folder) + "&person=../x"
    )
    mixed = tmp_path / "mixed.json"  # a point that gives a gaze has no image to label
    mixed.write_text(json.dumps({"points": [{"photo": str(folder / "p1.png"), "screen_px": [1, 1]},
                                            {"gaze_deg": [1.0, 2.0], "screen_px": [5, 5]}]}))  # fmt: skip
    assert "point 2 gives a gaze, not a photo" in refused(
        _spec(folder).replace(str(folder / "points.json"), str(mixed))
    )
    blank = tmp_path / "blank.png"
    Image.fromarray(np.full((256, 256, 3), 128, np.uint8)).save(blank)
    faceless = tmp_path / "faceless.json"
    faceless.write_text(json.dumps({"points": [{"photo": str(blank), "screen_px": [1, 1]}]}))
    err = refused(_spec(folder).replace(str(folder / "points.json"), str(faceless)))
    assert "point 1's photo" in err and "no face found" in err
    (tmp_path / "junk.png").write_bytes(b"junk")
    (tmp_path / "clip.mp4").write_bytes(b"junk")
    for name, said in (("junk.png", "junk.png is not a readable image"), ("clip.mp4", "clip.mp4 is a video: each")):
        faceless.write_text(json.dumps({"points": [{"photo": name, "screen_px": [1, 1]}]}))
        err = refused(_spec(folder).replace(str(folder / "points.json"), str(faceless)))
        assert f"point 1's photo {tmp_path / said}" in err and err.count(name) == 1 and "--video" not in err
    behind = tmp_path / "behind.json"  # the screen 2 m in front of the camera: the face is behind it
    behind.write_text(json.dumps({**SCREEN, "top_left_mm": [172, 8, 2000]}))
    err = refused(_spec(folder, screen=behind))
    assert "the face is behind the screen's plane" in err
    assert not (tmp_path / "c").exists()


def test_a_command_checking_its_validation_spec_knows_the_photos_kind_in_a_fresh_process(session):
    """alfa pretrain checks --val-data before anything opens a spec (which registers photos:): the check must know
    the kind itself, as a fresh process shows (in the suite another test may have registered it already)."""
    import subprocess
    import sys

    folder, _ = session
    code = (
        "import argparse, sys; from alfa.cli.guards import check_val_data; "
        "check_val_data(argparse.Namespace(val_data=sys.argv[1], data='synthetic:mpii'))"
    )
    run = subprocess.run([sys.executable, "-c", code, _spec(folder)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


def test_a_photos_spec_opened_before_its_module_is_imported_says_what_to_do(monkeypatch):
    """The library's open_dataset knows photos: only once alfa.gaze.photo_data (above the loaders: it needs the
    camera path) is imported; before, "unknown kind" would send a user looking for a typo."""
    import importlib

    from alfa.gaze.data import registry

    for kind, module in registry.REGISTERED_ABOVE.items():
        importlib.import_module(module)
        assert kind in registry._BY_NAME, f"{module} does not register {kind}:"
    monkeypatch.delitem(registry._BY_NAME, "photos")
    with pytest.raises(ValueError) as e:
        registry.open_dataset("photos:points.json?screen=screen.json")
    assert "the photos: kind is registered by alfa.gaze.photo_data: import it first" in str(e.value)
