"""``python -m explorer.worker.zygote``: see :mod:`explorer.worker._zygote`."""

import sys

from explorer.worker._zygote import main

if __name__ == "__main__":
    sys.exit(main())
