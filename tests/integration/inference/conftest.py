"""Until tests/conftest.py lists ``tests.fixtures.inference`` in ``pytest_plugins``.

Delete this file when it does: a second definition would start a second engine.
"""

from tests.fixtures.inference import inference_address, inference_service

__all__ = ["inference_address", "inference_service"]
