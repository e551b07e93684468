import pytest

from rendezvous import EtcdRendezvousBackend, RendezvousSettingsError, RendezvousStateError
from rendezvous.job.keys import STATE_HEADER
from tests.contract import BackendContract


class TestEtcdBackend(BackendContract):
    @pytest.fixture
    def backend(self, etcd_client, key_prefix):
        return EtcdRendezvousBackend(etcd_client, "job", key_prefix=key_prefix)


@pytest.fixture
def backend(etcd_client, key_prefix):
    return EtcdRendezvousBackend(etcd_client, "job", key_prefix=key_prefix)


def test_name_is_etcd_v3(backend):
    assert backend.name == "etcd-v3"


def test_state_lives_under_prefix_run_id_state(backend, key_prefix):
    assert backend.key == f"{key_prefix}/job/state"


def test_token_is_the_etcd_mod_revision_of_the_state_key(backend, etcd_client):
    _, token, _ = backend.set_state(b"s")
    assert etcd_client.get(backend.key).mod_revision == token


@pytest.mark.parametrize("garbage", [b"", b"\x80\x04\x95garbage", b'{"round": 1}', b"elastic-state/2\nx"])
def test_get_state_raises_state_error_for_a_value_that_is_not_ours(backend, etcd_client, garbage):
    etcd_client.put(backend.key, garbage)
    with pytest.raises(RendezvousStateError, match="not etcd-elastic state"):
        backend.get_state()


def test_set_state_raises_state_error_when_the_lost_race_reads_garbage(backend, etcd_client):
    etcd_client.put(backend.key, b"garbage")
    with pytest.raises(RendezvousStateError):
        backend.set_state(b"x")


def test_stored_value_is_header_then_state(backend, etcd_client):
    backend.set_state(b'{"a": 1}')
    assert etcd_client.get(backend.key).value == STATE_HEADER + b'{"a": 1}'


def test_backends_of_different_run_ids_do_not_share_state(etcd_client, key_prefix):
    one = EtcdRendezvousBackend(etcd_client, "one", key_prefix=key_prefix)
    two = EtcdRendezvousBackend(etcd_client, "two", key_prefix=key_prefix)
    one.set_state(b"1")
    assert two.get_state() is None


@pytest.mark.parametrize("run_id", ["", "a/b", "has space", "tab\t", "x" * 201])
def test_a_run_id_that_is_not_a_key_segment_is_refused(etcd_client, run_id):
    with pytest.raises(RendezvousSettingsError):
        EtcdRendezvousBackend(etcd_client, run_id)
