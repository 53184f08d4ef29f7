#!/usr/bin/env python3
"""Start a compute node: python compute_node.py <port> <load_prob> [options]; --help for more."""

import sys

from compute_node.threads import limit_threads, threads_from_argv

# Before numpy or torch loads (compute_node.cli imports them): they read it only then.
limit_threads(threads_from_argv(sys.argv[1:]))

from setup_hint import requirements_checked  # noqa: E402

with requirements_checked():
    from compute_node.cli import main

if __name__ == "__main__":
    sys.exit(main())
