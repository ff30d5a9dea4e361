"""The viewer's orbit camera: poses in the scenes' convention, looking at the target, at a fixed distance."""
import math

import pytest
import torch

from tinn.render import camera_rays
from tinn.scenes.data.procedural import look_at_poses, sphere_positions
from tinn.viewer.orbit import MAX_ELEVATION, OrbitCamera


def forward(c2w):
    return -c2w[:3, 2]  # the camera looks down its -z axis


@pytest.mark.parametrize("azimuth,elevation", [(0, 0), (37, 20), (200, -60), (359, 84)])
def test_pose_looks_at_the_target_from_its_radius(azimuth, elevation):
    target = torch.tensor([0.3, -0.2, 0.1])
    cam = OrbitCamera(target, radius=2.5, azimuth=azimuth, elevation=elevation)
    c2w = cam.c2w()
    pos = c2w[:3, 3]
    assert (pos - target).norm().item() == pytest.approx(2.5, rel=1e-6)
    to_target = (target - pos) / (target - pos).norm()
    assert torch.dot(forward(c2w), to_target).item() == pytest.approx(1.0, abs=1e-6)
    rot = c2w[:3, :3].double()
    assert torch.allclose(rot.T @ rot, torch.eye(3, dtype=torch.float64), atol=1e-6)
    assert torch.det(rot).item() == pytest.approx(1.0, abs=1e-6)  # a rotation, not a reflection
    assert c2w[:3, 0][2].abs().item() < 1e-6 and c2w[:3, 1][2].item() > 0  # no roll: right is level, up is up
    assert torch.equal(c2w[3], torch.tensor([0.0, 0.0, 0.0, 1.0]))
    # The centre pixel's ray goes through the target (camera_rays reads the same convention).
    _, dirs = camera_rays(c2w, 1, 1, 10.0)
    assert torch.allclose(dirs[0], to_target, atol=1e-6)


def test_starting_from_a_pose_reproduces_it_and_keeps_its_distance():
    poses = look_at_poses(sphere_positions(6, 3.0, seed=4))
    for c2w in poses:
        if abs(c2w[2, 3].item()) / 3.0 > math.sin(math.radians(MAX_ELEVATION)):
            continue
        cam = OrbitCamera.from_c2w(c2w)
        assert torch.equal(cam.c2w(), c2w)  # bit for bit until it moves
        cam.rotate(90.0, 0.0)
        cam.rotate(-90.0, 0.0)
        assert not cam.at_home or torch.equal(cam.c2w(), c2w)
        cam.set_angles(cam.azimuth + 1e-9, cam.elevation)  # off the home pose: the angles' own pose
        assert torch.allclose(cam.c2w(), c2w, atol=1e-5)
        cam.rotate(123.0, -10.0)
        assert (cam.c2w()[:3, 3]).norm().item() == pytest.approx(3.0, rel=1e-5)
        cam.reset()
        assert torch.equal(cam.c2w(), c2w)


def test_a_rolled_pose_is_reproduced_and_orbits_rigidly():
    c2w = look_at_poses(torch.tensor([[2.0, 1.0, 1.0]]))[0]
    spin = torch.tensor([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])  # 90 degrees about the view axis
    rolled = c2w.clone()
    rolled[:3, :3] = c2w[:3, :3] @ spin
    cam = OrbitCamera.from_c2w(rolled)
    cam.set_angles(cam.azimuth + 1e-9, cam.elevation)
    assert torch.allclose(cam.c2w(), rolled, atol=1e-5)
    cam.rotate(45.0, 0.0)
    pos = cam.c2w()[:3, 3]
    # The roll stays a roll: the camera still faces the target, turned about its view axis as before.
    assert torch.dot(forward(cam.c2w()), -pos / pos.norm()).item() == pytest.approx(1.0, abs=1e-5)
    assert abs(cam.c2w()[2, 1].item()) < 1e-5  # the image's up axis lies level, as in the rolled start


def test_azimuth_goes_round_and_elevation_is_clamped():
    cam = OrbitCamera(radius=1.0, azimuth=350.0, elevation=10.0, max_elevation=60.0, min_elevation=-30.0)
    cam.rotate(20.0, 0.0)
    assert cam.azimuth == pytest.approx(10.0)
    x, y, z = cam.c2w()[:3, 3].tolist()
    assert math.degrees(math.atan2(y, x)) == pytest.approx(10.0, abs=1e-4)
    cam.rotate(0.0, 500.0)
    assert cam.elevation == 60.0
    assert cam.c2w()[2, 3].item() == pytest.approx(math.sin(math.radians(60.0)), abs=1e-6)
    cam.rotate(0.0, -500.0)
    assert cam.elevation == -30.0
    assert OrbitCamera(elevation=90.0).elevation == MAX_ELEVATION  # never at the pole
    with pytest.raises(ValueError):
        OrbitCamera(radius=0.0)
    with pytest.raises(ValueError):
        OrbitCamera(max_elevation=90.0)
