"""An orbit camera for scene sources: azimuth and elevation around a target point, world +z up.

Poses are camera-to-world matrices in the scenes' (NeRF / Blender) convention, the one
`tinn.render.camera_rays` reads and the scene loaders produce: the camera looks down its -z
axis, +y is up in the image and +x right; world +z is up (`tinn.scenes.data.procedural.look_at_poses`).

    cam = OrbitCamera.from_c2w(held_out_c2w, target=(0, 0, 0))
    cam.rotate(15.0, 0.0)        # degrees: once round the target in 24 steps
    c2w = cam.c2w()              # (4, 4) float32

Angles are in degrees. Azimuth is measured from +x towards +y, elevation from the xy plane
towards +z; elevation stays within [min_elevation, max_elevation] because at the poles the
view direction is parallel to world up and the camera's roll is undefined.
"""
from __future__ import annotations

import math

import torch

MAX_ELEVATION = 85.0  # degrees: short of the pole, where "up" no longer fixes the camera's roll


def look_at_rotation(azimuth: float, elevation: float) -> torch.Tensor:
    """(3, 3) float64 camera-to-world rotation of a camera at (azimuth, elevation) looking at the target, z up.

    Columns: right, up, back (the camera looks down -back), as `look_at_poses` builds them.
    """
    a, e = math.radians(azimuth), math.radians(elevation)
    back = torch.tensor([math.cos(e) * math.cos(a), math.cos(e) * math.sin(a), math.sin(e)], dtype=torch.float64)
    right = torch.tensor([-math.sin(a), math.cos(a), 0.0], dtype=torch.float64)  # z_up x back, normalised
    up = torch.linalg.cross(back, right)
    return torch.stack([right, up, back], dim=1)


class OrbitCamera:
    """A camera on a sphere of `radius` around `target`, at (`azimuth`, `elevation`) degrees.

    `roll` is a fixed camera-space rotation applied after the look-at rotation: `from_c2w` sets it so
    that a starting pose which does not look exactly at the target (or is rolled) is still reproduced;
    for a look-at pose it is the identity and the camera always faces the target.
    """

    def __init__(self, target=(0.0, 0.0, 0.0), radius: float = 3.0, azimuth: float = 0.0, elevation: float = 0.0,
                 min_elevation: float = -MAX_ELEVATION, max_elevation: float = MAX_ELEVATION, roll=None):
        if not radius > 0:
            raise ValueError(f"radius must be positive, got {radius}")
        if not -90.0 < min_elevation <= max_elevation < 90.0:
            raise ValueError(f"elevation limits must satisfy -90 < min <= max < 90, got {min_elevation}, "
                             f"{max_elevation}")
        self.target = torch.as_tensor(target, dtype=torch.float64).reshape(3).clone()
        self.radius = float(radius)
        self.min_elevation, self.max_elevation = float(min_elevation), float(max_elevation)
        self.azimuth = float(azimuth) % 360.0
        self.elevation = self._clamp(float(elevation))
        self.roll = torch.eye(3, dtype=torch.float64) if roll is None else \
            torch.as_tensor(roll, dtype=torch.float64).reshape(3, 3).clone()
        self._home = None  # (azimuth, elevation, c2w) of the starting pose, see from_c2w

    def _clamp(self, elevation: float) -> float:
        return min(max(elevation, self.min_elevation), self.max_elevation)

    @classmethod
    def from_c2w(cls, c2w, target=(0.0, 0.0, 0.0), **limits) -> "OrbitCamera":
        """The orbit through the pose `c2w` (4, 4): its distance to `target` and its angles seen from it."""
        c2w = torch.as_tensor(c2w).detach().cpu()
        pose = c2w.to(torch.float64)
        target = torch.as_tensor(target, dtype=torch.float64).reshape(3).cpu()
        offset = pose[:3, 3] - target
        radius = float(offset.norm())
        azimuth = math.degrees(math.atan2(float(offset[1]), float(offset[0])))
        elevation = math.degrees(math.asin(max(-1.0, min(1.0, float(offset[2]) / radius))))
        cam = cls(target, radius, azimuth, elevation, **limits)
        # What the pose adds to a camera at these angles looking at the target (identity for a look-at pose).
        cam.roll = look_at_rotation(cam.azimuth, cam.elevation).T @ pose[:3, :3]
        if cam.elevation == elevation:  # not clamped: the camera sits at the pose
            # Until the camera moves, c2w() hands back this pose bit for bit: the angles' round trip is off by
            # float round-off, and the first frame must be the one the source showed without an orbit.
            cam._home = (cam.azimuth, cam.elevation, c2w.to(torch.float32).clone())
        return cam

    def rotate(self, d_azimuth: float = 0.0, d_elevation: float = 0.0) -> None:
        """Move along the orbit by these many degrees; the elevation stops at its limits."""
        self.azimuth = (self.azimuth + float(d_azimuth)) % 360.0
        self.elevation = self._clamp(self.elevation + float(d_elevation))

    def set_angles(self, azimuth: float, elevation: float) -> None:
        self.azimuth = float(azimuth) % 360.0
        self.elevation = self._clamp(float(elevation))

    def reset(self) -> None:
        """Back to the starting pose of `from_c2w` (a no-op for a camera built from angles)."""
        if self._home is not None:
            self.azimuth, self.elevation = self._home[0], self._home[1]

    @property
    def at_home(self) -> bool:
        """Whether the camera is at the pose it was built from (`from_c2w`)."""
        return self._home is not None and (self.azimuth, self.elevation) == self._home[:2]

    def position(self) -> torch.Tensor:
        return (self.target + self.radius * look_at_rotation(self.azimuth, self.elevation)[:, 2]).float()

    def c2w(self) -> torch.Tensor:
        """(4, 4) float32 camera-to-world matrix of the current pose (on the CPU)."""
        if self.at_home:
            return self._home[2].clone()
        rot = look_at_rotation(self.azimuth, self.elevation)
        out = torch.eye(4, dtype=torch.float64)
        out[:3, :3] = rot @ self.roll
        out[:3, 3] = self.target + self.radius * rot[:, 2]
        return out.float()
