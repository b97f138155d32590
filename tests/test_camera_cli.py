"""``alfa predict`` on real photos (scikit-image's, inside its wheel) and on bad inputs: one clear line and exit 2;
and ``alfa serve``'s ``/predict/photo`` answering a raw photo."""

from __future__ import annotations

import io
import json
import sys
import threading
import urllib.error
import urllib.request

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


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("camera")
    torch.manual_seed(0)
    model = TinyGazeNet().eval()
    alfa.truncate(model, 8)  # a base the service can share
    save_model(tmp / "base.safetensors", model, "tiny_gaze_net", input_size=(SIZE, SIZE))
    return tmp / "base.safetensors", model


@pytest.fixture(scope="module")
def astronaut() -> np.ndarray:
    from alfa.gaze.camera import read_photo

    return read_photo("skimage:astronaut")[0]


def _write(path, pixels: np.ndarray, fmt: str = "PNG"):
    Image.fromarray(pixels).save(path, format=fmt, compress_level=1)  # zlib's fastest: the pixels are the same
    return str(path)


def test_predict_the_astronaut(checkpoint, tmp_path, capsys):
    path, model = checkpoint
    out = tmp_path / "out.json"
    code = main(["predict", "skimage:astronaut", "--checkpoint", str(path), "--crops", str(tmp_path / "crops"),
                 "--json", str(out), "--quiet"])  # fmt: skip
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    photo = printed["photos"][0]
    assert photo["camera"]["source"].startswith("default") and "atan2(-g_x, -g_z)" in photo["convention"]
    (face,) = photo["faces"]
    assert set(face) >= {"box", "landmarks", "head_pose", "normalization", "gaze_normalized", "gaze_camera", "crop"}
    crop = np.asarray(Image.open(face["crop"]))
    assert crop.shape == (224, 224, 3)
    # the printed normalized gaze is the model's on that crop (resized to its input size), in degrees
    expected = _model_on_crop(model, face["crop"])
    got = [face["gaze_normalized"]["yaw_deg"], face["gaze_normalized"]["pitch_deg"]]
    assert np.allclose(got, expected, rtol=0, atol=1e-3)  # printed to 0.001°
    with torch.no_grad():  # ...a check that tells this crop from a blank one (the tiny model varies little)
        blank = np.degrees(model(torch.zeros(1, 3, SIZE, SIZE))[0].double().numpy())
    assert np.abs(blank - expected).max() > 10 * 1e-3
    # and its camera-frame gaze is that direction turned back by the normalization: g_c = R^T g_n
    from alfa.gaze.camera import angles_to_gaze_vector

    rotation = np.array(face["normalization"]["rotation"])
    g_c = angles_to_gaze_vector(np.radians(expected)) @ rotation
    assert np.allclose(face["gaze_camera"]["vector"], g_c, atol=1e-4)
    # a second run into the same crops folder is refused before any work, the first crop kept
    assert main(["predict", "skimage:astronaut", "--checkpoint", str(path), "--crops", str(tmp_path / "crops")]) == 2
    assert "already holds crops" in capsys.readouterr().err
    assert np.array_equal(np.asarray(Image.open(face["crop"])), crop)


