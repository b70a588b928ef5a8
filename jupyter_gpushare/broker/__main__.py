import gc
import logging
import os
import sys

from .app import BrokerApp, main
from .ops.standby import wait_for_go


def _warm_up() -> None:
    """What a standby can do before it is needed: import what the start imports lazily,
    and move everything imported out of the garbage collector's way."""
    import sqlalchemy.dialects.sqlite  # noqa: F401

    from .. import discovery, policy  # noqa: F401

    gc.collect()
    gc.freeze()


if __name__ == "__main__":
    # a warm standby of broker/ops/supervisor.py has everything imported and starts when told
    # (one byte on stdin); it leaves when the supervisor goes away (end of file)
    if os.environ.pop("GPUSHARE_STANDBY", None):
        _warm_up()
        app = BrokerApp.instance()
        app.initialize(sys.argv[1:])
        app.ahead.prepare(app)
        if not wait_for_go(sys.stdin.buffer, lambda: app.ahead.prepare(app)):
            sys.exit(0)
        app.start()
    else:
        main()
    # it stopped cleanly: every write is committed and the database closed. Leave without
    # the interpreter's teardown of every module (~0.3 s of CPU) that would keep the next
    # broker (its supervisor's restart after a SIGTERM) from starting
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
