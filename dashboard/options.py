"""The coordinator's dashboard options; apart from the server so that a coordinator without
a dashboard never imports the web stack (it adds to every start)."""

from __future__ import annotations

import argparse

from thrift_trainer.wire import arg_types


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "dashboard", "a read-only web dashboard and Prometheus /metrics, served by this process")
    group.add_argument("--dashboard-port", type=arg_types.listen_port, default=None,
                       metavar="PORT", help="serve the dashboard on this port (0: any free port; "
                                            "default: no dashboard)")
    group.add_argument("--dashboard-host", default="127.0.0.1",
                       help="address the dashboard binds (default 127.0.0.1: this machine only)")
