"""The private DBOS names the task service uses exist on the installed DBOS (an upgrade that moves
one fails here, not in a worker's stop), and each guard degrades as documented without them."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("dbos", reason="the durable extra (dbos) is not installed")

from tether._errors import OperationFailed
from tether.durable import _dbos_private as dbos_private


def test_every_private_name_is_on_the_installed_dbos(tmp_path) -> None:
    from dbos import _context, _dbos, _error

    from tether.durable import setup, teardown

    setup(f"sqlite:///{tmp_path / 'd.db'}")
    try:
        live = dbos_private.instance()
        assert live is not None
        for name in dbos_private.NAMES:
            owner, _, attr = name.rpartition(".")
            # the instance has the class's names and its own
            target = live if owner == "DBOS" else _context if owner == "_context" else _error if owner == "_error" \
                else _dbos
            assert hasattr(target, attr), f"dbos {_dbos.__name__} has no {name}: re-review tether.durable._dbos_private"
    finally:
        teardown()


def test_without_them_the_guards_say_so_or_do_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from dbos import DBOS, _dbos

    monkeypatch.delattr(DBOS, "_recover_pending_workflows")
    with pytest.raises(OperationFailed, match="cannot adopt a dead worker's runs"):
        dbos_private.recover_pending(["w1"])
    monkeypatch.setattr(_dbos, "_dbos_global_instance", None)
    dbos_private.stop_background_threads()  # nothing to stop: no error
    assert asyncio.run(_tasks()) == []


async def _tasks() -> list:
    return dbos_private.workflow_tasks(asyncio.get_running_loop())
