"""The camera path (alfa.gaze.camera): normalization round trips, a scene of known camera, head pose and gaze,
the angle convention against the loaders', screen points, and detection on a real photo shipped in a wheel."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

cv2 = pytest.importorskip("cv2")

from alfa.gaze.camera import (  # noqa: E402
    Camera,
    HeadPose,
    NormalizationConfig,
    angles_to_gaze_vector,
    detect_faces,
    estimate_head_pose,
    fit_screen,
    gaze_vector_to_angles,
    normalization_of,
    warp_to_camera,
    warp_to_normalized,
)
from alfa.gaze.camera.normalize import FACE_CENTRE_WEIGHTS, FACE_MODEL_MM  # noqa: E402
from alfa.gaze.camera.screen import ILL_CONDITIONED, Screen  # noqa: E402
from alfa.gaze.geometry import angular_error, gazehub_vector_to_pitchyaw  # noqa: E402

K = np.array([[600.0, 0.0, 320.0], [0.0, 600.0, 240.0], [0.0, 0.0, 1.0]])
CAMERA = Camera(K, np.zeros(0), (640, 480), "test")
HEAD_RVEC = np.array([0.12, -0.3, 0.06])  # turned, tilted and rolled a little
HEAD_T = np.array([60.0, -30.0, 550.0])
TARGET = np.array([-150.0, 120.0, 0.0])  # a point below and to the image's left of the camera, in its plane


def _scene_pose() -> HeadPose:
    rotation, _ = cv2.Rodrigues(HEAD_RVEC)
    return HeadPose(rotation, HEAD_T.copy())


def _landmarks(pose: HeadPose) -> np.ndarray:
    rvec, _ = cv2.Rodrigues(pose.rotation)
    points, _ = cv2.projectPoints(FACE_MODEL_MM, rvec, pose.translation_mm, K, None)
    return points.reshape(4, 2)


def _paper_rotation(pose: HeadPose) -> np.ndarray:
    """Zhang et al. 2018, written out here on its own: forward to the face centre, x from the head."""
    centre = FACE_CENTRE_WEIGHTS @ (FACE_MODEL_MM @ pose.rotation.T + pose.translation_mm)
    z = centre / np.linalg.norm(centre)
    y = np.cross(z, pose.rotation[:, 0])
    y /= np.linalg.norm(y)
    return np.stack([np.cross(y, z), y, z])


def _angle_deg(a: np.ndarray, b: np.ndarray) -> float:
    return float(angular_error(torch.as_tensor(a), torch.as_tensor(b)))


def test_warp_maps_a_3d_point_as_the_normalized_camera_sees_it_and_back():
    norm = normalization_of(_scene_pose(), CAMERA)
    config = NormalizationConfig()
    for point in ([0.0, 0.0, 0.0], [25.0, -40.0, 10.0], [-30.0, 55.0, -20.0]):
        p = np.asarray(point) + norm.face_centre_mm  # points around the face centre
        camera_px = K @ p
        normalized = config.matrix() @ norm.scale @ norm.rotation @ p  # the normalized camera's projection
        warped = norm.warp @ camera_px
        assert np.allclose(warped[:2] / warped[2], normalized[:2] / normalized[2], atol=1e-6)
        back = np.linalg.inv(norm.warp) @ warped
        assert np.allclose(back[:2] / back[2], camera_px[:2] / camera_px[2], atol=1e-6)
    # the face centre lands on the crop's centre, at the normalized distance
    centre = norm.warp @ (K @ norm.face_centre_mm)
    assert np.allclose(centre[:2] / centre[2], [112.0, 112.0], atol=1e-6)
    assert (norm.scale @ norm.rotation @ norm.face_centre_mm)[2] == pytest.approx(600.0)


def test_gaze_round_trip_and_convention_of_the_loaders():
    norm = normalization_of(_scene_pose(), CAMERA)
    rng = np.random.default_rng(0)
    g = rng.normal(size=(20, 3))
    g /= np.linalg.norm(g, axis=1, keepdims=True)
    assert np.allclose(norm.to_camera(norm.to_normalized(g)), g, atol=1e-12)
    yaw_pitch = gaze_vector_to_angles(g)
    assert np.allclose(angles_to_gaze_vector(yaw_pitch), g, atol=1e-12)
    # the loaders' formulas (xgaze.py, gazehub.py): pitch = asin(-g_y), yaw = atan2(-g_x, -g_z)
    assert np.allclose(yaw_pitch[:, 0], np.arctan2(-g[:, 0], -g[:, 2]))
    assert np.allclose(yaw_pitch[:, 1], np.arcsin(-g[:, 1]))
    # and the function the gazehub: loader reads 3DGaze columns with (a vector from the face to the target)
    assert np.allclose(yaw_pitch, gazehub_vector_to_pitchyaw(torch.as_tensor(g)).numpy())
    # a person looking into the camera has normalized gaze (0, 0), wherever the face and however the head
    to_camera = -norm.face_centre_mm / np.linalg.norm(norm.face_centre_mm)
    assert np.allclose(gaze_vector_to_angles(norm.to_normalized(to_camera)), 0.0, atol=1e-9)
    # looking towards the image's left and up: positive yaw, positive pitch
    yaw, pitch = gaze_vector_to_angles(np.array([-0.3, -0.2, -0.93]))
    assert yaw > 0 and pitch > 0


def _facing(yaw_deg: float, pitch_deg: float) -> np.ndarray:
    """A head rotation (axes as columns) whose face points at (yaw, pitch), unrolled: its x axis horizontal."""
    z = -np.asarray(angles_to_gaze_vector(np.radians([yaw_deg, pitch_deg])), dtype=np.float64).reshape(3)
    x = np.cross([0.0, 1.0, 0.0], z)
    x /= np.linalg.norm(x)
    return np.stack([x, np.cross(z, x), z], axis=1)


@pytest.mark.parametrize("yaw", [-60.0, -30.0, 0.0, 30.0, 60.0])
def test_the_head_pose_fit_finds_heads_tilted_up_and_down_from_exact_landmarks(yaw):
    """Refined from a frontal start alone, the fit settled on the mirror pose of a head tilted up: (0°, +30°)
    came out (0°, −6°), and (30°, +10°) turned the other way; the normalized head pitch then had the wrong sign."""
    for pitch in (-30.0, -10.0, 10.0, 30.0):
        truth = HeadPose(_facing(yaw, pitch), np.array([0.0, 0.0, 600.0]))
        assert truth.angles()["yaw_deg"] == pytest.approx(yaw, abs=1e-6)  # the check's own construction
        assert truth.angles()["pitch_deg"] == pytest.approx(pitch, abs=1e-6)
        fitted = estimate_head_pose(_landmarks(truth), CAMERA)
        got = fitted.angles()
        assert (got["yaw_deg"], got["pitch_deg"]) == pytest.approx((yaw, pitch), abs=1.0), (yaw, pitch, got)
        normalized = normalization_of(fitted, CAMERA).head_angles(fitted)["pitch_deg"]
        assert np.sign(normalized) == np.sign(normalization_of(truth, CAMERA).head_angles(truth)["pitch_deg"])


def test_a_small_face_is_fitted_and_non_finite_landmarks_are_one_clear_error():
    """SQPnP asserts (cv2.error, not a failed fit) on landmarks close together: a face 10 px between the eyes
    under a 3000 px focal length ended a video's reading and printed OpenCV's assertion to a user."""
    intrinsics = np.array([[3000.0, 0.0, 2000.0], [0.0, 3000.0, 1500.0], [0.0, 0.0, 1.0]])
    far = Camera(intrinsics, np.zeros(0), (4000, 3000), "t")
    pose = HeadPose(_facing(10.0, 5.0), np.array([0.0, 0.0, 3000.0 * 63.0 / 10.0]))
    rvec, _ = cv2.Rodrigues(pose.rotation)
    points, _ = cv2.projectPoints(FACE_MODEL_MM, rvec, pose.translation_mm, far.matrix, None)
    fitted = estimate_head_pose(points.reshape(4, 2), far)  # rough at this size, but a pose
    assert fitted.translation_mm[2] > 0 and np.isfinite(fitted.rotation).all()
    landmarks = _landmarks(HeadPose(_facing(0.0, 0.0), np.array([0.0, 0.0, 600.0])))
    landmarks[2, 0] = np.nan
    with pytest.raises(RuntimeError, match="the head pose fit failed on these landmarks"):
        estimate_head_pose(landmarks, CAMERA)


def test_known_scene_gives_the_known_normalized_gaze():
    truth = _scene_pose()
    gaze_camera = TARGET - FACE_CENTRE_WEIGHTS @ truth.points_mm
    gaze_camera /= np.linalg.norm(gaze_camera)
    expected = _paper_rotation(truth) @ gaze_camera
    estimated = estimate_head_pose(_landmarks(truth), CAMERA)
    assert np.allclose(estimated.rotation, truth.rotation, atol=1e-5)
    assert np.allclose(estimated.translation_mm, truth.translation_mm, atol=1e-3)
    norm = normalization_of(estimated, CAMERA)
    assert _angle_deg(norm.to_normalized(gaze_camera), expected) < 0.01
    # landmarks a detector misplaces by 1 pixel (sd; the eyes are 63 px apart): the normalized gaze moves by
    # 0.27 degrees on average, 1.02 at most over these 30 draws, since the rotation rests on the face centre and
    # the head's x-axis, which four points fix well (the head's yaw and pitch they fix far less well)
    rng = np.random.default_rng(0)
    errors = []
    for _ in range(30):
        noisy = estimate_head_pose(_landmarks(truth) + rng.normal(0, 1.0, (4, 2)), CAMERA)
        errors.append(_angle_deg(normalization_of(noisy, CAMERA).to_normalized(gaze_camera), expected))
    assert np.mean(errors) < 0.5 and max(errors) < 1.5, errors


def _synthetic_face(yaw_pitch_gaze: np.ndarray, yaw_pitch_head: np.ndarray) -> np.ndarray:
    """A synthetic head (the benchmark's renderer) whose normalized gaze and head are the given angles."""
    from alfa.gaze.data.synthetic.domains import get_domain, sample_persons, sample_scenes
    from alfa.gaze.data.synthetic.render import NOISE_CHANNELS, FaceParams, head_rotation, render_faces
    from alfa.gaze.geometry import pitchyaw_to_vector, vector_to_pitchyaw

    g = torch.Generator().manual_seed(0)
    cfg = get_domain("eth")
    values = {**sample_persons(cfg, 1, g), **sample_scenes(cfg, 1, g)}
    head = torch.tensor(yaw_pitch_head, dtype=torch.float32)
    gaze = torch.tensor(yaw_pitch_gaze, dtype=torch.float32)
    rotation = head_rotation(head[:1], head[1:], torch.zeros(1))[0]
    eye = vector_to_pitchyaw(rotation.T @ pitchyaw_to_vector(gaze))
    zero = torch.zeros(1)
    values.update(head_yaw=head[:1], head_pitch=head[1:], head_roll=zero, eye_yaw=eye[:1], eye_pitch=eye[1:])
    values.update(kappa_yaw=zero, kappa_pitch=zero, label_noise_yaw=zero, label_noise_pitch=zero)
    values.update(shift_x=zero, shift_y=zero, scale=torch.ones(1))
    params = FaceParams(**{k: v.float() for k, v in values.items()})
    image = render_faces(params, torch.zeros(1, NOISE_CHANNELS, 224, 224), 224)
    return (image[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)


def test_known_scene_rendered_into_a_camera_image_normalizes_back_to_its_crop():
    truth = _scene_pose()
    true_norm = normalization_of(truth, CAMERA)
    gaze_camera = TARGET - true_norm.face_centre_mm
    gaze_normalized = gaze_vector_to_angles(true_norm.to_normalized(gaze_camera / np.linalg.norm(gaze_camera)))
    head_normalized = gaze_vector_to_angles(-(true_norm.rotation @ truth.rotation)[:, 2])
    crop = _synthetic_face(gaze_normalized, head_normalized)
    photo = warp_to_camera(crop, true_norm, 640, 480)  # the head placed in the camera's image
    norm = normalization_of(estimate_head_pose(_landmarks(truth), CAMERA), CAMERA)
    again = warp_to_normalized(photo, norm)
    inner = slice(8, 216)  # the border resamples the crop's edge
    difference = np.abs(again[inner, inner].astype(float) - crop[inner, inner].astype(float)) / 255
    assert difference.mean() < 0.01, difference.mean()
    # and the crop the path makes carries the scene's gaze: the renderer's label, in the normalized frame
    assert math.degrees(float(np.abs(gaze_normalized).max())) > 5  # a gaze worth checking
    estimated = gaze_vector_to_angles(norm.to_normalized(gaze_camera / np.linalg.norm(gaze_camera)))
    assert np.degrees(np.abs(estimated - gaze_normalized)).max() < 0.01


def test_screen_point_by_ray_plane_intersection_and_by_a_fit():
    screen = Screen(300.0, 200.0, 1500, 1000, np.array([150.0, 10.0, 0.0]))  # webcam 10 mm above the top middle
    origin = np.array([0.0, 100.0, 600.0])
    aim = np.array([-50.0, 60.0, 0.0])  # 50 mm to the image's left of the camera = the screen's right of centre
    point = screen.point(origin, (aim - origin) / np.linalg.norm(aim - origin))
    assert point["x_mm"] == pytest.approx(200.0) and point["y_mm"] == pytest.approx(50.0)
    assert point["x_px"] == pytest.approx(1000.0) and point["y_px"] == pytest.approx(250.0)
    assert point["on_screen"] is True
    assert "error" in screen.point(origin, np.array([0.0, 0.0, 1.0]))  # looking away from the screen
    gaze = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, -8.0], [-12.0, -6.0]])
    pixels = gaze @ np.array([[-40.0, 3.0], [2.0, -50.0]]) + [750.0, 100.0]
    fit = fit_screen(gaze, pixels, degree=1)
    assert fit.rms_px < 1e-6
    assert fit.point(5.0, -4.0)["x_px"] == pytest.approx(750.0 - 200.0 - 8.0)
    with pytest.raises(ValueError, match="at least 6 points"):
        fit_screen(gaze, pixels, degree=2)
    with pytest.raises(ValueError, match="do not determine"):
        fit_screen(np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]), pixels[:3])
    assert fit.leave_one_out_px < 1e-6  # an exactly affine screen: each point is predicted from the others
    assert fit_screen(gaze[:3], pixels[:3]).leave_one_out_px is None  # no point to spare


