"""tcnn's Adam as one Triton launch on CUDA: the same elementwise update as `optimizers.adam_step` /
`adam_step_pair` (Taichi), for one or two tables a launch. Imported only where Triton runs (CUDA, or its CPU
interpreter in tests).

Why a second copy of the update: Adam runs once per training step on every model, and Taichi's launch path costs
the host time for every tensor and scalar argument (it fills and copies an argument buffer and queries each
pointer), which with the pair's twenty tensors made it a step's costliest launch; a Triton launch of the same
arguments costs a fraction of that (measured in docs/design-notes.md, "A step's bookkeeping as Triton launches").
Taichi's kernels stay the CPU's and the reference the tests compare this one with.

Semantics, per element i of a table viewed flat in rows of `cols` (row = i // cols):
- nothing changes where `skip[0]` is set (a gradient scaler's overflow verdict), nor, with `skip_zero`, where the
  gradient is exactly zero (hash-grid entries no sample touched);
- the bias correction's step count is `step_now - pending[0]` for a table counted as a whole (`step_now` > 0),
  else the element's own count `steps[i] + 1`, stored back; the correction at that count is read from the
  optimizer's table (`Adam._correction_table`: float64 values rounded once, as Taichi's kernels read them), not
  computed per element: two float64 powers an element made the update bound by float64 arithmetic rather than
  by memory;
- the rate is `lr * lr_factor[0] * lr_scale[row]` times the correction, then tcnn's update (L2 term, gradient
  clipping, moments, AdaBound clamp, decoupled decays, weight clipping), as `optimizers.adam_update_corrected`.
"""
from __future__ import annotations

import triton
import triton.language as tl

BLOCK = 1024  # elements a program updates


