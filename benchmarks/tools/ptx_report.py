"""Compile the fused kernels once with PTX printing on, then ask ptxas (from triton) for registers and spills,
and, where cuobjdump is installed, print the instruction mix of every loop of their machine code
(`sass_loops.py`: FFMA share, loads, address arithmetic per iteration).

KEEP_PTX=1 leaves the fused kernels' PTX modules (modN.ptx) and their SASS (modN.sass) in the output folder."""
import glob
import os
import re
import shutil
import subprocess
import sys

import torch

from benchmarks.tools import sass_loops  # noqa: E402

out_dir = sys.argv[1]
width = int(sys.argv[2]) if len(sys.argv) > 2 else 64
log = os.path.join(out_dir, f"ptx_w{width}.txt")
fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
saved = os.dup(1)
os.dup2(fd, 1)
import tinn  # noqa: E402
os.chdir(out_dir)  # PTX files land in the working directory
tinn.init(arch="cuda", print_kernel_asm=True, offline_cache=False)
from tinn.networks import NetworkArray  # noqa: E402
net = NetworkArray(32, 16, {"n_neurons": width, "n_hidden_layers": 2}, n_networks=64)
x = torch.rand(4096, 32, device="cuda", requires_grad=True)
ids = torch.randint(0, 64, (4096,), device="cuda", dtype=torch.int32)
net(x, ids).sum().backward()
torch.cuda.synchronize()
sys.stdout.flush()
os.dup2(saved, 1)
text = open(log, errors="replace").read() + "".join(
    open(f, errors="replace").read() for f in sorted(glob.glob(os.path.join(out_dir, "*.ptx"))))
for f in glob.glob(os.path.join(out_dir, "*.ptx")):
    os.remove(f)
ptxas = (glob.glob("/opt/torch/.venv/lib/python3*/site-packages/triton/backends/nvidia/bin/ptxas")
         + glob.glob("/usr/local/cuda*/bin/ptxas"))
print("ptxas:", ptxas[:1], "ptx chars:", len(text))
keep = os.environ.get("KEEP_PTX") == "1"
# Each module starts with a ".version" line; keep the ones holding the fused kernels.
mods = re.split(r"(?=^\.version)", text, flags=re.M)
for i, m in enumerate(mods):
    names = re.findall(r"\.entry\s+(\w+)", m)
    if not any(n.startswith(("forward", "backward")) for n in names) or not ptxas:
        continue
    path = os.path.join(out_dir, f"mod{i}.ptx")
    open(path, "w").write(m[: m.rfind("}") + 1] + "\n")
    cubin = path[:-4] + ".cubin"
    r = subprocess.run([ptxas[0], "-v", "-arch=sm_90", path, "-o", cubin], capture_output=True, text=True)
    for line in (r.stdout + r.stderr).splitlines():
        if any(k in line for k in ("Compiling entry", "registers", "spill", "error")):
            print(names, line.strip())
    cuobjdump = shutil.which("cuobjdump") or os.path.join(os.path.dirname(ptxas[0]), "cuobjdump")
    if os.path.exists(cubin) and os.path.exists(cuobjdump):
        sass = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True).stdout
        print(sass_loops.report(sass, ("forward", "backward")))
        if keep:
            open(path[:-4] + ".sass", "w").write(sass)
    for f in (cubin,) if keep else (cubin, path):
        if os.path.exists(f):
            os.remove(f)
