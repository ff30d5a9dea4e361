"""tcnn's random numbers inside kernels: a PCG32 generator (64-bit LCG state, XSH-RR output) seeded with a
fixed value, jumped ahead by a per-call distance and read once. tcnn draws its `Rng` grid hash and the corner
of a stochastic interpolation this way (`random_val(seed, idx)`, `rng_hash`).

The seeding is the same for every call of one seed, so the host computes the seeded state (`seeded_state`)
and kernels start from that constant; only the jump runs on the device (up to 64 doublings).
"""
from ..backend import ti

MULTIPLIER = 0x5851F42D4C957F2D
STREAM_INCREMENT = 3      # (stream 1 << 1) | 1: PCG32's default stream when only the state is seeded
MASK64 = (1 << 64) - 1
SEED = 1337               # tcnn's seed for the Rng hash and the stochastic interpolation


def _step(state: int) -> int:
    return (state * MULTIPLIER + STREAM_INCREMENT) & MASK64


def seeded_state(seed: int) -> int:
    """The state after PCG32's seeding routine: one step from 0, add the seed, one more step."""
    return _step((_step(0) + seed) & MASK64)


SEEDED_STATE = seeded_state(SEED)
# As a signed 64-bit integer: Taichi takes Python literals through int64.
_SEEDED_BITS = SEEDED_STATE - (1 << 64) if SEEDED_STATE >= 1 << 63 else SEEDED_STATE


@ti.func
def _advance(state, delta):
    """`state` jumped `delta` steps ahead (u64 arithmetic, wrapping), by repeated doubling of the LCG step."""
    cur_mult = ti.u64(MULTIPLIER)
    cur_plus = ti.u64(STREAM_INCREMENT)
    acc_mult = ti.u64(1)
    acc_plus = ti.u64(0)
    d = delta
    while d > ti.u64(0):
        if d & ti.u64(1):
            acc_mult *= cur_mult
            acc_plus = acc_plus * cur_mult + cur_plus
        cur_plus = (cur_mult + ti.u64(1)) * cur_plus
        cur_mult *= cur_mult
        d >>= ti.u64(1)
    return acc_mult * state + acc_plus


@ti.func
def _output(state):
    """XSH-RR: the 32-bit output of the step that leaves `state`."""
    xorshifted = ti.cast(((state >> ti.u64(18)) ^ state) >> ti.u64(27), ti.u32)
    rot = ti.cast(state >> ti.u64(59), ti.u32)
    return (xorshifted >> rot) | (xorshifted << ((~rot + ti.u32(1)) & ti.u32(31)))


@ti.func
def uint_after(delta):
    """The next 32-bit number of tcnn's seed-1337 generator jumped `delta` (u64) steps ahead."""
    return _output(_advance(ti.cast(ti.i64(_SEEDED_BITS), ti.u64), delta))


@ti.func
def float_after(delta):
    """That number as tcnn's `next_float`: its top 23 bits as the mantissa of a float in [0, 1)."""
    bits = (uint_after(delta) >> ti.u32(9)) | ti.u32(0x3F800000)
    return ti.bit_cast(bits, ti.f32) - 1.0