@triton.jit
def _table(pid, w_ptr, g_ptr, m_ptr, v_ptr, steps_ptr, lr_scale_ptr, pending_ptr, skip_ptr, lr_factor_ptr, n, cols,
           lr, l2_reg, skip_zero, step_now, corrections_ptr, n_corrections, beta1, beta2, epsilon, rel_decay,
           abs_decay, clip, grad_clip, lower, upper, BLOCK: tl.constexpr):
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    grad = tl.load(g_ptr + offs, mask=inside, other=0.0)
    # Masks and clamps are built from blocks, not from comparisons of the scalar arguments alone: Triton's CPU
    # interpreter keeps those as Python booleans, and newer versions then widen a mask combined with one to int64.
    zeros = tl.zeros_like(offs)
    no_value = zeros.to(tl.float32)  # a float block of zeros (not grad * 0: that is NaN where grad is not finite)
    active = inside & (tl.load(skip_ptr) + zeros == 0) & ((grad != 0.0) | (zeros + skip_zero == 0))
    own = active & (zeros + step_now == 0)  # the elements that count their own steps
    # Tables are launched in chunks of fewer than 2^31 elements (tinn/chunks.py): the row fits 32 bits.
    scale = tl.load(lr_scale_ptr + offs.to(tl.int32) // cols, mask=active, other=0.0)
    t = tl.load(steps_ptr + offs, mask=own, other=0) + 1
    tl.store(steps_ptr + offs, t, mask=own)
    # One count for the table (step_now > 0, its skipped steps pending) or the element's own; a count past the
    # table's end takes its last entry, as Taichi's kernels do.
    count = tl.where(zeros + step_now == 0, t, zeros + step_now - tl.load(pending_ptr))
    count = tl.minimum(tl.maximum(count, 0), n_corrections - 1)
    correction = tl.load(corrections_ptr + count, mask=active, other=0.0)
    rate = lr * tl.load(lr_factor_ptr) * scale * correction
    w = tl.load(w_ptr + offs, mask=active, other=0.0)
    m = tl.load(m_ptr + offs, mask=active, other=0.0)
    v = tl.load(v_ptr + offs, mask=active, other=0.0)
    grad = grad + l2_reg * w
    # tcnn clips after the L2 term, before the moments (0: off)
    clipped = tl.where(grad >= 0.0, tl.minimum(grad, grad_clip), tl.maximum(grad, -grad_clip))
    grad = tl.where(no_value + grad_clip != 0.0, clipped, grad)
    m = beta1 * m + (1.0 - beta1) * grad
    v = beta2 * v + (1.0 - beta2) * grad * grad
    step = tl.minimum(tl.maximum(rate / (tl.sqrt(v) + epsilon), lower), upper)  # AdaBound clamp (no-op by default)
    decay = rel_decay * rate
    shrink = abs_decay * rate
    w = (1.0 - decay) * w - tl.where(w >= 0.0, shrink, -shrink) - step * m
    w = tl.where(no_value + clip != 0.0, tl.minimum(tl.maximum(w, -clip), clip), w)
    tl.store(m_ptr + offs, m, mask=active)
    tl.store(v_ptr + offs, v, mask=active)
    tl.store(w_ptr + offs, w, mask=active)


@triton.jit(do_not_specialize=["n", "cols", "skip_zero", "step_now", "n2", "cols2", "skip_zero2", "step_now2",
                               "programs", "n_corrections"])
def adam_kernel(w_ptr, g_ptr, m_ptr, v_ptr, steps_ptr, lr_scale_ptr, pending_ptr, skip_ptr, lr_factor_ptr, n, cols,
                lr, l2_reg, skip_zero, step_now,
                w2_ptr, g2_ptr, m2_ptr, v2_ptr, steps2_ptr, lr_scale2_ptr, pending2_ptr, skip2_ptr, lr_factor2_ptr, n2,
                cols2, lr2, l2_reg2, skip_zero2, step_now2,
                programs, corrections_ptr, n_corrections, beta1, beta2, epsilon, rel_decay, abs_decay, clip,
                grad_clip, lower, upper, BLOCK: tl.constexpr):
    """Programs [0, programs) update the first table, the rest the second (absent where n2 == 0)."""
    pid = tl.program_id(0)
    if pid < programs:
        _table(pid, w_ptr, g_ptr, m_ptr, v_ptr, steps_ptr, lr_scale_ptr, pending_ptr, skip_ptr, lr_factor_ptr, n,
               cols, lr, l2_reg, skip_zero, step_now, corrections_ptr, n_corrections, beta1, beta2, epsilon, rel_decay,
               abs_decay, clip, grad_clip, lower, upper, BLOCK)
    else:
        _table(pid - programs, w2_ptr, g2_ptr, m2_ptr, v2_ptr, steps2_ptr, lr_scale2_ptr, pending2_ptr, skip2_ptr,
               lr_factor2_ptr, n2, cols2, lr2, l2_reg2, skip_zero2, step_now2, corrections_ptr, n_corrections, beta1,
               beta2, epsilon, rel_decay, abs_decay, clip, grad_clip, lower, upper, BLOCK)


def _table_arguments(table) -> tuple:
    """One table's kernel arguments from the Taichi kernels' order (w, g, m, v, steps, lr_scale, cols, lr, l2_reg,
    skip_zero, step_now, pending, skip, lr_factor)."""
    w, g, m, v, steps, lr_scale, cols, lr, l2_reg, skip_zero, step_now, pending, skip, lr_factor = table
    return (w, g, m, v, steps, lr_scale, pending, skip, lr_factor, w.numel(), int(cols), float(lr), float(l2_reg),
            int(skip_zero), int(step_now))


def adam_step(tables, hyper) -> None:
    """Adam on one or two tables in one launch. `tables`: each table's arguments as `optimizers.adam_step` takes
    them up to `lr_factor`; `hyper`: (the bias corrections by step count, beta1, beta2, epsilon, rel_decay, abs_decay,
    clip, grad_clip, lower, upper), as Taichi's kernels take them."""
    if not 1 <= len(tables) <= 2:
        raise ValueError(f"adam_step takes one or two tables a launch, got {len(tables)}")
    first = _table_arguments(tables[0])
    second = _table_arguments(tables[1]) if len(tables) == 2 else first[:9] + (0,) + first[10:]
    programs = triton.cdiv(first[9], BLOCK)
    total = programs + triton.cdiv(second[9], BLOCK)
    if total == 0:
        return
    corrections, *scalars = hyper
    adam_kernel[(total,)](*first, *second, programs, corrections, corrections.shape[0], *(float(h) for h in scalars),
                          BLOCK=BLOCK)
