"""The demos' viewer flags, in one place:

    --viewer window   the GGUI window (PNG frames where it cannot open); --gui is the same
    --viewer png      headless PNG frames in --out; --gui --headless is the same
    --viewer web      a page served at --host:--port (127.0.0.1:8080) for any browser, e.g. over `ssh -L`
"""
from __future__ import annotations

import argparse

CHOICES = ("window", "png", "web")


def add_viewer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--viewer", choices=CHOICES, default=None,
                   help="train in a viewer: window (GGUI), png (headless frames in --out) or web (a page served "
                        "at --host:--port; remote: ssh -L 8080:127.0.0.1:8080 server)")
    p.add_argument("--gui", action="store_true", help="the same as --viewer window (--viewer png with --headless)")
    p.add_argument("--headless", action="store_true", help="with --gui: no window, frames saved to --out")
    p.add_argument("--host", default="127.0.0.1",
                   help="--viewer web: interface to listen on (others let anyone who reaches the port steer "
                        "training)")
    p.add_argument("--port", type=int, default=8080, help="--viewer web: port")
    p.add_argument("--keep-open", action="store_true",
                   help="--viewer web: at the last step pause and keep serving (resume trains on) until Ctrl+C")
    p.add_argument("--view-share", type=float, default=None,
                   help="--viewer web: at most about this share of the wall time goes to the page while a browser "
                        "is connected (0.01 .. 0.5; default 0.06)")


def viewer_kind(args) -> str | None:
    """window, png, web or None (no viewer), from --viewer or the older --gui [--headless]."""
    if args.viewer:
        return args.viewer
    if args.gui:
        return "png" if args.headless else "window"
    return None


def open_viewer(args, source, out_dir: str, title: str, **kwargs):
    """The `Viewer` the flags ask for (None without a viewer flag)."""
    from .app import Viewer

    kind = viewer_kind(args)
    if kind is None:
        return None
    if kind == "web":
        web = {"host": args.host, "port": args.port, "keep_open": args.keep_open}
        if getattr(args, "view_share", None) is not None:
            web["view_share"] = args.view_share
        return Viewer(source, out_dir=out_dir, backend="web", title=title, web=web, **kwargs)
    return Viewer(source, out_dir=out_dir, headless=kind == "png", title=title, **kwargs)
