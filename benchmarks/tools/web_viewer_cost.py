"""What the web viewer costs training: steps/s of a demo's training with no viewer, with the page served and
nobody connected, and with one connected headless client (its camera at rest, then moving).

    python -m benchmarks.tools.web_viewer_cost                       # GPU-sized image task (2^18 samples/step)
    python -m benchmarks.tools.web_viewer_cost --task kilonerf,octree --seconds 4 --rounds 3
    python -m benchmarks.tools.web_viewer_cost --task octree --demo-args "--res 64 --batch 4096"
    python -m benchmarks.tools.web_viewer_cost --task image,kilonerf,octree --quick --arch cpu   # toy sizes

Tasks: `image` (the image demo's ImageTrainerSource), `kilonerf` (demos/kilonerf.py's pipeline, measured in one
phase, fine-tuning the grid of networks by default, after short earlier phases) and `octree` (demos/octree_lod.py's
OctreeSource). Each trains the source the demo passes to the viewer, at the demo's own default size (its full
size; `--small` added on a CPU); `--demo-args` passes any of the demo's options. The baseline calls the source's
`train_step` in a bare loop; the other conditions run the web viewer's loop over the same source. A scene's step
rate drifts as it trains, so the conditions alternate with the bare loop in short windows (bare, served, bare,
resting, bare, moving, ... `--rounds` times, then bare) and each condition window is compared with the bare rate
interpolated between the bare windows beside it; the bare windows' drift is printed. Beside each ratio: the page's
share of the time by the viewer's own ledger, and the steps per second of the time it booked as training.

The client speaks viser's websocket protocol from Python (no browser needed; `viewer_client.py`), in a process of
its own as a browser is: it sends camera messages the way the page does (scenes: from the held-out view the page
opens at, turning around the scene while it moves) and reads everything the server sends, as a browser tab would,
counting the frames rendered for it. Prints one JSON object per task, then a table; the issue's goal is
`resting_client` within 10% of `no_viewer` on the H100.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import threading
import time

import tinn  # noqa: E402
from benchmarks.common import write_json  # noqa: E402
from benchmarks.tools.viewer_client import HeadlessClient, camera_message  # noqa: E402

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tinn", "configs", "config.json")
TASKS = ("image", "kilonerf", "octree")
CONDITIONS = ("no_viewer", "served_no_client", "resting_client", "moving_client")
# --quick: toy sizes and short conditions, to check the tool on a CPU (the numbers mean nothing)
QUICK = {"batch": 1024, "size": 16, "seconds": 0.5, "warmup": 0.5, "width": 64, "height": 36, "prep_steps": 2,
         "rounds": 1}


# ---- the client ------------------------------------------------------------------------------------------
def browser_pose(c2w) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(wxyz, position) of a browser camera (viser: OpenCV axes, +z forward, +y down) showing the scenes'
    camera-to-world pose `c2w` (4, 4); `tinn.viewer.web.camera_from_browser` turns it back."""
    import torch

    m = torch.as_tensor(c2w, dtype=torch.float64).cpu()
    r = (m[:3, :3] @ torch.diag(torch.tensor([1.0, -1.0, -1.0], dtype=torch.float64))).tolist()
    # The rotation's quaternion, from its largest component (stable for any rotation).
    trace = r[0][0] + r[1][1] + r[2][2]
    if trace > 0:
        s = 2.0 * math.sqrt(1.0 + trace)
        q = (0.25 * s, (r[2][1] - r[1][2]) / s, (r[0][2] - r[2][0]) / s, (r[1][0] - r[0][1]) / s)
    elif r[0][0] >= r[1][1] and r[0][0] >= r[2][2]:
        s = 2.0 * math.sqrt(1.0 + r[0][0] - r[1][1] - r[2][2])
        q = ((r[2][1] - r[1][2]) / s, 0.25 * s, (r[0][1] + r[1][0]) / s, (r[0][2] + r[2][0]) / s)
    elif r[1][1] >= r[2][2]:
        s = 2.0 * math.sqrt(1.0 + r[1][1] - r[0][0] - r[2][2])
        q = ((r[0][2] - r[2][0]) / s, (r[0][1] + r[1][0]) / s, 0.25 * s, (r[1][2] + r[2][1]) / s)
    else:
        s = 2.0 * math.sqrt(1.0 + r[2][2] - r[0][0] - r[1][1])
        q = ((r[1][0] - r[0][1]) / s, (r[0][2] + r[2][0]) / s, (r[1][2] + r[2][1]) / s, 0.25 * s)
    return q, tuple(float(v) for v in m[:3, 3])