def test_a_screen_fit_is_refused_where_its_targets_do_not_span_it_and_a_screen_seen_from_behind_says_so():
    """Targets on two rows (a 3×2 grid) leave a quadratic fit free along what they do not span: the gazes' noise
    passed the rank check and moved the screen's centre by hundreds of pixels. A screen whose rotation put the
    person behind it answered with a point mirrored left to right."""
    rng = np.random.default_rng(0)
    targets = np.array([[x, y] for y in (200.0, 880.0) for x in (160.0, 960.0, 1760.0)])
    gaze = (targets - [960.0, 540.0]) @ np.diag([-1 / 40, -1 / 50]) + rng.normal(0, 0.3, (6, 2))
    with pytest.raises(ValueError, match="screen positions lie on one conic"):
        fit_screen(gaze, targets, degree=2)
    row = np.array([[x, 540.0] for x in (160.0, 560.0, 960.0, 1360.0, 1760.0)])
    with pytest.raises(ValueError, match="screen positions lie on one line"):
        fit_screen((row - [960.0, 540.0]) / -40.0 + rng.normal(0, 0.3, (5, 2)), row, degree=1)
    grid = np.array([[x, y] for y in (100.0, 540.0, 980.0) for x in (160.0, 960.0, 1760.0)])
    assert fit_screen((grid - [960.0, 540.0]) / -45.0 + rng.normal(0, 0.3, (9, 2)), grid, degree=2).rms_px >= 0
    behind = Screen(344.0, 194.0, 1920, 1080, np.array([-172.0, 8.0, 0.0]), np.eye(3))
    origin, aim = np.array([0.0, 0.0, 600.0]), np.array([150.0, 50.0, 0.0])
    answer = behind.point(origin, (aim - origin) / np.linalg.norm(aim - origin))
    assert set(answer) == {"error"} and "behind the screen" in answer["error"]


