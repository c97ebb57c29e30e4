"""`pytest -p kvsched.integrations.vllm.checker_plugin`: vLLM's own tests with the live checker.

Every scheduler vLLM's tests build with their `create_scheduler` helper and no KV connector of
their own gets `KvschedChecker` as its connector (registered with vLLM's `KVConnectorFactory`
under that name, role `kv_producer`, raising on any finding), so the tests run unmodified over vLLM's own pool with
every scheduler step checked. A test that builds its own connector keeps it.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import pytest

CONNECTOR = "KvschedChecker"
HELPER = "tests.v1.core.utils"  # vLLM's tests' `create_scheduler`, imported by every test module


def pytest_configure(config: pytest.Config) -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    from kvsched.integrations.vllm import require_tested_vllm

    require_tested_vllm()
    KVConnectorFactory.register_connector(CONNECTOR, "kvsched.integrations.vllm.checker", CONNECTOR)
    helpers = importlib.import_module(HELPER)
    original = helpers.create_scheduler

    @functools.wraps(original)
    def create_scheduler(*args: Any, use_kv_connector: Any = None, **kwargs: Any) -> Any:
        if use_kv_connector:
            return original(*args, use_kv_connector=use_kv_connector, **kwargs)
        return original(*args, **{**kwargs, "use_kv_connector": CONNECTOR, "kv_role": "kv_producer"})

    setattr(helpers, "create_scheduler", create_scheduler)  # noqa: B010  (a module of vLLM's tests, untyped)


def pytest_report_header(config: pytest.Config) -> str:
    return f"kvsched: every scheduler {HELPER}.create_scheduler builds without a connector gets {CONNECTOR}"