def image_camera(k: int) -> dict:
    """The image task's camera after `k` moves: looking down world -z at the image plane from 0.8 units, turned
    a little further about world y with each move (and back after 20)."""
    angle = (0.05 * k) % 1.0
    # OpenCV axes looking down world -z: 180 degrees about x; then turned by `angle` about world y.
    c, s = math.cos(angle / 2), math.sin(angle / 2)
    distance = 0.8
    return {"wxyz": (0.0, c, 0.0, -s), "position": (distance * math.sin(angle), 0.0, distance * math.cos(angle)),
            "fov": 1.3, "look_at": (0.0, 0.0, 0.0), "up_direction": (0.0, 1.0, 0.0)}


def scene_cameras(source, degrees_per_move: float = 3.0):
    """A scene source's cameras: move `k` is the held-out view the page opens at (`orbit_start`), turned by
    k x `degrees_per_move` around the scene's centre (world +z up), at the held-out view's field of view."""
    import torch

    from tinn.viewer.orbit import OrbitCamera

    start, target = source.orbit_start()
    fov = 2.0 * math.atan(0.5 * source.test.height / float(source.test.focal))  # the held-out views' own
    look_at = tuple(float(v) for v in torch.as_tensor(target).cpu().reshape(3))

    def camera(k: int) -> dict:
        orbit = OrbitCamera.from_c2w(start, target)
        orbit.rotate(k * degrees_per_move, 0.0)
        wxyz, position = browser_pose(orbit.c2w())
        return {"wxyz": wxyz, "position": position, "fov": fov, "look_at": look_at, "up_direction": (0.0, 0.0, 1.0)}

    return camera


# ---- the tasks -------------------------------------------------------------------------------------------
class Task:
    """What one measurement trains: the viewer source, the client's cameras and a description for the JSON."""

    def __init__(self, name: str, source, camera, title: str, describe: dict):
        self.name, self.source, self.camera, self.title, self.describe = name, source, camera, title, describe


def image_task(args) -> Task:
    from tinn.tasks.image import ImageTask, default_image
    from tinn.trainer import Trainer
    from tinn.viewer import ImageTrainerSource

    task = ImageTask(default_image(args.size), tiles=args.tiles, seed=0)
    trainer = Trainer.from_config(tinn.load_config(args.config), 2, 3, n_networks=task.n_networks, seed=0)
    return Task("image", ImageTrainerSource(trainer, task, args.batch), image_camera, "tinn viewer",
                {"batch": args.batch, "tiles": args.tiles, "size": args.size})


def build_task(name: str, args, arch: str) -> Task:
    if name == "image":
        return image_task(args)
    from benchmarks.tools import web_viewer_scenes

    demo_argv = shlex.split(args.demo_args) + (["--small"] if arch == "cpu" else [])
    if args.quick:
        demo_argv = web_viewer_scenes.QUICK_ARGS[name] + demo_argv
    out = os.path.join(args.out, name)
    if name == "kilonerf":
        source, describe = web_viewer_scenes.kilonerf_source(demo_argv, arch, out, args.phase, args.prep_steps)
        title = "tinn KiloNeRF"
    else:
        source, describe = web_viewer_scenes.octree_source(demo_argv, arch, out)
        title = "tinn octree LoD"
    return Task(name, source, scene_cameras(source), title, describe)


