"""The engines under here run in this process, several at once at times (see :func:`tests.conftest.pytest_configure`).
vLLM's in-process engine assumes it is the process's only one, twice; :func:`engines_share_the_process` mends both
for the session."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session", autouse=True)
def engines_share_the_process() -> Iterator[None]:
    """1. An in-process engine core tears down the process's distributed state as it shuts down
       (``cleanup_dist_env_and_memory``), which an engine still running here needs: a plain engine kept beside a
       speculative one loses its tensor-parallel group. Here shutdown frees the engine's memory only; every engine of
       the suite has the same single-rank groups, which the next one reuses.
    2. Each worker's start registers the CPU platform's kernel overrides again, by a scan of every loaded module that
       fails on llvmlite's wrappers once n-gram lookup has loaded numba. The kernels stay rebound for the process
       after the first registration, so later ones are skipped."""
    from vllm.platforms import current_platform
    from vllm.v1.engine import core

    def free_memory(shutdown_ray: bool = False) -> None:
        gc.unfreeze()
        gc.collect()

    platform = type(current_platform)
    register = platform.register_triton_kernel_overrides
    registered: list[bool] = []

    def register_once(cls: Any) -> None:
        if not registered:
            register()
            registered.append(True)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(core, "cleanup_dist_env_and_memory", free_memory)
        mp.setattr(platform, "register_triton_kernel_overrides", classmethod(register_once))
        yield
