"""The ``yt.wrapper`` side of the YTsaurus backend: an offline client (for building specs
without a cluster), the ``VanillaSpecBuilder`` of an operation spec, and telling a "no such
operation" error from others. ``yt.wrapper`` is imported only when called."""

from __future__ import annotations

from typing import Any


def offline_client() -> Any:
    """A ``yt.wrapper`` client that never reaches a cluster: for building specs offline
    (tests, ``--dry-run``); every request it would send fails at once."""
    import yt.wrapper as yt

    return yt.YtClient(
        proxy="offline.invalid",
        config={"apply_remote_patch_at_start": None, "proxy": {"retries": {"enable": False}}},
    )


def spec_builder(operation: dict[str, Any]) -> Any:
    """The ``yt.wrapper`` ``VanillaSpecBuilder`` for an operation spec of
    :func:`.ytsaurus_spec.operation_spec`: each option through the builder's own method
    where it has one (``pool``, ``gpu_limit``, ``file_paths``...), the rest as a patch."""
    from yt.wrapper.spec_builders import VanillaSpecBuilder

    op = dict(operation)
    builder = VanillaSpecBuilder()
    for name, task in dict(op.pop("tasks")).items():
        task_builder = builder.begin_task(name)
        patch = {}
        for key, value in task.items():
            if hasattr(task_builder, key) and key != "spec":
                getattr(task_builder, key)(value)
            else:
                patch[key] = value
        if patch:
            task_builder.spec(patch)
        task_builder.end_task()
    patch = {}
    for key, value in op.items():
        if hasattr(builder, key) and key not in ("spec", "task", "tasks"):
            getattr(builder, key)(value)
        else:
            patch[key] = value
    if patch:
        builder.spec(patch)
    return builder


def _is_no_such_operation(exc: BaseException) -> bool:
    check = getattr(exc, "is_no_such_operation", None)
    resolve = getattr(exc, "is_resolve_error", None)
    return bool((check and check()) or (resolve and resolve()))
