import sys

from horizonrl.cli import main

sys.exit(main())
