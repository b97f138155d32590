"""What ``alfa predict`` refuses before it runs, in one line and exit 2, losing nothing: crops of two photos under
one name, an output over an input photo, options that do nothing for these inputs, misspelt or implausible camera
and screen files; and that a large photo still shows its one face."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_models import TinyGazeNet

from alfa.checkpoint import save_model
from alfa.cli import main

pytest.importorskip("cv2")
pytest.importorskip("skimage")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    tmp = tmp_path_factory.mktemp("camera-inputs")
    torch.manual_seed(0)
    model = TinyGazeNet().eval()
    save_model(tmp / "base.safetensors", model, "tiny_gaze_net", input_size=(32, 32))
    return str(tmp / "base.safetensors")


@pytest.fixture(scope="module")
def astronaut() -> np.ndarray:
    from alfa.gaze.camera import read_photo

    return read_photo("skimage:astronaut")[0]


def _photo(path: Path, pixels: np.ndarray) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, compress_level=1)  # zlib's fastest: the pixels are the same
    return str(path)


def _refused(capsys, *argv: str) -> str:
    assert main(["predict", *argv, "--quiet"]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.err.count("\n") == 1 and captured.out == ""
    return captured.err


def test_two_photos_never_write_one_crop_and_no_output_replaces_a_photo(checkpoint, astronaut, tmp_path, capsys):
    a, b = _photo(tmp_path / "a" / "x.png", astronaut), _photo(tmp_path / "b" / "x.png", astronaut)
    crops = ["--checkpoint", checkpoint, "--crops", str(tmp_path / "crops")]
    assert "would both write x-face" in _refused(capsys, a, b, *crops)
    assert "is given twice" in _refused(capsys, a, a, *crops)
    assert not (tmp_path / "crops").exists()
    before = Path(a).read_bytes()
    assert f"--json {a} is this command's IMAGE" in _refused(
        capsys, a, "--checkpoint", checkpoint, "--json", a, "--replace"
    )
    assert Path(a).read_bytes() == before


def test_a_photo_named_like_a_crop_in_the_crops_folder_is_never_replaced(checkpoint, astronaut, tmp_path, capsys):
    """q.png and q-face0.png both in --crops, with --replace: q.png's crop overwrote the photo q-face0.png (exit 0)."""
    q, q_face = _photo(tmp_path / "q.png", astronaut), _photo(tmp_path / "q-face0.png", astronaut)
    before = Path(q_face).read_bytes()
    said = _refused(capsys, q, q_face, "--checkpoint", checkpoint, "--crops", str(tmp_path), "--replace")
    assert f"{q_face} is one of these photos and is named like a crop of {q}" in said
    assert Path(q_face).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q-face0.png", "q.png"]


def test_crops_are_replaced_only_when_asked(checkpoint, tmp_path, capsys):
    argv = ["predict", "skimage:astronaut", "--checkpoint", checkpoint, "--crops", str(tmp_path), "--quiet"]
    assert main(argv) == 0
    crop = tmp_path / "astronaut-face0.png"
    crop.write_bytes(b"edited")
    capsys.readouterr()
    assert "already holds crops of skimage:astronaut: choose another folder, or add --replace" in _refused(
        capsys, *argv[1:-1]
    )
    assert crop.read_bytes() == b"edited"
    assert main([*argv, "--replace"]) == 0 and crop.read_bytes().startswith(b"\x89PNG")


def test_options_that_would_do_nothing_are_refused(checkpoint, tmp_path, capsys):
    photo = ["skimage:astronaut", "--checkpoint", checkpoint]
    assert "--smooth applies to videos (with --video); these are photos" in _refused(capsys, *photo, "--smooth", "0.3")
    assert "--smooth and --every apply to videos" in _refused(capsys, *photo, "--smooth", "0.3", "--every", "2")
    video = [str(tmp_path / "v.mp4"), "--video", "--checkpoint", checkpoint]
    assert "a video is read by its largest face per frame" in _refused(capsys, *video, "--faces", "all")


