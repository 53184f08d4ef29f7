#!/usr/bin/env python3
"""Start the coordinator: python coordinator_node.py <port> <policy> [options]; --help for more."""

import sys

from thrift_trainer.commands import coordinator

if __name__ == "__main__":
    sys.exit(coordinator())