# ---- measuring -------------------------------------------------------------------------------------------
def sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def host_clock() -> tuple[float, float, float, float]:
    """(wall seconds, this process's CPU seconds, the machine's stolen CPU ticks, its total CPU ticks), read at
    both ends of a window. CPU seconds count every thread of this process (the viewer's server threads too) and
    no time the hypervisor gave to another guest; the ticks are 0 where /proc/stat cannot be read."""
    steal = total = 0.0
    try:
        with open("/proc/stat") as f:
            fields = [float(v) for v in f.readline().split()[1:]]
        steal, total = (fields[7] if len(fields) > 7 else 0.0), sum(fields[:8])
    except (OSError, ValueError):
        pass
    return time.perf_counter(), time.process_time(), steal, total


def window_rates(steps: int, start: tuple, end: tuple) -> dict:
    """Steps per wall second and per CPU second of this process over a window, and the machine's stolen share."""
    wall, cpu = end[0] - start[0], end[1] - start[1]
    ticks = end[3] - start[3]
    return {"rate": steps / wall, "cpu_rate": steps / cpu if cpu > 0 else None,
            "steal": (end[2] - start[2]) / ticks if ticks > 0 else None}


def plain_rate(source, seconds: float, warm_steps: int = 20) -> dict:
    """The bare loop over `seconds` (losses kept on the device, one sync every 10 steps): `window_rates`."""
    for _ in range(warm_steps):
        source.train_step()
    sync()
    start, n = host_clock(), 0
    while time.perf_counter() - start[0] < seconds:
        for _ in range(10):
            source.train_step()
        n += 10
        sync()
    return window_rates(n, start, host_clock())


def viewer_rate(viewer, seconds: float, warmup_s: float) -> dict:
    """The web viewer's loop over `seconds` after `warmup_s` (a client connects, first renders): `rate` (steps/s),
    `cpu_rate` and `steal` (`window_rates`), `start` and `end` (perf_counter), and by the viewer's own ledger
    (`tinn.viewer.budget`; nothing booked with nobody connected) the page's `share` of the time and
    `training_rate`, steps per second of booked training."""
    c, schedule = viewer.controller, viewer.frontend.schedule
    c.quit_requested = False
    marks = {}

    def stopper():
        time.sleep(warmup_s)
        marks["start"] = (host_clock(), c.step, *schedule.totals())
        time.sleep(seconds)
        marks["end"] = (host_clock(), c.step, *schedule.totals())
        c.quit()

    thread = threading.Thread(target=stopper)
    thread.start()
    viewer._run_web()
    thread.join()
    (c0, s0, p0, b0), (c1, s1, p1, b1) = marks["start"], marks["end"]
    page, training = p1 - p0, b1 - b0
    return {**window_rates(s1 - s0, c0, c1), "start": c0[0], "end": c1[0],
            "share": page / (page + training) if page + training > 0 else 0.0,
            "training_rate": (s1 - s0) / training if training > 0 else None}


def interleaved_ratios(windows: list[dict]) -> dict:
    """Each condition's steps/s against the bare loop's, from windows measured in turn: dicts with `condition`
    ("no_viewer" for the bare loop), `start` and `end` (seconds) and `rate` (steps/s over the window), in time order.

    A condition window's baseline is the bare rate at its midpoint, interpolated linearly between the nearest bare
    windows before and after it (the one there is, at either end), so a step rate that drifts steadily as training
    goes on cancels. Returns {condition: {"ratio": mean of its windows' ratios, "median": their median,
    "ratios": [...]}}: a window the host slowed for reasons of its own (the bare loop's windows spread by 10-30%
    on the GPU machines) moves the mean, less the median.
    """
    bare = [(0.5 * (w["start"] + w["end"]), w["rate"]) for w in windows if w["condition"] == "no_viewer"]
    if not bare:
        raise ValueError("interleaved_ratios needs at least one bare-loop (no_viewer) window")
    out: dict = {}
    for w in windows:
        if w["condition"] == "no_viewer":
            continue
        mid = 0.5 * (w["start"] + w["end"])
        before = [b for b in bare if b[0] <= mid]
        after = [b for b in bare if b[0] > mid]
        if before and after:
            (t0, r0), (t1, r1) = before[-1], after[0]
            baseline = r0 + (r1 - r0) * (mid - t0) / (t1 - t0)
        else:
            baseline = (before or after)[-1 if before else 0][1]
        out.setdefault(w["condition"], {"ratios": []})["ratios"].append(w["rate"] / baseline)
    for entry in out.values():
        entry["ratio"] = sum(entry["ratios"]) / len(entry["ratios"])
        entry["median"] = statistics.median(entry["ratios"])
    return out


