"""One teacher, several KiloNeRF students: where the student's gap to the teacher comes from.

Trains the demo's teacher once (all of `demos/kilonerf.py`'s options apply), then distils and fine-tunes one
student per `--variants` entry against that same teacher and occupancy grid, and reports for each: held-out
PSNR, PSNR on training views (fit against generalisation), the squared error split between edge pixels
(a large colour gradient in the truth: silhouettes and facet borders) and flat ones, and the frame time.

    python -m benchmarks.tools.kilonerf_students --data /tmp/bunny --res 800 --samples 256 \
        --teacher-steps 6000 --batch-rays 8192 --distill-steps 5000 --finetune-steps 6000 \
        --variants f6w32h2,f8w32h2,f6w64h2 --json out.json

A variant is `f<frequencies>w<neurons>h<hidden layers>`, optionally `g<grid>` (default: --grid), then optional
fine-tuning settings `:key=value` (lr, final = the final learning-rate factor, rays, steps, and the Adam options
beta1, beta2, epsilon, l2_reg; the demo's settings where not given), e.g. `f6w32h2:final=0.1:rays=8192`. Variants of one architecture fine-tune
from the same distilled state (distilled once), so their rows differ by fine-tuning alone.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time

import torch


import tinn  # noqa: E402
from benchmarks.loading import load_file  # noqa: E402

demo = load_file("demos/kilonerf.py")

VARIANT = re.compile(r"^f(\d+)w(\d+)h(\d+)(?:g(\d+))?$")
FINETUNE_KEYS = {"lr": float, "final": float, "rays": int, "steps": int,
                 "beta1": float, "beta2": float, "epsilon": float, "l2_reg": float}


def parse_variant(text: str, default_grid: int) -> dict:
    arch, *settings = text.split(":")
    m = VARIANT.match(arch)
    if not m:
        raise SystemExit(f"variant {text!r}: expected f<frequencies>w<neurons>h<hidden layers>[g<grid>][:key=value...]")
    f, w, h, g = m.groups()
    finetune = {}
    for item in settings:
        key, _, value = item.partition("=")
        if key not in FINETUNE_KEYS or not value:
            raise SystemExit(f"variant {text!r}: fine-tuning setting {item!r} is not key=value with key one of "
                             f"{sorted(FINETUNE_KEYS)}")
        finetune[key] = FINETUNE_KEYS[key](value)
    return {"name": text, "arch": arch, "frequencies": int(f), "neurons": int(w), "hidden": int(h),
            "grid": int(g) if g else default_grid, "finetune": finetune}


def edge_mask(image: torch.Tensor, threshold: float = 0.1) -> torch.Tensor:
    """Pixels whose colour differs from a 4-neighbour by more than `threshold` (in any channel)."""
    d = torch.zeros(image.shape[:2], dtype=torch.bool, device=image.device)
    dx = (image[:, 1:] - image[:, :-1]).abs().amax(-1) > threshold
    dy = (image[1:] - image[:-1]).abs().amax(-1) > threshold
    d[:, 1:] |= dx
    d[:, :-1] |= dx
    d[1:] |= dy
    d[:-1] |= dy
    return d


def error_split(pipe, model, images, poses, occupancy="auto") -> dict:
    """Mean PSNR and the share of squared error on edge pixels, over the given views."""
    from tinn.tasks.image import psnr

    total_psnr, edge_se, flat_se, edge_px, flat_px = 0.0, 0.0, 0.0, 0, 0
    for image, c2w in zip(images, poses):
        out = pipe.render_pose(model, c2w, occupancy=occupancy, early_stop=0.0).rgb
        total_psnr += psnr(out, image)
        se = ((out - image) ** 2).mean(-1)
        mask = edge_mask(image)
        edge_se += float(se[mask].sum())
        flat_se += float(se[~mask].sum())
        edge_px += int(mask.sum())
        flat_px += int((~mask).sum())
    n = len(images)
    return {"psnr": total_psnr / n, "edge_pixel_share": edge_px / (edge_px + flat_px),
            "edge_error_share": edge_se / max(edge_se + flat_se, 1e-30),
            "edge_mse": edge_se / max(edge_px, 1), "flat_mse": flat_se / max(flat_px, 1)}


def save_maps(pipe, model, name: str, out_dir: str, occupancy="auto") -> None:
    """Held-out view 0 rendered, and its error (|difference| x 8, clamped) beside it."""
    from tinn.tasks.image import save_png

    out = pipe.render_view(model, 0, occupancy=occupancy, early_stop=0.0).rgb
    error = ((out - pipe.test.images[0]).abs() * 8.0).clamp(0.0, 1.0)
    save_png(os.path.join(out_dir, f"{name}.png"), torch.cat([out, error], 1))


@torch.no_grad()
def error_by_face_distance(student, teacher, occupancy, step_size: float, n_points: int = 1 << 20,
                           bins: int = 5) -> list:
    """Student-teacher alpha and colour RMS at occupied points, binned by the point's distance to its cell's
    nearest face (max |local coordinate|: 0 at the centre, 1 on a face)."""
    gen = torch.Generator(device=occupancy.occupied.device).manual_seed(7)
    points = occupancy.sample(n_points, gen)
    sigma_t, rgb_t = teacher(points)
    sigma, rgb = student(points)
    alpha_t = 1.0 - torch.exp(-sigma_t * step_size)
    alpha = 1.0 - torch.exp(-sigma * step_size)
    edge = student.cell_of(points).local.abs().amax(-1)
    rows = []
    for b in range(bins):
        sel = (edge >= b / bins) & (edge < (b + 1) / bins if b + 1 < bins else edge <= 1.0)
        w = alpha_t[sel, None].expand(-1, 3)
        rows.append({"from": b / bins, "to": (b + 1) / bins, "points": int(sel.sum()),
                     "alpha_rms": float(((alpha[sel] - alpha_t[sel]) ** 2).mean().sqrt()),
                     "rgb_rms": float(((w * (rgb[sel] - rgb_t[sel]) ** 2).sum() / w.sum().clamp_min(1e-12)).sqrt())})
    return rows


def main() -> None:
    argv = sys.argv[1:]
    variants, json_path = "f6w32h2", None
    if "--variants" in argv:
        i = argv.index("--variants")
        variants = argv[i + 1]
        del argv[i:i + 2]
    if "--json" in argv:
        i = argv.index("--json")
        json_path = argv[i + 1]
        del argv[i:i + 2]
    maps = None
    if "--maps" in argv:
        i = argv.index("--maps")
        maps = argv[i + 1]
        del argv[i:i + 2]
        os.makedirs(maps, exist_ok=True)
    args = demo.parse_args(argv)
    arch = demo.start_script(args)
    from tinn.scenes.fields.kilonerf import KiloNeRF
    from tinn.scenes.training import Distiller
    from tinn.render import seconds_per_frame

    train, test = demo.load_data(args)
    pipe = demo.KiloNeRFPipeline(args, train, test)
    pipe.run_phase()  # the teacher; its end builds the occupancy grid
    n_train = min(4, len(train))
    train_views = ([train.images[i] for i in range(n_train)], [train.c2w[i] for i in range(n_train)])
    test_views = ([test.images[i] for i in range(len(test))], [test.c2w[i] for i in range(len(test))])
    results = {"arch": arch, "scene": args.data, "res": args.res, "steps": dict(pipe.steps),
               "teacher": {"heldout": error_split(pipe, pipe.teacher, *test_views, occupancy=pipe.teacher_occupancy),
                           "train": error_split(pipe, pipe.teacher, *train_views, occupancy=pipe.teacher_occupancy),
                           "time_s": round(pipe.times["teacher"], 2)},
               "students": []}
    # The students render with the grid built from the teacher's density after training; the teacher with it:
    results["teacher"]["heldout_with_student_grid"] = error_split(pipe, pipe.teacher, *test_views,
                                                                  occupancy=pipe.occupancy)
    if maps:
        from tinn.tasks.image import save_png

        save_png(os.path.join(maps, "truth.png"), test.images[0])
        save_maps(pipe, pipe.teacher, "teacher", maps, occupancy=pipe.teacher_occupancy)
    print(f"teacher: held-out {results['teacher']['heldout']['psnr']:.2f} dB, "
          f"train views {results['teacher']['train']['psnr']:.2f} dB", flush=True)
    distilled = {}  # architecture -> (state_dict, distilled PSNR, seconds)
    for spec in (parse_variant(v, args.grid) for v in variants.split(",")):
        torch.manual_seed(args.seed)
        student = KiloNeRF(train.box_min, train.box_max, grid=spec["grid"], n_frequencies=spec["frequencies"],
                           n_neurons=spec["neurons"], n_hidden_layers=spec["hidden"], seed=args.seed + 2)
        student.occupancy = pipe.occupancy
        pipe.student = student
        if spec["arch"] not in distilled:
            distiller = Distiller(student, pipe.teacher_rendered, pipe.occupancy, pipe.render_step,
                                  batch=args.distill_batch, learning_rate=args.distill_lr,
                                  total_steps=args.distill_steps, seed=args.batch_seed)
            tinn.runtime.sync()
            t0 = time.perf_counter()
            for _ in range(args.distill_steps):
                distiller.step()
            tinn.runtime.sync()
            seconds = time.perf_counter() - t0
            distilled[spec["arch"]] = ({k: v.clone() for k, v in student.state_dict().items()},
                                       pipe.heldout_psnr(student), seconds)
        state, distilled_psnr, distill_s = distilled[spec["arch"]]
        student.load_state_dict(state)
        ft = spec["finetune"]
        steps = ft.get("steps", args.finetune_steps)
        adam = {k: ft[k] for k in ("beta1", "beta2", "epsilon", "l2_reg") if k in ft}
        tuner = pipe.finetuner(student, rays=ft.get("rays"), learning_rate=ft.get("lr"),
                               final_lr_factor=ft.get("final"), steps=steps, adam_options=adam)
        grid = student.occupancy
        tinn.runtime.sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            tuner.step()
        tinn.runtime.sync()
        finetune_s = time.perf_counter() - t0
        render_ms = 1e3 * seconds_per_frame(lambda: pipe.render_view(student), 10 if arch == "cuda" else 1)
        row = {**spec, "heldout": error_split(pipe, student, *test_views),
               "train": error_split(pipe, student, *train_views), "distilled_psnr": distilled_psnr,
               "time_s": {"distill": round(distill_s, 2), "finetune": round(finetune_s, 2)},
               "render_ms": round(render_ms, 2), "param_bytes": student.networks.memory_bytes(),
               "occupied_fraction": float(grid.occupied.float().mean()),
               "heldout_with_teacher_grid": error_split(pipe, student, *test_views, occupancy=pipe.teacher_occupancy),
               "error_by_face_distance": error_by_face_distance(student, pipe.teacher, pipe.occupancy,
                                                                pipe.render_step)}
        if maps:
            save_maps(pipe, student, spec["name"].replace(":", "_"), maps)
        results["students"].append(row)
        print(f"{spec['name']}: held-out {row['heldout']['psnr']:.2f} dB, train {row['train']['psnr']:.2f} dB, "
              f"render {render_ms:.1f} ms", flush=True)
        if json_path:
            with open(json_path, "w") as f:
                json.dump(results, f, indent=1)
    t = results["teacher"]
    width = max([9] + [len(r["name"]) for r in results["students"]])
    print(f"\n{'model':{width}} | held-out dB | train dB | distilled dB | edge px % | edge err % (held-out) | "
          "distill s | finetune s | render ms")
    print(f"{'teacher':{width}} | {t['heldout']['psnr']:11.2f} | {t['train']['psnr']:8.2f} |            - | "
          f"{100 * t['heldout']['edge_pixel_share']:9.1f} | {100 * t['heldout']['edge_error_share']:21.1f} | "
          f"        - |          - |         -")
    for r in results["students"]:
        print(f"{r['name']:{width}} | {r['heldout']['psnr']:11.2f} | {r['train']['psnr']:8.2f} | "
              f"{r['distilled_psnr']:12.2f} | {100 * r['heldout']['edge_pixel_share']:9.1f} | "
              f"{100 * r['heldout']['edge_error_share']:21.1f} | {r['time_s']['distill']:9.1f} | "
              f"{r['time_s']['finetune']:10.1f} | {r['render_ms']:9.2f}")


if __name__ == "__main__":
    main()
