import pytest

from tests.contract import BackendContract
from tests.fakes import InMemoryBackend


class TestInMemoryBackend(BackendContract):
    @pytest.fixture
    def backend(self):
        return InMemoryBackend()
