"""The pure parts of metaroce.collectives: segment/chunk planning, reductions per element type
(bfloat16 as raw bits, rounded as torch rounds), avg, bus bandwidth."""

import numpy as np
import pytest
from _deps import require
from hypothesis import given
from hypothesis import strategies as st

from metaroce.collectives import reduce as R


@given(st.integers(0, 5000), st.integers(1, 8), st.sampled_from([1, 2, 4, 8]),
       st.integers(1, 3000))
def test_segments_and_chunks_tile_the_buffer(count, parts, itemsize, chunk_bytes):
    segs = R.segments(count, parts, itemsize)
    assert len(segs) == parts
    pos = 0
    for s in segs:
        assert s.offset == pos and s.length % itemsize == 0
        pos += s.length
        cpos = s.offset
        for c in R.chunks(s, chunk_bytes, itemsize):
            assert c.offset == cpos and 0 < c.length <= max(chunk_bytes, itemsize)
            assert c.length % itemsize == 0
            cpos += c.length
        assert cpos == s.offset + s.length
    assert pos == count * itemsize
    sizes = [s.length for s in segs]
    assert max(sizes) - min(sizes) <= itemsize


def test_segments_rejects_zero_parts():
    with pytest.raises(R.CollectiveError):
        R.segments(10, 0, 4)


def test_bf16_round_trip_and_rounding_matches_round_to_nearest_even():
    x = np.array([1.0, -2.5, 3.140625, 1.00390625, 1.01171875, np.inf, -0.0], np.float32)
    b = R.f32_to_bf16(x)
    # 1.00390625 is halfway between 1.0 and 1.0078125: ties to even (1.0);
    # 1.01171875 is halfway between 1.0078125 and 1.015625: ties to even (1.015625)
    assert list(R.bf16_to_f32(b)) == [1.0, -2.5, 3.140625, 1.0, 1.015625, np.inf, -0.0]
    assert np.isnan(R.bf16_to_f32(R.f32_to_bf16(np.array([np.nan], np.float32))))[0]


def test_bf16_matches_torch():
    torch = require("torch", "the .[torch] extra (make setup installs it)")
    x = np.random.default_rng(1).normal(size=10000).astype(np.float32) * 1e3
    ours = R.f32_to_bf16(x)
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(ours, theirs)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "int64", "bfloat16"])
@pytest.mark.parametrize("op", ["sum", "min", "max", "prod"])
def test_reduce_into_matches_numpy(dtype, op):
    rng = np.random.default_rng(3)
    st_ = R.storage(dtype)
    if dtype == "bfloat16":
        a32, b32 = (rng.uniform(-8, 8, 999).astype(np.float32) for _ in range(2))
        a, b = R.f32_to_bf16(a32), R.f32_to_bf16(b32)
        fa, fb = R.bf16_to_f32(a), R.bf16_to_f32(b)
        want = R.f32_to_bf16({"sum": fa + fb, "min": np.minimum(fa, fb),
                              "max": np.maximum(fa, fb), "prod": fa * fb}[op])
    else:
        a = rng.integers(-100, 100, 999).astype(st_) if st_.kind == "i" else \
            rng.uniform(-8, 8, 999).astype(st_)
        b = rng.integers(-100, 100, 999).astype(st_) if st_.kind == "i" else \
            rng.uniform(-8, 8, 999).astype(st_)
        want = {"sum": a + b, "min": np.minimum(a, b), "max": np.maximum(a, b),
                "prod": a * b}[op]
    R.reduce_into(a, b, op, dtype)
    assert a.dtype == st_ and np.array_equal(a, want)


def test_avg_divides_by_world():
    f = np.array([3.0, 9.0], np.float32)
    R.finish(f, "avg", "float32", 3)
    assert list(f) == [1.0, 3.0]
    i = np.array([7, -7], np.int64)
    R.finish(i, "avg", "int64", 2)
    assert list(i) == [3, -4]          # floor division
    b = R.f32_to_bf16(np.array([6.0], np.float32))
    R.finish(b, "avg", "bfloat16", 4)
    assert R.bf16_to_f32(b)[0] == 1.5
    s = np.array([5.0], np.float32)
    R.finish(s, "sum", "float32", 4)
    assert s[0] == 5.0


def test_unknown_op_and_dtype_are_rejected():
    with pytest.raises(R.CollectiveError):
        R.check_op("xor")
    with pytest.raises(R.CollectiveError):
        R.storage("complex64")
    with pytest.raises(R.CollectiveError):
        R.dtype_name(np.complex64)


def test_volumes():
    assert R.ring_allreduce_bytes(1 << 20, 1) == 0
    assert R.ring_allreduce_bytes(1 << 20, 2) == 1 << 20
    assert R.ring_allreduce_bytes(3 << 20, 4) == (9 << 20) // 2
    assert R.bus_bandwidth(1000, 1.0, 2) == 1000.0
    assert R.bus_bandwidth(1000, 1.0, 4) == 1500.0
