"""The pure parts of fault handling: which etcd errors are retried, how long each try may take,
how long a keep-alive answer is waited for (and waited for again by a loop that woke late), and
the fencing settings."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from rendezvous.errors import RendezvousSettingsError
from rendezvous.etcd import retry
from rendezvous.etcd.session import AnswerWait, default_renew_deadline, hear, keep_alive_interval
from rendezvous.etcd.watch import Watch
from rendezvous.settings import RendezvousSettings

# One real answer for each row of retry.ANSWERS (etcd's messages as its server sends them), and
# answers no row names, which are final.
ROW_EXAMPLES = {
    "handshake failed": ("UNAVAILABLE", "last error: UNKNOWN: ipv4:127.0.0.1:1: Ssl handshake failed"),
    "database space exceeded": ("RESOURCE_EXHAUSTED", "etcdserver: mvcc: database space exceeded"),
    "no leader": ("UNAVAILABLE", "etcdserver: no leader"),
    "leader changed": ("UNAVAILABLE", "etcdserver: leader changed"),
    "not leader": ("UNAVAILABLE", "etcdserver: not leader"),
    "request timed out": ("UNKNOWN", "etcdserver: request timed out, possibly due to previous leader failure"),
    "context deadline exceeded": ("UNKNOWN", "context deadline exceeded"),
    "too many requests": ("RESOURCE_EXHAUSTED", "etcdserver: too many requests"),
    "unhealthy cluster": ("UNAVAILABLE", "etcdserver: unhealthy cluster"),
    "not capable": ("UNAVAILABLE", "etcdserver/api: not capable"),
    "raft: stopped": ("UNKNOWN", "raft: stopped"),
    "proposal dropped": ("UNKNOWN", "raft proposal dropped"),
    "server stopped": ("UNAVAILABLE", "etcdserver: server stopped"),
    "request cancelled": ("CANCELLED", "etcdserver: request cancelled"),
    "request canceled": ("CANCELLED", "etcdserver: request canceled"),
    "": None,  # the code rows, below
}
CODE_EXAMPLES = {
    "UNAVAILABLE": "failed to connect to all addresses; last error: Connection refused",
    "DEADLINE_EXCEEDED": "Deadline Exceeded",
}
FINAL = [
    ("INVALID_ARGUMENT", "etcdserver: authentication failed, invalid user ID or password"),
    ("PERMISSION_DENIED", "etcdserver: permission denied"),
    ("NOT_FOUND", "etcdserver: requested lease not found"),
    ("FAILED_PRECONDITION", "etcdserver: mvcc: required revision has been compacted"),
    ("OUT_OF_RANGE", "etcdserver: mvcc: required revision is a future revision"),
    ("INVALID_ARGUMENT", "etcdserver: key is not provided"),
    ("UNKNOWN", "etcdserver: corrupt cluster"),
]


def _example(row):
    return (row.code, CODE_EXAMPLES[row.code]) if not row.words else ROW_EXAMPLES[row.words]


@pytest.mark.parametrize("row", retry.ANSWERS, ids=lambda row: row.words or row.code)
def test_each_row_of_the_answer_table_decides_its_answer(row):
    code, details = _example(row)
    assert retry.answer(code, details) is row
    assert retry.is_retryable(code, details) is row.retry


def test_a_frozen_leaders_context_deadline_is_retried_not_final():
    # An agent started while the etcd leader was frozen got this from a follower and exited 3.
    assert retry.is_retryable("UNKNOWN", "context deadline exceeded")


@pytest.mark.parametrize("code, details", FINAL)
def test_answers_no_row_names_are_final(code, details):
    assert retry.answer(code, details).retry is False


def test_the_first_pass_shares_the_budget_so_a_frozen_member_cannot_eat_it():
    assert retry.attempt_timeout(6.0, 3, 0) == pytest.approx(2.0)
    assert retry.attempt_timeout(4.0, 3, 1) == pytest.approx(2.0)
    assert retry.attempt_timeout(2.0, 3, 2) == pytest.approx(2.0)


def test_later_passes_give_each_try_longer_but_never_more_than_is_left():
    assert retry.attempt_timeout(3.0, 3, 3) == pytest.approx(2.0)
    assert retry.attempt_timeout(3.0, 3, 6) == pytest.approx(3.0)
    assert retry.attempt_timeout(0.2, 3, 0) == pytest.approx(0.2)
    assert retry.attempt_timeout(0.0, 3, 0) == 0.0


def test_a_lone_endpoint_gets_the_whole_budget_each_try():
    assert retry.attempt_timeout(4.5, 1, 0) == 4.5


def test_backoff_comes_between_passes_only_and_is_capped():
    assert [retry.backoff(a, 3) for a in range(7)] == [0.0, 0.0, 0.0, 0.05, 0.0, 0.0, 0.1]
    assert retry.backoff(300, 3) == 1.0


def test_reasons_are_a_few_words():
    assert (
        retry.reason("UNAVAILABLE", "ipv4:127.0.0.1:1: Failed to connect to remote host: Connection refused")
        == "connection refused"
    )
    assert retry.reason("DEADLINE_EXCEEDED", "Deadline Exceeded", 1.25) == "no answer within 1.2 s"
    assert retry.reason("UNAVAILABLE", "etcdserver: no leader") == "no leader"
    assert retry.reason("UNAVAILABLE", "Socket closed") == "connection closed"
    # grpc's words for a name that does not resolve (the README's etcd-0:2379 on a machine without it)
    unresolved = (
        "errors resolving etcd-0:2379: [field:hostname lookup error:address lookup failed for etcd-0:2379: "
        "Domain name not found]"
    )
    assert retry.reason("UNAVAILABLE", unresolved) == "the host name does not resolve"
    assert retry.reason("UNAVAILABLE", "DNS resolution failed for etcd-0:2379") == "the host name does not resolve"


def test_the_unreachable_message_says_where_why_and_how_long():
    text = retry.unreachable_message({"h1:2379": "connection refused", "h2:2379": "no answer within 1.7 s"}, 9, 5.04)
    assert (
        text == "cannot reach etcd at h1:2379 (connection refused), h2:2379 (no answer within 1.7 s); "
        "tried 9 times over 5.0 s"
    )


def _wait_after(round_trips, deadline=14.0):
    wait = AnswerWait(deadline)
    for rtt in round_trips:
        wait.answered(rtt, in_time=True)
    return wait


def test_the_answer_wait_follows_the_round_trip_and_its_variation_but_stays_under_half_the_deadline():
    assert AnswerWait(14.0).seconds == 0.5  # nothing measured yet
    assert _wait_after([0.01] * 5).seconds == 0.5  # the least wait
    assert _wait_after([0.6]).seconds == pytest.approx(0.6 + 4 * 0.3)  # one sample: its variation is half of it
    assert _wait_after([0.6] * 40).seconds == pytest.approx(0.6, abs=0.01)  # steady: the round trip itself
    assert _wait_after([3.0]).seconds == 7.0 and _wait_after([3.0], 4.0).seconds == 2.0
    assert AnswerWait(0.4).seconds == 0.5  # the least wait, even past half a tiny deadline


def test_one_slow_answer_lengthens_the_wait_for_a_while_and_fast_ones_bring_it_back():
    wait = _wait_after([0.005] * 10 + [0.9])
    after_spike = wait.seconds
    assert after_spike > 0.9, "another answer as slow as that one would be taken for silence"
    for _ in range(30):
        wait.answered(0.005, in_time=True)
    assert wait.seconds == 0.5


def test_each_silence_in_a_row_doubles_the_wait_until_the_usual_stream_answers_in_time():
    wait = _wait_after([0.005] * 10)
    waits = []
    for _ in range(5):
        wait.silent()
        wait.answered(0.005, in_time=False)  # renewed by another stream: the backoff stays
        waits.append(wait.seconds)
    assert waits == [1.0, 2.0, 4.0, 7.0, 7.0]
    wait.answered(0.005, in_time=True)
    assert wait.seconds == 0.5


def test_default_fencing_settings_renew_every_second_and_fence_a_second_before_the_ttl():
    settings = RendezvousSettings(run_id="job")
    assert (settings.lease_ttl, settings.fence_after, settings.renew_every) == (15, 14.0, 1.0)
    assert default_renew_deadline(5) == 4.0 and keep_alive_interval(4.0) == 0.5
    short = RendezvousSettings.from_conf(
        "job", 1, 1, "lease_ttl=5,renew_deadline=3,keep_alive_interval=0.2,connect_timeout=9"
    )
    assert (short.fence_after, short.renew_every, short.connect_timeout) == (3.0, 0.2, 9.0)


@pytest.mark.parametrize(
    "max_nodes, every",
    [(1, 1.0), (1024, 1.0), (1536, 1.5), (2048, 2.0), (3000, 3000 / 1024), (4096, 3.5), (10000, 3.5)],
)
def test_a_job_of_more_than_1024_nodes_renews_less_often_up_to_a_quarter_of_the_deadline(max_nodes, every):
    """Its renewals are etcd's main load while it trains (docs/scale.md): 10,000 a second at 10,000
    nodes. The fence does not move: a node stops its workers 14 s after its last answered renewal;
    an outage of 14 - 3.5 s still passes unnoticed."""
    settings = RendezvousSettings(run_id="job", min_nodes=1, max_nodes=max_nodes)
    assert settings.renew_every == pytest.approx(every)
    assert (settings.fence_after, settings.lease_ttl) == (14.0, 15)
    short = RendezvousSettings(run_id="job", min_nodes=1, max_nodes=max_nodes, lease_ttl=5)  # deadline 4 s
    assert short.renew_every == pytest.approx(min(max(0.5, 0.5 * max_nodes / 1024), 1.0))
    given = RendezvousSettings(run_id="job", min_nodes=1, max_nodes=max_nodes, keep_alive_interval=0.3)
    assert given.renew_every == 0.3  # the user's word wins


def test_a_watch_asks_for_progress_only_after_the_renewals_it_relies_on_stop():
    """A quiet watch asks etcd for progress when the same connection heard nothing for PROBE_EVERY;
    renewals further apart than that (a big job's) would have it ask between them, and reopen it
    after SILENCE: its waits follow the renewals'."""
    assert Watch.waits(0.0) == Watch.waits(1.0) == (Watch.PROBE_EVERY, Watch.SILENCE) == (1.0, 3.0)
    assert Watch.waits(0.2) == (1.0, 3.0)
    probe_every, silence = Watch.waits(3.5)
    assert probe_every == pytest.approx(4.375) and silence == pytest.approx(6.375)


@pytest.mark.parametrize(
    "conf, words",
    [
        ("lease_ttl=5,renew_deadline=5", "renew_deadline must be from 0.1 s to lease_ttl - 0.5 (4.5)"),
        ("renew_deadline=0", "renew_deadline must be"),
        (
            "lease_ttl=5,keep_alive_interval=3",
            "keep_alive_interval must be from 0.01 s to half the renew deadline (2 s)",
        ),
        ("connect_timeout=0", "connect_timeout must be a positive number"),
    ],
)
def test_fencing_settings_that_cannot_be_safe_are_refused(conf, words):
    with pytest.raises(RendezvousSettingsError, match=words.replace("(", r"\(").replace(")", r"\)")):
        RendezvousSettings.from_conf("job", 1, 1, conf)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _session(clock: _Clock):
    from rendezvous.etcd.session import Session

    session = Session.__new__(Session)  # the deadline bookkeeping only: no etcd, no keep-alive task
    session.renew_deadline, session._clock, session._on_renew = 4.0, clock, None
    session._missed, session._handled = False, None
    session.done, session.lost, session._moved = threading.Event(), threading.Event(), threading.Condition()
    session.deadline = clock() + 4.0
    return session


def test_a_missed_renew_deadline_is_overdue_until_the_fence_is_handled():
    clock = _Clock()
    session = _session(clock)
    clock.now += 3.9
    assert not session.overdue()
    clock.now += 0.2
    assert session.overdue()
    session.clear_overdue()
    assert not session.overdue(), "handled: waiting for etcd is not a second fence"


def test_the_late_renewal_of_a_handled_deadline_is_not_a_second_fence():
    clock = _Clock()
    session = _session(clock)
    sent = clock.now
    clock.now += 6.0
    session.clear_overdue()
    session._acknowledged(sent + 5.0)
    assert not session.overdue()
    assert session.deadline == sent + 9.0


def test_a_renewal_acknowledged_after_an_unhandled_deadline_still_fences():
    clock = _Clock()
    session = _session(clock)
    sent = clock.now
    clock.now += 4.5  # a frozen process: the renewal's answer is read only now
    session._acknowledged(sent + 3.0)
    clock.now += 0.1
    assert session.deadline > clock.now and session.overdue()


def test_workers_wait_for_a_renewal_that_puts_the_deadline_ahead_of_them_after_a_handled_fence():
    from rendezvous.rounds.member import LeaseStatus

    clock = _Clock()
    session = _session(clock)
    lease, told = LeaseStatus(lambda: session), []
    assert lease.wait_ahead(1.0, 5.0, told.append) and not told, "a live lease: no wait, nothing said"
    clock.now += 10.0  # etcd was away: the deadline passed, and the fence dealt with it
    session.clear_overdue()
    assert not session.overdue()
    began = time.monotonic()
    assert not lease.wait_ahead(1.0, 0.2, told.append), "no renewal: not ahead, after the timeout"
    assert time.monotonic() - began >= 0.2 and told == [pytest.approx(10.0)]
    threading.Timer(0.1, session._acknowledged, (clock.now - 3.5,)).start()  # 0.5 s left: not enough
    threading.Timer(0.2, session._acknowledged, (clock.now,)).start()
    began = time.monotonic()
    assert lease.wait_ahead(1.0, 5.0, told.append) and time.monotonic() - began < 1.0
    assert session.deadline == clock.now + 4.0 and not session.overdue()
    clock.now += 20.0
    session.lose()  # etcd said the lease is gone: no renewal can come
    began = time.monotonic()
    assert not session.wait_ahead(1.0, 5.0) and time.monotonic() - began < 0.5


def _hear_while_busy(busy: float, answer_at: float | None, last: float = 5.0) -> tuple[bool, float]:
    """``hear`` on a loop whose thread is held for ``busy`` seconds from 0.05 s on (nothing is read
    meanwhile), the answer coming at ``answer_at``; whether it was heard, and when hear returned."""

    async def scenario() -> tuple[bool, float]:
        loop = asyncio.get_running_loop()
        usual = loop.create_future()
        start = time.monotonic()
        if busy:
            loop.call_later(0.05, time.sleep, busy)
        if answer_at is not None:
            loop.call_later(answer_at, usual.set_result, "answer")
        await hear(usual, 0.5, sent=start, late=0.1, last=start + last)
        return usual.done(), time.monotonic() - start

    return asyncio.run(scenario())


def test_a_loop_that_woke_late_waits_again_for_the_answer_it_could_not_read():
    # held until 0.85 s, past the 0.5 s wait: the answer read just after is not taken for silence
    heard, took = _hear_while_busy(0.8, 0.9)
    assert heard and took == pytest.approx(0.9, abs=0.1)


def test_a_loop_on_time_gives_up_after_the_wait_and_a_late_one_at_the_last_moment():
    heard, took = _hear_while_busy(0.0, 3.0)
    assert not heard and took == pytest.approx(0.5, abs=0.1)
    heard, took = _hear_while_busy(0.8, None, last=1.0)  # woke late, then nothing: given up at ``last``
    assert not heard and took == pytest.approx(1.0, abs=0.1)
