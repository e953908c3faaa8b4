from tfmlops.cli import entry

if __name__ == "__main__":  # prepare's spawned workers import this module again
    entry()
