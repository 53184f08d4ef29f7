#!/usr/bin/env python3
"""Start a compute node: python compute_node.py <port> <load_prob> [options]; --help for more."""

import sys

from thrift_trainer.commands import node

if __name__ == "__main__":
    sys.exit(node())
