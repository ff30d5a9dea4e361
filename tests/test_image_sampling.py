"""The image task's one-launch batch sampler: targets and routing match the torch reference
(`ImageTask.lookup` / `route`) at the kernel's own xy, the xy follow the documented hash bit for bit,
batches are reproducible per seed and differ per step, the xy are uniform, and size 0 works."""
import numpy as np
import pytest
import torch

from tinn.kernels import image_sampling
from tinn.tasks.image import ImageTask, default_image


def random_image(height, width, seed=0):
    return np.random.default_rng(seed).random((height, width, 3), dtype=np.float32)


def pcg_hash(v):
    """numpy twin of the kernel's hash (uint32 arithmetic wraps)."""
    v = np.atleast_1d(np.asarray(v, dtype=np.uint32))
    with np.errstate(over="ignore"):
        state = v * np.uint32(747796405) + np.uint32(2891336453)
        word = ((state >> ((state >> np.uint32(28)) + np.uint32(4))) ^ state) * np.uint32(277803737)
    return (word >> np.uint32(22)) ^ word


def reference_xy(seed, step, size):
    """The documented stream: 24 high bits of hash(hash(hash(seed) ^ step) ^ hash(2i + component)) / 2^24."""
    key = pcg_hash(pcg_hash(np.uint32(seed)) ^ np.uint32(step))
    counter = np.arange(2 * size, dtype=np.uint32)
    bits = pcg_hash(key ^ pcg_hash(counter)) >> np.uint32(8)
    return (bits.astype(np.float32) * np.float32(2.0 ** -24)).reshape(size, 2)


@pytest.mark.parametrize("height,width,tiles", [(32, 32, 1), (32, 32, 4), (24, 40, 4), (20, 1, 1), (20, 1, 3),
                                                (1, 9, 2)], ids=["square-t1", "square-t4", "non-square-t4",
                                                                 "one-wide-t1", "one-wide-t3", "one-high-t2"])
def test_batch_matches_torch_lookup_and_route(height, width, tiles):
    task = ImageTask(random_image(height, width), tiles=tiles, seed=3)
    for step in range(2):
        local, targets, ids, xy = task.batch(4096, return_xy=True)
        assert local.shape == xy.shape == (4096, 2) and targets.shape == (4096, 3) and ids.shape == (4096,)
        assert local.dtype == targets.dtype == xy.dtype == torch.float32 and ids.dtype == torch.int32
        assert local.device == targets.device == ids.device == xy.device == task.device
        # The xy are the documented hash stream, bit for bit (what makes CPU and CUDA agree).
        assert np.array_equal(xy.cpu().numpy(), reference_xy(3, step, 4096))
        ref_local, ref_ids = task.route(xy)
        torch.testing.assert_close(local, ref_local, atol=1e-6, rtol=0)
        assert torch.equal(ids, ref_ids)
        torch.testing.assert_close(targets, task.lookup(xy), atol=1e-6, rtol=0)
        assert ids.min() >= 0 and ids.max() < tiles * tiles
        assert local.min() >= 0 and local.max() < 1


def test_batch_without_xy_equals_batch_with_xy():
    a = ImageTask(random_image(16, 16), tiles=2, seed=11)
    b = ImageTask(random_image(16, 16), tiles=2, seed=11)
    for _ in range(3):
        plain = a.batch(1000)
        with_xy = b.batch(1000, return_xy=True)
        assert len(plain) == 3
        for p, q in zip(plain, with_xy[:3]):
            assert torch.equal(p, q)


