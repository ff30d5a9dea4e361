"""Interactive training viewer on Taichi GGUI, with a headless PNG mode for servers and CI.

    from tinn.viewer import Viewer, run_viewer
    run_viewer(trainer, task, steps=300, headless=True, out_dir="out/viewer")   # ImageTask + Trainer
    Viewer(my_source, headless=True).run(steps=100)                            # any source, see .source
    serve(my_source, port=8080, steps=2000)            # a web page: open http://127.0.0.1:8080 in a browser
"""
from .app import BACKEND_ENV, Viewer, open_frontend, run_viewer, serve
from .controller import ViewerController
from .orbit import OrbitCamera
from .source import ImageTrainerSource
from .window import ViewerUnavailable, vulkan_installed

__all__ = ["BACKEND_ENV", "ImageTrainerSource", "OrbitCamera", "Viewer", "ViewerController", "ViewerUnavailable",
           "open_frontend", "run_viewer", "serve", "vulkan_installed"]
