"""The GGUI front end: a Taichi `ti.ui.Window` showing the frame, with imgui controls in the sidebar.

With `visible=False` the same window renders offscreen (`show_window=False`) and
`save()` writes what it would have shown, controls included. Every widget and key
calls a `ViewerController` method: there is no logic here.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys

import numpy as np

from .controller import LOG10_LR_RANGE
from .layout import Layout

# key -> (controller method, capability the source must have or None)
KEY_ACTIONS = {
    " ": ("toggle_pause", None),
    "n": ("single_step", None),
    "r": ("reset", "reset"),
    "c": ("save_checkpoint", "save_checkpoint"),
    "p": ("request_screenshot", None),
    "Escape": ("quit", None),
    # Orbit camera (scene sources): GGUI reports key presses, so a held key turns one step per press.
    "a": ("orbit_left", "render_from"),
    "d": ("orbit_right", "render_from"),
    "w": ("orbit_up", "render_from"),
    "s": ("orbit_down", "render_from"),
    "h": ("orbit_home", "render_from"),
}
IMGUI_INI = "imgui.ini"
KEY_HELP = ("keys: space pause, n step,", "r reset, c checkpoint, p shot")
ORBIT_HELP = ("orbit: drag (left button),", "a/d w/s turn, h held-out view")
DRAG_DEGREES = 180.0  # a drag across the whole window turns the camera half way round


class ViewerUnavailable(RuntimeError):
    """GGUI cannot run here; the message says why in one line."""


def vulkan_installed() -> tuple[bool, str]:
    """Whether a Vulkan loader and, on Linux, at least one driver manifest (ICD) are installed."""
    names = ["vulkan-1"] if sys.platform == "win32" else ["libvulkan.so.1", "libvulkan.dylib", "libvulkan.so"]
    found = ctypes.util.find_library("vulkan") is not None
    for name in names:
        if found:
            break
        try:
            ctypes.CDLL(name)
            found = True
        except OSError:
            pass
    if not found:
        return False, "no Vulkan loader (libvulkan) installed"
    if not sys.platform.startswith("linux"):
        return True, ""
    # The loader's own search: an explicit list replaces the standard folders, VK_ADD_DRIVER_FILES adds to them.
    listed = os.environ.get("VK_DRIVER_FILES") or os.environ.get("VK_ICD_FILENAMES")
    if listed:
        files = [f for f in listed.split(os.pathsep) if os.path.isfile(f)]
    else:
        roots = ["/usr/share", "/usr/local/share", "/etc", "/etc/xdg"]
        for var in ("XDG_DATA_DIRS", "XDG_CONFIG_DIRS"):
            roots += [d for d in os.environ.get(var, "").split(os.pathsep) if d]
        files = [f for r in roots for f in glob.glob(os.path.join(r, "vulkan", "icd.d", "*.json"))]
    files += [f for f in os.environ.get("VK_ADD_DRIVER_FILES", "").split(os.pathsep) if f and os.path.isfile(f)]
    if not files:
        return False, "no Vulkan driver (ICD) installed; on Linux: apt-get install mesa-vulkan-drivers"
    return True, ""


def ggui_support() -> tuple[bool, str]:
    """Whether the kernel backend has GGUI: Taichi does, Quadrants removed it (no `ui` module)."""
    from .. import backend
    if hasattr(backend.ti, "ui"):
        return True, ""
    return False, (f"the {backend.name()} {backend.version()} backend has no GGUI (its ui module was removed); "
                   "the window needs the taichi backend")


def has_display() -> bool:
    if sys.platform.startswith("linux"):
        return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    return True


def draw_controls(gui, controller, layout: Layout) -> None:
    """The imgui panel over the sidebar. `gui` is `window.get_gui()` (tests pass a stand-in)."""
    sb, (height, width) = layout.sidebar, layout.size
    with gui.sub_window("tinn viewer", sb.x / width, sb.y / height, sb.w / width, sb.h / height) as g:
        for line in controller.status_lines():
            g.text(line)
        if g.button("Resume" if controller.paused else "Pause"):
            controller.toggle_pause()
        if g.button("Step"):
            controller.single_step()
        if controller.can("learning_rate"):
            current = controller.log10_learning_rate
            value = g.slider_float("log10 lr", current, *LOG10_LR_RANGE)
            if abs(value - current) > 1e-4:  # imgui hands back a float32: ignore round-off
                controller.set_log10_learning_rate(value)
        if controller.can("reset") and g.button("Reset parameters"):
            controller.reset()
        if controller.can("save_checkpoint") and g.button("Save checkpoint"):
            controller.save_checkpoint()
        if g.button("Save screenshot"):
            controller.request_screenshot()
        if controller.orbiting and g.button("Held-out view"):
            controller.orbit_home()
        for line in KEY_HELP + (ORBIT_HELP if controller.orbit is not None else ()):
            g.text(line)


def handle_key(key: str, controller) -> bool:
    """Run the controller method bound to `key`; False if the key is unbound or unsupported here."""
    action = KEY_ACTIONS.get(key)
    if action is None or (action[1] is not None and not controller.can(action[1])):
        return False
    getattr(controller, action[0])()
    return True


class OrbitDrag:
    """Turns left-button drags over the panels into orbit angles; drags that start on the sidebar are imgui's.

    `update` takes GGUI's cursor position (x, y in [0, 1], y up) once per frame. Dragging moves the scene
    with the cursor: right turns the camera to smaller azimuths, up lowers it.
    """

    def __init__(self, layout: Layout):
        self.layout = layout
        self.last: tuple[float, float] | None = None
        self.active = False

    def over_sidebar(self, x: float, y: float) -> bool:
        sb, (height, width) = self.layout.sidebar, self.layout.size
        px, py = x * width, (1.0 - y) * height  # the layout's rows count from the top
        return sb.x <= px < sb.x + sb.w and sb.y <= py < sb.y + sb.h

    def update(self, pressed: bool, x: float, y: float) -> tuple[float, float]:
        """(d_azimuth, d_elevation) in degrees since the last frame."""
        if not pressed:
            self.last, self.active = None, False
            return 0.0, 0.0
        if self.last is None:  # the press began this frame
            self.last, self.active = (x, y), not self.over_sidebar(x, y)
            return 0.0, 0.0
        dx, dy = x - self.last[0], y - self.last[1]
        self.last = (x, y)
        if not self.active:
            return 0.0, 0.0
        return -DRAG_DEGREES * dx, -DRAG_DEGREES * dy


class GGUIFrontend:
    kind = "ggui"
    text_status = False  # imgui shows the status

    def __init__(self, layout: Layout, visible: bool, title: str = "tinn viewer"):
        from ..backend import ti

        ok, why = ggui_support()
        if not ok:
            raise ViewerUnavailable(why)
        self.ti, self.layout, self.visible = ti, layout, visible
        self._ini_was_there = os.path.exists(IMGUI_INI)
        height, width = layout.size
        try:
            self.window = ti.ui.Window(title, (width, height), vsync=visible, show_window=visible)
        except Exception as exc:  # Taichi raises RuntimeError("Vulkan must be available for GGUI") and kin
            raise ViewerUnavailable(f"GGUI could not open a window ({str(exc).strip().splitlines()[0]})") from None
        self.canvas = self.window.get_canvas()
        self.gui = self.window.get_gui()
        self.drag = OrbitDrag(layout)

    @property
    def running(self) -> bool:
        return self.window.running if self.visible else True

    def present(self, frame: np.ndarray, controller) -> None:
        if self.visible:  # get_events() is refused on an offscreen window
            for event in self.window.get_events(self.ti.ui.PRESS):
                handle_key(event.key, controller)
            if controller.orbit is not None:
                x, y = self.window.get_cursor_pos()
                d_azimuth, d_elevation = self.drag.update(self.window.is_pressed(self.ti.ui.LMB), x, y)
                if d_azimuth or d_elevation:
                    controller.orbit_by(d_azimuth, d_elevation)
        # GGUI images are indexed [x, y] with y pointing up.
        self.canvas.set_image(np.ascontiguousarray(frame.transpose(1, 0, 2)[:, ::-1]))
        draw_controls(self.gui, controller, self.layout)

    def save(self, path: str) -> None:
        self.window.save_image(path)

    def show(self) -> None:
        if self.visible:  # show() on an offscreen window crashes the process
            self.window.show()

    def close(self) -> None:
        self.window.destroy()
        # imgui saves its window positions to the working directory; the viewer places them itself.
        if not self._ini_was_there and os.path.exists(IMGUI_INI):
            os.remove(IMGUI_INI)