def test_a_missing_file_or_a_folder_is_named_before_any_model_loads(tmp_path, capsys):
    no_model = ["--checkpoint", str(tmp_path / "no-model.safetensors")]
    assert f"{tmp_path / 'gone.png'}: no such file" in _refused(
        capsys, "skimage:astronaut", str(tmp_path / "gone.png"), *no_model
    )
    assert f"{tmp_path} is a folder, not a photo" in _refused(capsys, str(tmp_path), *no_model)


SCREEN = {"width_mm": 344, "height_mm": 194, "width_px": 1920, "height_px": 1080, "top_left_mm": [172, 8, 0]}


@pytest.mark.parametrize(
    "kind, content, message",
    [
        ("camera", {"matrix": [[512, 0, 256], [0, 512, 256], [0, 0, 1]], "distorsion": [0.5, 0, 0, 0, 0]},
         "unknown key 'distorsion' (expected matrix, distortion, image_size)"),
        ("camera", {"matrix": [[512, 0, 256], [0, 1500, 256], [0, 0, 1]]}, "one is over twice the other"),
        ("camera", {"matrix": [[512, 0, 256], [0, 512, 256], [0, 0, 1]], "distortion": [50, 0, 0, 0, 0]},
         "moves this image's corner"),
        ("camera", {"matrix": [[512, 0, 256], [0, 512, 256], [0, 0, 1]], "distortion": [0, 0, 5, 5, 0]},
         "moves this image's corner"),  # tangential terms count too
        ("camera", {"matrix": [[512, 0, 256], [0, 512, 256], [0, 0, 1]], "image_size": [True, 512]},
         "image_size must be a whole number, got True"),
        ("camera", {"matrix": [[512, 0, 256], [0, 512, 256], [0, 0, 1]], "image_size": [float("inf"), 512]},
         "image_size must be a whole number, got inf"),
        ("screen-fit", {"points": [{"gaze_deg": [0, 0], "screen_px": [1e308, 0]}]}, "lies beyond ±100,000 px"),
        ("screen", {"width_mm": 344, "height_mm": 194, "width_px": 1920, "height_px": 1080, "top_left_mm": [172, 8, 0],
                    "rotaton": [[-1, 0, 0], [0, 1, 0], [0, 0, -1]]}, "unknown key 'rotaton'"),
        ("screen", {**SCREEN, "width_px": 1920.5}, "width_px must be a whole number, got 1920.5"),
        ("screen", {**SCREEN, "width_mm": "wide"}, "width_mm must be numbers, got 'wide'"),
        ("screen-fit", {"degree": 1.5, "points": []}, "degree must be 1 (affine) or 2 (quadratic), got 1.5"),
        ("screen-fit", {"degree": True, "points": []}, "got True"),
        ("screen-fit", {"points": [{"gaze_deg": [0, -200], "screen_px": [0, 0]}]}, "lies beyond ±90°"),
        ("screen-fit", {"points": [{"gaze": [0, 0], "screen_px": [0, 0]}]}, "point 1: unknown key 'gaze'"),
        ("screen-fit", {"points": [{"screen_px": [0, 0]}]}, "point 1 needs either gaze_deg or photo"),
        ("screen-fit", {"points": [{"gaze_deg": [0, 0, 1], "screen_px": [0, 0]}]}, "gaze_deg must have shape (2,)"),
        ("screen-fit", {"points": [{"gaze_deg": [True, "0"], "screen_px": [0, 0]}]},
         "gaze_deg must be numbers, got [True, '0']"),
        ("camera", {"matrix": [[512, 0, 256], [0, 512, 256], [0, 0, 1]], "distortion": [True, False, 0, 0, 0]},
         "distortion must be numbers, got [True, False, 0, 0, 0]"),
        ("camera", {"matrix": [["512", 0, 256], [0, 512, 256], [0, 0, 1]]}, "matrix must be numbers"),
        ("camera", {"matrix": [[512, 0, 256], [0, 512, 256], [0, 0, 1]], "image_size": [-512, 512]},
         "image_size must be positive, got [-512, 512]"),
        ("screen", {**SCREEN, "width_mm": "344"}, "width_mm must be numbers, got '344'"),
        ("screen", {**SCREEN, "top_left_mm": ["172", True, 0]}, "top_left_mm must be numbers"),
        ("screen", {**SCREEN, "width_mm": 1e-320}, "width_mm is 1e-320; a screen's is 1 to 100,000"),
        ("screen", {**SCREEN, "width_px": 10**300}, "a screen's is 1 to 100,000"),
    ],
)  # fmt: skip
def test_a_misspelt_or_implausible_camera_or_screen_file_is_refused(
    checkpoint, tmp_path, capsys, kind, content, message
):
    path = tmp_path / f"{kind}.json"
    path.write_text(json.dumps(content), encoding="utf-8")
    assert message in _refused(capsys, "skimage:astronaut", "--checkpoint", checkpoint, f"--{kind}", str(path))