def _error_of(capsys, *args: str) -> str:
    assert main(["predict", *args, "--quiet"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


def test_bad_inputs_give_one_line_and_exit_2(checkpoint, astronaut, tmp_path, capsys):
    ckpt = ["--checkpoint", str(checkpoint[0])]
    assert "no face found" in _error_of(capsys, "skimage:coffee", *ckpt)
    two = _write(tmp_path / "two.png", np.concatenate([astronaut, astronaut], axis=1))
    assert "2 faces found" in _error_of(capsys, two, *ckpt)
    tiny = _write(tmp_path / "tiny.png", astronaut[::16, ::16])
    assert "too small" in _error_of(capsys, tiny, *ckpt)
    corrupt = tmp_path / "corrupt.jpg"
    corrupt.write_bytes(_encoded(astronaut, "JPEG")[:2000])
    assert "not a readable image" in _error_of(capsys, str(corrupt), *ckpt)
    (tmp_path / "junk.png").write_bytes(b"not an image at all")
    assert "not a readable image" in _error_of(capsys, str(tmp_path / "junk.png"), *ckpt)
    assert "missing.png: no such file" in _error_of(capsys, str(tmp_path / "missing.png"), *ckpt)
    wrong = tmp_path / "k.json"
    wrong.write_text(json.dumps({"matrix": [[1000, 0, 960], [0, 1000, 540], [0, 0, 1]], "image_size": [1920, 1080]}))
    message = _error_of(capsys, "skimage:astronaut", *ckpt, "--camera", str(wrong))
    assert "1920×1080 camera; this image is 512×512" in message
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"matrix": [[500, 0, 960], [0, 500, 540], [0, 0, 1]]}))
    assert "outside this 512×512 image" in _error_of(capsys, "skimage:astronaut", *ckpt, "--camera", str(outside))
    (tmp_path / "bad.json").write_text("{")
    assert "is not JSON" in _error_of(capsys, "skimage:astronaut", *ckpt, "--screen", str(tmp_path / "bad.json"))


def test_grayscale_photo_is_read_and_said(checkpoint, astronaut, tmp_path, capsys):
    gray = _write(tmp_path / "gray.png", np.asarray(Image.fromarray(astronaut).convert("L")))
    assert main(["predict", gray, "--checkpoint", str(checkpoint[0]), "--quiet", "--faces", "all"]) == 0
    photo = json.loads(capsys.readouterr().out)["photos"][0]
    assert photo["image"]["notes"] == ["grayscale (L) copied into RGB"] and len(photo["faces"]) == 1


def test_several_photos_one_bad_the_others_kept(checkpoint, astronaut, tmp_path, capsys):
    good = _write(tmp_path / "a.png", astronaut)
    (tmp_path / "b.png").write_bytes(b"junk")
    out = tmp_path / "out.json"
    assert main(["predict", good, str(tmp_path / "b.png"), "--checkpoint", str(checkpoint[0]), "--json", str(out),
                 "--quiet"]) == 2  # fmt: skip
    assert "1 of 2 inputs gave no gaze; first: " in capsys.readouterr().err
    records = json.loads(out.read_text())["photos"]
    assert len(records[0]["faces"]) == 1 and "not a readable image" in records[1]["error"]


