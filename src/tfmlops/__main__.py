import sys

from tfmlops.cli import main

sys.exit(main())
