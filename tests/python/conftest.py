"""Fixtures shared by the Python tests."""
import pytest


class DlpackProducer:
    """Any object with __dlpack__ (not a numpy array), here backed by a numpy array `a`."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


@pytest.fixture
def dlpack_producer():
    """DlpackProducer: wraps a numpy array so that it reaches kvtier through DLPack."""
    return DlpackProducer
