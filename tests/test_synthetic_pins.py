"""The synthetic worlds' output, pinned bit for bit: SHA-256 digests of small renders of every registered world
(all versions), recorded from the renderer before its in-place rewrite. The benchmark's cached models and
calibrations record signatures of these images and committed records were scored on them, so a change that moves a
single bit of a world's images, labels or head poses must fail here, not pass unseen.

Two kinds of machine render the worlds a few bits apart (another CPU takes other vector paths through exp, pow and
the convolution; tests/test_synthetic.py's committed samples allow one level of 255 for it), so the digests are
compared on the kind of machine that recorded them (the project's, which runs the suite) and the check is skipped,
with its reason, elsewhere. The list of pinned worlds is checked everywhere."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest
import torch

from alfa.gaze.data.synthetic import make_domain
from alfa.gaze.data.synthetic.domains import NOISE_CHANNELS, camera_resolution, get_domain, list_domains, render_person
from alfa.gaze.data.synthetic.render import render_faces
from alfa.study.timing import cpu_name

RECORDED_ON = {"cpu": "AMD EPYC (family 25, model 17)", "capability": "AVX512"}
"""The machine the digests below were recorded on (:func:`alfa.study.timing.cpu_name`, torch's CPU capability)."""

PINS: dict[str, dict[str, str]] = {
    "eth": {
        "data64": "53a5e4780ffb270bc4f8b6573087acdaff5daa807c647298e30d2bc7ce27f174",
        "data224": "07ad445229a2cb7a8ddd28cb63d82bce131cb628f25b65f0ba5c307b67b6cddc",
        "float64": "a9fc8f708bf12a93c07ac25977779150d35c017d4e5b267c51960984e7fdae9d",
    },
    "gaze360": {
        "data64": "eb3b2f5f21fbac370046bb405780fb9f19c448e93d72eb64a20e9ceadd99217d",
        "data224": "1c54082b0f33a76d56d84c612e73abfacb5b65de82f1f011253989c5902e7275",
        "float64": "91dc60dcb08d7e8ec0ba00a9c3343629769336a8a1c110ab37008c251682f502",
    },
    "mpii": {
        "data64": "1f64ec3a81ae53678c0928813fb09573d07439f1ad1b0be2bc97e4260cb6864e",
        "data224": "d41c993c6b9d7eef80703cf54cc178a3f5368e8884b30f22690dc36a64c0878b",
        "float64": "b0fffa1be080826e177a3102059e1ed37234286000e808b411da0d5e9f11b6e1",
    },
    "eyediap": {
        "data64": "cb81a494556ce5d7c8a679976d0b9380f649df6c99179c699bda74e327bd0a2f",
        "data224": "3be5f7dcbc84d5f961586361dbddd8b38460d52d89b3f7d68edf208b8fc98172",
        "float64": "3e559105817d5170928c4874962eb7bd5884b0659065ce068b6b49ed3964cb5d",
    },
    "eth-studio": {
        "data64": "3c04c9b7c0b67e3af701a07b96061e4595460cdd937be4977580cab1b8aef46a",
        "data224": "d0f6ac098e48ccfe7633ca71f94fda6f295af7acfcf8475b1155b4cd0cf49c07",
        "float64": "4ff04f125121ff41019800ed0fd58b5dd4e11ffda13854bc2eef680adcfe64db",
    },
    "mpii-window": {
        "data64": "ba215a918f111f3522cd1c64ba5fd3eb3ab66326b74ef00ae71b10af5380cebe",
        "data224": "048d40f9ddaa1d5cf2bb86a8bc5f43b9bbd38fa6531cf853e69cd0ce1bc62357",
        "float64": "6d0027fc627255d51dbe70788a46207ce34efa04fdfff30d02cca9e4cfe21c09",
    },
    "eyediap-offcam": {
        "data64": "5186383e40dd38e8f64b71eb62e3626e900292789ac346bb5a62ea02d5069f9d",
        "data224": "cc0b05ef0cba3f5c0c966b2b8318b71f12d188ef3aca664b1efec08b44d0d422",
        "float64": "cdd119de50e6c7bbe04465e04aacb54a6c5bf3dffca494d17a137d74823eab5b",
    },
    "eth-v2": {
        "data64": "d62e4cb00c0c48ee7c8a4a418ef4a30280b55fc71fba78834a86921b1d68dc54",
        "data224": "c7ee456028d8dd8a45fc2df1ae6b72fabace7ee670ab62c2c3a29d46e9566e35",
        "float64": "ea2de1a8d642db8704ede442f724861c9ec6d14800f66062c1fe274c400d7831",
    },
    "gaze360-v2": {
        "data64": "009244551a7d89764ac76f6028c824fbf15ed29e186b94a92b3b0e9000a26ca2",
        "data224": "42b04633ff297ddf74c85841ec51220f84879b9766c422c24ebbcc604bc2cd42",
        "float64": "50e57d46fc43eb2b509cb86839c01130cd3ac5f9f836ec9eefac6756c5859d0a",
    },
    "mpii-v2": {
        "data64": "64e1300ed002b18f7063026c65836332d588b4b4daca7a4ea3cc554be06c44be",
        "data224": "c2707b420aab1954fc78e09a2bfec7f7e47ba4ef9ce28e2476e1cf833dd45e7b",
        "float64": "7d1f8c4d9595bc4c096d4ffc67ca2328bcb21c61ed487618dd61b7e210c82c90",
    },
    "eyediap-v2": {
        "data64": "a46bcaa4a38ab2fcc9e69365f50a36a023f026a6a6a8371e471d3f1316453136",
        "data224": "4987f5a322114b1203a14a1edd4dfd639e0803ed58f1139c699fc60cdad48960",
        "float64": "7de1066c14933df53188bb12f75130ca24e1345ebefe4cc920b6b890f875abbb",
    },
    "eth-studio-v2": {
        "data64": "4d940222e6dbf60c6cb2622fec840e493ec28b799cfb98e24bd7d15d7c342b1e",
        "data224": "6fdf1829c1434fe9a9818653ce156eb67e0773b3f8af1a44750d196ea8a4ee69",
        "float64": "2a77d4221fb0bfadc91a5892dc47f07c5ca6510d4bf87c85dd24b1960cbbf624",
    },
    "mpii-window-v2": {
        "data64": "1316bda5ffc20dd89fede39ad516bedf1a739bdb2f1ef5542e77dbfc0a64e593",
        "data224": "1b78bb4e0f40ca8674748e348244139ee0c1d0c06bc5e5576875063a387aa9e3",
        "float64": "ecc536d4d82203bb2f42a8b53fd1243f4d20d56fd09ba38672bf2ac36dbe87f1",
    },
    "eyediap-offcam-v2": {
        "data64": "8200a582abf8c042c88521145c0a0bb74627152817b5e2a7a61c29365324cc5d",
        "data224": "8469a696e32f4323e48ad96951d29306812b53d39749ed7bc3276cadb7c5f691",
        "float64": "87e1cd4c8960144da880db001736d7a7da11beee81c590bd52c8e4c38a11f40b",
    },
    "gaze360-window-v2": {
        "data64": "ce79fe9699e05ec5a17de5e08ab11f11e964b03f9fcc6b847c5e9e1ace1be132",
        "data224": "a98cc00b7942611bad54c93e476636f0b46e1f22918de0e5c6c1569364bbb2f9",
        "float64": "5b39f7af6748f711c888e71625977af45817cd4c387ade000a27b19716c3e751",
    },
    "eth-studio-mirrored-v2": {
        "data64": "570e5b88ef58fa20d51f5b4e908e11b5f853619de05c6a8e7b76550570bf8248",
        "data224": "d00be52e246f1b7a4a5e46733f818487c749e7cf9ff659e9d3c120b30068ba6f",
        "float64": "abe4ea7090396c311d4df068d6014e143466c66d03aeb4f26e4c7ba18e84a398",
    },
}
"""Per world: ``data64`` (:func:`make_domain`, 2 persons × 6 images at 64×64: images, gaze, head, person ids),
``data224`` (1 person × 2 images at 224×224) and ``float64`` (:func:`render_faces`' float images of 6 scenes at 64×64,
before the 8-bit rounding, so a change too small to move a rounded pixel of these few images still shows)."""


def _digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(str((t.dtype, tuple(t.shape))).encode())
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _float_render(world: str, nudge: float = 0.0) -> torch.Tensor:
    """Six of a person's scenes rendered in float at 64×64, with a fixed noise field (``nudge``: added to the first
    scene's light azimuth, to show the digest sees a change of one ulp)."""
    cfg = get_domain(world)
    params = render_person(cfg, 1, cfg.default_split(), 2, 6, 64)[3]
    if nudge:
        light_az = params.light_az.clone()
        light_az[0] += nudge
        params = replace(params, light_az=light_az)
    res = camera_resolution(cfg, 64)
    noise = torch.randn(6, NOISE_CHANNELS, res, res, generator=torch.Generator().manual_seed(3))
    return render_faces(params, noise, 64)


def world_digests(world: str) -> dict[str, str]:
    """The digests :data:`PINS` records for ``world``."""
    data = make_domain(world, seed=0, persons=2, images_per_person=6, size=64, workers=1)
    large = make_domain(world, seed=0, persons=1, images_per_person=2, size=224, workers=1)
    return {
        "data64": _digest(data.images, data.gaze, data.head, data.person_ids),
        "data224": _digest(large.images, large.gaze, large.head),
        "float64": _digest(_float_render(world)),
    }


def _recorded_here() -> bool:
    return cpu_name() == RECORDED_ON["cpu"] and torch.backends.cpu.get_cpu_capability() == RECORDED_ON["capability"]


def test_every_registered_world_is_pinned():
    assert sorted(PINS) == sorted(list_domains(None)), "pin the new world: add world_digests(<world>) to PINS"


@pytest.mark.parametrize("world", sorted(PINS))
def test_the_worlds_render_the_pinned_bits(world):
    if not _recorded_here():
        pytest.skip(f"digests recorded on {RECORDED_ON}; another kind of machine may render a few bits apart")
    assert world_digests(world) == PINS[world], (
        f"{world}: the rendered images, labels or head poses changed; the benchmark's records were made on the pinned "
        "ones (only re-pin for a deliberate change of the worlds, and say so in docs/synthetic.md)"
    )


def test_a_change_of_one_ulp_moves_the_float_digest():
    world = "eth"
    image = _float_render(world)
    nudged = _float_render(world, nudge=float(torch.finfo(torch.float32).eps))
    assert not torch.equal(image, nudged) and _digest(image) != _digest(nudged)
    assert torch.equal(image[1:], nudged[1:])  # the other scenes: their own arithmetic, untouched
