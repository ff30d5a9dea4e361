"""A benchmark tool run over two CPU ranks: torchrun on a free port, gloo, the tensor-core arrays under Triton's
interpreter (the tools' own tests)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_tool(module: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --nproc_per_node 2 -m module args...` from the repository root, finished."""
    env = dict(os.environ, TINN_ARCH="cpu", TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
           "-m", module, *args]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
