"""The face renderer of the synthetic gaze world: parameters in, batches of RGB face crops out.

Everything is float math on pixel grids, batched over images; there is no per-pixel Python loop.

Frames. Directions use the field's ``(yaw, pitch)`` map ``d = (cos p · sin y, sin p, cos p · cos y)``
(spec gaze-data §1). The renderer works in that "d-frame": ``x`` points to the image's left, ``y`` up,
``z`` from the face towards the camera, so a face looking straight into the camera has ``d = (0, 0, 1)``
and a positive gaze yaw moves the iris towards the image's left. The camera is orthographic (a
normalized face crop): pixel ``(row i, column j)`` sees the d-frame point ``x = -u_j``, ``y = -v_i``,
where ``u, v`` run over pixel centres in ``[-1, 1]``. Pixel centres are symmetric about the middle,
so the horizontal flip of the grid is exactly ``x -> -x``.

The head is an ellipsoid rotated by ``R = Ry(yaw) · Rx(pitch) · Rz(roll)``; every pixel is traced to
the front surface and the face is a texture in head coordinates (hair, brows, eye openings, mouth,
glasses), so the whole layout follows the head pose, including foreshortening and the far eye
vanishing behind the head. The eyeballs rotate inside the head: the iris is a disc on the eyeball
along the *optical* axis, while the gaze label is the *visual* axis, which differs by the person's
kappa angle (invisible in the image, so even a perfect image model has a per-person floor).

Flip law. Mirroring the scene (``FaceParams.mirrored``: negate every left/right-odd parameter, such as
yaws, roll, kappa yaw, asymmetries, light azimuth, and flip the noise field) conjugates every
rotation by ``diag(-1, 1, 1)`` and so renders the horizontally flipped image, up to float rounding.

Roll law. Rolling the scene about the camera axis (``FaceParams.rolled``: the head rotation ``Rz · R``, the light,
the crop shift and the background gradient turned) renders the crop rotated about its centre, inside its inscribed
disc and up to bilinear resampling, once the terms fixed to the image frame (``light_grad``, the noise field, the
label noise) are zero (tests/test_roll_law.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from ...geometry import pitchyaw_to_vector, vector_to_pitchyaw

__all__ = ["FaceParams", "render_faces", "gaze_labels", "head_rotation", "NOISE_CHANNELS"]

NOISE_CHANNELS = 4
"""The noise field has one luminance channel and three chroma channels (standard normal)."""

# Parameters that change sign under the left/right mirror; all others are unchanged.
_MIRROR_ODD = frozenset(
    {
        "head_yaw",
        "head_roll",
        "eye_yaw",
        "kappa_yaw",
        "eye_sep_asym",
        "eye_y_asym",
        "eye_w_asym",
        "eye_open_asym",
        "brow_asym",
        "nose_dx",
        "mouth_dx",
        "hair_part",
        "shift_x",
        "light_az",
        "light_grad",
        "bg_grad_x",
        "label_noise_yaw",
    }
)


@dataclass
class FaceParams:
    """Everything that determines one rendered face crop and its label, as a batch.

    Every field is a float tensor of shape ``(B,)`` or ``(B, 3)`` (colours, RGB in [0, 1]). Lengths are
    in head units (the head's half-width is about 0.7; the crop spans [-1, 1]); angles in radians.
    Identity fields are constant over a person's images; scene fields vary per image.
    """

    # --- identity: head shape and colours
    face_w: Tensor  # ellipsoid half-width
    face_h: Tensor  # ellipsoid half-height
    face_d: Tensor  # ellipsoid half-depth
    skin: Tensor  # (B, 3) skin albedo
    hair: Tensor  # (B, 3) hair and brow colour
    iris: Tensor  # (B, 3) iris colour
    sclera: Tensor  # (B, 3) white of the eye
    # --- identity: eyes (each eye's value is base · (1 ± asym) or base ± asym; "outward" is away from the nose)
    eye_sep: Tensor  # half distance between eye centres
    eye_y: Tensor  # eye height on the face
    eye_w: Tensor  # half-width of the eye opening
    eye_open: Tensor  # upper lid height relative to eye_w
    eye_low: Tensor  # lower lid depth relative to eye_w
    eye_tilt: Tensor  # canthal tilt: outer corner up if positive
    lid_skew: Tensor  # upper lid peak shifted inward if positive
    lid_follow: Tensor  # how much the upper lid follows the eye's pitch
    ball_r: Tensor  # eyeball radius
    iris_r: Tensor  # iris radius
    eye_sep_asym: Tensor
    eye_y_asym: Tensor
    eye_w_asym: Tensor
    eye_open_asym: Tensor
    kappa_yaw: Tensor  # visual axis minus optical axis, in the head frame
    kappa_pitch: Tensor
    # --- identity: brows, nose, mouth, hair, glasses
    brow_gap: Tensor
    brow_arch: Tensor
    brow_t: Tensor
    brow_asym: Tensor
    nose_dx: Tensor
    nose_len: Tensor
    nose_h: Tensor  # nose bump height (shading only)
    mouth_y: Tensor
    mouth_w: Tensor
    mouth_curve: Tensor  # smile if negative (the mouth corners go up)
    mouth_dx: Tensor
    hair_y: Tensor  # hairline height at the parting
    hair_part: Tensor
    glasses: Tensor  # 0 or 1
    glasses_rim: Tensor  # rim thickness
    glasses_tint: Tensor
    # --- scene: pose and gaze
    head_yaw: Tensor
    head_pitch: Tensor
    head_roll: Tensor
    eye_yaw: Tensor  # visual axis in the head frame
    eye_pitch: Tensor
    shift_x: Tensor  # crop misalignment (d-frame units) of the face centre
    shift_y: Tensor
    scale: Tensor  # crop scale
    label_noise_yaw: Tensor  # annotation error added to the label only
    label_noise_pitch: Tensor
    # --- scene: light
    light_az: Tensor  # light direction azimuth (positive: from the image's left)
    light_el: Tensor  # elevation (positive: from above)
    ambient: Tensor
    diffuse: Tensor
    light_rgb: Tensor  # (B, 3) light colour
    light_grad: Tensor  # left-right illumination falloff over the crop
    specular: Tensor  # strength of glints on cornea and lenses
    bg: Tensor  # (B, 3) background colour
    bg_grad_x: Tensor
    bg_grad_y: Tensor
    # --- scene: camera
    exposure: Tensor
    white_balance: Tensor  # (B, 3) channel gains (colour cast)
    vignette: Tensor
    blur: Tensor  # Gaussian sigma in camera pixels at the reference size (at most 1)
    noise_read: Tensor  # signal-independent noise std
    noise_shot: Tensor  # signal-dependent noise: std = noise_shot · sqrt(signal)
    noise_chroma: Tensor  # fraction of the noise that is per-channel (colour speckle)
    gamma: Tensor

    @property
    def batch_size(self) -> int:
        return self.face_w.shape[0]

    def mirrored(self) -> FaceParams:
        """The left/right mirror image of every scene in the batch (see the module docstring)."""
        return replace(self, **{name: -getattr(self, name) for name in _MIRROR_ODD})

    def rolled(self, angle: float | Tensor) -> FaceParams:
        """Every scene of the batch rolled about the camera axis by ``angle`` (radians; the sense of
        :func:`alfa.gaze.geometry.roll_gaze`), the scene whose image is the crop rotated about its centre.

        The head rotation becomes ``Rz(angle) · R``, re-expressed as this renderer's yaw, pitch and roll; the
        light direction, the crop shift and the background's gradient rotate with it. Two terms are fixed to the
        image's frame and have no rolled form, so they are kept as they are and a caller that wants the exact law
        sets them to zero: ``light_grad`` (a falloff along the image's columns) and the label noise (added to the
        angles, not to the visual axis); the sensor noise field is the caller's too (rotate it or zero it)."""
        a = torch.as_tensor(angle, dtype=self.head_yaw.dtype).expand_as(self.head_yaw)
        cos, sin = torch.cos(a), torch.sin(a)
        one, zero = torch.ones_like(a), torch.zeros_like(a)
        rz = torch.stack([cos, -sin, zero, sin, cos, zero, zero, zero, one], -1).view(-1, 3, 3)
        rot = rz @ head_rotation(self.head_yaw, self.head_pitch, self.head_roll)
        forward = vector_to_pitchyaw(rot[:, :, 2])  # R e_z is the direction of (yaw, pitch)
        rest = head_rotation(forward[:, 0], forward[:, 1], zero).transpose(1, 2) @ rot  # Rz(roll) alone
        light = vector_to_pitchyaw((rz @ _direction(self.light_az, self.light_el).unsqueeze(-1)).squeeze(-1))

        def turn(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
            return x * cos - y * sin, x * sin + y * cos

        shift_x, shift_y = turn(self.shift_x, self.shift_y)
        bg_grad_x, bg_grad_y = turn(-self.bg_grad_x, -self.bg_grad_y)  # the gradient is along (u, v) = -(x, y)
        return replace(
            self,
            head_yaw=forward[:, 0],
            head_pitch=forward[:, 1],
            head_roll=torch.atan2(rest[:, 1, 0], rest[:, 0, 0]),
            light_az=light[:, 0],
            light_el=light[:, 1],
            shift_x=shift_x,
            shift_y=shift_y,
            bg_grad_x=-bg_grad_x,
            bg_grad_y=-bg_grad_y,
        )

    def select(self, index: Tensor | slice) -> FaceParams:
        return FaceParams(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    @staticmethod
    def cat(parts: list[FaceParams]) -> FaceParams:
        return FaceParams(**{f.name: torch.cat([getattr(p, f.name) for p in parts]) for f in fields(FaceParams)})


def head_rotation(yaw: Tensor, pitch: Tensor, roll: Tensor) -> Tensor:
    """``(B, 3, 3)`` rotation ``Ry(yaw) Rx(pitch) Rz(roll)``: maps the head's forward axis ``(0, 0, 1)``
    to the d-frame direction of ``(yaw, pitch)``; under the mirror it becomes ``R(-yaw, pitch, -roll)``."""
    cy, sy = torch.cos(yaw), torch.sin(yaw)
    cp, sp = torch.cos(pitch), torch.sin(pitch)
    cr, sr = torch.cos(roll), torch.sin(roll)
    one, zero = torch.ones_like(yaw), torch.zeros_like(yaw)
    ry = torch.stack([cy, zero, sy, zero, one, zero, -sy, zero, cy], -1).view(-1, 3, 3)
    rx = torch.stack([one, zero, zero, zero, cp, sp, zero, -sp, cp], -1).view(-1, 3, 3)
    rz = torch.stack([cr, -sr, zero, sr, cr, zero, zero, zero, one], -1).view(-1, 3, 3)
    return ry @ rx @ rz


def _direction(yaw: Tensor, pitch: Tensor) -> Tensor:
    return pitchyaw_to_vector(torch.stack([yaw, pitch], -1))


def gaze_labels(p: FaceParams) -> Tensor:
    """``(B, 2)`` gaze labels ``(yaw, pitch)``: the visual axis in the camera frame, plus annotation noise."""
    rot = head_rotation(p.head_yaw, p.head_pitch, p.head_roll)
    visual = (rot @ _direction(p.eye_yaw, p.eye_pitch).unsqueeze(-1)).squeeze(-1)
    label = vector_to_pitchyaw(visual)
    return label + torch.stack([p.label_noise_yaw, p.label_noise_pitch], -1)


# In place. The per-pixel passes below mostly write into temporaries they own instead of allocating a tensor
# per operation (allocating is a large part of a pass's time). Each in-place step computes exactly what its
# out-of-place form did, element by element: the same operation on the same operands, at most with the
# operands of ``+`` or ``×`` swapped (exact in IEEE arithmetic), never reassociated or fused, so the images are
# bit for bit those of the out-of-place code (tests/test_synthetic_pins.py holds them to checksums).


def _soft_(signed_distance: Tensor, pixel: float | Tensor) -> Tensor:
    """Coverage of a shape from its signed distance (positive inside), ``(0.5 + signed_distance / pixel)`` clamped
    to [0, 1], in place on a temporary: a one-pixel linear ramp, which anti-aliases edges and keeps sub-pixel
    motion (the iris moves by fractions of a pixel) visible."""
    return signed_distance.div_(pixel).add_(0.5).clamp_(0.0, 1.0)


def _rsub_(x: Tensor, a: float | Tensor) -> Tensor:
    """``a - x`` in place on a temporary ``x`` (a float ``a`` as a float32 scalar, as ``a - x`` takes it)."""
    return torch.sub(a if isinstance(a, Tensor) else torch.tensor(a, dtype=x.dtype), x, out=x)


class _Painter:
    """Paints flat-coloured layers from the top down, in one channel: each layer's weight is its
    coverage times what the layers above let through, and the colour is one batched matrix product
    at the end. This keeps the per-pixel work single-channel, which is most of the renderer's speed."""

    def __init__(self, like: Tensor, layers: int, through: Tensor | None = None) -> None:
        b, h, w = like.shape
        self.through = torch.ones_like(like) if through is None else through
        self.owned = through is None  # whether ``through`` is the painter's own (then it is updated in place)
        self.weights = torch.empty(b, layers, h, w, dtype=like.dtype)
        self.colours = torch.empty(b, 3, layers, dtype=like.dtype)
        self.count = 0

    def paint(self, coverage: Tensor | None, colour: Tensor, shade: Tensor | None = None) -> None:
        """A layer of ``colour`` (B, 3) over ``coverage`` (B, H, W) in [0, 1] (``None``: 1 everywhere, and the
        weight ``1 · through`` is ``through`` itself), its colour scaled by ``shade``."""
        weight = self.weights[:, self.count]
        if coverage is None:
            weight.copy_(self.through)
        else:
            torch.mul(coverage, self.through, out=weight)
        if self.owned:
            self.through.sub_(weight)
        else:
            self.through, self.owned = self.through - weight, True
        if shade is not None:
            weight.mul_(shade)
        self.colours[:, :, self.count] = colour
        self.count += 1

    def paint_nothing(self, colour: Tensor) -> None:
        """A layer of zero coverage everywhere: what :meth:`paint` makes of it (its weight ``0 · through`` is
        +0, as ``through`` is finite and never negative, and it leaves ``through`` as it was), without the passes."""
        self.weights[:, self.count].zero_()
        self.colours[:, :, self.count] = colour
        self.count += 1

    def darken(self, amount: Tensor) -> None:
        """A black layer of partial coverage: everything below is dimmed by ``1 - amount`` (``amount``: a
        temporary, overwritten)."""
        factor = _rsub_(amount, 1.0)
        if self.owned:
            self.through.mul_(factor)
        else:
            self.through, self.owned = self.through * factor, True

    def image(self) -> Tensor:
        b, k, h, w = self.weights.shape
        if self.count != k:
            raise RuntimeError(f"painted {self.count} layers, expected {k}")
        return torch.bmm(self.colours, self.weights.view(b, k, h * w)).view(b, 3, h, w)


def _col(t: Tensor) -> Tensor:
    """(B,) -> (B, 1, 1), to broadcast a per-image scalar over the pixel grid."""
    return t[:, None, None]


REFERENCE_SIZE = 64
"""Blur is given in camera pixels of a crop rendered at this size; other sizes scale it, so a domain
looks the same at every size, only more finely sampled."""


def _blur(img: Tensor, sigma: Tensor, radius: int) -> Tensor:
    """Separable Gaussian blur with a per-image sigma (a depthwise convolution, one kernel per image).
    The kernel is symmetric and the padding replicates edges, so the blur commutes with the flip. The
    radius is fixed by the image size alone, so an image's arithmetic never depends on its batch."""
    b, ch, h, w = img.shape
    taps = torch.arange(-radius, radius + 1, dtype=img.dtype)
    kernel = torch.exp(-0.5 * (taps / sigma.clamp_min(1e-3)[:, None]) ** 2)
    kernel = (kernel / kernel.sum(1, keepdim=True)).repeat_interleave(ch, 0)  # (B·C, K)
    x = F.pad(img.reshape(1, b * ch, h, w), (radius,) * 4, mode="replicate")
    x = F.conv2d(x, kernel[:, None, None, :], groups=b * ch)
    x = F.conv2d(x, kernel[:, None, :, None], groups=b * ch)
    return x.reshape(b, ch, h, w)


class _EyeWindow:
    """The pixels around one eye: a fixed-size box per batch, placed per image, that provably holds
    every painted feature of that eye (opening, lids, brow, glasses), so the eye's many per-pixel
    operations run on about a sixth of the crop. Outside it each feature's coverage is exactly zero."""

    def __init__(self, rows: Tensor, cols: Tensor, r: int) -> None:
        self.shape = (rows.shape[0], rows.shape[1], cols.shape[1])
        self.index = (rows[:, :, None] * r + cols[:, None, :]).view(rows.shape[0], -1)  # (B, h·w)

    def gather(self, full: Tensor) -> Tensor:
        """(B, r, r) -> (B, h, w)."""
        b = full.shape[0]
        return full.reshape(b, -1).gather(1, self.index).view(self.shape)


def _eye_window(
    centre: Tensor, half_extent: Tensor, centres: Tensor, pixel: float, full: bool
) -> tuple[_EyeWindow, Tensor, Tensor]:
    """The window around image point ``centre`` (B, 2) = (u, v) covering ``half_extent`` (B, 2), and the
    pixel-centre coordinates ``u`` (B, 1, w) and ``v`` (B, h, 1) inside it."""
    r = centres.shape[0]
    b = centre.shape[0]
    if full:
        span = torch.arange(r).expand(b, r)
        return _EyeWindow(span, span, r), centres[span][:, None, :], centres[span][:, :, None]
    size = (2 * half_extent.amax(0) / pixel).ceil().long() + 3  # (w, h) in pixels, with margin
    w, h = (min(int(n), r) for n in size)
    index_centre = (centre + 1.0) / pixel - 0.5  # continuous pixel index of the centre
    col0 = (index_centre[:, 0] - (w - 1) / 2).round().long().clamp(0, r - w)
    row0 = (index_centre[:, 1] - (h - 1) / 2).round().long().clamp(0, r - h)
    cols = col0[:, None] + torch.arange(w)
    rows = row0[:, None] + torch.arange(h)
    return _EyeWindow(rows, cols, r), centres[cols][:, None, :], centres[rows][:, :, None]


def render_faces(p: FaceParams, noise: Tensor, size: int, *, eye_windows: bool = True) -> Tensor:
    """Render a batch of face crops.

    ``noise`` is the sensor noise field, standard normal, shape ``(B, 4, r, r)``: ``r`` is the camera's
    resolution (the scene is rendered at ``r``, then resampled to ``size``, as a normalization warp
    does with a low-resolution camera). Returns float RGB ``(B, 3, size, size)`` in [0, 1].
    ``eye_windows=False`` computes the eyes over the whole crop instead of their windows (same image;
    it exists to test that the windows hold everything).
    """
    b, r = p.batch_size, noise.shape[-1]
    if noise.shape != (b, NOISE_CHANNELS, r, r):
        raise ValueError(f"noise must be (B, {NOISE_CHANNELS}, r, r) with B={b}, got {tuple(noise.shape)}")
    surface = _trace_head(p, r)
    optics = _eye_optics(p, surface.rot)
    eyes = _paint_eyes(p, surface, optics, eye_windows)
    albedo = _paint_face_under_eyes(p, surface, eyes.through.view(b, r, r)).add_(eyes.colour.view(b, 3, r, r))
    img = _shade(p, surface, optics, albedo, eyes)
    return _camera(p, img, noise, surface, size)


@dataclass
class _HeadSurface:
    """The pixel grid of a crop of ``r × r`` pixels, every pixel traced to the front of the head."""

    centres: Tensor  # (r,) pixel-centre coordinates in [-1, 1]
    u: Tensor  # (1, 1, r): image right
    v: Tensor  # (1, r, 1): image down
    pixel: float  # a pixel's side in crop units
    rot: Tensor  # (B, 3, 3) head rotation
    origin: Tensor  # (B, 2) d-frame position of the head centre in the crop
    face: Tensor  # (B, r, r) coverage of the head's outline
    hx: Tensor  # (B, r, r) head-frame coordinates of the surface point, in unscaled head units
    hy: Tensor
    hz: Tensor
    hpix: Tensor  # (B,) a pixel in head units (ignoring foreshortening)


def _trace_head(p: FaceParams, r: int) -> _HeadSurface:
    """Trace every pixel of an ``r × r`` crop to the front of the head ellipsoid."""
    centres = (torch.arange(r, dtype=torch.float32) + 0.5) * (2.0 / r) - 1.0
    u, v = centres.view(1, 1, r), centres.view(1, r, 1)  # image right, image down
    pixel = 2.0 / r

    rot = head_rotation(p.head_yaw, p.head_pitch, p.head_roll)  # (B, 3, 3)
    a, bb, c = p.face_w * p.scale, p.face_h * p.scale, p.face_d * p.scale

    # The front of the head ellipsoid x^T Q x = 1, Q = R diag(1/a², 1/b², 1/c²) R^T.
    q = rot @ torch.diag_embed(torch.stack([a, bb, c], -1).reciprocal().square()) @ rot.transpose(1, 2)
    # Like a gaze normalization, the crop is centred on the face centre (midway between eyes and mouth,
    # on the surface), not on the head's centre, so the face stays in the crop at large head yaw.
    centre_y = 0.5 * (p.eye_y + p.mouth_y)
    face_centre = torch.stack([torch.zeros_like(centre_y), centre_y, _surface_z(p, 0.0, centre_y)], -1)
    origin = torch.stack([p.shift_x, p.shift_y], -1) - (rot @ face_centre.unsqueeze(-1))[:, :2, 0] * p.scale[:, None]
    px = -u - _col(origin[:, 0])  # (B, 1, r) d-frame x relative to the head centre
    py = -v - _col(origin[:, 1])  # (B, r, 1)
    qa = _col(q[:, 2, 2])
    qb = _col(q[:, 0, 2]) * px + _col(q[:, 1, 2]) * py
    # qc = (q00 px² - 1) + 2 q01 px py + q11 py², summed in that order
    qc = (2 * _col(q[:, 0, 1]) * px * py).add_(_col(q[:, 0, 0]) * px * px - 1.0).add_(_col(q[:, 1, 1]) * py * py)
    disc = (qb * qb).sub_(qc.mul_(qa))
    z = disc.clamp_min(0.0).sqrt_().sub_(qb).div_(qa)
    # The projected outline is e = 1 - disc/qa = 1; (1 - sqrt(e)) · radius approximates the distance to it.
    outline = _rsub_(disc.div_(qa), 1.0)
    face = _soft_(_rsub_(outline.clamp_min_(0.0).sqrt_(), 1.0).mul_(_col(0.5 * (a + bb))), pixel)

    # Head-frame coordinates of the surface point, in unscaled head units: h = R^T (px, py, z) / scale.
    def head_coord(k: int) -> Tensor:
        along_x, along_y, along_z = (_col(rot[:, j, k] / p.scale) for j in range(3))
        return (along_x * px + along_y * py).add_(z * along_z)

    hx, hy, hz = head_coord(0), head_coord(1), head_coord(2)
    hpix = pixel / p.scale
    return _HeadSurface(centres, u, v, pixel, rot, origin, face, hx, hy, hz, hpix)


@dataclass
class _EyeOptics:
    """The light and the eyes' optical axis of every image, shared by both eyes (and the light by the shading)."""

    light_head: Tensor  # (B, 3) towards the light, in the head frame
    half: Tensor  # (B, 3) d-frame half vector between the light and the camera (corneal glints)
    optical: Tensor  # (B, 3) the eyes' optical axis, d-frame
    o_dir_x: Tensor  # (B, 1, 1) image-plane direction of the optical axis
    o_dir_y: Tensor
    o_squash: Tensor  # (B, 1, 1) foreshortening of the iris disc
    pupil_frac: Tensor  # (B, 1, 1) pupil radius relative to the iris
    lid_shift: Tensor  # (B,) how far the upper lids follow the eye's pitch


def _eye_optics(p: FaceParams, rot: Tensor) -> _EyeOptics:
    light = _direction(p.light_az, p.light_el)  # (B, 3), d-frame, pointing towards the light
    light_head = (rot.transpose(1, 2) @ light.unsqueeze(-1)).squeeze(-1)
    half = light + torch.tensor([0.0, 0.0, 1.0])
    half = half / half.norm(dim=-1, keepdim=True)
    optical_head = _direction(p.eye_yaw - p.kappa_yaw, p.eye_pitch - p.kappa_pitch)
    optical = (rot @ optical_head.unsqueeze(-1)).squeeze(-1)  # (B, 3) d-frame
    o_xy = optical[:, :2].norm(dim=-1).clamp_min(1e-6)
    o_dir_x, o_dir_y = _col(optical[:, 0] / o_xy), _col(optical[:, 1] / o_xy)
    o_squash = _col(optical[:, 2].clamp_min(0.08))
    # Pupils contract in bright light; upper lids follow the eye's pitch (they drop when looking down).
    brightness = p.exposure * (p.ambient + 0.6 * p.diffuse)
    pupil_frac = _col((0.55 - 0.25 * brightness).clamp(0.25, 0.55))
    lid_shift = p.lid_follow * optical_head[:, 1]
    return _EyeOptics(light_head, half, optical, o_dir_x, o_dir_y, o_squash, pupil_frac, lid_shift)


_RIM = torch.tensor((0.1, 0.09, 0.09))  # the glasses' frame
_PUPIL = torch.tensor((0.03, 0.03, 0.03))
_LASH = torch.tensor((0.08, 0.06, 0.05))
_LIPS = torch.tensor([0.72, 0.42, 0.42])  # the lips' colour relative to the skin's


@dataclass
class _Eyes:
    """Both eyes painted into the crop, flattened to ``r · r`` pixels, and the eye sockets' shading terms."""

    colour: Tensor  # (B, 3, r·r) the eyes' painted colour, already weighted by their coverage
    through: Tensor  # (B, r·r) what the eyes let through to the face below
    glint: Tensor  # (B, r·r) specular spots: corneal reflections and lens glare
    sockets: Tensor  # (B, r, r) eye-socket depressions: their coverage and height gradient
    socket_gx: Tensor
    socket_gy: Tensor


def _paint_eyes(p: FaceParams, surface: _HeadSurface, optics: _EyeOptics, eye_windows: bool) -> _Eyes:
    """The eyes, each in its window, painted top-down (see _Painter) and scattered into the crop."""
    b, r = p.batch_size, surface.centres.shape[0]
    eye_colour = torch.zeros(b, 3, r * r)
    eye_through = torch.ones(b, r * r)
    glint = torch.zeros(b, r * r)
    sockets = torch.zeros_like(surface.hx)
    socket_gx, socket_gy = torch.zeros_like(surface.hx), torch.zeros_like(surface.hx)
    on_face = surface.hz > 0
    for side in (1.0, -1.0):  # +1: the eye on the head's +x side (image left when frontal)
        ex0 = p.eye_sep * (1 + side * p.eye_sep_asym)
        ey0 = p.eye_y + side * p.eye_y_asym
        ew0 = p.eye_w * (1 + side * p.eye_w_asym)
        ex, ey, ew = _col(ex0), _col(ey0), _col(ew0)

        # Sockets shade softly over a wide area, so they are computed over the whole crop.
        ds = torch.mul(surface.hx, side).sub_(ex).div_(1.6 * ew)
        dt = torch.sub(surface.hy, ey).div_(1.4 * ew)
        dip = (ds * ds).add_(dt * dt).neg_().clamp_min_(-30.0).exp_().mul_(on_face)
        sockets.add_(dip)
        socket_gx.add_(ds.mul_(dip).mul_(side).div_(ew))
        socket_gy.add_(dt.mul_(dip).div_(ew))

        eye = (ex0, ey0, ew0)
        window, wu, wv = _window_of_eye(p, surface, side, eye, full=not eye_windows)
        painter, eye_glint = _paint_eye(p, surface, optics, side, eye, window, wu, wv)

        # Into the crop: this eye lies under the eyes painted before it (the same order as one painter).
        through_above = eye_through.gather(1, window.index)
        eye_colour.scatter_add_(
            2, window.index[:, None].expand(b, 3, -1), painter.image().view(b, 3, -1).mul_(through_above[:, None])
        )
        eye_through.scatter_(1, window.index, through_above.mul_(painter.through.view(b, -1)))
        glint.scatter_add_(1, window.index, eye_glint.view(b, -1))
    return _Eyes(eye_colour, eye_through, glint, sockets, socket_gx, socket_gy)


def _window_of_eye(
    p: FaceParams, surface: _HeadSurface, side: float, eye: tuple[Tensor, Tensor, Tensor], full: bool
) -> tuple[_EyeWindow, Tensor, Tensor]:
    """The window of one eye (``eye``: as for :func:`_paint_eye`): a head-frame box holding every feature
    :func:`_paint_eye` paints, projected into the image (see :func:`_eye_window`)."""
    ex0, ey0, ew0 = eye
    rim, tilt = p.glasses_rim, p.eye_tilt.abs() * 1.1 * ew0
    margin = 0.01 + 2 * surface.hpix
    box_x = torch.maximum(0.8 * ex0 + rim, 1.6 * ew0) + margin
    brow_top = p.brow_gap + side * p.brow_asym + p.brow_arch.clamp_min(0.0) + 1.4 * p.brow_t
    lid_top = (0.9 * (1 + p.lid_skew.abs()) + 0.05) * ew0 + 0.02  # the upper lid and its lash line
    box_up = torch.stack([brow_top, 1.25 * ew0 + 0.02 + rim, lid_top], -1).amax(-1) + tilt + margin
    box_down = torch.maximum(0.6 * ew0, 1.25 * ew0 - 0.02 + rim) + tilt + margin
    box_y = ey0 + 0.5 * (box_up - box_down)
    near_x = (ex0 - box_x).clamp_min(0.0)
    near_y = torch.minimum((ey0 - box_down).abs(), (ey0 + box_up).abs()) * ((ey0 - box_down) * (ey0 + box_up) > 0)
    z_top = _surface_z(p, near_x, near_y)
    z_low = _surface_z(p, ex0 + box_x, torch.maximum((ey0 - box_down).abs(), (ey0 + box_up).abs()), floor=0.0)
    box_centre = torch.stack([side * ex0, box_y, 0.5 * (z_top + z_low)], -1)
    box_half = torch.stack([box_x, 0.5 * (box_up + box_down), 0.5 * (z_top - z_low)], -1)
    centre_img = (surface.rot @ box_centre.unsqueeze(-1))[:, :2, 0] * p.scale[:, None] + surface.origin
    half_img = (surface.rot[:, :2].abs() @ box_half.unsqueeze(-1))[:, :, 0] * p.scale[:, None]
    return _eye_window(-centre_img, half_img, surface.centres, surface.pixel, full=full)


def _paint_eye(
    p: FaceParams,
    surface: _HeadSurface,
    optics: _EyeOptics,
    side: float,
    eye: tuple[Tensor, Tensor, Tensor],
    window: _EyeWindow,
    wu: Tensor,
    wv: Tensor,
) -> tuple[_Painter, Tensor]:
    """One eye's layers inside its window, top-down: glasses rim and lens, pupil, iris, sclera, lash line,
    brow. ``eye`` is ``(x, y, half-width)`` of its opening in the head frame, per image, ``x`` unsigned (the
    eye's centre is at ``side · x``). Returns the painter and the eye's specular glint (B, h, w)."""
    ex0, ey0, ew0 = eye
    ex, ey, ew = _col(ex0), _col(ey0), _col(ew0)
    whx, why, whz = window.gather(surface.hx), window.gather(surface.hy), window.gather(surface.hz)
    sc, iris_r = _col(p.scale), _col(p.iris_r)

    up = _col((p.eye_open * (1 + side * p.eye_open_asym) + optics.lid_shift).clamp(0.05, 0.9))
    low = _col((p.eye_low - 0.3 * optics.lid_shift).clamp(0.1, 0.6))
    outward = torch.mul(whx, side).sub_(ex)
    s_along = outward / ew  # along the eye, outward positive, both eyes alike
    t = torch.sub(why, ey).div_(ew).sub_(s_along * _col(p.eye_tilt))
    s_along2 = s_along * s_along
    bell = 1.0 - s_along2
    upper = (bell * up).mul_(_rsub_(s_along * _col(p.lid_skew), 1.0))
    whpix = _col(surface.hpix)
    # Only the face side of the head carries eyes (at extreme yaw the back of the head shows).
    front = (whz > 0).float()
    inside = _soft_(torch.minimum(upper - t, (bell * low).add_(t), out=whz).mul_(ew), whpix).mul_(front)
    painter = _Painter(whx, layers=6)
    eye_glint = _paint_glasses(p, optics, side, (ex, ey, ew), (outward, why, front, whpix), painter)

    # The eyeball sits behind the surface; the iris is a disc on it along the optical axis.
    optical = optics.optical
    ball_head = torch.stack([side * ex0, ey0, _surface_z(p, ex0, ey0) - 0.85 * p.ball_r], -1)
    ball = (surface.rot @ ball_head.unsqueeze(-1))[:, :, 0] * p.scale[:, None]
    ball[:, :2] += surface.origin
    wx = -wu - _col(ball[:, 0] + p.scale * p.ball_r * optical[:, 0])
    wy = -wv - _col(ball[:, 1] + p.scale * p.ball_r * optical[:, 1])
    along = (wx * optics.o_dir_x + wy * optics.o_dir_y).div_(optics.o_squash)
    across = wx * optics.o_dir_y - wy * optics.o_dir_x
    ell = along.mul_(along).add_(across.mul_(across)).sqrt_().div_(sc)  # head units
    t_above = t.sub_(upper)  # t - upper
    lid_shadow = _rsub_((t_above / 0.25).clamp_(-30.0, 0.0).exp_().mul_(0.45), 1.0)
    painter.paint(_soft_(torch.sub(iris_r * optics.pupil_frac, ell), whpix).mul_(inside), _PUPIL)
    ring = _rsub_((ell / iris_r).sub_(0.6).div_(0.4).clamp_(0.0, 1.0).mul_(0.5), 1.0)
    painter.paint(_soft_(_rsub_(ell, iris_r), whpix).mul_(inside), p.iris, ring.mul_(lid_shadow))
    painter.paint(inside, p.sclera, _rsub_(s_along2.clamp_(max=1.0).mul_(0.3), 1.0).mul_(lid_shadow))

    # Corneal glint: the light's reflection on the eyeball, fixed by light and eye position, not by gaze.
    gx = -wu - _col(ball[:, 0] + p.scale * 0.9 * p.ball_r * optics.half[:, 0])
    gy = -wv - _col(ball[:, 1] + p.scale * 0.9 * p.ball_r * optics.half[:, 1])
    spot = (0.2 * iris_r * sc).clamp_min(0.45 * surface.pixel)
    corneal = (gx * gx + gy * gy).neg_().div_(2 * spot * spot).clamp_min_(-30.0).exp_().mul_(inside)
    eye_glint = corneal if eye_glint is None else eye_glint.add_(corneal)

    # Lash line above the upper lid, then the brow above that.
    above = t_above.mul_(ew)
    lash = torch.minimum(above, 0.018 - above, out=inside)
    lash = torch.minimum(lash, _rsub_(s_along.abs_(), 1.08).mul_(ew), out=lash)
    painter.paint(_soft_(lash, whpix).mul_(front), _LASH)
    sb = outward.sub_(0.2 * ew).div_(1.35 * ew)
    brow_c = _rsub_(sb * sb, 1).mul_(_col(p.brow_arch)).add_(ey + _col(p.brow_gap + side * p.brow_asym))
    brow = _rsub_(sb * 0.4, 1.0).mul_(_col(p.brow_t)).sub_(_rsub_(brow_c, why).abs_())
    brow = torch.minimum(brow, _rsub_(sb.abs_(), 1).mul_(ew), out=brow)
    painter.paint(_soft_(brow, whpix).mul_(front), p.hair * 0.9)
    return painter, eye_glint


def _paint_glasses(
    p: FaceParams,
    optics: _EyeOptics,
    side: float,
    eye: tuple[Tensor, Tensor, Tensor],
    grid: tuple[Tensor, Tensor, Tensor, Tensor],
    painter: _Painter,
) -> Tensor | None:
    """The glasses' layers of one eye (:func:`_paint_eye`'s first): a rim around the eye, a tinted lens with a
    glare that moves with the light; returns the glare (B, h, w). A lens spans 80% of the way to the midline,
    so the two never overlap (their painting order is moot). ``eye`` is ``(x, y, half-width)``, each (B, 1, 1);
    ``grid``: :func:`_paint_eye`'s ``outward``, ``why``, ``front`` and ``whpix``.

    In a batch without glasses (a person's images share them) the rim's and the lens's coverages are +0
    everywhere, so the rim paints nothing, the tint dims nothing and the glare is +0, which adds nothing to
    the corneal glint: then the layers are painted empty and no glare is returned (``None``)."""
    ex, ey, ew = eye
    outward, why, front, whpix = grid
    if not bool(p.glasses.any()):
        painter.paint_nothing(_RIM)
        return None
    has_glasses = _col(p.glasses)
    lens_w = 0.8 * ex
    gdx = outward / lens_w
    gdy = torch.sub(why, ey).sub_(0.02).div_(1.25 * ew)
    rho = (gdx * gdx).add_(gdy * gdy).sqrt_()
    to_rim = rho.sub_(1.0).mul_(torch.minimum(lens_w, 1.25 * ew))  # about the distance to the rim line
    painter.paint(_soft_(_rsub_(to_rim.abs(), 0.5 * _col(p.glasses_rim)), whpix).mul_(has_glasses).mul_(front), _RIM)
    lens = _soft_(to_rim.neg_(), whpix).mul_(has_glasses).mul_(front)
    painter.darken(lens * _col(p.glasses_tint))
    rx = gdx.sub_(side * 0.55 * _col(optics.light_head[:, 0]))
    ry = gdy.sub_(0.55 * _col(optics.light_head[:, 1]))
    return lens.mul_(0.5).mul_((rx * -24.0).mul_(rx).sub_((ry * 8.0).mul_(ry)).clamp_min_(-30.0).exp_())


_NOSE_W = 0.07  # half-width of the nose bump


def _nose_top_and_length(p: FaceParams) -> tuple[Tensor, Tensor]:
    """(B, 1, 1) head-frame height where the nose starts, and its length."""
    return _col(p.eye_y) - 0.05, _col(p.nose_len)


def _paint_face_under_eyes(p: FaceParams, surface: _HeadSurface, eye_through: Tensor) -> Tensor:
    """The rest of the face's albedo (B, 3, r, r), under the eyes (``eye_through``: what they let through):
    the glasses' bridge, the nostrils, the lips, the hair and the skin."""
    hx, hy, hpix = surface.hx, surface.hy, _col(surface.hpix)
    painter = _Painter(hx, layers=4, through=eye_through)
    if bool(p.glasses.any()):
        bridge = _rsub_(torch.sub(hy, _col(p.eye_y) + 0.05).abs_(), 0.5 * _col(p.glasses_rim))
        bridge = torch.minimum(bridge, _rsub_(hx.abs(), _col(p.eye_sep) * 0.3), out=bridge)
        painter.paint(_soft_(bridge, hpix).mul_(_col(p.glasses)), _RIM)
    else:  # as in _paint_glasses: the bridge's coverage is +0 everywhere
        painter.paint_nothing(_RIM)
    nose_top, nose_len = _nose_top_and_length(p)
    nostril = torch.zeros_like(hx)
    ndy = torch.sub(hy, nose_top - nose_len).div_(0.014)
    ndy2 = ndy.mul_(ndy)  # the same for both nostrils
    for side in (1.0, -1.0):
        ndx = torch.sub(hx, _col(p.nose_dx)).sub_(side * 0.035).div_(0.022)
        nostril.add_(ndx.mul_(ndx).add_(ndy2).neg_().clamp_min_(-30.0).exp_())
    painter.darken(nostril.clamp_(max=1.0).mul_(0.6))
    mouth_s = torch.sub(hx, _col(p.mouth_dx)).div_(_col(p.mouth_w))
    mouth_t = _rsub_((mouth_s * _col(p.mouth_curve)).mul_(mouth_s).add_(_col(p.mouth_y)), hy).abs_()
    lips = _rsub_(mouth_s * mouth_s, 1).mul_(0.022).sub_(mouth_t)
    lips = torch.minimum(lips, _rsub_(mouth_s.abs_(), 1).mul_(_col(p.mouth_w)), out=lips)
    painter.paint(_soft_(lips, hpix), p.skin * _LIPS)
    hairline = _rsub_(torch.sub(hx, _col(p.hair_part)).div_(_col(p.face_w)).pow_(2).mul_(0.35), _col(p.hair_y))
    painter.paint(_soft_(_rsub_(hairline, hy), hpix), p.hair)
    painter.paint(None, p.skin)  # the skin covers the rest
    return painter.image()


def _shade(p: FaceParams, surface: _HeadSurface, optics: _EyeOptics, albedo: Tensor, eyes: _Eyes) -> Tensor:
    """The lit face over the background, (B, 3, r, r): Lambert on the ellipsoid normal, bent by the nose bump
    and the eye sockets, plus the specular glints. ``albedo`` and ``eyes``' shading terms are temporaries, overwritten
    (the result is ``albedo``'s tensor)."""
    b, r = p.batch_size, surface.centres.shape[0]
    hx, hy, hz = surface.hx, surface.hy, surface.hz
    light_head = optics.light_head
    nose_top, nose_len = _nose_top_and_length(p)
    nx, ny, nz = hx / _col(p.face_w**2), hy / _col(p.face_h**2), hz / _col(p.face_d**2)
    norm = (nx * nx).add_(ny * ny).add_(nz * nz).add_(1e-12).rsqrt_()
    dx = torch.sub(hx, _col(p.nose_dx)).div_(_NOSE_W)
    dy = torch.sub(hy, nose_top - 0.5 * nose_len).div_(0.5 * nose_len)
    dy2 = dy * dy
    bump = (dx * dx).neg_().sub_(dy2 * dy2).clamp_min_(-30.0).exp_().mul_(_col(p.nose_h))
    socket_depth = 0.05  # the normal tilts by -grad(height), height = -depth · dip
    nx.mul_(norm).add_((bump * 2).mul_(dx).div_(_NOSE_W)).sub_(eyes.socket_gx.mul_(socket_depth))
    ny.mul_(norm).add_(bump.mul_(4).mul_(dy).mul_(dy2).div_(0.5 * nose_len)).sub_(eyes.socket_gy.mul_(socket_depth))
    nz.mul_(norm)
    lambert = (nx * _col(light_head[:, 0])).add_(ny * _col(light_head[:, 1])).add_(nz * _col(light_head[:, 2]))
    lambert.mul_(nx.mul_(nx).add_(ny.mul_(ny)).add_(nz.mul_(nz)).add_(1e-12).rsqrt_())
    dimmed = _rsub_(eyes.sockets.clamp_(max=1.0).mul_(0.35), 1.0)
    shade = lambert.clamp_min_(0.0).mul_(_col(p.diffuse)).mul_(dimmed).add_(_col(p.ambient))
    specular = eyes.glint.view(b, r, r).mul_(_col(p.specular * p.diffuse))
    lit = albedo.mul_(shade.unsqueeze(1)).add_(specular.unsqueeze(1)).mul_(surface.face.unsqueeze(1))

    background = p.bg[:, :, None, None] + (_col(p.bg_grad_x) * surface.u + _col(p.bg_grad_y) * surface.v).unsqueeze(1)
    background.mul_((1.0 - surface.face).unsqueeze(1)).mul_(_col(p.ambient + 0.5 * p.diffuse).unsqueeze(1))
    return lit.add_(background)


def _camera(p: FaceParams, img: Tensor, noise: Tensor, surface: _HeadSurface, size: int) -> Tensor:
    """What the camera makes of the scene ``img`` (a temporary, overwritten): uneven illumination, exposure and
    colour cast, vignetting, optics blur, sensor noise, gamma, then the resampling to ``size``."""
    u, v, r = surface.u, surface.v, surface.centres.shape[0]
    vignette = _rsub_(_col(p.vignette) * 0.5 * (u * u + v * v), 1.0)
    gain = vignette.mul_(_col(p.exposure) * (1.0 + _col(p.light_grad) * u))
    img = img.mul_(gain.unsqueeze(1)).mul_((p.white_balance * p.light_rgb)[:, :, None, None])
    zoom = size / REFERENCE_SIZE
    img = _blur(img, p.blur * zoom, radius=math.ceil(3 * zoom))  # sigma up to 1 reference pixel
    variance = img.clamp_min(0).mul_(_col(p.noise_shot).unsqueeze(1) ** 2).add_(_col(p.noise_read).unsqueeze(1) ** 2)
    chroma = _col(p.noise_chroma).unsqueeze(1)
    mixed = (noise[:, 1:] * chroma).add_((1 - chroma) * noise[:, :1])
    img.add_(variance.sqrt_().mul_(mixed))
    img = img.clamp_(1e-6, 1.0).pow_(_col(p.gamma).unsqueeze(1))
    if r != size:
        img = F.interpolate(img, size=(size, size), mode="bilinear", align_corners=False, antialias=r > size)
    return img.clamp_(0.0, 1.0)


def _surface_z(p: FaceParams, x: Tensor | float, y: Tensor | float, floor: float = 0.05) -> Tensor:
    """Depth of the head ellipsoid's front surface at head-frame ``(x, y)`` (unscaled), per image."""
    return p.face_d * torch.sqrt((1 - (x / p.face_w) ** 2 - (y / p.face_h) ** 2).clamp_min(floor))
