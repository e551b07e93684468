"""How a function entrypoint is written for its workers (launcher.workers.payload), without etcd."""

from __future__ import annotations

import io
import os
import pickle
import threading

import pytest

from launcher.workers.payload import UnsendableError, dump_payload


def _roundtrip(fn, args, preparation):
    buffer = io.BytesIO()
    dump_payload(buffer, preparation, fn, args)
    buffer.seek(0)
    assert pickle.load(buffer) == preparation
    return pickle.load(buffer)


def test_an_importable_function_goes_by_reference_and_a_lambda_by_value_beside_a_main_file():
    preparation = {"init_main_from_path": __file__}
    fn, args = _roundtrip(os.path.join, ("a", "b"), preparation)
    assert fn is os.path.join and fn(*args) == os.path.join("a", "b")
    fn, args = _roundtrip(lambda x: x * 2, (21,), preparation)
    assert fn(*args) == 42


def test_without_a_main_file_a_closure_goes_by_value():
    offset = 5
    fn, args = _roundtrip(lambda x: x + offset, (1,), {})
    assert fn(*args) == 6


def test_a_lock_in_the_closure_is_one_line_naming_the_function():
    lock = threading.Lock()

    def guarded():
        with lock:
            return 1

    with pytest.raises(UnsendableError) as caught:
        dump_payload(io.BytesIO(), {}, guarded, ())
    message = str(caught.value)
    assert message.startswith("test_a_lock_in_the_closure_is_one_line_naming_the_function.<locals>.guarded() cannot")
    assert "lock" in message and "\n" not in message
