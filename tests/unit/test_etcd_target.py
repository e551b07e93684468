"""Where etcd is and how to reach it (rendezvous.etcd.target): one frozen value, and its JSON form
for the helper processes, without etcd."""

from __future__ import annotations

import pytest

from rendezvous.errors import RendezvousSettingsError
from rendezvous.etcd.client import EtcdClient, EtcdTarget
from rendezvous.settings import RendezvousSettings


def test_settings_build_one_target_with_tls_and_user_that_survives_its_json_form():
    settings = RendezvousSettings.from_conf(
        "job", 1, 1, "protocol=https,cacert=/ca.pem,cert=/c.pem,key=/k.pem,user=u,password=p,read_timeout=7", environ={}
    )
    target = settings.target("a:2379,b:2380")
    assert target.urls == "https://a:2379,https://b:2380" and target.timeout == 7.0
    assert target.files == ("/ca.pem", "/k.pem", "/c.pem") and (target.user, target.password) == ("u", "p")
    assert EtcdTarget.from_json(target.to_json()) == target
    assert EtcdTarget.from_json(target.to_json()).with_timeout(3.0).timeout == 3.0


def test_a_client_is_made_from_a_target_or_from_its_fields_alike():
    target = EtcdTarget.of("127.0.0.1:2379", timeout=2.0)
    assert EtcdClient(target).target == EtcdClient("127.0.0.1:2379", timeout=2.0).target == target


@pytest.mark.parametrize(
    "text, words",
    [
        ('{"endpoints": "", "timeout": 5}', "etcd endpoint is empty"),
        ('{"endpoints": "h:1", "timeout": 0}', "positive number of seconds"),
        ('{"endpoints": "h:1", "user": "u"}', "user and password go together"),
        ('{"endpoints": "h:1", "cert_key": "/k"}', "certificate and key go together"),
        ('{"timeout": 5}', "not an etcd target"),
        ("[1, 2]", "not an etcd target"),
        ('{"endpoints": "h:1", "colour": "red"}', "not an etcd target"),
    ],
)
def test_a_bad_target_is_one_settings_error(text, words):
    with pytest.raises(RendezvousSettingsError, match=words):
        EtcdTarget.from_json(text)
