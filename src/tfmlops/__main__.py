import sys

from tfmlops.cli import main

if __name__ == "__main__":  # prepare's spawned workers import this module again
    sys.exit(main())