def measure(task: Task, args, arch: str) -> dict:
    """The conditions for one task on the same source (training goes on throughout), in alternating windows: bare
    loop, served, bare loop, resting client, bare loop, moving client, ... `args.rounds` times, then the bare loop.
    Each condition is compared with the bare windows beside it (`interleaved_ratios`)."""
    from tinn.viewer import Viewer

    result = {"task": task.name, "arch": arch, **task.describe, "viewport": [args.width, args.height],
              "rounds": args.rounds, "window_s": args.seconds}
    task.source.render()  # the render kernels compile here, not in a measured condition
    web_options = {"port": args.port} if args.view_share is None else {"port": args.port,
                                                                       "view_share": args.view_share}
    viewer = Viewer(task.source, out_dir=os.path.join(args.out, task.name, "viewer"), backend="web",
                    web=web_options, title=task.title, log=lambda *a: None)
    web = viewer.frontend
    result["view_share"] = web.schedule.budget.share
    windows, clock0 = [], time.perf_counter()
    conditions = args.conditions
    totals = {c: {"frames_sent": 0, "frames_received": 0, "mbytes": 0.0, "page_share": []} for c in conditions
              if c != "served_no_client"}
    training_windows = []  # steps per second of the viewer's booked training time, beside the bare windows

    def bare(first: bool) -> None:
        start = time.perf_counter() - clock0
        rates = plain_rate(task.source, args.seconds, warm_steps=20 if first else 3)
        windows.append({"condition": "no_viewer", "start": start, "end": time.perf_counter() - clock0, **rates})

    def served(condition: str) -> None:
        move_every_s = {"served_no_client": None, "resting_client": None, "moving_client": 1 / 30}[condition]
        client, sent = None, web.frames_sent
        if condition != "served_no_client":
            # The moves of the window and its warm-up (and a margin), encoded before the client starts.
            moves = 1 if move_every_s is None else int((args.warmup + args.seconds) / move_every_s) + 64
            cameras = [camera_message(task.camera(k), args.width, args.height) for k in range(moves)]
            client = HeadlessClient(web.url, cameras, move_every_s).__enter__()
        try:
            m = viewer_rate(viewer, args.seconds, args.warmup)
            window = {"condition": condition, "start": m["start"] - clock0, "end": m["end"] - clock0}
            windows.append({**window, "rate": m["rate"], "cpu_rate": m["cpu_rate"], "steal": m["steal"]})
            if m["training_rate"] is not None:
                training_windows.append({**window, "condition": condition + "_training", "rate": m["training_rate"]})
        finally:
            if client is not None:
                client.__exit__(None, None, None)
        if client is not None:
            t = totals[condition]
            t["frames_sent"] += web.frames_sent - sent
            t["frames_received"] += client.frames
            t["mbytes"] += client.bytes_received / 2**20
            t["page_share"].append(m["share"])

    try:
        for r in range(args.rounds):
            for condition in conditions:
                bare(first=not windows)
                served(condition)
        bare(first=False)
        result["refused_messages"] = web.refused
    finally:
        web.close()
    ratios = interleaved_ratios(windows)
    # Per CPU second of this process: the host's own speed changes move the wall rates of the bare loop by
    # 10-70% between windows; time stolen by other guests does not count here (a slower clock still does).
    cpu_windows = [{**w, "rate": w["cpu_rate"]} for w in windows if w.get("cpu_rate")]
    cpu_ratios = interleaved_ratios(cpu_windows) if any(w["condition"] == "no_viewer" for w in cpu_windows) else {}
    steal = [w["steal"] for w in windows if w.get("steal") is not None]
    result["steal_share_max"] = round(max(steal), 4) if steal else None
    bare_windows = [w for w in windows if w["condition"] == "no_viewer"]
    training_ratios = interleaved_ratios(bare_windows + training_windows) if training_windows else {}
    bare_rates = [w["rate"] for w in windows if w["condition"] == "no_viewer"]
    result["no_viewer"] = sum(bare_rates) / len(bare_rates)
    result["no_viewer_windows"] = [round(v, 2) for v in bare_rates]
    result["baseline_drift"] = round(bare_rates[-1] / bare_rates[0] - 1.0, 3)
    for condition in conditions:
        rates = [w["rate"] for w in windows if w["condition"] == condition]
        result[condition] = round(sum(rates) / len(rates), 2)
        _put_ratios(result, condition, ratios[condition])
        if condition in cpu_ratios:
            _put_ratios(result, f"{condition}_cpu", cpu_ratios[condition])
    for condition, t in totals.items():
        result[f"{condition}_frames_sent"] = t["frames_sent"]
        result[f"{condition}_frames_received"] = t["frames_received"]
        result[f"{condition}_mbytes"] = round(t["mbytes"], 2)
        # What the viewer itself booked as the page's time: if the throughput lost is larger, the difference is
        # work its ledger does not see (another thread, the device's queue).
        result[f"{condition}_page_share"] = round(sum(t["page_share"]) / len(t["page_share"]), 3)
        # Steps per second of the time the ledger booked as training, against the bare loop: below 1, the steps
        # themselves ran slower with a client (contention the ledger cannot see).
        if condition + "_training" in training_ratios:
            _put_ratios(result, f"{condition}_training_only", training_ratios[condition + "_training"])
    result["no_viewer"] = round(result["no_viewer"], 2)
    return result