def test_a_fits_leave_one_out_error_is_each_points_error_from_the_others():
    rng = np.random.default_rng(0)
    gaze = rng.uniform(-15, 15, (9, 2))
    pixels = gaze @ np.array([[-40.0, 3.0], [2.0, -50.0]]) + [750.0, 100.0] + rng.normal(0, 20, (9, 2))
    fit = fit_screen(gaze, pixels)
    by_hand = []
    for i in range(9):
        other = fit_screen(np.delete(gaze, i, 0), np.delete(pixels, i, 0))
        x, y = np.array([1.0, *gaze[i]]) @ other.coefficients
        by_hand.append((x - pixels[i, 0]) ** 2 + (y - pixels[i, 1]) ** 2)
    assert fit.leave_one_out_px == pytest.approx(np.sqrt(np.mean(by_hand)), rel=1e-12)
    assert fit.leave_one_out_px > fit.rms_px  # a point the fit has not seen is predicted worse
    assert fit.summary()["points"][0] == {
        "gaze_deg": list(np.round(gaze[0], 3)),
        "screen_px": list(np.round(pixels[0], 1)),
    }


def test_detects_the_astronaut_and_her_landmarks():
    from alfa.gaze.camera import read_photo

    rgb, notes = read_photo("skimage:astronaut")
    faces = detect_faces(rgb)
    assert len(faces) == 1 and notes == []
    x, y, w, h = faces[0].box
    assert 160 <= x <= 195 and 50 <= y <= 85 and 80 <= w <= 110  # her face, by eye: x 177-270, y 66-160
    right_eye, left_eye, mouth_right, mouth_left = faces[0].landmarks
    assert faces[0].estimated == ()
    assert right_eye[0] < left_eye[0] and mouth_right[0] < mouth_left[0]  # the person's right is the image's left
    assert abs(right_eye[1] - left_eye[1]) < 8 and 30 < left_eye[0] - right_eye[0] < 60
    assert mouth_right[1] > right_eye[1] + 25


