"""Compute nodes as the engine sees them: reaching them, counting them, knowing they live.

* `client`: the seam below the engine (`NodeClient`), with three implementations:
  `thrift_client` (pushed nodes the engine dials), `pull_client` (nodes that lease their
  units) and tests' in-process nodes; every failure is one of `errors`
* `pool`: a node's handle (`NodeHandle`): its client, counters, bench after failures
* `liveness`: alive, suspect or dead, from heartbeats and every other answer
* `membership` (and `membership_service`, its Thrift calls): nodes that register, leave and
  lease; `run_nodes`: the nodes of one run (the nodes file's and the registered ones);
  `quorum`: enough nodes to train, waiting and pausing
* `nodes_file` and `local_host`: compute_nodes.txt; `sent_weights`: which weights a node holds
"""