def _put_ratios(result: dict, name: str, entry: dict) -> None:
    """One `interleaved_ratios` entry into the result: `{name}_vs_no_viewer` (the mean),
    `{name}_median_vs_no_viewer` and `{name}_ratios` (every window's)."""
    result[f"{name}_vs_no_viewer"] = round(entry["ratio"], 3)
    result[f"{name}_median_vs_no_viewer"] = round(entry["median"], 3)
    result[f"{name}_ratios"] = [round(v, 3) for v in entry["ratios"]]


def print_results(results: dict) -> None:
    """The table: one row per task and condition, steps/s and the ratio to the bare loop's windows beside it."""
    from benchmarks.common import print_table

    def row(name: str, r: dict, c: str) -> dict:
        bare = c == "no_viewer"  # the baseline: 1 by definition
        return {"task": name, "condition": c, "steps_per_s": r[c],
                "vs_no_viewer": r.get(f"{c}_vs_no_viewer", 1.0), "median": r.get(f"{c}_median_vs_no_viewer", 1.0),
                "cpu": 1.0 if bare else r.get(f"{c}_cpu_vs_no_viewer"),
                "cpu_median": 1.0 if bare else r.get(f"{c}_cpu_median_vs_no_viewer"),
                "windows": "-" if bare else str(len(r.get(f"{c}_ratios", [])))}

    rows = [row(name, r, c) for name, r in results.items() for c in CONDITIONS if c in r]
    print_table(rows, [("task", "task", "s"), ("condition", "condition", "s"), ("steps_per_s", "steps/s", ".1f"),
                       ("vs_no_viewer", "x no viewer (mean)", ".3f"), ("median", "median", ".3f"),
                       ("cpu", "per CPU s (mean)", ".3f"), ("cpu_median", "median", ".3f"),
                       ("windows", "windows", "s")])
    for name, r in results.items():
        print(f"{name}: bare loop {', '.join(f'{v:.1f}' for v in r['no_viewer_windows'])} steps/s in its windows "
              f"(drift first to last {100 * r['baseline_drift']:+.1f}%); each condition against the bare windows "
              f"beside it; stolen share of the machine's CPU at most {r.get('steal_share_max')}")
        for c in CONDITIONS[2:]:
            if f"{c}_page_share" not in r:
                continue
            training = r.get(f"{c}_training_only_vs_no_viewer")
            print(f"  {c}: page share by the viewer's ledger {r[f'{c}_page_share']:.3f}; steps/s of its booked "
                  f"training time x no viewer {'-' if training is None else format(training, '.3f')}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="image",
                   help="comma list of tasks, measured one after the other: " + ", ".join(TASKS))
    p.add_argument("--config", default=CONFIG, help="image: the network config")
    p.add_argument("--size", type=int, default=None, help="image: side of the image in pixels (256)")
    p.add_argument("--tiles", type=int, default=1, help="image: tiles per side, one network each")
    p.add_argument("--batch", type=int, default=None, help="image: samples per step (2^18)")
    p.add_argument("--demo-args", default="", help="kilonerf, octree: options for the demo (its sizes: --res, "
                   "--samples, --grid, --batch, ...), quoted as one string")
    p.add_argument("--phase", default="finetune", choices=["teacher", "distill", "finetune"],
                   help="kilonerf: the phase measured")
    p.add_argument("--prep-steps", type=int, default=None,
                   help="kilonerf: steps of each phase before the measured one (500)")
    p.add_argument("--seconds", type=float, default=None, help="measured time per window (3)")
    p.add_argument("--warmup", type=float, default=None,
                   help="unmeasured time at the start of each viewer window (the client connects, first renders; 1.5)")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds of alternating windows, each condition once a round beside bare-loop windows (2)")
    p.add_argument("--conditions", default=",".join(CONDITIONS[1:]),
                   help="comma list of the conditions measured each round beside bare-loop windows: "
                        + ", ".join(CONDITIONS[1:]))
    p.add_argument("--width", type=int, default=None, help="the client's viewport (1280 x 720)")
    p.add_argument("--height", type=int, default=None)
    p.add_argument("--port", type=int, default=0, help="0: any free port")
    p.add_argument("--view-share", type=float, default=None,
                   help="the page's share of the wall time while a client is connected (the viewer's default)")
    p.add_argument("--out", default="out/web_viewer_cost", help="the viewer's and demos' output folder")
    p.add_argument("--quick", action="store_true", help="toy sizes and half-second conditions: checks the tool")
    p.add_argument("--json", default=None, help="write {'tasks': {task: result}} here")
    p.add_argument("--arch", default=None)
    args = p.parse_args(argv)
    tasks = [t.strip() for t in args.task.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        p.error(f"--task {args.task!r}: allowed: a comma list of {', '.join(TASKS)}")
    args.tasks = tasks
    args.conditions = [c.strip() for c in args.conditions.split(",") if c.strip()]
    if not args.conditions or any(c not in CONDITIONS[1:] for c in args.conditions) \
            or len(set(args.conditions)) != len(args.conditions):
        p.error(f"--conditions {','.join(args.conditions)!r}: allowed: a comma list of distinct "
                + ", ".join(CONDITIONS[1:]))
    defaults = {"batch": 1 << 18, "size": 256, "seconds": 3.0, "warmup": 1.5, "width": 1280, "height": 720,
                "prep_steps": 500, "rounds": 2}
    for key, value in (QUICK if args.quick else defaults).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.prep_steps < 0:
        p.error(f"--prep-steps must be >= 0, got {args.prep_steps}")
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    arch = tinn.init(args.arch)
    import torch

    results = {}
    for name in args.tasks:
        threads = torch.get_num_threads()
        if arch == "cpu" and name != "image":
            # As the scene demos run on a CPU: Taichi's kernels bring their own threads (see demos/kilonerf.py).
            torch.set_num_threads(1)
        try:
            results[name] = measure(build_task(name, args, arch), args, arch)
        finally:
            torch.set_num_threads(threads)
        print(json.dumps(results[name], indent=1))
    print()
    print_results(results)
    out = {"arch": arch, "tasks": results}
    write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