def test_several_faces_are_refused_before_any_is_normalized_and_each_reader_says_what_to_do(monkeypatch, tmp_path):
    """One face asked, two found: SeveralFaces, raised before a face is normalized or the model runs; alfa predict
    names its option, a calibration photo says it must show one person; the largest face alone is read (a video's
    frames) with one normalization."""
    pytest.importorskip("skimage")
    from PIL import Image

    from alfa.gaze.camera import PhotoOptions, SeveralFaces, analyse_photo, calibration_gaze, read_photo
    from alfa.gaze.camera import photo as photo_module
    from alfa.gaze.camera.photo import predict_photos

    astronaut = read_photo("skimage:astronaut")[0]
    two = np.concatenate([astronaut, astronaut[:, ::-1]], 1)
    normalized, predicted = [], []
    real = photo_module._normalize_face
    monkeypatch.setattr(photo_module, "_normalize_face", lambda *a: normalized.append(1) or real(*a))

    def predictor(crops: torch.Tensor) -> torch.Tensor:
        predicted.append(crops.shape[0])
        return torch.zeros(crops.shape[0], 2)

    with pytest.raises(SeveralFaces) as refused:
        analyse_photo(two, predictor, PhotoOptions(faces="one"))
    assert len(refused.value.boxes) == 2 and str(refused.value).startswith("2 faces found (boxes [")
    assert normalized == [] and predicted == []
    answer, _ = analyse_photo(two, predictor, PhotoOptions(faces="largest"))
    assert len(answer["faces"]) == 1 and normalized == [1] and predicted == [1]
    answer, _ = analyse_photo(two, predictor, PhotoOptions(faces="all"))
    assert len(answer["faces"]) == 2
    path = tmp_path / "two.png"
    Image.fromarray(two).save(path, compress_level=1)  # zlib's fastest: the pixels are the same
    with pytest.raises(ValueError, match=r"^2 faces found \(boxes .*\): a calibration photo must show only the person"):
        calibration_gaze(path, predictor)
    configs = []  # a calibration photo is normalized with the config the fit's photos are read with
    monkeypatch.setattr(photo_module, "_normalize_face", lambda *a: configs.append(a[3]) or real(*a))
    Image.fromarray(astronaut).save(tmp_path / "one.png", compress_level=1)
    wide = NormalizationConfig(distance_mm=900.0)
    calibration_gaze(tmp_path / "one.png", predictor, config=wide)
    assert configs == [wide]
    with pytest.raises(ValueError, match=r"the model's gaze for this face is not finite \(\[nan, 0.0\]\)"):
        analyse_photo(astronaut, lambda crops: torch.tensor([[float("nan"), 0.0]]), PhotoOptions())
    _, failures = predict_photos([str(path)], predictor, PhotoOptions(), progress=False)
    assert failures == [
        f"{path}: 2 faces found (boxes {', '.join(map(str, refused.value.boxes))}); pass --faces all to read every one"
    ]


