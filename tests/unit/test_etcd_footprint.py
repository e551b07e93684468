"""What a job keeps in etcd, decided without etcd: records that do not grow with the job, the job's
retention in its state, and the operator's ages."""

import json

import pytest

from launcher.cli.ctl_jobs import describe_age, parse_age
from rendezvous.errors import RendezvousSettingsError, RendezvousStateError
from rendezvous.job.history import NAMES, Event, freeze_details
from rendezvous.job.state import JobState, JobStatus, Keep, NodeInfo, Participant
from rendezvous.rounds.decide import LiveNode, closed_state, forming_state, frozen_state
from rendezvous.settings import DEFAULT_RETENTION, RendezvousSettings


def _frozen(names: list[str], round_: int = 1, keep: Keep = Keep()) -> JobState:
    participants = tuple(Participant(n, i, "10.0.0.1", 8) for i, n in enumerate(names))
    live = [LiveNode(NodeInfo(n, round_, "10.0.0.1", 8, 29500), i) for i, n in enumerate(names)]
    return frozen_state("job", round_, participants, live, 1, len(names), keep=keep)


def test_a_round_frozen_record_is_the_same_size_at_any_job_size():
    sizes = []
    for k in (4, 64, 1024, 16384):
        before = _frozen([f"node-{i:05d}" for i in range(k)])
        after = _frozen([f"node-{i:05d}" for i in range(1, k)] + [f"new-{i:05d}" for i in range(k // 2)], round_=2)
        details = freeze_details(before, after, formed_in=1.0)
        assert details["left"] == ["node-00000"] and details["left_count"] == 1
        assert len(details["joined"]) == min(NAMES, k // 2) and details["joined_count"] == k // 2
        assert details["nodes"] == k - 1 + k // 2
        sizes.append(len(Event(0.0, 2, "node-00001", "round_frozen", details).encode()))
    assert max(sizes) - min(sizes) < 100 and max(sizes) < 600, sizes


def test_the_first_round_names_a_few_of_its_nodes_and_counts_them_all():
    details = freeze_details(None, _frozen([f"n{i}" for i in range(100)]), formed_in=0.5)
    assert details["joined_count"] == 100 and len(details["joined"]) == NAMES and details["left"] == []


def test_a_new_job_carries_its_retention_and_every_later_state_keeps_the_jobs_lease():
    first = forming_state(None, "job", 1, min_nodes=1, max_nodes=2, last_call_at=None, max_restarts=0, retention=60)
    assert first.keep == Keep(lease=0, retention=60)
    leased = JobState.decode(first.__class__(**{**first.__dict__, "keep": Keep(7, 60)}).encode())
    assert leased.keep == Keep(7, 60, None)
    again = forming_state(leased, "job", 2, min_nodes=1, max_nodes=2, last_call_at=None, max_restarts=0, retention=9)
    assert again.keep == Keep(7, 60)  # the job's own setting stays
    closed = closed_state(_frozen(["a"], keep=Keep(7, 60)), "done", when=1234.5678)
    assert closed.status is JobStatus.CLOSED and closed.keep == Keep(7, 60, 1234.568)
    assert JobState.decode(closed.encode()).keep == closed.keep


@pytest.mark.parametrize(
    "keep", [{"lease": -1}, {"lease": "7"}, {"retention": True}, {"closed_at": "yesterday"}, {"closed_at": True}]
)
def test_a_keep_that_is_not_ours_is_refused_on_read(keep):
    data = json.loads(_frozen(["a"]).encode())
    data["keep"] = keep
    with pytest.raises(RendezvousStateError, match="keep"):
        JobState.decode(json.dumps(data).encode())


def test_retention_is_three_days_by_default_zero_keeps_forever_and_nonsense_is_refused():
    assert RendezvousSettings("job").retention == DEFAULT_RETENTION == 3 * 86400
    assert RendezvousSettings.from_conf("job", 1, 1, "retention=0").retention == 0
    for bad in ("retention=-1", "retention=1.5", "retention=99999999999"):
        with pytest.raises(RendezvousSettingsError, match="retention"):
            RendezvousSettings.from_conf("job", 1, 1, bad)


def test_ages_read_and_said_as_an_operator_writes_them():
    assert [parse_age(t) for t in ("90", "90s", "30m", "12h", "7d", "2w", "0.5h")] == [
        90,
        90,
        1800,
        43200,
        604800,
        1209600,
        1800,
    ]
    for bad in ("", "7 days", "-1d", "d"):
        with pytest.raises(ValueError, match="not an age"):
            parse_age(bad)
    assert [describe_age(s) for s in (None, 5, 125, 7300, 3 * 86400 + 3600)] == ["-", "5s", "2m", "2h 1m", "3d 1h"]
