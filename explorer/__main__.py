import sys

from explorer.cli import main

sys.exit(main())