def test_screen_geometry_point_for_the_astronaut(checkpoint, tmp_path, capsys):
    screen = tmp_path / "screen.json"
    screen.write_text(json.dumps({"width_mm": 600, "height_mm": 340, "width_px": 1920, "height_px": 1080,
                                  "top_left_mm": [300, 10, 0]}))  # fmt: skip
    assert main(["predict", "skimage:astronaut", "--checkpoint", str(checkpoint[0]), "--screen", str(screen),
                 "--quiet"]) == 0  # fmt: skip
    face = json.loads(capsys.readouterr().out)["photos"][0]["faces"][0]
    point = face["screen"]
    if "error" not in point:  # the ray from her face centre along her camera-frame gaze, onto the plane z = 0
        centre = np.array(face["normalization"]["face_centre_mm"])
        g = np.array(face["gaze_camera"]["vector"])
        hit = centre - centre[2] / g[2] * g
        assert point["x_mm"] == pytest.approx(300 - hit[0], abs=0.1)
        assert point["y_mm"] == pytest.approx(hit[1] - 10, abs=0.1)
    else:
        assert face["gaze_camera"]["vector"][2] >= 0  # only a gaze away from the camera's plane misses it
    # a screen 700 mm deep puts every face behind it: the run is refused, its gazes printed and kept
    screen.write_text(json.dumps({"width_mm": 600, "height_mm": 340, "width_px": 1920, "height_px": 1080,
                                  "top_left_mm": [300, 10, 700]}))  # fmt: skip
    out = tmp_path / "out.json"
    assert main(["predict", "skimage:astronaut", "--checkpoint", str(checkpoint[0]), "--screen", str(screen),
                 "--json", str(out), "--quiet"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert f"--screen {screen}: for every face, the face is behind the screen's plane as its top_left_mm" in err
    assert err.count("\n") == 1 and "gaze_camera" in json.loads(out.read_text())["photos"][0]["faces"][0]


def _encoded(pixels: np.ndarray, fmt: str) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt, compress_level=1)  # as _write's
    return out.getvalue()


def test_serve_answers_a_raw_photo(checkpoint, astronaut, tmp_path, monkeypatch):
    from alfa.gaze.service import GazeService, make_server

    base, _ = alfa.checkpoint.load_model(checkpoint[0])
    alfa.attach(base, alfa.LoraConfig(rank=2))
    alfa.save_adapter(base, tmp_path / "adapters" / "ann.safetensors")
    server = make_server(GazeService(checkpoint[0], tmp_path / "adapters"), port=0)  # LoRA on that base
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/predict/photo"
    try:
        status, answer = _post(f"{url}?user=ann", _encoded(astronaut, "JPEG"))
        assert status == 200 and answer["user"] == "ann" and len(answer["faces"]) == 1
        face = answer["faces"][0]
        assert {"box", "landmarks", "gaze_normalized", "gaze_camera"} <= set(face) and "convention" in answer
        # a photo of two faces: test_service.py's test_a_photo_of_several_faces_is_refused_in_the_services_own_words
        assert _post(f"{url}?user=ann", b"junk")[0] == 400
        png = _encoded(astronaut, "PNG")
        assert _post(f"{url}?user=nobody", png)[0] == 404
        monkeypatch.setitem(sys.modules, "cv2", None)  # a server without the camera extra
        status, answer = _post(f"{url}?user=ann", png)
        assert status == 501 and "cv2 is not installed" in answer["error"]
    finally:
        server.shutdown()
        server.server_close()


def test_a_service_given_its_camera_and_screen_answers_the_screen_point_alfa_predict_gives(
    checkpoint, astronaut, tmp_path, capsys
):
    """A kiosk: one camera and screen for every user. /predict/photo then answers each face's screen point, the
    same as alfa predict --camera --screen of the photo; either option with --selftest, or a bad file, is one line."""
    from alfa.gaze.camera import PhotoOptions, load_camera, load_screen
    from alfa.gaze.service import GazeService, make_server

    (tmp_path / "adapters").mkdir()
    screen, camera = tmp_path / "screen.json", tmp_path / "camera.json"
    screen.write_text(json.dumps({"width_mm": 344, "height_mm": 194, "width_px": 1920, "height_px": 1080,
                                  "top_left_mm": [172, 8, 0]}))  # fmt: skip
    camera.write_text(json.dumps({"matrix": [[600, 0, 250], [0, 600, 260], [0, 0, 1]], "image_size": [512, 512]}))
    photo = _write(tmp_path / "a.png", astronaut)
    assert main(["predict", photo, "--checkpoint", str(checkpoint[0]), "--camera", str(camera), "--screen",
                 str(screen), "--quiet"]) == 0  # fmt: skip
    expected = json.loads(capsys.readouterr().out)["photos"][0]
    options = PhotoOptions(camera=load_camera(camera), screen=load_screen(screen), faces="one")
    alfa.save_adapter(_lora(checkpoint[0]), tmp_path / "adapters" / "ann.safetensors")  # LoRA's B at 0: the base
    server = make_server(GazeService(checkpoint[0], tmp_path / "adapters", photo_options=options), port=0)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/predict/photo?user=ann"
        status, answer = _post(url, (tmp_path / "a.png").read_bytes())
    finally:
        server.shutdown()
        server.server_close()
    assert status == 200 and answer["camera"] == expected["camera"]
    assert answer["faces"][0]["screen"]["method"] == "geometry"
    for key in ("x_px", "y_px", "x_mm", "y_mm", "on_screen"):
        assert answer["faces"][0]["screen"][key] == pytest.approx(expected["faces"][0]["screen"][key], abs=0.2), key
    for option, value in (("--screen", screen), ("--camera", camera)):
        assert main(["serve", "--selftest", option, str(value)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{option} does not apply to --selftest" in err
    screen.write_text(json.dumps({"width_mm": 0.344}))
    assert main(["serve", "--checkpoint", str(checkpoint[0]), "--adapters", str(tmp_path / "adapters"), "--screen",
                 str(screen), "--port", "0"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "screen.json: missing" in err


def _lora(path):
    base, _ = alfa.checkpoint.load_model(path)
    alfa.attach(base, alfa.LoraConfig(rank=2))
    return base


def _post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_video_frames_are_read_and_smoothed(checkpoint, astronaut, tmp_path, capsys):
    import cv2

    video = str(tmp_path / "clip.avi")
    writer = cv2.VideoWriter(video, cv2.VideoWriter_fourcc(*"MJPG"), 5, (512, 512))
    moved = np.roll(astronaut, 12, axis=1)  # the head a little to the right: another camera-frame gaze
    for frame in (astronaut, moved, np.full_like(astronaut, 128)):
        writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
    writer.release()
    assert main(["predict", video, "--video", "--smooth", "0.5", "--checkpoint", str(checkpoint[0]), "--quiet"]) == 0
    record = json.loads(capsys.readouterr().out)["videos"][0]
    frames = record["frames"]
    assert [f["frame"] for f in frames] == [0, 1, 2] and "no face" in frames[2]["error"]
    # the video's intrinsics and convention, as a photo's answer has them
    camera = record["camera"]
    assert camera["source"].startswith("default (no --camera)") and camera["matrix"][0][2] == 256
    assert "atan2(-g_x, -g_z)" in record["convention"] and record["smoothing"] == 0.5
    first, second = (np.array(f["gaze_camera"]["vector"]) for f in frames[:2])
    assert frames[0]["gaze_smoothed"] == {k: frames[0]["gaze_camera"][k] for k in ("yaw_deg", "pitch_deg")}
    from alfa.gaze.camera import gaze_vector_to_angles

    mixed = (first + second) / np.linalg.norm(first + second)
    expected = np.degrees(gaze_vector_to_angles(mixed))
    got = [frames[1]["gaze_smoothed"]["yaw_deg"], frames[1]["gaze_smoothed"]["pitch_deg"]]
    assert np.allclose(got, expected, atol=0.01) and not np.allclose(first, second)


def _model_on_crop(model, crop_file) -> np.ndarray:
    """What a model says, in degrees, on a written crop resized to its input size as the command does."""
    crop = np.asarray(Image.open(crop_file).convert("RGB")).copy()
    x = torch.from_numpy(crop).permute(2, 0, 1)[None].float() / 255
    x = torch.nn.functional.interpolate(x, size=(SIZE, SIZE), mode="bilinear", align_corners=False, antialias=True)
    with torch.no_grad():
        return np.degrees(model(x)[0].double().numpy())


def test_given_intrinsics_with_distortion_a_screen_fit_and_an_adapter(checkpoint, tmp_path, capsys):
    import copy

    from alfa.adapters import adapter_parameters

    adapted = copy.deepcopy(checkpoint[1])
    alfa.attach(adapted, alfa.LoraConfig(rank=2))
    torch.manual_seed(1)
    with torch.no_grad():
        for p in adapter_parameters(adapted).values():
            p.normal_(0, 0.5)  # large enough to move the gaze by degrees
    alfa.save_adapter(adapted, tmp_path / "ann.safetensors")
    camera = tmp_path / "k.json"
    camera.write_text(json.dumps({"matrix": [[700, 0, 250], [0, 700, 260], [0, 0, 1]], "distortion": [0.02, 0, 0, 0],
                                  "image_size": [512, 512]}))  # fmt: skip
    calibration = tmp_path / "fit.json"
    points = [([0, 0], [960, 0]), ([10, 0], [560, 0]), ([0, -10], [960, 500]), ([10, -10], [560, 500])]
    calibration.write_text(json.dumps({"points": [{"gaze_deg": g, "screen_px": s} for g, s in points]}))
    assert main(["predict", "skimage:astronaut", "--checkpoint", str(checkpoint[0]), "--camera", str(camera),
                 "--screen-fit", str(calibration), "--adapter", str(tmp_path / "ann.safetensors"),
                 "--crops", str(tmp_path / "crops"), "--quiet"]) == 0  # fmt: skip
    photo = json.loads(capsys.readouterr().out)["photos"][0]
    assert photo["camera"]["source"] == str(camera) and photo["camera"]["distortion"] == [0.02, 0, 0, 0]
    face = photo["faces"][0]
    yaw, pitch = face["gaze_camera"]["yaw_deg"], face["gaze_camera"]["pitch_deg"]
    assert face["screen"]["method"] == "fit (degree 1)"
    assert face["screen"]["x_px"] == pytest.approx(960 - 40 * yaw, abs=0.1)
    assert face["screen"]["y_px"] == pytest.approx(-50 * pitch, abs=0.1)
    # the gaze is the adapted model's, not the base's
    got = [face["gaze_normalized"]["yaw_deg"], face["gaze_normalized"]["pitch_deg"]]
    assert np.allclose(got, _model_on_crop(adapted, face["crop"]), atol=1e-3)
    assert np.abs(np.subtract(got, _model_on_crop(checkpoint[1], face["crop"]))).max() > 0.5


def test_an_ill_conditioned_screen_fit_is_one_warning_line_and_a_good_one_none(checkpoint, tmp_path, capsys):
    grid = [[x, y] for y in (100, 540, 980) for x in (160, 960, 1760)]
    rng = np.random.default_rng(0)
    spread = [[(960 - x) / 60, (540 - y) / 60] for x, y in grid]  # ±13° by ±7°: a laptop's screen at arm's length
    huddled = (np.array([5.0, -10.0]) + rng.normal(0, 0.5, (9, 2))).tolist()  # every gaze within a degree or so
    said = []
    for name, gazes in (("good", spread), ("huddled", huddled)):
        fit = tmp_path / f"{name}.json"
        fit.write_text(json.dumps({"points": [{"gaze_deg": g, "screen_px": s} for g, s in zip(gazes, grid)]}))
        assert main(["predict", "skimage:astronaut", "--checkpoint", str(checkpoint[0]), "--screen-fit", str(fit),
                     "--quiet"]) == 0  # fmt: skip
        out, err = capsys.readouterr()
        assert json.loads(out)["photos"][0]["faces"][0]["screen"]["method"] == "fit (degree 1)"  # kept either way
        said.append(err)
    assert said[0] == ""
    assert said[1].startswith(f"alfa predict: warning: {tmp_path / 'huddled.json'}: the screen fit is ill-conditioned")
    assert said[1].count("\n") == 1 and "is above 50)" in said[1]


def _calibration_photos(astronaut, folder) -> list[str]:
    """Three photos of one face whose gazes (by the tests' random model) differ: as taken, mirrored, and smaller.
    At 384 px (the face 72 px wide) the cascades still find every landmark in each, and search a photo in half of
    512 px's time."""
    folder.mkdir(exist_ok=True)
    taken = np.asarray(Image.fromarray(astronaut).resize((384, 384)))
    small = np.asarray(Image.fromarray(astronaut).resize((306, 306)))
    padded = np.pad(small, ((39, 39), (13, 65), (0, 0)), mode="edge")
    photos = (taken, taken[:, ::-1].copy(), padded)
    return [_write(folder / f"p{i}.png", p) for i, p in enumerate(photos, start=1)]


def test_a_screen_fit_from_photos_is_the_fit_from_the_gazes_predict_prints(checkpoint, astronaut, tmp_path, capsys):
    path = str(checkpoint[0])
    photos = _calibration_photos(astronaut, tmp_path / "calib")
    assert main(["predict", *photos, "--checkpoint", path, "--quiet"]) == 0
    printed = [p["faces"][0]["gaze_camera"] for p in json.loads(capsys.readouterr().out)["photos"]]
    targets = [[100, 100], [1500, 150], [800, 900]]
    by_photo = tmp_path / "calib" / "fit.json"  # photo names relative to the file's folder
    by_photo.write_text(
        json.dumps({"points": [{"photo": f"p{i}.png", "screen_px": t} for i, t in enumerate(targets, 1)]})
    )
    by_gaze = tmp_path / "gazes.json"  # what a person would write by hand from the printed gazes
    by_gaze.write_text(json.dumps({"points": [{"gaze_deg": [g["yaw_deg"], g["pitch_deg"]], "screen_px": t}
                                              for g, t in zip(printed, targets)]}))  # fmt: skip
    answers = []
    for fit in (by_photo, by_gaze):
        assert main(["predict", *photos, "--checkpoint", path, "--screen-fit", str(fit), "--quiet"]) == 0
        answers.append(json.loads(capsys.readouterr().out))
    from_photos, from_gazes = answers
    summary = from_photos["screen_fit"]
    assert [p["photo"] for p in summary["points"]] == photos
    assert [p["gaze_deg"] for p in summary["points"]] == [[g["yaw_deg"], g["pitch_deg"]] for g in printed]
    assert summary["degree"] == 1 and summary["rms_px"] == 0.0 and summary["leave_one_out_px"] is None
    for a, b, target in zip(from_photos["photos"], from_gazes["photos"], targets):
        assert a["faces"][0]["screen"] == b["faces"][0]["screen"]
        # three points fix an affine fit: each calibration photo lands on the pixel it was taken at (up to the
        # printed gazes' 0.001°, which the fit multiplies)
        assert [a["faces"][0]["screen"]["x_px"], a["faces"][0]["screen"]["y_px"]] == pytest.approx(target, abs=1)


def test_a_screen_fit_photo_that_cannot_be_read_is_named(checkpoint, astronaut, tmp_path, capsys):
    photos = _calibration_photos(astronaut, tmp_path)
    _write(tmp_path / "wall.png", np.full((200, 200, 3), 128, np.uint8))
    (tmp_path / "shots").mkdir()
    points = [{"photo": "p1.png", "screen_px": [0, 0]}, {"photo": "p2.png", "screen_px": [9, 0]}]
    fit = tmp_path / "fit.json"
    for extra, message in [
        ({"photo": "wall.png", "screen_px": [0, 9]}, "point 3's photo {}/wall.png: no face found"),
        ({"photo": "gone.png", "screen_px": [0, 9]}, "point 3's photo {}/gone.png: no such file"),
        ({"photo": "shots", "screen_px": [0, 9]}, "point 3's photo {}/shots: a folder, not a photo"),
        (
            {"photo": "p3.png", "gaze_deg": [1, 2], "screen_px": [0, 9]},
            "point 3 needs either gaze_deg or photo, not both",
        ),
    ]:
        fit.write_text(json.dumps({"points": [*points, extra]}))
        assert (
            main(["predict", photos[0], "--checkpoint", str(checkpoint[0]), "--screen-fit", str(fit), "--quiet"]) == 2
        )
        assert message.format(tmp_path) in capsys.readouterr().err
    fit.write_text(json.dumps({"points": [*points, {"photo": "p3.png", "screen_px": [0, 9]}]}))
    out = tmp_path / "p3.png"  # the --json output may not replace a calibration photo, even with --replace
    code = main(["predict", photos[0], "--checkpoint", str(checkpoint[0]), "--screen-fit", str(fit), "--json", str(out),
                 "--replace"])  # fmt: skip
    assert code == 2 and "is a photo of --screen-fit" in capsys.readouterr().err and out.read_bytes()[:4] == b"\x89PNG"
