"""The backend contract, one suite run against every backend (in-memory fake and real etcd).

A subclass provides a ``backend`` fixture; each test below then runs against it.
"""

from __future__ import annotations

import threading

import pytest


class BackendContract:
    def test_get_state_returns_none_if_there_is_no_state(self, backend):
        assert backend.get_state() is None

    def test_set_state_writes_state_if_there_is_none_and_token_is_none(self, backend):
        state, token, written = backend.set_state(b"x")
        assert (state, written) == (b"x", True)
        assert backend.get_state() == (b"x", token)

    def test_get_state_returns_the_state_and_the_token_of_the_last_write(self, backend):
        _, token, _ = backend.set_state(b"one")
        assert backend.get_state() == (b"one", token)

    def test_set_state_writes_state_if_token_is_current(self, backend):
        _, token, _ = backend.set_state(b"one")
        state, new_token, written = backend.set_state(b"two", token)
        assert (state, written) == (b"two", True)
        assert new_token != token
        assert backend.get_state() == (b"two", new_token)

    def test_set_state_returns_current_state_if_token_is_old(self, backend):
        _, old, _ = backend.set_state(b"one")
        _, current, _ = backend.set_state(b"two", old)
        assert backend.set_state(b"three", old) == (b"two", current, False)
        assert backend.get_state() == (b"two", current)

    def test_set_state_returns_current_state_if_token_is_none_while_state_exists(self, backend):
        _, token, _ = backend.set_state(b"one")
        assert backend.set_state(b"two") == (b"one", token, False)
        assert backend.get_state() == (b"one", token)

    @pytest.mark.parametrize("bad_token", ["12", -1, 0, 2.5, True, object(), b"3"])
    def test_set_state_returns_current_state_if_token_is_invalid(self, backend, bad_token):
        _, token, _ = backend.set_state(b"one")
        assert backend.set_state(b"two", bad_token) == (b"one", token, False)
        assert backend.get_state() == (b"one", token)

    def test_set_state_returns_none_if_token_is_invalid_and_there_is_no_state(self, backend):
        assert backend.set_state(b"two", "not-a-token") is None
        assert backend.get_state() is None

    def test_set_state_returns_none_if_token_is_stale_and_state_was_deleted(self, backend):
        _, token, _ = backend.set_state(b"one")
        assert backend.delete_state() is True
        assert backend.set_state(b"two", token) is None
        assert backend.get_state() is None

    def test_set_state_keeps_arbitrary_bytes_intact(self, backend):
        blob = bytes(range(256)) * 4
        _, token, _ = backend.set_state(blob)
        assert backend.get_state() == (blob, token)

    def test_set_state_rejects_a_state_that_is_not_bytes(self, backend):
        with pytest.raises(TypeError):
            backend.set_state("text")

    def test_delete_state_returns_false_if_there_is_no_state(self, backend):
        assert backend.delete_state() is False

    def test_exactly_one_writer_wins_each_round_under_contention(self, backend):
        """N threads race on the same token, round after round: one winner a round, no lost update."""
        threads, rounds = 8, 15
        _, token, _ = backend.set_state(b"0")
        barrier = threading.Barrier(threads)
        results: list[list[tuple[int, bool]]] = [[] for _ in range(rounds)]
        lock = threading.Lock()
        tokens = [token]

        def racer(me: int) -> None:
            for round_ in range(rounds):
                barrier.wait(timeout=30)
                start = tokens[round_]
                outcome = backend.set_state(f"{round_ + 1}:{me}".encode(), start)
                with lock:
                    results[round_].append((me, outcome[2]))
                    if outcome[2]:
                        tokens.append(outcome[1])
                barrier.wait(timeout=30)

        workers = [threading.Thread(target=racer, args=(i,)) for i in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=60)
        assert not any(worker.is_alive() for worker in workers)
        for round_ in range(rounds):
            winners = [me for me, written in results[round_] if written]
            assert len(results[round_]) == threads
            assert len(winners) == 1, f"round {round_}: winners {winners}"
        state, token = backend.get_state()
        assert state.startswith(f"{rounds}:".encode())
        assert token == tokens[-1]
        assert len(set(tokens)) == rounds + 1