def test_faces_found_from_several_threads_at_once_are_those_found_one_at_a_time():
    """A server detects in up to 8 workers: one shared OpenCV cascade gave other boxes, missed faces and errors."""
    from concurrent.futures import ThreadPoolExecutor

    from alfa.gaze.camera import read_photo

    astronaut = read_photo("skimage:astronaut")[0]
    photos = [astronaut, np.concatenate([astronaut, astronaut[:, ::-1]], 1)] * 4

    def boxes(rgb: np.ndarray) -> list[tuple[int, int, int, int]]:
        return [face.box for face in detect_faces(rgb)]

    alone = [boxes(rgb) for rgb in photos[:2]] * 4
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(boxes, photos)) == alone


def test_an_ill_conditioned_screen_fit_is_kept_with_a_warning_and_a_well_spread_one_has_none():
    """Gazes that barely spread (the calibration's gazes within a degree of one another) or nearly lie on one line
    pass the rank check, but the fit they make follows their noise: ``warning()`` says so in one line."""
    rng = np.random.default_rng(0)
    grid = np.array([[x, y] for y in (100.0, 540.0, 980.0) for x in (160.0, 960.0, 1760.0)])
    spread = (grid - [960.0, 540.0]) / -60.0 + rng.normal(0, 0.3, (9, 2))  # ±13° by ±7°, a laptop at arm's length
    for degree in (1, 2):
        fit = fit_screen(spread, grid, degree=degree)
        assert fit.warning() is None and fit.condition < ILL_CONDITIONED[degree] / 4
    huddled = np.array([5.0, -10.0]) + rng.normal(0, 0.5, (9, 2))  # every gaze within a degree or so of the others
    along = np.stack([np.linspace(-15, 15, 9), np.linspace(-20, 0, 9)], 1) + rng.normal(0, 0.2, (9, 2))
    for gazes in (huddled, along):
        for degree in (1, 2):
            fit = fit_screen(gazes, grid, degree=degree)
            assert fit.condition > ILL_CONDITIONED[degree]
            assert fit.warning() == (
                f"the screen fit is ill-conditioned (its terms' condition number {fit.condition:.3g} is above "
                f"{ILL_CONDITIONED[degree]:g}): the calibration gazes barely spread or nearly lie on one line, so a "
                "gaze error of a degree may move a screen point far; spread the points over the screen (a 3×3 grid)"
            )
