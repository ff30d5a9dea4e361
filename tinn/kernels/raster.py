"""Triangle rasterisation for rendering meshes into posed images (tinn/scenes/data/mesh.py).

Camera space as in tinn/render/rays.py: the camera at the origin looks down -z, +y up; pixel (i, j) is seen
through (i + 0.5 - W / 2, -(j + 0.5 - H / 2), -focal). Each triangle's thread walks its screen bounding box
and intersects the pixels' rays with it exactly (Moller-Trumbore), so depth and barycentrics are the ray's,
perspective-correct; edges carry a small slack so that shared edges are watertight. The nearest hit per
pixel wins an atomic min on a key whose high 32 bits are the depth's float bits (positive floats order like
their bits) and whose low 32 bits are the triangle.
"""
from ..backend import ti

f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)
f32_3d = ti.types.ndarray(dtype=ti.f32, ndim=3)
i32_2d = ti.types.ndarray(dtype=ti.i32, ndim=2)
i64_2d = ti.types.ndarray(dtype=ti.i64, ndim=2)
f32_1d = ti.types.ndarray(dtype=ti.f32, ndim=1)

NO_HIT = (1 << 63) - 1
# A ray through a shared edge must hit one of its two triangles. Rounding (and CUDA's fast math) can put the
# barycentrics of both just outside, leaving a pinhole; a slack of 1e-5 of a triangle's size closes it and the
# depth key then picks one of the two.
EDGE_SLACK = 1e-5


@ti.func
def _pixel_ray(i, j, width, height, focal):
    return ti.Vector([(i + 0.5 - 0.5 * width) / focal, -(j + 0.5 - 0.5 * height) / focal, -1.0])


@ti.func
def _intersect(d, a, b, c):
    """(t, u, v) of the ray 0 + t d through triangle (a, b, c); t <= 0 when it misses."""
    e1 = b - a
    e2 = c - a
    p = d.cross(e2)
    det = e1.dot(p)
    t, u, v = -1.0, 0.0, 0.0
    if ti.abs(det) > 1e-12:
        inv = 1.0 / det
        s = -a
        u = s.dot(p) * inv
        q = s.cross(e1)
        v = d.dot(q) * inv
        if u >= -EDGE_SLACK and v >= -EDGE_SLACK and u + v <= 1.0 + EDGE_SLACK:
            t = e2.dot(q) * inv
    return t, u, v


@ti.func
def _corner(verts: ti.template(), faces: ti.template(), f, k):
    n = faces[f, k]
    return ti.Vector([verts[n, 0], verts[n, 1], verts[n, 2]])


@ti.kernel
def raster_depth(verts: f32_2d, faces: i32_2d, key: i64_2d, focal: ti.f32, near: ti.f32):
    """key[j, i] = min over triangles hit by pixel (i, j)'s ray of (depth bits << 32 | triangle); `key` starts at
    NO_HIT. Triangles with a corner closer than `near` to the camera plane are skipped."""
    height, width = key.shape[0], key.shape[1]
    for f in range(faces.shape[0]):
        a, b, c = _corner(verts, faces, f, 0), _corner(verts, faces, f, 1), _corner(verts, faces, f, 2)
        if -a[2] > near and -b[2] > near and -c[2] > near:
            xs = ti.Vector([focal * a[0] / -a[2], focal * b[0] / -b[2], focal * c[0] / -c[2]]) + 0.5 * width
            ys = 0.5 * height - ti.Vector([focal * a[1] / -a[2], focal * b[1] / -b[2], focal * c[1] / -c[2]])
            i0 = ti.max(ti.cast(ti.floor(xs.min() - 0.5), ti.i32), 0)
            i1 = ti.min(ti.cast(ti.ceil(xs.max() - 0.5), ti.i32), width - 1)
            j0 = ti.max(ti.cast(ti.floor(ys.min() - 0.5), ti.i32), 0)
            j1 = ti.min(ti.cast(ti.ceil(ys.max() - 0.5), ti.i32), height - 1)
            for j in range(j0, j1 + 1):
                for i in range(i0, i1 + 1):
                    t, u, v = _intersect(_pixel_ray(i, j, width, height, focal), a, b, c)
                    if t > 0.0:
                        bits = ti.cast(ti.bit_cast(ti.cast(t, ti.f32), ti.i32), ti.i64)
                        ti.atomic_min(key[j, i], (bits << 32) | ti.cast(f, ti.i64))