def test_batches_differ_per_step_and_repeat_per_seed():
    image = default_image(32)
    first = ImageTask(image, tiles=4, seed=5)
    runs = [first.batch(2048) for _ in range(3)]
    for earlier, later in zip(runs, runs[1:]):
        assert not torch.equal(earlier[0], later[0]) and not torch.equal(earlier[1], later[1])
    again = ImageTask(image, tiles=4, seed=5)
    for ref in runs:
        for r, o in zip(ref, again.batch(2048)):
            assert torch.equal(r, o)  # bit-exact
    other = ImageTask(image, tiles=4, seed=6).batch(2048)
    assert not torch.equal(runs[0][0], other[0]) and not torch.equal(runs[0][1], other[1])
    # Outputs are fresh tensors: a kept batch is not overwritten by the next one.
    kept = [t.clone() for t in runs[2]]
    first.batch(2048)
    for k, r in zip(kept, runs[2]):
        assert torch.equal(k, r)


def test_large_and_negative_seeds_are_accepted_and_distinct():
    image = random_image(8, 8)
    seeds = [0, 1, -1, 2 ** 32, 2 ** 40 + 7, 2 ** 63 - 1]
    firsts = [ImageTask(image, seed=s).batch(64, return_xy=True)[3] for s in seeds]
    for i in range(len(firsts)):
        for j in range(i + 1, len(firsts)):
            assert not torch.equal(firsts[i], firsts[j]), (seeds[i], seeds[j])


def test_xy_are_uniform():
    task = ImageTask(random_image(32, 32), tiles=4, seed=1)
    n = 1 << 16
    _, _, ids, xy = task.batch(n, return_xy=True)
    xy = xy.double().cpu()
    assert xy.min() >= 0.0 and xy.max() < 1.0
    assert (xy.mean(0) - 0.5).abs().max() < 0.01, xy.mean(0)
    counts = torch.bincount(ids.long().cpu(), minlength=16)
    assert counts.numel() == 16
    share = n / 16
    assert ((counts.double() - share).abs() <= 0.15 * share).all(), counts
    # Neither component is stuck: the two coordinates are not (close to) equal, and not correlated.
    corr = torch.corrcoef(xy.T)[0, 1]
    assert abs(float(corr)) < 0.02


def test_batch_size_zero(monkeypatch):
    task = ImageTask(random_image(8, 8), tiles=2, seed=0)

    def no_launch(*args):
        raise AssertionError("size 0 must not launch")

    monkeypatch.setattr(image_sampling, "sample_image_batch", no_launch)
    local, targets, ids, xy = task.batch(0, return_xy=True)
    assert local.shape == (0, 2) and targets.shape == (0, 3) and ids.shape == (0,) and xy.shape == (0, 2)
    assert ids.dtype == torch.int32 and targets.dtype == torch.float32
    monkeypatch.undo()
    local, targets, ids = task.batch(16)
    assert local.shape == (16, 2)


@pytest.mark.parametrize("height,width,tiles", [(32, 32, 1), (24, 40, 4), (20, 1, 3), (1, 9, 2)],
                         ids=["square-t1", "non-square-t4", "one-wide-t3", "one-high-t2"])
def test_the_triton_sampler_draws_the_taichi_samplers_batches(height, width, tiles, tuned):
    """The Triton launch that draws batches on CUDA (here under Triton's interpreter) against the Taichi kernel:
    the same xy, local coordinates and tile ids bit for bit, the targets within float32 rounding, over two steps
    and a seed past 2^31."""
    from tinn.kernels import triton_available
    if not triton_available():
        pytest.skip("Triton is not installed")
    image = random_image(height, width, seed=5)
    batches = {}
    for triton in (False, True):
        tuned(triton_step_kernels=triton)
        task = ImageTask(image, tiles=tiles, seed=(1 << 31) + 7)
        batches[triton] = [task.batch(3000, return_xy=True) for _ in range(2)]
    for (local, targets, ids, xy), (t_local, t_targets, t_ids, t_xy) in zip(batches[False], batches[True]):
        assert torch.equal(xy, t_xy) and torch.equal(local, t_local) and torch.equal(ids, t_ids)
        torch.testing.assert_close(t_targets, targets, atol=1e-6, rtol=0)
    assert not torch.equal(batches[True][0][3], batches[True][1][3])
