import os
import sys

from .app import main

if __name__ == "__main__":
    # a warm standby of broker/supervisor.py has everything imported and starts when told
    # (one byte on stdin); it leaves when the supervisor goes away (end of file)
    if os.environ.pop("GPUSHARE_STANDBY", None) and not sys.stdin.buffer.read(1):
        sys.exit(0)
    main()
