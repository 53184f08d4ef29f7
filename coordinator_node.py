#!/usr/bin/env python3
"""Start the coordinator: python coordinator_node.py <port> <policy> [options]; --help for more."""

import sys

from setup_hint import requirements_checked

with requirements_checked():
    from coordinator.cli import main

if __name__ == "__main__":
    sys.exit(main())
