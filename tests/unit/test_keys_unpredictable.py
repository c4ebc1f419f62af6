"""Where the NIC's secrets come from (issue 9, part 3): initial PSNs and QP numbers are drawn from
the `secrets` module (the OS CSPRNG), not from `random`, whose state an application could seed or
reconstruct. (rkeys and MR addresses come from `secrets` in RxPath.reg_mr; the integration test
tests/integration/test_isolation.py checks their distribution on a live device.)"""

import random
import secrets

from metaroce.nic import device, rx
from metaroce.nic.device import Qp


def psns(n):
    return [Qp(1, None, 1, None, None, {}).sq_psn for _ in range(n)]


def test_initial_psns_come_from_secrets(monkeypatch):
    calls = []

    def fake(bits):
        calls.append(bits)
        return 0xABCDEF

    monkeypatch.setattr(device.secrets, "randbits", fake)
    assert psns(3) == [0xABCDEF] * 3 and calls == [24, 24, 24]


def test_seeding_random_does_not_reproduce_psns():
    random.seed(1234)
    first = psns(64)
    random.seed(1234)
    second = psns(64)
    assert first != second
    assert len(set(first + second)) >= 127            # 24-bit draws: a repeat is ~1 in 70,000


def test_psns_cover_24_bits_evenly():
    vals = psns(4000)
    assert all(0 <= v < 1 << 24 for v in vals)
    sd = (len(vals) / 4) ** 0.5
    for b in range(24):
        assert abs(sum(v >> b & 1 for v in vals) - len(vals) / 2) < 5 * sd, b
    assert len(set(vals)) >= len(vals) - 3             # birthday bound: ~0.5 expected repeats


def test_the_generators_are_the_secrets_module():
    assert device.secrets is secrets and rx.secrets is secrets
    src = open(rx.__file__).read()
    assert "rkey = secrets.randbits(32)" in src
    assert "secrets.randbits(47)" in src               # MR addresses
    assert "import random" not in src and "import random" not in open(device.__file__).read()
