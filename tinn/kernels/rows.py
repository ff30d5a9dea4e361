"""Row views shared by the kernels of every part: whether a network's row lies in a launch's chunk.

Its own module so that the MLP, grid and deterministic-reduction kernels can all use it without
importing one another (tinn.chunks splits a table into row spans; a launch sees one span).
No `from __future__ import annotations` here: Taichi reads the annotations as objects."""
from ..backend import ti


@ti.func
def in_chunk(net, table: ti.template()):
    """Whether row `net` (already shifted by the chunk's first row) lies in this launch's chunk view."""
    return net >= 0 and net < table.shape[0]
