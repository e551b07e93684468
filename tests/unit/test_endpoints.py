import pytest

from rendezvous import Endpoint, EtcdClient, RendezvousSettingsError, parse_endpoints


@pytest.mark.parametrize(
    "text, expected",
    [
        ("localhost", (Endpoint("localhost", 2379),)),
        ("127.0.0.1:2380", (Endpoint("127.0.0.1", 2380),)),
        (" a:1 , b:2 ", (Endpoint("a", 1), Endpoint("b", 2))),
        ("http://etcd-0:2379/", (Endpoint("etcd-0", 2379),)),
        ("https://etcd:2379", (Endpoint("etcd", 2379, secure=True),)),
        ("[::1]:2379", (Endpoint("::1", 2379),)),
    ],
)
def test_parse_endpoints_accepts_host_port_lists(text, expected):
    assert parse_endpoints(text) == expected


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "empty"),
        ("host:abc", "port 'abc'"),
        ("host:0", "port '0'"),
        ("host:70000", "port '70000'"),
        ("a:1,,b:2", "not host[:port]"),
        ("grpc://host:1", "scheme 'grpc'"),
        ("ho st:1", "not host[:port]"),
        ("host:1:2", "not host[:port]"),
    ],
)
def test_parse_endpoints_names_the_bad_entry(text, fragment):
    with pytest.raises(RendezvousSettingsError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        parse_endpoints(text)


def test_endpoint_target_brackets_ipv6_hosts():
    assert Endpoint("::1", 1).target == "[::1]:1"


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"timeout": 0}, "timeout"),
        ({"user": "root"}, "user and password"),
        ({"cert_key": "k.pem"}, "certificate and key"),
        ({"ca_cert": "/nonexistent/ca.pem"}, "cannot read the etcd CA certificate"),
    ],
)
def test_client_settings_are_validated(kwargs, fragment):
    with pytest.raises(RendezvousSettingsError, match=fragment):
        EtcdClient("127.0.0.1:2379", **kwargs)
