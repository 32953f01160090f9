"""Push admission rules: one table of cases per mode, plain values in and out."""

from __future__ import annotations

import pytest

from services.paramserver.consistency import Mode, Rules, Verdict, judge_push, step_complete

SYNC = Rules(Mode.SYNC, num_slots=3)
ASYNC = Rules(Mode.ASYNC, num_slots=3)
SSP_WAIT = Rules(Mode.SSP, num_slots=3, staleness=2)
SSP_REFUSE = Rules(Mode.SSP, num_slots=3, staleness=2, refuse_when_stale=True)
SSP_ZERO = Rules(Mode.SSP, num_slots=2, staleness=0)

CRC, OTHER = 0xABCD, 0x1234

# (id, rules, version, clocks, step, slot, base_version, applied_crc, verdict)
CASES = [
    # sync: the step to push is the current version, computed from that version
    ("sync-accept", SYNC, 5, [5, 5, 5], 5, 1, 5, None, Verdict.ACCEPT),
    ("sync-accept-first", SYNC, 0, [0, 0, 0], 0, 0, 0, None, Verdict.ACCEPT),
    ("sync-duplicate", SYNC, 5, [5, 5, 5], 4, 1, 4, CRC, Verdict.DUPLICATE),
    ("sync-duplicate-old", SYNC, 5, [5, 5, 5], 0, 2, 0, CRC, Verdict.DUPLICATE),
    ("sync-duplicate-out-of-window", SYNC, 5, [5, 5, 5], 1, 0, 1, None, Verdict.DUPLICATE),
    ("sync-conflict", SYNC, 5, [5, 5, 5], 4, 1, 4, OTHER, Verdict.CONFLICT),
    ("sync-ahead", SYNC, 5, [5, 5, 5], 6, 1, 5, None, Verdict.AHEAD),
    ("sync-ahead-far", SYNC, 5, [5, 5, 5], 50, 0, 5, None, Verdict.AHEAD),
    ("sync-stale-base", SYNC, 5, [5, 5, 5], 5, 1, 4, None, Verdict.STALE_BASE),
    ("sync-future-base", SYNC, 5, [5, 5, 5], 5, 1, 6, None, Verdict.STALE_BASE),
    # async: each slot's own clock decides; base version does not matter
    ("async-accept", ASYNC, 9, [4, 2, 3], 2, 1, 0, None, Verdict.ACCEPT),
    ("async-accept-behind-version", ASYNC, 9, [4, 2, 3], 4, 0, 1, None, Verdict.ACCEPT),
    ("async-duplicate", ASYNC, 9, [4, 2, 3], 1, 1, 7, CRC, Verdict.DUPLICATE),
    ("async-duplicate-out-of-window", ASYNC, 9, [4, 2, 3], 0, 1, 0, None, Verdict.DUPLICATE),
    ("async-conflict", ASYNC, 9, [4, 2, 3], 1, 1, 7, OTHER, Verdict.CONFLICT),
    ("async-ahead", ASYNC, 9, [4, 2, 3], 3, 1, 9, None, Verdict.AHEAD),
    ("async-no-staleness-bound", ASYNC, 9, [40, 0, 3], 40, 0, 9, None, Verdict.ACCEPT),
    # ssp: like async, plus a bound on how far ahead of the slowest slot
    ("ssp-accept-at-bound", SSP_WAIT, 6, [2, 0, 1], 2, 0, 6, None, Verdict.ACCEPT),
    ("ssp-accept-slowest", SSP_WAIT, 6, [3, 0, 1], 0, 1, 0, None, Verdict.ACCEPT),
    ("ssp-wait", SSP_WAIT, 6, [3, 0, 1], 3, 0, 6, None, Verdict.WAIT),
    ("ssp-refuse", SSP_REFUSE, 6, [3, 0, 1], 3, 0, 6, None, Verdict.TOO_STALE),
    ("ssp-refuse-accept-at-bound", SSP_REFUSE, 6, [2, 0, 1], 2, 0, 6, None, Verdict.ACCEPT),
    ("ssp-duplicate-beats-staleness", SSP_REFUSE, 6, [9, 0, 1], 4, 0, 4, CRC, Verdict.DUPLICATE),
    ("ssp-conflict", SSP_WAIT, 6, [3, 0, 1], 2, 0, 2, OTHER, Verdict.CONFLICT),
    ("ssp-ahead-beats-staleness", SSP_REFUSE, 6, [3, 0, 1], 5, 0, 6, None, Verdict.AHEAD),
    ("ssp-zero-is-lockstep-accept", SSP_ZERO, 0, [0, 0], 0, 0, 0, None, Verdict.ACCEPT),
    ("ssp-zero-is-lockstep-wait", SSP_ZERO, 1, [1, 0], 1, 0, 1, None, Verdict.WAIT),
]


@pytest.mark.parametrize(
    "rules,version,clocks,step,slot,base,applied,verdict",
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_judge_push(rules, version, clocks, step, slot, base, applied, verdict):
    got = judge_push(rules, version, clocks, step, slot, base, CRC, applied)
    assert got is verdict


@pytest.mark.parametrize("rules", [SYNC, ASYNC, SSP_WAIT], ids=["sync", "async", "ssp"])
def test_duplicate_with_same_crc_is_never_a_conflict(rules):
    for step in range(3):
        assert judge_push(rules, 3, [3, 3, 3], step, 0, step, CRC, CRC) is Verdict.DUPLICATE
        assert judge_push(rules, 3, [3, 3, 3], step, 0, step, CRC, OTHER) is Verdict.CONFLICT


def test_judge_push_does_not_touch_clocks():
    clocks = [3, 0, 1]
    judge_push(SSP_WAIT, 6, clocks, 3, 0, 6, CRC, None)
    assert clocks == [3, 0, 1]


@pytest.mark.parametrize(
    "rules,pending,complete",
    [
        (SYNC, [], False),
        (SYNC, [0, 1], False),
        (SYNC, [0, 1, 1], False),
        (SYNC, [2, 0, 1], True),
        (SYNC, [0, 1, 2, 2], True),
        (Rules(Mode.SYNC, num_slots=1), [0], True),
        (ASYNC, [1], True),
        (ASYNC, [], True),
        (SSP_WAIT, [0], True),
    ],
    ids=[
        "sync-none",
        "sync-two-of-three",
        "sync-repeat-not-enough",
        "sync-all-any-order",
        "sync-all-with-repeat",
        "sync-one-slot",
        "async-each-push",
        "async-empty",
        "ssp-each-push",
    ],
)
def test_step_complete(rules, pending, complete):
    assert step_complete(rules, pending) is complete
