"""Real meshes as scene data: read OBJ (with an MTL colour or texture), PLY and COLLADA (with one texture),
render posed RGBA views with a Taichi rasteriser, and write them as a NeRF-synthetic folder that
`load_nerf_synthetic` and the demos read.

    python -m tinn.scenes.data.mesh /usr/share/glmark2/models/bunny.obj out/bunny --views 100 --res 800

The mesh is centred and scaled into [-1, 1]^3 (NeRF-synthetic objects fit in [-1.5, 1.5]^3); cameras sit on a
sphere of radius 4 looking at the origin with Blender's default field of view, spread by a Fibonacci lattice;
validation and test cameras take positions between the training ones. Shading: the surface colour times an
ambient term plus a distant light fixed in the world (|cos| of the surface normal, both sides lit), so the
shading is the same from every view, as the fields trained on it (no view direction) can represent; `--light
headlight` puts the light at each camera instead. 2 x 2 supersampling smooths edges, and alpha is the
pixel's coverage.

Normals are smooth by default, as a modelling tool's "auto smooth" shades: each corner's normal averages the
(area-weighted) normals of the faces that meet at its position and bend from its own face by less than a crease
angle (60 degrees), so scanned surfaces look smooth and hard edges stay hard. Corners are matched by position,
so triangle soups (the bunny's file repeats every vertex) and faces wound either way shade the same.
`--shading flat` gives every face its own normal: a scanned mesh then shows tens of thousands of flat facets,
detail that no real capture of the object has.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import dataclass

import numpy as np
import torch

from ... import runtime
from ...errors import InputError

CAMERA_ANGLE_X = 0.6911112070083618  # Blender's default horizontal field of view (the NeRF-synthetic scenes)
CAMERA_RADIUS = 4.0
# Towards a distant light above and to the side, fixed in the world: the shading is baked into the scene, the
# same from every view, as in the NeRF-synthetic renders (a light at the camera would make it view-dependent).
DEFAULT_LIGHT = (0.4, 0.8, 0.45)


@dataclass
class Mesh:
    """Triangles with a colour per corner or a texture: vertices (V, 3) float32, faces (F, 3) int32,
    corner_rgb (F, 9) float32 in [0, 1], corner_uv (F, 6) float32 and texture (H, W, 3) float32 or None."""

    vertices: np.ndarray
    faces: np.ndarray
    corner_rgb: np.ndarray
    corner_uv: np.ndarray | None = None
    texture: np.ndarray | None = None

    def __post_init__(self):
        v, f = self.vertices, self.faces
        if v.ndim != 2 or v.shape[1] != 3 or not len(v):
            raise InputError(f"mesh vertices must be a non-empty (V, 3) array, got shape {v.shape}")
        if f.ndim != 2 or f.shape[1] != 3 or not len(f):
            raise InputError(f"mesh faces must be a non-empty (F, 3) array, got shape {f.shape}")
        if f.min() < 0 or f.max() >= len(v):
            raise InputError(f"mesh faces index vertices {int(f.min())}..{int(f.max())}; allowed: 0..{len(v) - 1}")
        if not np.isfinite(v).all():
            raise InputError("mesh vertices hold NaN or Inf")

    def normalised(self) -> "Mesh":
        """Centred on its bounding box, scaled so that the box's longest half-side is 1."""
        lo, hi = self.vertices.min(0), self.vertices.max(0)
        half = float((hi - lo).max()) / 2
        if half <= 0:
            raise InputError("the mesh is a single point; nothing to render")
        return Mesh(((self.vertices - (lo + hi) / 2) / half).astype(np.float32), self.faces, self.corner_rgb,
                    self.corner_uv, self.texture)

    def surface_points(self, n: int, seed: int = 0) -> torch.Tensor:
        """(n, 3) float32 points spread uniformly over the surface: a triangle drawn by area, then a point in it."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InputError(f"n={n!r} must be an integer >= 0")
        v, f = torch.from_numpy(self.vertices).double(), torch.from_numpy(self.faces).long()
        a, b, c = v[f[:, 0]], v[f[:, 1]], v[f[:, 2]]
        area = torch.linalg.cross(b - a, c - a).norm(dim=1)
        if not float(area.sum()) > 0:
            raise InputError("the mesh's triangles have no area; nothing to sample")
        g = torch.Generator().manual_seed(seed)
        tri = torch.multinomial(area, n, replacement=True, generator=g) if n else torch.zeros(0, dtype=torch.long)
        u, w = torch.rand(n, generator=g, dtype=torch.float64), torch.rand(n, generator=g, dtype=torch.float64)
        flip = u + w > 1  # reflected into the triangle: uniform over it
        u[flip], w[flip] = 1 - u[flip], 1 - w[flip]
        return (a[tri] + u[:, None] * (b[tri] - a[tri]) + w[:, None] * (c[tri] - a[tri])).float()


SHADINGS = ("smooth", "flat")
DEFAULT_CREASE_DEGREES = 60.0


def check_shading(shading) -> str:
    if shading not in SHADINGS:
        raise InputError(f"shading={shading!r}; allowed: {', '.join(SHADINGS)}")
    return shading


def corner_normals(mesh: Mesh, crease_degrees: float = DEFAULT_CREASE_DEGREES, pair_block: int = 1 << 22) -> np.ndarray:
    """(F, 9) float32 unit normals per corner: the sum of the area-weighted normals of the faces at the corner's
    position whose normals are within `crease_degrees` of the corner's face normal, each turned to the corner's
    side (so winding does not matter). Degenerate faces get a zero normal; their corners then use their
    neighbours' (and a corner with none shades as ambient)."""
    if isinstance(crease_degrees, bool) or not isinstance(crease_degrees, (int, float)) \
            or not 0.0 <= float(crease_degrees) <= 180.0:
        raise InputError(f"crease_degrees={crease_degrees!r} must be an angle in [0, 180] degrees")
    v, f = mesh.vertices.astype(np.float64), mesh.faces.astype(np.int64)
    a, b, c = v[f[:, 0]], v[f[:, 1]], v[f[:, 2]]
    area_normal = np.cross(b - a, c - a)                        # length: twice the face's area
    length = np.linalg.norm(area_normal, axis=1, keepdims=True)
    unit = np.divide(area_normal, length, out=np.zeros_like(area_normal), where=length > 0)
    # Corners at one position are one vertex, whether or not the file shares it: positions quantised at 1e-6
    # of the mesh's extent.
    extent = float(np.ptp(v, axis=0).max()) or 1.0
    keys = np.round(v / (extent * 1e-6)).astype(np.int64)
    _, weld = np.unique(keys, axis=0, return_inverse=True)
    corner_vertex = weld.reshape(-1)[f.reshape(-1)]              # (3F,) welded vertex of each corner
    corner_face = np.repeat(np.arange(len(f)), 3)
    order = np.argsort(corner_vertex, kind="stable")
    sorted_vertex = corner_vertex[order]
    starts = np.flatnonzero(np.r_[True, sorted_vertex[1:] != sorted_vertex[:-1]])
    sizes = np.diff(np.r_[starts, len(order)])
    cos_crease = math.cos(math.radians(float(crease_degrees)))
    out = np.zeros((len(order), 3))
    # Every (corner, corner at the same position) pair, in blocks of positions so that a vertex shared by very
    # many faces does not need one huge allocation.
    group = 0
    while group < len(starts):
        end, pairs = group, 0
        while end < len(starts) and (end == group or pairs + sizes[end] ** 2 <= pair_block):
            pairs += int(sizes[end]) ** 2
            end += 1
        g_size = sizes[group:end]
        mine = np.arange(starts[group], starts[end - 1] + sizes[end - 1])  # the block's corners, in sorted order
        reps = np.repeat(g_size, g_size)                         # for each of them: its position's corner count
        first = np.repeat(starts[group:end], g_size)             # and its position's first corner
        me = np.repeat(mine, reps)                               # pair (me, other)
        other = np.repeat(first, reps) + (np.arange(me.size) - np.repeat(np.cumsum(reps) - reps, reps))
        face_me, face_other = corner_face[order[me]], corner_face[order[other]]
        cos = np.einsum("ij,ij->i", unit[face_me], unit[face_other])
        keep = np.abs(cos) >= cos_crease - 1e-9
        contribution = area_normal[face_other] * (np.where(cos < 0, -1.0, 1.0) * keep)[:, None]
        np.add.at(out, order[me], contribution)
        group = end
    norm = np.linalg.norm(out, axis=1, keepdims=True)
    out = np.divide(out, norm, out=np.zeros_like(out), where=norm > 0)
    return out.reshape(len(f), 9).astype(np.float32)