def test_a_large_photo_shows_its_one_face(astronaut):
    from alfa.gaze.camera.detect import detect_faces

    for side in (1024, 2048):
        large = np.asarray(Image.fromarray(astronaut).resize((side, side), Image.BICUBIC))
        faces = detect_faces(large)
        assert len(faces) == 1 and faces[0].estimated == (), side
        x, y, w, _ = faces[0].box
        assert abs(x / side - 177 / 512) < 0.02 and abs(w / side - 93 / 512) < 0.02  # where it is at 512


def test_crop_names_are_matched_whole_and_replace_removes_a_photos_earlier_crops(
    checkpoint, astronaut, tmp_path, capsys
):
    crops = tmp_path / "crops"
    crops.mkdir()
    (crops / "a-face1-face0.png").write_bytes(b"the crop of a photo named a-face1.png")
    (crops / "a-face3.png").write_bytes(b"an earlier run's fourth face of a.png")
    photo = _photo(tmp_path / "a.png", astronaut)
    argv = ["predict", photo, "--checkpoint", checkpoint, "--crops", str(crops), "--quiet"]
    assert "already holds crops of" in _refused(capsys, *argv[1:-1])  # a-face3.png is a.png's
    assert main([*argv, "--replace"]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in crops.iterdir()) == ["a-face0.png", "a-face1-face0.png"]


def test_no_face_says_the_smallest_face_the_photo_size_allows(checkpoint, tmp_path, capsys):
    blank = np.full((2000, 1000, 3), 128, dtype=np.uint8)
    assert "a frontal face of at least 125 pixels is needed" in _refused(
        capsys, _photo(tmp_path / "blank.png", blank), "--checkpoint", checkpoint
    )


def test_a_file_that_is_no_video_is_refused_in_one_line_without_ffmpegs_own(tmp_path, checkpoint):
    # In a fresh process: FFmpeg reads its log level once, when OpenCV first opens a video; and its lines are the
    # C library's, which capsys does not see.
    import subprocess
    import sys

    garbage = tmp_path / "clip.mp4"
    garbage.write_bytes(b"not a video" * 20)
    argv = [str(garbage), "--video", "--checkpoint", checkpoint]
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import tiny_models; "
        f"from alfa.cli import main; sys.exit(main({['predict', *argv]!r}))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 2
    assert run.stderr == f"alfa predict: error: {garbage} is not a video OpenCV can read\n"  # no bar, no FFmpeg
    assert run.stdout == ""


def test_a_deep_grayscale_photo_is_scaled_to_8_bits_not_clipped_white(astronaut):
    """A 16-bit (or 12-bit in 16) grayscale photo, a near-infrared camera's: Pillow's own conversion clips every
    value above 255 to white; it is scaled by the depth its values use, and the face is found."""
    import io

    from alfa.gaze.camera import decode_photo
    from alfa.gaze.camera.detect import detect_faces

    gray = np.asarray(Image.fromarray(astronaut).convert("L"), dtype=np.uint16)
    for values, depth in ((gray * 257, "16-bit"), (gray * 16, "12-bit")):
        buffer = io.BytesIO()
        Image.fromarray(values.astype(np.uint16)).save(buffer, format="PNG", compress_level=1)
        rgb, notes = decode_photo(buffer.getvalue())
        assert any(f"scaled to 8 bits (I;16, {depth} values)" in n for n in notes), notes
        assert abs(int(rgb[..., 0].astype(int).mean()) - int(gray.mean())) <= 2  # not washed out
        assert len(detect_faces(rgb)) == 1


