import sys

from explorer.worker._train import main

sys.exit(main())
