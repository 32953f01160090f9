"""The report's rules on made-up event streams: detection, the fix, the resume."""

from __future__ import annotations

from stalwart.demo.timeline import Ev, Fault, audit_steps, health_drain, recover


def commits(first_seq: int, t: float, steps: range, job: str = "j") -> list[Ev]:
    return [
        Ev(first_seq + i, "STEP_COMMITTED", t + 0.01 * i, job, "", s, f"step {s} committed")
        for i, s in enumerate(steps)
    ]


def test_trainer_recovery_is_the_commit_of_the_step_the_standby_computed():
    events = commits(1, 9.0, range(1, 11))
    events += [
        Ev(20, "NODE_DEAD", 11.0, "", "trainer-1", 0, "trainer trainer-1 dead: lease expired"),
        # a step the dead trainer pushed before dying may still commit
        *commits(21, 11.05, range(11, 12)),
        Ev(22, "STANDBY_PROMOTED", 11.1, "j", "standby-0", 11, "standby-0 promoted at step 11"),
        *commits(23, 11.5, range(12, 14)),
    ]
    rec = recover(Fault("trainer", "trainer-1", 10.0, 10), events)
    assert rec.detection_s == 1.0
    assert rec.action.startswith("standby-0")
    assert rec.resumed_step == 12  # computed from version 11 by the standby
    assert abs(rec.recovery_s - 1.5) < 1e-9
    assert rec.steps_during == 1  # step 11


def test_a_slot_taken_beside_its_own_by_a_node_named_standby_is_the_fix():
    # both standbys already took drained trainers' slots: the dead one's slot goes to
    # standby-1 beside its own (elastic slots); its name is no "warm standby" place
    events = [
        Ev(20, "NODE_DEAD", 10.2, "", "trainer-1", 0, "trainer trainer-1 dead: port closed"),
        Ev(21, "SLOT_ASSIGNED", 10.2, "j", "standby-1", 51,
           "standby-1 computes, beside its own, slot 1 of j at step 51"),
        *commits(22, 10.4, range(52, 54)),
    ]  # fmt: skip
    rec = recover(Fault("trainer", "trainer-1", 10.0, 50), events)
    assert rec.action.startswith("standby-1 computes, beside its own")
    assert rec.resumed_step == 52 and rec.recovery_s is not None
    attached = Ev(21, "SLOT_ASSIGNED", 10.2, "j", "tr-9", -1, "tr-9 is a warm standby of j")
    assert recover(Fault("trainer", "trainer-1", 10.0, 50), [*events[:1], attached]).action == ""


def test_paramserver_recovery_waits_for_the_promotion():
    events = [
        Ev(5, "NODE_DEAD", 10.3, "", "ps-0a", 0, "paramserver ps-0a dead"),
        Ev(6, "REPLICA_PROMOTED", 10.35, "j", "ps-0b", 0, "ps-0b promoted"),
        *commits(7, 10.6, range(51, 53)),
    ]
    rec = recover(Fault("paramserver", "ps-0a", 10.0, 50), events)
    assert (round(rec.detection_s, 2), rec.resumed_step, round(rec.recovery_s, 2)) == (0.3, 51, 0.6)


def test_a_commit_made_before_the_paramserver_kill_is_no_recovery():
    # the primary held 52 when killed; the event stream had only seen 50 and hears of
    # 51 and 52 after the promotion
    events = [
        Ev(5, "NODE_DEAD", 10.3, "", "ps-0a", 0, "paramserver ps-0a dead"),
        Ev(6, "REPLICA_PROMOTED", 10.35, "j", "ps-0b", 0, "ps-0b promoted"),
        *commits(7, 10.4, range(51, 53)),
        *commits(9, 11.2, range(53, 54)),
    ]
    rec = recover(Fault("paramserver", "ps-0a", 10.0, 52), events)
    assert (rec.resumed_step, round(rec.recovery_s, 2)) == (53, 1.2)


def test_coordinator_recovery_counts_steps_committed_while_no_one_led():
    events = [
        Ev(30, "LEADER_ELECTED", 20.2, "", "coord-1", 0, "leader elected at epoch 2"),
        *commits(31, 20.3, range(71, 75)),
    ]
    rec = recover(Fault("coordinator", "coord-0", 20.0, 70), events)
    assert rec.detected_by == "leader elected at epoch 2"
    assert rec.resumed_step == 71 and rec.steps_during == 0
    assert round(rec.recovery_s, 2) == 0.3


def test_unrecovered_fault_has_no_times():
    rec = recover(Fault("trainer", "trainer-1", 10.0, 10), commits(1, 9.0, range(1, 11)))
    assert rec.detected_at is None and rec.recovery_s is None
    assert rec.to_dict()["recovery_s"] is None


def test_a_kill_after_the_last_step_is_told_apart_from_one_never_recovered():
    # the event stream trailed the job: the leader was killed after step 40 of 40
    events = [
        *commits(1, 5.0, range(30, 41)),
        Ev(20, "LEADER_ELECTED", 5.4, "", "coord-0", 0, "leader elected at epoch 2"),
    ]
    late = recover(Fault("coordinator", "coord-1", 5.358, 32), events, last_step=40)
    assert late.recovery_s is None and late.after_end and late.to_dict()["after_end"]
    # the same kill before the last step, with no step after it: not recovered
    early = recover(Fault("coordinator", "coord-1", 5.05, 35), events[:6], last_step=40)
    assert early.recovery_s is None and not early.after_end
    assert not recover(Fault("coordinator", "coord-1", 5.358, 32), events).after_end


def test_events_before_the_kill_do_not_count():
    events = [Ev(1, "NODE_DEAD", 5.0, "", "trainer-1", 0, "an earlier death")]
    assert recover(Fault("trainer", "trainer-1", 10.0, 3), events).detected_at is None


def test_audit_finds_missing_and_repeated_steps():
    events = commits(1, 0.0, range(1, 5)) + commits(10, 1.0, range(3, 4))
    audit = audit_steps(events, "j", 5)
    assert (audit.committed, audit.missing, audit.repeated) == (4, [5], [3])
    assert audit_steps(events, "other", 0).committed == 0


WHY = "node trainer-0 drained: health service predicts a failure (risk 0.85): GPU at 90.0 C"


def test_a_heated_trainer_drained_before_its_death_is_ok():
    events = commits(1, 1.0, range(1, 40))
    events.append(Ev(50, "NODE_DRAINED", 1.205, "", "trainer-0", 0, WHY))  # after step 21
    got = health_drain(events, "trainer-0", heat_from=16, crash_at=44, alive=True)
    assert (got["drained"], got["drained_at_step"], got["ok"]) == (True, 21, True)
    assert got["reason"] == WHY and got["crash_fired"] is False


def test_a_drain_too_late_or_not_for_health_or_a_death_is_not_ok():
    events = commits(1, 1.0, range(1, 40))
    late = [*events, Ev(50, "NODE_DRAINED", 1.395, "", "trainer-0", 0, WHY)]  # after step 40
    assert health_drain(late, "trainer-0", 16, 30, alive=True)["ok"] is False
    by_hand = [*events, Ev(50, "NODE_DRAINED", 1.1, "", "trainer-0", 0,
                           "node trainer-0 drained: drained from the CLI")]  # fmt: skip
    assert health_drain(by_hand, "trainer-0", 16, 44, alive=True)["ok"] is False
    died = health_drain(events, "trainer-0", 16, 30, alive=False)
    assert (died["drained"], died["crash_fired"], died["ok"]) == (False, True, False)