def test_json_files_in_utf16_or_with_a_bom_and_a_json_named_like_a_crop(checkpoint, astronaut, tmp_path, capsys):
    camera = {"matrix": [[512, 0, 256], [0, 512, 256], [0, 0, 1]]}
    (tmp_path / "utf16.json").write_text(json.dumps(camera), encoding="utf-16")
    (tmp_path / "bom.json").write_text(json.dumps(camera), encoding="utf-8-sig")
    words = _refused(capsys, "skimage:astronaut", "--checkpoint", checkpoint, "--camera", str(tmp_path / "utf16.json"))
    assert f"{tmp_path / 'utf16.json'} is not UTF-8 text" in words
    from alfa.gaze.camera import load_camera

    assert load_camera(tmp_path / "bom.json").matrix[0, 0] == 512
    photo = _photo(tmp_path / "d" / "astro.png", astronaut)
    clash = str(tmp_path / "d" / "astro-face0.png")
    words = _refused(capsys, photo, "--checkpoint", checkpoint, "--crops", str(tmp_path / "d"), "--json", clash)
    assert "is named like a crop of these photos in --crops" in words


def test_replace_keeps_a_photos_earlier_crops_when_the_photo_now_fails(checkpoint, tmp_path, capsys):
    crops = tmp_path / "crops"
    crops.mkdir()
    (crops / "blank-face0.png").write_bytes(b"an earlier run's crop")
    blank = _photo(tmp_path / "blank.png", np.full((256, 256, 3), 128, np.uint8))
    assert "no face found" in _refused(capsys, blank, "--checkpoint", checkpoint, "--crops", str(crops), "--replace")
    assert (crops / "blank-face0.png").read_bytes() == b"an earlier run's crop"


def test_a_box_without_eyes_or_mouth_is_no_face_but_one_without_a_mouth_is(astronaut, monkeypatch):
    """The face cascade alone finds hair or a chin in a tilted photo: a box where neither an eye pair nor a mouth
    is found is dropped; one with only its mouth missing is a face whose mouth the average face places."""
    from alfa.gaze.camera import detect

    monkeypatch.setattr(detect, "_mouth_corners", lambda *a: None)
    (face,) = detect.detect_faces(astronaut)
    assert face.estimated == ("mouth_right", "mouth_left")
    monkeypatch.setattr(detect, "_eye_pair", lambda *a: None)
    assert detect.detect_faces(astronaut) == []


def test_a_damaged_later_frame_does_not_cost_the_first():
    """Counting an animation's frames reads every one; a file cut short fails there, after its first frame was
    read: the count falls back to one frame, and the photo is still read."""
    from alfa.gaze.camera.photo import _frame_count

    class CutShort:
        @property
        def n_frames(self):
            raise IndexError("a damaged frame")

    class Animation:
        n_frames = 3

    assert _frame_count(CutShort()) == 1 and _frame_count(Animation()) == 3


def test_a_header_over_pillows_warning_size_gives_our_one_line_only():
    """Between Pillow's warning (89 M pixels) and its error (179 M) it only warns, which printed a warning above
    the command's own line; our limit is 50 M."""
    import struct
    import warnings
    import zlib

    from alfa.gaze.camera.photo import decode_photo

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 12000, 12000, 8, 2, 0, 0, 0)  # 144 M pixels, RGB
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0")) + chunk(b"IEND", b"")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        with pytest.raises(ValueError, match=r"is 12000×12000: over the limit of 50,000,000 pixels"):
            decode_photo(png, "bomb.png")


