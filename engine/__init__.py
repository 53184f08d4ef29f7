"""The round engine: work units pushed to compute nodes, shared by the coordinator and relays.

A round's units go out on worker threads to the nodes a scheduling policy picks; results
pass the round's update filters and the algorithm combines them. Both the coordinator
process (coordinator/) and a relay node (compute_node/relay.py) run rounds with it; the
engine imports neither of them, and reaches a run store only through `LedgerStore`.

Where things are:

* rounds and streams: `round_engine` (threads, retries, backups, quorum), `work_queue`
  (units, attempts, backups and failure counts under one lock), settled by `round_state`
  (a round's barrier) or `stream_state` (the asynchronous modes' buffer); `stragglers`
  (deadlines, backup thresholds, re-issue); `pass_queue` (sync rounds drawn from passes
  over the data)
* what goes out and comes back: `tasks`; checks of a result: `update_filters`,
  `update_norms`; cancels sent off the critical path: `cancels`
* bookkeeping: `ledger` (the run store's view, one call per event), `attempt_log` (the one
  place an attempt's end is recorded), `progress` and `records` (what status shows),
  `phase_clock` (where a round's time goes)
* scheduling: `policies`; `residual_placement` (topk units back to their node)
* the nodes themselves: `nodes/` (clients, liveness, membership, quorum); before round 1,
  `warm_up`; between rounds, `session_moves`
"""
