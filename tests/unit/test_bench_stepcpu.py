"""The pure parts of ``stalwart.bench.stepcpu``: /proc parsing and per-step arithmetic."""

import os

from stalwart.bench import stepcpu


def test_cpu_seconds_reads_user_and_system_after_the_command_name():
    ticks = os.sysconf("SC_CLK_TCK")
    # a command name with spaces and a ")" inside, as /proc writes it
    fields = ["S", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", str(3 * ticks), str(ticks)]
    line = "4242 (py (worker) 1) " + " ".join(fields) + " 0 0 20 0"
    assert stepcpu.cpu_seconds(line) == 4.0


def test_cpu_seconds_of_this_process_grows():
    with open(f"/proc/{os.getpid()}/stat") as f:
        first = stepcpu.cpu_seconds(f.read())
    sum(i * i for i in range(2_000_000))
    with open(f"/proc/{os.getpid()}/stat") as f:
        assert stepcpu.cpu_seconds(f.read()) > first


def test_per_step_divides_and_skips_members_that_went_away():
    before = {"ps-0a": (1.0, {"Push": 10.0}), "trainer-0": (2.0, {}), "gone": (1.0, {})}
    after = {"ps-0a": (1.5, {"Push": 310.0, "Pull": 300.0}), "trainer-0": (2.2, {}),
             "gone": (None, {})}  # fmt: skip
    out = stepcpu.per_step(before, after, 100)
    assert out == {
        "ps-0a": {"cpu_ms": 5.0, "calls": {"Pull": 3.0, "Push": 3.0}},
        "trainer-0": {"cpu_ms": 2.0, "calls": {}},
    }