def test_pillows_warning_filter_is_set_by_one_thread_at_a_time(astronaut, monkeypatch):
    """The service decodes in worker threads, and ``warnings.catch_warnings`` saves and restores the process's
    one filter list: two threads inside it at once could leave one's filter in place for good. Both places that
    set a Pillow filter (the service's header check, the camera path's decode) hold one lock while Pillow parses."""
    from PIL import Image

    from alfa.gaze.camera.photo import PILLOW_WARNINGS_LOCK, decode_photo
    from alfa.gaze.service.limits import ServiceLimits, open_image

    held = []
    real_open = Image.open
    monkeypatch.setattr(Image, "open", lambda *a, **k: held.append(PILLOW_WARNINGS_LOCK.locked()) or real_open(*a, **k))
    buffer = io.BytesIO()
    Image.fromarray(astronaut[:128, :128]).save(buffer, format="PNG")
    decode_photo(buffer.getvalue())
    open_image(buffer.getvalue(), ServiceLimits()).close()
    assert held == [True, True] and not PILLOW_WARNINGS_LOCK.locked()


def test_a_video_whose_every_frame_fails_says_the_first_frames_reason(astronaut, tmp_path):
    from alfa.gaze.camera import photo

    def analyse(video, predictor, options, alpha, every, camera):
        yield {"frame": 0, "error": "camera.json describes a 640×480 camera; this image is 512×512"}
        yield {"frame": 1, "error": "the same"}

    original = photo.analyse_video
    photo.analyse_video = analyse
    try:
        records, failures = photo.predict_videos(["clip.avi"], None, None, alpha=0.5, every=1, progress=False)
    finally:
        photo.analyse_video = original
    assert records[0]["camera"] is None  # no frame read: no intrinsics used
    assert failures == [
        "clip.avi: no frame with a readable face (the first frame: camera.json describes a 640×480 camera; this "
        "image is 512×512)"
    ]


def test_json_dash_is_refused_and_a_closed_pipe_ends_quietly(checkpoint, tmp_path, capsys, monkeypatch, stdout_pipe):
    monkeypatch.chdir(tmp_path)  # where a file named "-" would appear
    assert "--json -: name a file (this output is not written to stdout)" in _refused(
        capsys, "skimage:astronaut", "--checkpoint", checkpoint, "--json", "-"
    )
    assert not (tmp_path / "-").exists()
    stdout_pipe.use()
    stdout_pipe.close_reader()  # the JSON's print goes to a reader gone (| head)
    assert main(["predict", "skimage:astronaut", "--checkpoint", checkpoint, "--quiet"]) == 141
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("mode", "fmt", "notes"),
    [
        ("RGBA", "PNG", ["its transparency dropped (a transparent pixel shows the colour it stores)"]),
        ("CMYK", "JPEG", ["CMYK converted to RGB"]),
        ("P", "PNG", []),  # a palette converts without loss: nothing to say
        ("RGB", "PNG", []),
    ],
)
def test_a_conversion_that_changes_what_the_photo_shows_is_noted(mode, fmt, notes):
    import io

    from alfa.gaze.camera.photo import decode_photo

    buffer = io.BytesIO()
    Image.new(mode, (64, 64)).save(buffer, format=fmt)
    assert decode_photo(buffer.getvalue())[1] == notes


@pytest.mark.parametrize(
    "image, got",
    [
        (np.zeros((64, 64), np.uint8), "uint8 (64, 64)"),
        (np.zeros((64, 64, 3), np.float32), "float32 (64, 64, 3)"),
        (np.zeros((64, 64, 4), np.uint8), "uint8 (64, 64, 4)"),
        ([[0]], "list"),
    ],
)
def test_detect_faces_names_the_image_it_takes(image, got):
    """A grey or float image gave OpenCV's own assertion from inside its colour conversion."""
    from alfa.gaze.camera import detect_faces

    with pytest.raises(ValueError, match=rf"^detect_faces takes an RGB uint8 image \(H, W, 3\), got {re.escape(got)} "):
        detect_faces(image)
