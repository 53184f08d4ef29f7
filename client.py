#!/usr/bin/env python3
"""The client: python client.py <coordinator_ip> <port> <data_dir> <rounds> <epochs> <h> <eta>,
or python client.py <coordinator_ip> <port> --config configs/<recipe>.yaml [--set KEY=VALUE].

Run with --help for every option, and `client.py status|runs|cancel|evaluate|predict --help`.
"""

import sys

from thrift_trainer.commands import client

if __name__ == "__main__":
    sys.exit(client())