@ti.kernel
def shade(verts: f32_2d, faces: i32_2d, key: i64_2d, corner_rgb: f32_2d, corner_uv: f32_2d, texture: f32_3d,
          textured: ti.i32, focal: ti.f32, ambient: ti.f32, light: f32_1d, headlight: ti.i32, corner_normal: f32_2d,
          smooth: ti.i32, rgba: f32_3d):
    """rgba[j, i]: the hit triangle's colour (per-corner colours, or a bilinear texture lookup at the
    interpolated uv, v up) times ambient + (1 - ambient) |cos| of the normal against the light: the
    direction `light` (camera space), or the ray itself with `headlight` (a light at the camera, so shading
    changes with the view); alpha 1. Pixels without a hit: 0. The normal is the face's, or with `smooth` the
    interpolation of its corners' (camera-space `corner_normal` (F, 9))."""
    height, width = key.shape[0], key.shape[1]
    th, tw = texture.shape[0], texture.shape[1]
    for j, i in ti.ndrange(height, width):
        k = key[j, i]
        for ch in ti.static(range(4)):
            rgba[j, i, ch] = 0.0
        if k != ti.i64(NO_HIT):
            f = ti.cast(k & ti.i64(0xFFFFFFFF), ti.i32)
            a, b, c = _corner(verts, faces, f, 0), _corner(verts, faces, f, 1), _corner(verts, faces, f, 2)
            d = _pixel_ray(i, j, width, height, focal)
            t, u, v = _intersect(d, a, b, c)
            w0 = 1.0 - u - v
            colour = ti.Vector([0.0, 0.0, 0.0])
            if textured:
                tu = w0 * corner_uv[f, 0] + u * corner_uv[f, 2] + v * corner_uv[f, 4]
                tv = w0 * corner_uv[f, 1] + u * corner_uv[f, 3] + v * corner_uv[f, 5]
                x = (tu - ti.floor(tu)) * tw - 0.5
                y = (1.0 - (tv - ti.floor(tv))) * th - 0.5
                x0, y0 = ti.floor(x), ti.floor(y)
                fx, fy = x - x0, y - y0
                for ch in ti.static(range(3)):
                    acc = 0.0
                    for dy, dx in ti.static(ti.ndrange(2, 2)):
                        xi = (ti.cast(x0, ti.i32) + dx) % tw
                        yi = (ti.cast(y0, ti.i32) + dy) % th
                        wx = fx if dx else 1.0 - fx
                        wy = fy if dy else 1.0 - fy
                        acc += wx * wy * texture[yi, xi, ch]
                    colour[ch] = acc
            else:
                for ch in ti.static(range(3)):
                    colour[ch] = w0 * corner_rgb[f, ch] + u * corner_rgb[f, 3 + ch] + v * corner_rgb[f, 6 + ch]
            n = (b - a).cross(c - a)
            if smooth:
                for ax in ti.static(range(3)):
                    n[ax] = w0 * corner_normal[f, ax] + u * corner_normal[f, 3 + ax] + v * corner_normal[f, 6 + ax]
            to_light = ti.Vector([light[0], light[1], light[2]])
            if headlight:
                to_light = d
            lit = ambient + (1.0 - ambient) * ti.abs(n.dot(to_light)) / ti.max(n.norm() * to_light.norm(), 1e-20)
            for ch in ti.static(range(3)):
                rgba[j, i, ch] = ti.min(colour[ch] * lit, 1.0)
            rgba[j, i, 3] = 1.0
