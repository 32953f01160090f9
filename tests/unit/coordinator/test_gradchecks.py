"""Duplicate-compute decisions: agreement, majority, outvoted holders, timeouts."""

from __future__ import annotations

import pytest

from services.coordinator.gradchecks import GradientChecks, Verdict

pytestmark = pytest.mark.timeout(30)
KEY = ("job", 5, 1)


def test_agreeing_fingerprints_confirm_the_push():
    g = GradientChecks()
    assert g.holder_report(KEY, "a", 111, ["s", "b"], 0.0).verdict is Verdict.WAIT
    assert g.asked_of("s") == [KEY] and g.asked_of("b") == []
    assert g.duplicate_report(KEY, "s", 111) == ()
    out = g.holder_report(KEY, "a", 111, ["s", "b"], 0.1)
    assert (out.verdict, out.quarantine) == (Verdict.PUSH, ())


def test_a_flipped_holder_is_outvoted_by_two_others_and_its_successor_is_held_to_them():
    g = GradientChecks()
    g.holder_report(KEY, "a", 999, ["s", "b"], 0.0)
    assert g.duplicate_report(KEY, "s", 111) == ()  # 999 vs 111: undecided
    out = g.holder_report(KEY, "a", 999, ["s", "b"], 0.1)
    assert out.verdict is Verdict.WAIT and g.asked_of("b") == [KEY]  # a third is asked
    assert g.duplicate_report(KEY, "b", 111) == ("a",)  # majority 111: a is the suspect
    assert g.holder_report(KEY, "a", 999, ["s", "b"], 0.2).verdict is Verdict.DROP
    # the standby that takes the slot computes it again and matches the majority
    assert g.holder_report(KEY, "s", 111, ["b"], 0.3).verdict is Verdict.PUSH


def test_an_outvoted_verifier_is_the_suspect_and_the_holder_pushes():
    g = GradientChecks()
    g.holder_report(KEY, "a", 111, ["s", "b"], 0.0)
    g.duplicate_report(KEY, "s", 222)
    g.holder_report(KEY, "a", 111, ["s", "b"], 0.1)
    assert g.duplicate_report(KEY, "b", 111) == ("s",)
    out = g.holder_report(KEY, "a", 111, ["s", "b"], 0.2)
    assert out.verdict is Verdict.PUSH and out.quarantine == ()  # reported once, above


def test_nobody_to_compare_with_pushes_unverified():
    out = GradientChecks().holder_report(KEY, "a", 111, [], 0.0)
    assert out.verdict is Verdict.PUSH and out.unverified


def test_two_disagreeing_nodes_and_no_third_start_over_without_pushing():
    g = GradientChecks()
    g.holder_report(KEY, "a", 999, ["s"], 0.0)
    g.duplicate_report(KEY, "s", 111)
    out = g.holder_report(KEY, "a", 999, ["s"], 0.1)
    assert out.verdict is Verdict.DROP and out.restarted and out.quarantine == ()
    assert g.checks == {}


def test_a_verifier_that_never_answers_is_replaced_then_everyone_is_asked_again():
    g = GradientChecks(verifier_timeout_s=1.0)
    g.holder_report(KEY, "a", 111, ["s", "b"], 0.0)
    assert g.holder_report(KEY, "a", 111, ["s", "b"], 0.5).verdict is Verdict.WAIT
    g.holder_report(KEY, "a", 111, ["s", "b"], 1.6)  # s timed out: b is asked
    assert g.asked_of("s") == [] and g.asked_of("b") == [KEY]
    assert g.duplicate_report(KEY, "s", 111) == ()  # too late: ignored
    out = g.holder_report(KEY, "a", 111, ["s", "b"], 3.0)  # b timed out too
    # a loaded machine is no reason to push unchecked: the candidates are asked again
    assert out.verdict is Verdict.WAIT and not out.unverified
    assert g.asked_of("s") == [KEY]
    assert g.duplicate_report(KEY, "s", 111) == ()
    assert g.holder_report(KEY, "a", 111, ["s", "b"], 3.5).verdict is Verdict.PUSH


def test_a_flipped_holder_whose_verifiers_are_slow_is_never_pushed():
    g = GradientChecks(verifier_timeout_s=1.0)
    for t in range(0, 60):  # verifiers on a starved machine: every answer comes too late
        out = g.holder_report(KEY, "a", 999, ["s", "b"], t * 0.6)
        assert out.verdict is Verdict.WAIT, f"{out} at {t * 0.6:.1f} s"
    assert g.duplicate_report(KEY, g.asked_of("s") and "s" or "b", 111) == ()
    g.holder_report(KEY, "a", 999, ["s", "b"], 40.0)
    other = "b" if g.asked_of("b") else "s"
    assert g.duplicate_report(KEY, other, 111) == ("a",)
    assert g.holder_report(KEY, "a", 999, ["s", "b"], 41.0).verdict is Verdict.DROP


def test_two_trainers_pushing_the_same_batch_settle_it_between_them():
    """A step some shard groups lag behind on is pushed for every slot by every trainer
    that holds its base (services/trainer/worker.py, _slots_to_push), so one batch can
    get two holders' reports: equal ones confirm each other, and of two that differ
    the one a third node agrees with is pushed, the other dropped."""
    g = GradientChecks()
    assert g.holder_report(KEY, "a", 111, ["s", "b"], 0.0).verdict is Verdict.WAIT
    out = g.holder_report(KEY, "b", 111, ["s", "a"], 0.0)
    assert (out.verdict, out.quarantine) == (Verdict.PUSH, ())
    assert g.holder_report(KEY, "a", 111, ["s", "b"], 0.1).verdict is Verdict.PUSH

    g = GradientChecks()
    g.holder_report(KEY, "a", 111, ["s", "b"], 0.0)
    assert g.holder_report(KEY, "b", 999, ["s", "a"], 0.0).verdict is Verdict.WAIT
    assert g.duplicate_report(KEY, "s", 111) == ("b",)
    assert g.holder_report(KEY, "b", 999, ["s", "a"], 0.1).verdict is Verdict.DROP
    assert g.holder_report(KEY, "a", 111, ["s", "b"], 0.1).verdict is Verdict.PUSH
