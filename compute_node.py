#!/usr/bin/env python3
"""Start a compute node: python compute_node.py <port> <load_prob> [options]; --help for more."""

import sys

from compute_node.cli import main

if __name__ == "__main__":
    sys.exit(main())
