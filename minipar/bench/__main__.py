"""`python -m minipar.bench ...`: the same as `minipar bench ...`."""

import argparse
import sys

from minipar.bench import configure, main

parser = argparse.ArgumentParser(prog="minipar bench")
configure(parser)
sys.exit(main(parser.parse_args()))
