"""A c10d line's etcd (``launcher.hosted``): the endpoint as torchrun reads it, whether this machine
is its host, and the hosting agent's bounded wait for the others to leave."""

from __future__ import annotations

import pytest

from launcher.errors import UsageError
from launcher.hosted import C10D_PORT, Hosting, c10d_endpoint, matches_machine, wait_alone


@pytest.mark.parametrize(
    "text, hosting",
    [
        ("node0:29500", Hosting("node0", 29500)),
        ("node0", Hosting("node0", C10D_PORT)),  # torchrun's c10d port when none is given
        (" localhost:1 ", Hosting("localhost", 1)),
        ("[::1]:29401", Hosting("::1", 29401)),
        ("[fe80::1]", Hosting("fe80::1", C10D_PORT)),
    ],
)
def test_the_endpoint_is_read_as_torchrun_reads_a_c10d_one(text, hosting):
    assert c10d_endpoint(text) == hosting


def test_an_ipv6_host_is_bracketed_again_in_the_endpoint_clients_dial():
    assert Hosting("::1", 29401).endpoint == "[::1]:29401" and Hosting("a", 1).endpoint == "a:1"


@pytest.mark.parametrize("text", ["a:1,b:2", "a:x", ":29400", "a:0", "a:65536", "[::1]:"])
def test_an_endpoint_that_cannot_be_served_is_a_usage_error(text):
    with pytest.raises(UsageError):
        c10d_endpoint(text)


def test_port_0_is_kept_for_the_single_node_line_to_be_told_by():
    assert c10d_endpoint("localhost:0", free_port=True).port == 0


@pytest.mark.parametrize("text, value", [("true", True), ("1", True), ("YES", True), ("false", False), ("0", False)])
def test_is_host_is_torchs_boolean(text, value):
    assert c10d_endpoint("a:1", text).is_host is value


def test_is_host_that_is_not_a_boolean_is_a_usage_error():
    with pytest.raises(UsageError, match="is_host='maybe'"):
        c10d_endpoint("a:1", "maybe")


MACHINE = dict(names=["vm", "vm.example.org"], ips=["10.0.0.5", "127.0.1.1"])


@pytest.mark.parametrize(
    "host, host_ips, here",
    [
        ("localhost", [], True),
        ("127.0.0.1", ["127.0.0.1"], True),
        ("::1", ["::1"], True),
        ("vm", ["10.0.0.5"], True),
        ("vm.example.org", ["10.0.0.5"], True),
        ("10.0.0.5", ["10.0.0.5"], True),
        ("alias-of-vm", ["10.0.0.5"], True),  # another name for one of its addresses
        ("node1", ["10.0.0.6"], False),
        ("10.0.0.6", ["10.0.0.6"], False),
        ("unknown", [], False),
    ],
)
def test_the_endpoint_names_this_machine_by_a_loopback_a_name_or_an_address(host, host_ips, here):
    assert matches_machine(host, host_ips, MACHINE["names"], MACHINE["ips"]) is here


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def nap(self, seconds: float) -> None:
        self.now += seconds


def test_the_host_waits_for_the_others_to_leave_and_says_so_once():
    clock, said, left = _Clock(), [], iter([2, 1, 1, 0])
    assert wait_alone(lambda: next(left), 30, said.append, clock=clock, nap=clock.nap) == 0
    assert said == ["hosting the job's etcd: waiting up to 30 s for 2 other node(s) to leave before it stops"]
    assert clock.now == pytest.approx(0.6)


def test_the_hosts_wait_is_bounded_and_silent_when_it_is_alone():
    clock, said = _Clock(), []
    assert wait_alone(lambda: 0, 30, said.append, clock=clock, nap=clock.nap) == 0 and said == []
    assert wait_alone(lambda: 1, 2, said.append, clock=clock, nap=clock.nap) == 1
    assert 2 <= clock.now <= 2.2 and len(said) == 1