def read_mesh(path) -> Mesh:
    """An OBJ, PLY or COLLADA (.dae) file (by extension)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise InputError(f"mesh file {path!r} does not exist")
    ext = os.path.splitext(path)[1].lower()
    if ext == ".obj":
        return read_obj(path)
    if ext == ".ply":
        return read_ply(path)
    if ext == ".dae":
        return read_dae(path)
    raise InputError(f"mesh file {path!r}: extension {ext!r} is not supported; allowed: .obj, .ply, .dae")


# ---- OBJ ------------------------------------------------------------------------------------------------
def read_obj(path: str) -> Mesh:
    """Vertices (optionally with r g b after x y z), texture coordinates, polygons (fan-triangulated; v, v/vt,
    v//vn and v/vt/vn forms, negative indices relative to the end), and from `mtllib` the diffuse colour `Kd`
    and one diffuse texture `map_Kd` of the materials named by `usemtl`."""
    verts, colours, uvs, faces, face_uv, face_mat = [], [], [], [], [], []
    materials: dict[str, tuple] = {}
    current = None
    folder = os.path.dirname(path)
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            parts = line.split()
            if not parts or parts[0].startswith("#"):
                continue
            tag, args = parts[0], parts[1:]
            try:
                if tag == "v":
                    verts.append([float(a) for a in args[:3]])
                    colours.append([float(a) for a in args[3:6]] if len(args) >= 6 else None)
                elif tag == "vt":
                    uvs.append([float(args[0]), float(args[1]) if len(args) > 1 else 0.0])
                elif tag == "f":
                    corners = [_obj_corner(a, len(verts), len(uvs)) for a in args]
                    if len(corners) < 3:
                        raise ValueError("a face needs 3 corners")
                    for k in range(1, len(corners) - 1):  # a fan: polygons are assumed convex
                        tri = (corners[0], corners[k], corners[k + 1])
                        faces.append([c[0] for c in tri])
                        face_uv.append([c[1] for c in tri])
                        face_mat.append(current)
                elif tag == "mtllib":
                    materials.update(_read_mtl(os.path.join(folder, " ".join(args))))
                elif tag == "usemtl":
                    current = " ".join(args)
            except (ValueError, IndexError) as e:
                raise InputError(f"{path}:{number}: cannot read {line.strip()!r} ({e})") from None
    if not faces:
        raise InputError(f"{path}: no faces ('f' lines)")
    v = np.asarray(verts, dtype=np.float32).reshape(-1, 3)
    fa = np.asarray(faces, dtype=np.int64)
    if fa.min() < 0 or fa.max() >= len(v):
        raise InputError(f"{path}: faces index vertices outside 1..{len(v)}")
    textures = {materials[m][1] for m in set(face_mat) if m in materials and materials[m][1]}
    if len(textures) > 1:
        raise InputError(f"{path}: the materials use {len(textures)} texture maps {sorted(textures)}; supported: one")
    texture = None
    if textures and uvs and all(all(i is not None for i in t) for t in face_uv):
        texture = _read_texture(textures.pop())
    rgb = np.empty((len(fa), 9), dtype=np.float32)
    vertex_rgb = all(c is not None for c in colours)
    for k, m in enumerate(face_mat):
        if vertex_rgb:
            rgb[k] = np.asarray([colours[i] for i in fa[k]], dtype=np.float32).reshape(9)
        else:
            rgb[k] = np.tile(materials.get(m, ((0.8, 0.8, 0.8), None))[0], 3)
    corner_uv = None
    if texture is not None:
        uv = np.asarray(uvs, dtype=np.float32)
        corner_uv = uv[np.asarray(face_uv, dtype=np.int64)].reshape(-1, 6)
    return Mesh(v, fa.astype(np.int32), np.clip(rgb, 0.0, 1.0), corner_uv, texture)


def _obj_corner(text: str, n_verts: int, n_uvs: int) -> tuple[int, int | None]:
    fields = text.split("/")

    def index(value: str, count: int) -> int:
        i = int(value)
        return i - 1 if i > 0 else count + i

    vt = index(fields[1], n_uvs) if len(fields) > 1 and fields[1] else None
    return index(fields[0], n_verts), vt


def _read_mtl(path: str) -> dict[str, tuple]:
    """name -> (Kd colour, texture path or None)."""
    if not os.path.isfile(path):
        raise InputError(f"material library {path!r} (mtllib) does not exist")
    out, name = {}, None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            if parts[0] == "newmtl":
                name = " ".join(parts[1:])
                out[name] = ((0.8, 0.8, 0.8), None)
            elif parts[0] == "Kd" and name is not None:
                out[name] = (tuple(float(a) for a in parts[1:4]), out[name][1])
            elif parts[0] == "map_Kd" and name is not None:
                out[name] = (out[name][0], os.path.join(os.path.dirname(path), parts[-1]))
    return out


def _read_texture(path: str) -> np.ndarray:
    import imageio.v3 as iio

    if not os.path.isfile(path):
        raise InputError(f"texture {path!r} (map_Kd) does not exist")
    img = np.asarray(iio.imread(path))
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=2)
    scale = 65535.0 if img.dtype == np.uint16 else 255.0 if img.dtype == np.uint8 else 1.0
    return np.ascontiguousarray(img[..., :3].astype(np.float32) / scale)


# ---- PLY ------------------------------------------------------------------------------------------------
_PLY_TYPES = {"char": "i1", "uchar": "u1", "int8": "i1", "uint8": "u1", "short": "i2", "ushort": "u2",
              "int16": "i2", "uint16": "u2", "int": "i4", "uint": "u4", "int32": "i4", "uint32": "u4",
              "float": "f4", "float32": "f4", "double": "f8", "float64": "f8"}


def read_ply(path: str) -> Mesh:
    """ASCII or binary little-endian PLY: vertex x, y, z (and red, green, blue when present) and a face list
    property (vertex_indices or vertex_index), polygons fan-triangulated."""
    with open(path, "rb") as f:
        if f.readline().strip() != b"ply":
            raise InputError(f"{path}: not a PLY file (first line is not 'ply')")
        fmt, elements = None, []
        while True:
            line = f.readline()
            if not line:
                raise InputError(f"{path}: the header has no end_header line")
            parts = line.decode("ascii", "replace").split()
            if not parts or parts[0] in ("comment", "obj_info"):
                continue
            if parts[0] == "end_header":
                break
            if parts[0] == "format":
                fmt = parts[1]
            elif parts[0] == "element":
                elements.append((parts[1], int(parts[2]), []))
            elif parts[0] == "property" and elements:
                elements[-1][2].append(parts[1:])
        if fmt not in ("ascii", "binary_little_endian"):
            raise InputError(f"{path}: format {fmt!r} is not supported; allowed: ascii, binary_little_endian")
        data = {}
        if fmt == "ascii":
            text, pos = f.read().decode("ascii", "replace").split(), 0
            for name, count, props in elements:
                data[name], pos = _ply_ascii(text, pos, count, props, path)
        else:
            body = memoryview(f.read())  # right after the header's last line
            for name, count, props in elements:
                data[name], used = _ply_binary(body, count, props, path)
                body = body[used:]
    if "vertex" not in data or "face" not in data:
        raise InputError(f"{path}: needs 'vertex' and 'face' elements, found {[e[0] for e in elements]}")
    vert = data["vertex"]
    for axis in "xyz":
        if axis not in vert:
            raise InputError(f"{path}: vertex element has no '{axis}' property")
    v = np.stack([vert["x"], vert["y"], vert["z"]], 1).astype(np.float32)
    lists = data["face"].get("vertex_indices", data["face"].get("vertex_index"))
    if lists is None:
        raise InputError(f"{path}: face element has no vertex_indices list")
    tris = [[poly[0], poly[k], poly[k + 1]] for poly in lists for k in range(1, len(poly) - 1)]
    faces = np.asarray(tris, dtype=np.int64).reshape(-1, 3)
    if not len(faces) or faces.min() < 0 or faces.max() >= len(v):
        raise InputError(f"{path}: faces are empty or index vertices outside 0..{len(v) - 1}")
    if all(c in vert for c in ("red", "green", "blue")):
        scale = 255.0 if np.asarray(vert["red"]).dtype.kind in "iu" else 1.0
        vc = np.stack([vert["red"], vert["green"], vert["blue"]], 1).astype(np.float32) / scale
        rgb = vc[faces].reshape(-1, 9)
    else:
        rgb = np.full((len(faces), 9), 0.8, dtype=np.float32)
    return Mesh(v, faces.astype(np.int32), np.clip(rgb, 0.0, 1.0))


def _ply_ascii(tokens, pos, count, props, path):
    out = {p[-1]: [] for p in props}
    try:
        for _ in range(count):
            for p in props:
                if p[0] == "list":
                    n = int(tokens[pos])
                    out[p[-1]].append([int(t) for t in tokens[pos + 1:pos + 1 + n]])
                    pos += 1 + n
                else:
                    out[p[-1]].append(float(tokens[pos]))
                    pos += 1
    except (IndexError, ValueError):
        raise InputError(f"{path}: the data ends early or holds a non-number") from None
    return {k: (v if props[[q[-1] for q in props].index(k)][0] == "list" else np.asarray(v)) for k, v in out.items()}, pos


def _ply_binary(body, count, props, path):
    if all(p[0] != "list" for p in props):
        dtype = np.dtype([(p[-1], "<" + _ply_type(p[0], path)) for p in props])
        if len(body) < count * dtype.itemsize:
            raise InputError(f"{path}: the data ends early")
        arr = np.frombuffer(body, dtype=dtype, count=count)
        return {p[-1]: arr[p[-1]] for p in props}, count * dtype.itemsize
    if len(props) == 1 and props[0][0] == "list":  # faces: try all triangles at once, else one by one
        n_type, i_type = np.dtype("<" + _ply_type(props[0][1], path)), np.dtype("<" + _ply_type(props[0][2], path))
        tri = np.dtype([("n", n_type), ("i", i_type, 3)])
        if len(body) >= count * tri.itemsize:
            arr = np.frombuffer(body, dtype=tri, count=count)
            if (arr["n"] == 3).all():
                return {props[0][-1]: arr["i"].astype(np.int64).tolist()}, count * tri.itemsize
        lists, pos = [], 0
        for _ in range(count):
            if pos + n_type.itemsize > len(body):
                raise InputError(f"{path}: the data ends early")
            n = int(np.frombuffer(body, dtype=n_type, count=1, offset=pos)[0])
            pos += n_type.itemsize
            if pos + n * i_type.itemsize > len(body):
                raise InputError(f"{path}: the data ends early")
            lists.append(np.frombuffer(body, dtype=i_type, count=n, offset=pos).astype(np.int64).tolist())
            pos += n * i_type.itemsize
        return {props[0][-1]: lists}, pos
    raise InputError(f"{path}: binary elements mixing lists and scalars are not supported")


def _ply_type(name: str, path: str) -> str:
    if name not in _PLY_TYPES:
        raise InputError(f"{path}: property type {name!r} is not supported; allowed: {sorted(_PLY_TYPES)}")
    return _PLY_TYPES[name]


# ---- COLLADA ----------------------------------------------------------------------------------------------
def read_dae(path: str) -> Mesh:
    """COLLADA 1.4/1.5: the triangles and polylists of the geometries the visual scene instances (with their
    nodes' translate/rotate/scale/matrix transforms), positions and texture coordinates, and one diffuse
    texture (the first image of the file) or the effects' diffuse colour."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        raise InputError(f"{path}: not valid XML ({e})") from None
    ns = root.tag[:root.tag.index("}") + 1] if root.tag.startswith("{") else ""
    sources = {}
    for src in root.iter(ns + "source"):
        arr = src.find(ns + "float_array")
        acc = src.find(f"{ns}technique_common/{ns}accessor")
        if arr is not None and acc is not None:
            stride = int(acc.get("stride", "1"))
            values = np.asarray((arr.text or "").split(), dtype=np.float32)
            sources[src.get("id")] = values[:len(values) // stride * stride].reshape(-1, stride)
    vertices = {}
    for v in root.iter(ns + "vertices"):
        for inp in v.findall(ns + "input"):
            if inp.get("semantic") == "POSITION":
                vertices[v.get("id")] = inp.get("source", "").lstrip("#")
    geometries = {g.get("id"): g for g in root.iter(ns + "geometry")}
    placed = _dae_instances(root, ns) or [(gid, np.eye(4)) for gid in geometries]
    verts, faces, uvs = [], [], []
    for gid, transform in placed:
        mesh = geometries.get(gid)
        mesh = mesh.find(ns + "mesh") if mesh is not None else None
        if mesh is None:
            continue
        for prims in list(mesh.findall(ns + "triangles")) + list(mesh.findall(ns + "polylist")):
            _dae_primitives(prims, ns, sources, vertices, transform, verts, faces, uvs, path)
    if not faces:
        raise InputError(f"{path}: no triangles or polylists in the instanced geometries")
    v = np.concatenate(verts).astype(np.float32)
    f = np.concatenate(faces).astype(np.int32)
    uv = np.concatenate(uvs).astype(np.float32) if uvs and all(u is not None for u in uvs) else None
    texture, colour = None, (0.8, 0.8, 0.8)
    image = next(root.iter(ns + "image"), None)
    init = image.find(".//" + ns + "init_from") if image is not None else None
    if uv is not None and init is not None and init.text:
        texture = _read_texture(os.path.join(os.path.dirname(path), init.text.strip().replace("file://", "")))
    else:
        diffuse = next((d for d in root.iter(ns + "diffuse") if d.find(ns + "color") is not None), None)
        if diffuse is not None:
            colour = tuple(float(c) for c in diffuse.find(ns + "color").text.split()[:3])
    return Mesh(v, f, np.tile(np.asarray(colour, np.float32), (len(f), 3)), uv if texture is not None else None,
                texture)


def _dae_instances(root, ns) -> list:
    """(geometry id, 4x4 world transform) of every instance_geometry under the visual scenes' nodes."""
    out = []

    def walk(node, parent):
        m = parent @ _dae_node_matrix(node, ns)
        for inst in node.findall(ns + "instance_geometry"):
            out.append((inst.get("url", "").lstrip("#"), m))
        for child in node.findall(ns + "node"):
            walk(child, m)

    for scene in root.iter(ns + "visual_scene"):
        for node in scene.findall(ns + "node"):
            walk(node, np.eye(4))
    return out


def _dae_node_matrix(node, ns) -> np.ndarray:
    m = np.eye(4)
    for el in node:
        tag = el.tag[len(ns):]
        values = [float(v) for v in (el.text or "").split()]
        t = np.eye(4)
        if tag == "translate" and len(values) == 3:
            t[:3, 3] = values
        elif tag == "scale" and len(values) == 3:
            t[:3, :3] = np.diag(values)
        elif tag == "rotate" and len(values) == 4:
            axis = np.asarray(values[:3]) / max(np.linalg.norm(values[:3]), 1e-12)
            a = math.radians(values[3])
            k = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
            t[:3, :3] = np.eye(3) + math.sin(a) * k + (1 - math.cos(a)) * (k @ k)
        elif tag == "matrix" and len(values) == 16:
            t = np.asarray(values).reshape(4, 4)
        m = m @ t
    return m


def _dae_primitives(prims, ns, sources, vertices, transform, verts, faces, uvs, path) -> None:
    inputs = prims.findall(ns + "input")
    stride = max(int(i.get("offset", "0")) for i in inputs) + 1 if inputs else 1
    p = np.asarray((prims.findtext(ns + "p") or "").split(), dtype=np.int64)
    if not len(p):
        return
    corners = p[:len(p) // stride * stride].reshape(-1, stride)
    pos_in = next((i for i in inputs if i.get("semantic") == "VERTEX"), None)
    if pos_in is None:
        raise InputError(f"{path}: a <{prims.tag[len(ns):]}> has no VERTEX input")
    positions = sources.get(vertices.get(pos_in.get("source", "").lstrip("#"), ""))
    if positions is None:
        raise InputError(f"{path}: positions {pos_in.get('source')!r} not found")
    tex_in = next((i for i in inputs if i.get("semantic") == "TEXCOORD" and i.get("set", "0") == "0"), None)
    counts = [3] * (len(corners) // 3)
    if prims.tag.endswith("polylist"):
        counts = [int(c) for c in (prims.findtext(ns + "vcount") or "").split()]
    tris, start = [], 0
    for n in counts:  # fans over each polygon's corners
        tris += [(start, start + k, start + k + 1) for k in range(1, n - 1)]
        start += n
    tris = np.asarray(tris, dtype=np.int64).reshape(-1, 3)
    if start > len(corners) or not len(tris):
        raise InputError(f"{path}: the index list holds {len(corners)} corners, fewer than the {start} counted")
    pos = positions[corners[:, int(pos_in.get("offset", "0"))]][:, :3].astype(np.float64)
    pos = (np.c_[pos, np.ones(len(pos))] @ transform.T)[:, :3]
    base = sum(len(v) for v in verts)
    verts.append(pos)
    faces.append(tris + base)
    if tex_in is not None and tex_in.get("source", "").lstrip("#") in sources:
        uv = sources[tex_in.get("source").lstrip("#")][corners[:, int(tex_in.get("offset", "0"))]][:, :2]
        uvs.append(uv[tris].reshape(-1, 6))
    else:
        uvs.append(None)


# ---- cameras and rendering --------------------------------------------------------------------------------
def look_at(position) -> np.ndarray:
    """Camera-to-world (4, 4) of a camera at `position` looking at the origin, world +z up (NeRF convention:
    the camera looks down its -z)."""
    pos = np.asarray(position, dtype=np.float64)
    back = pos / np.linalg.norm(pos)
    up = np.array([0.0, 0.0, 1.0]) if abs(back[2]) < 0.999 else np.array([0.0, 1.0, 0.0])
    right = np.cross(up, back)
    right /= np.linalg.norm(right)
    true_up = np.cross(back, right)
    c2w = np.eye(4)
    c2w[:3, 0], c2w[:3, 1], c2w[:3, 2], c2w[:3, 3] = right, true_up, back, pos
    return c2w


def sphere_cameras(n: int, radius: float = CAMERA_RADIUS, offset: float = 0.0) -> np.ndarray:
    """(n, 4, 4) cameras on a Fibonacci lattice of the sphere; `offset` in [0, 1) shifts the lattice (held-out
    views between the training ones)."""
    golden = math.pi * (3.0 - math.sqrt(5.0))
    out = []
    for k in range(n):
        z = 1.0 - 2.0 * ((k + 0.5 + offset) % n) / n  # wrapped: past half a step the last view would leave the sphere
        r = math.sqrt(max(0.0, 1.0 - z * z))
        phi = golden * (k + offset * 7.3)
        out.append(look_at(radius * np.array([r * math.cos(phi), r * math.sin(phi), z])))
    return np.stack(out)


def ring_cameras(n: int, radii=(CAMERA_RADIUS,), offset: float = 0.0) -> np.ndarray:
    """(n, 4, 4) cameras looking at the origin from spheres of several `radii`: the views split as evenly as the
    count allows (the first radii get one more), each sphere's lattice shifted by its own offset so that near and
    far views look from different directions. A capture with close-up spheres feeds deeper octree nodes: a
    view's pixel footprint on the surface shrinks with its distance (docs/guides/scenes.md)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InputError(f"n={n!r} must be an integer >= 0")
    radii = check_radii(radii)
    shares = [n // len(radii) + (i < n % len(radii)) for i in range(len(radii))]
    rings = [sphere_cameras(k, r, (offset + 0.37 * i) % 1.0) for i, (k, r) in enumerate(zip(shares, radii)) if k]
    return np.concatenate(rings) if rings else np.zeros((0, 4, 4))


def parse_radii(text: str) -> tuple:
    """A demo's `--camera-radii` ("4,2.6,1.8") as checked radii."""
    try:
        values = tuple(float(v) for v in str(text).split(",") if v.strip())
    except ValueError:
        raise InputError(f"--camera-radii {text!r}: expected comma-separated numbers, e.g. 4,2.6,1.8") from None
    return check_radii(values)


def check_radii(radii) -> tuple:
    """The camera radii as floats: each finite and beyond the normalised mesh's bounding box (the cube of half-side
    1, whose corners lie sqrt(3) from the origin), so no camera sits inside the object."""
    try:
        values = tuple(float(r) for r in radii)
    except (TypeError, ValueError):
        values = ()
    if not values or not all(math.isfinite(r) and r > math.sqrt(3.0) for r in values):
        raise InputError(f"camera radii={radii!r} must be one or more finite numbers > sqrt(3) (the normalised mesh "
                         "lies in the cube of half-side 1 around the origin)")
    return values


def render_rgba(mesh: Mesh, c2w: np.ndarray, width: int, height: int, focal: float, supersample: int = 2,
                ambient: float = 0.35, near: float = 0.05, light=DEFAULT_LIGHT, normals: np.ndarray | None = None,
                shading: str = "smooth") -> torch.Tensor:
    """(H, W, 4) float32 RGBA of one view (alpha = coverage), on tinn's device.

    light: a world-space direction towards a distant light (the shading is then the same from every view, as
    the scene fields here, which take no view direction, can represent), or "headlight" (a light at the
    camera: shading changes with the view). shading: "smooth" (interpolated corner normals: `normals`, the
    (F, 9) array of `corner_normals`, computed here when None) or "flat" (each face's own normal)."""
    from ...kernels import raster

    check_shading(shading)
    dev = runtime.device()
    s = int(supersample)
    if s < 1:
        raise InputError(f"supersample={supersample!r} must be an integer >= 1")
    c2w_t = torch.as_tensor(c2w, dtype=torch.float64)
    verts = torch.as_tensor(mesh.vertices, dtype=torch.float64)
    cam = ((verts - c2w_t[:3, 3]) @ c2w_t[:3, :3]).float().contiguous().to(dev)
    faces = torch.as_tensor(mesh.faces, dtype=torch.int32, device=dev).contiguous()
    key = torch.full((height * s, width * s), raster.NO_HIT, dtype=torch.int64, device=dev)
    raster.raster_depth(cam, faces, key, float(focal) * s, float(near))
    textured = mesh.texture is not None
    texture = torch.as_tensor(mesh.texture if textured else np.zeros((1, 1, 3), np.float32), device=dev).contiguous()
    uv = torch.as_tensor(mesh.corner_uv if textured else np.zeros((1, 6), np.float32), device=dev).contiguous()
    rgb = torch.as_tensor(mesh.corner_rgb, device=dev).contiguous()
    big = torch.empty(height * s, width * s, 4, device=dev)
    headlight = isinstance(light, str)
    if headlight and light != "headlight":
        raise InputError(f"light={light!r}; allowed: 'headlight' or a world-space direction of 3 numbers")
    world = np.zeros(3) if headlight else np.asarray(light, dtype=np.float64).reshape(-1)
    if world.shape != (3,) or not np.all(np.isfinite(world)) or (not headlight and not np.any(world)):
        raise InputError(f"light={light!r} must be 'headlight' or a non-zero direction of 3 finite numbers")
    to_light = torch.as_tensor(c2w_t[:3, :3].numpy().T @ world, dtype=torch.float32, device=dev).contiguous()
    smooth = shading == "smooth"
    if smooth:
        world_normals = corner_normals(mesh) if normals is None else np.asarray(normals, dtype=np.float64)
        if world_normals.shape != (len(mesh.faces), 9):
            raise InputError(f"normals has shape {world_normals.shape}; allowed: ({len(mesh.faces)}, 9), one normal "
                             "per face corner")
        rotation = c2w_t[:3, :3].numpy()
        cam_normals = (world_normals.reshape(-1, 3, 3) @ rotation).reshape(-1, 9)  # row vectors: R^T n
        normal_arg = torch.as_tensor(cam_normals, dtype=torch.float32, device=dev).contiguous()
    else:
        normal_arg = torch.zeros(1, 9, device=dev)
    raster.shade(cam, faces, key, rgb, uv, texture, int(textured), float(focal) * s, float(ambient), to_light,
                 int(headlight), normal_arg, int(smooth), big)
    img = big.reshape(height, s, width, s, 4).mean(dim=(1, 3))
    # Colour weighted by coverage: straight (not premultiplied) alpha, as PNGs store it.
    alpha = img[..., 3:]
    img[..., :3] = torch.where(alpha > 0, img[..., :3] / alpha.clamp(min=1e-8), torch.zeros_like(img[..., :3]))
    return img


def write_nerf_synthetic(mesh: Mesh, out_dir, views: int = 100, val_views: int = 10, test_views: int = 20,
                         resolution: int = 800, supersample: int = 2, light=DEFAULT_LIGHT, shading: str = "smooth",
                         crease_degrees: float = DEFAULT_CREASE_DEGREES, radii=(CAMERA_RADIUS,)) -> dict:
    """Render train/val/test views of `mesh` (normalised first) into `out_dir` as a NeRF-synthetic folder, every
    split's cameras on the spheres of `radii` (`ring_cameras`). Returns {split: number of views}."""
    import imageio.v3 as iio

    for name, value in (("views", views), ("resolution", resolution)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{name}={value!r} must be an integer >= 1")
    check_shading(shading)
    radii = check_radii(radii)
    mesh = mesh.normalised()
    normals = corner_normals(mesh, crease_degrees) if shading == "smooth" else None
    focal = 0.5 * resolution / math.tan(0.5 * CAMERA_ANGLE_X)
    counts = {}
    for split, n, offset in (("train", views, 0.0), ("val", val_views, 0.5), ("test", test_views, 0.25)):
        if n <= 0:
            continue
        os.makedirs(os.path.join(out_dir, split), exist_ok=True)
        frames = []
        for k, c2w in enumerate(ring_cameras(n, radii, offset)):
            rgba = render_rgba(mesh, c2w, resolution, resolution, focal, supersample, light=light, normals=normals,
                               shading=shading)
            pixels = (rgba.clamp(0, 1) * 255 + 0.5).to(torch.uint8).cpu().numpy()
            iio.imwrite(os.path.join(out_dir, split, f"r_{k}.png"), pixels)
            frames.append({"file_path": f"./{split}/r_{k}", "transform_matrix": c2w.tolist()})
        with open(os.path.join(out_dir, f"transforms_{split}.json"), "w") as f:
            json.dump({"camera_angle_x": CAMERA_ANGLE_X, "frames": frames}, f, indent=1)
        counts[split] = n
    return counts


def scene_from_mesh(mesh_path, out_dir, views: int, test_views: int, resolution: int,
                    radii=(CAMERA_RADIUS,)) -> str:
    """A demo's `--mesh`: the mesh rendered into `out_dir` (train and test views on the spheres of `radii`);
    returns the folder."""
    write_nerf_synthetic(read_mesh(mesh_path), out_dir, views=views, val_views=0, test_views=test_views,
                         resolution=resolution, radii=radii)
    return os.fspath(out_dir)


def _direction(name: str, text: str) -> tuple:
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3:
        raise InputError(f"{name}={text!r} must be three comma-separated numbers (x,y,z) or 'headlight'")
    return values


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mesh", help="an .obj or .ply file")
    p.add_argument("out", help="output folder (NeRF-synthetic layout)")
    p.add_argument("--views", type=int, default=100, help="training views")
    p.add_argument("--val-views", type=int, default=10)
    p.add_argument("--test-views", type=int, default=20)
    p.add_argument("--res", type=int, default=800, help="image side in pixels")
    p.add_argument("--supersample", type=int, default=2, help="samples per pixel side (antialiasing)")
    p.add_argument("--light", default=",".join(str(v) for v in DEFAULT_LIGHT),
                   help="direction towards a distant light, 'x,y,z' in world space, or 'headlight' (a light at each "
                        "camera: view-dependent shading)")
    p.add_argument("--shading", default="smooth", choices=SHADINGS,
                   help="smooth: corner normals averaged across edges flatter than --crease; flat: one normal per face")
    p.add_argument("--crease", type=float, default=DEFAULT_CREASE_DEGREES,
                   help="smooth shading: edges whose faces bend by more than this many degrees stay sharp")
    p.add_argument("--arch", default=None, help="cpu, cuda or auto")
    args = p.parse_args(argv)
    if not 0.0 <= args.crease <= 180.0:
        p.error(f"--crease must be an angle in [0, 180] degrees, got {args.crease}")
    light = args.light if args.light == "headlight" else _direction("--light", args.light)
    runtime.init(args.arch)
    import time
    t0 = time.perf_counter()
    counts = write_nerf_synthetic(read_mesh(args.mesh), args.out, args.views, args.val_views, args.test_views,
                                  args.res, args.supersample, light, args.shading, args.crease)
    print(f"{sum(counts.values())} views ({counts}) at {args.res}x{args.res} in {time.perf_counter() - t0:.1f} s: "
          f"{args.out}")
    return counts


if __name__ == "__main__":
    main()
