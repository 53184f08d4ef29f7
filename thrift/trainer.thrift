/*
 * Services of the distributed trainer.
 *
 * Tensors travel as raw little-endian bytes with their dtype and shape; the
 * wire layer (wire/) sets the protocol's string and frame limits deliberately, and
 * sends a message bigger than a chunk as a sequence of frames (wire/chunks.py).
 * Every call takes one request struct and returns one result struct, so fields
 * can be added without breaking older peers. Names of models, data sets,
 * algorithms and policies are plain strings checked by the receiver.
 */

namespace py trainer_rpc
namespace java trainer.rpc
namespace js trainer_rpc
namespace go trainerrpc

// 4: messages bigger than a chunk travel as announced sequences of frames
const i32 PROTOCOL_VERSION = 4

struct Tensor {
  1: required string name,
  2: required string dtype,          // numpy dtype name: "float32", "float64", "int64", ...
  3: required list<i64> shape,
  4: required binary data,           // C-order, little-endian
}

/* A request whose fields are wrong; the message says how to fix it. */
exception InvalidRequest {
  1: required string message,
}

/* The caller's protocol version differs from the receiver's. */
exception VersionMismatch {
  1: required string message,
  2: required i32 expected,
  3: required i32 received,
}

/* The run could not finish; nodes_tried lists "host:port" of every node tried. With
   `leader` set, this coordinator does not lead its run store (it stands by, or lost the
   lead mid-run): the run goes on at the leader, "host:port" when known (else ""). */
exception TrainingFailed {
  1: required string message,
  2: optional list<string> nodes_tried,
  3: optional string leader,
}

/* The run was cancelled before it finished. */
exception RunCancelled {
  1: required string message,
}

/* No run with that id on this coordinator. */
exception UnknownRun {
  1: required string message,
}

/* The call lacked the shared token this server requires, or carried a wrong one. */
exception Unauthorized {
  1: required string message,
}

// ---------------------------------------------------------------- compute node

enum UnitOutcome {
  COMPLETED = 1,   // the update is in the result
  REJECTED = 2,    // the node refused the unit (simulated load): try another node
  CANCELLED = 3,   // the coordinator cancelled the unit while it waited or ran
  NEED_WEIGHTS = 4, // weights_cached was set but the node does not hold that version:
                    // send the task again with its weights
  UNFIT = 5,       // the node cannot serve this run (it lacks a plug-in the run names,
                   // builds another model or holds another copy of the data set): the
                   // message says why; leave the node out of the run
}

struct WorkRequest {
  1: required i32 protocol_version,
  2: required string run_id,
  3: required i64 round,             // model version the weights belong to
  4: required string unit_id,
  5: required i32 attempt,
  6: required string algorithm,      // e.g. "delta_avg"
  7: required string model,          // e.g. "mlp"
  8: required string dataset,        // data set folder under the node's data root
  9: required string unit_path,      // file of the unit, relative to the data set folder
  10: required string config_json,   // hyper-parameters of the algorithm and model
  11: required list<Tensor> weights,
  12: required i32 scheduling_policy, // 1 random, 2 load balancing, 3 adaptive
  13: optional i64 index_start,      // index range of the unit inside unit_path, if any
  14: optional i64 index_stop,
  15: optional i64 model_version,    // global-model version the weights are (async modes
                                     // count versions per applied update; sync: round - 1)
  16: optional bool weights_cached,  // weights left empty: use the weights of this run and
                                     // model_version the node kept from an earlier unit
  17: optional i32 part,             // compute only share `part` (0-based) of `parts` equal
  18: optional i32 parts,            // shares of the unit (a relay's member, local rounds)
  19: optional list<Tensor> expected_update, // the tensors a result's update must have (name,
                                     // dtype, shape; no data), as the coordinator checks it:
                                     // a relay checks its members' results against them
  20: optional string client,        // the federated client whose data the unit trains on
                                     // ("client7"): its examples, as the node's partition
                                     // of the run's data set deals them (clients section)
  21: optional string kind,          // "evaluate": score the weights on the client's
                                     // validation part and change nothing (no update);
                                     // absent: train, as before; "secagg_keys",
                                     // "secagg_shares", "secagg_unmask": a phase of a
                                     // secure-aggregation round (docs/privacy.md)
  22: optional binary secure_aggregation, // a secure-aggregation round's data for the
                                     // client (JSON): a phase's input, or, on a training
                                     // unit, how to mask its update
  100: optional string token,       // the shared token, when the server requires one
}

struct TrainResult {
  1: required bool accepted,
  2: required UnitOutcome outcome,
  3: required list<Tensor> update,   // empty unless COMPLETED
  4: required i64 num_samples,
  5: required double loss,
  6: required double error,
  7: required double compute_seconds,
  8: required double delay_seconds,  // time spent in the simulated load delay
  9: optional string message,        // why the unit was rejected or cancelled
  10: optional string node_id,
  11: optional i64 model_version,    // the model_version of the request it answers
  12: optional double loss_before,   // a federated client's unit: the loss of the weights
                                     // it was sent on its training examples, before training
  13: optional binary secure_aggregation, // a secure-aggregation phase's answer (JSON)
}

/* Before round 1: can this node serve the run? (Its plug-ins, model and data set.) */
struct RunCheckRequest {
  1: required i32 protocol_version,
  2: required string run_id,
  3: required string algorithm,
  4: required string model,
  5: required string dataset,
  6: required string config_json,    // as every unit of the run carries it
  100: optional string token,       // the shared token, when the server requires one
}

struct RunCheck {
  1: required bool ok,
  2: optional string problem,        // why the node cannot serve the run, one line
  3: optional map<string, string> plugins, // plug-in modules it allows -> their versions
  4: optional string model_fingerprint,    // a torch model's parameter names, shapes, dtypes
  5: optional string data_fingerprint,     // its copy of the data set
  6: optional i64 data_size,               // examples of the data set's training part
  7: optional string partition_fingerprint, // its partition of the data set into the run's
                                            // clients (clients section), if the run has them
  8: optional list<string> clients,         // the clients it holds, when it holds only some
                                            // (started with --clients, or its own data is
                                            // its client: placement nodes); absent: every one
  9: optional map<string, i64> client_sizes, // placement nodes: its clients' training examples
  10: optional map<string, string> client_labels, // ... and label counts, as JSON objects
                                            // (absent under --private-label-counts)
  11: optional map<string, string> client_fingerprints, // placement nodes: a fingerprint
                                            // of each client's data (a client of one name on
                                            // two nodes must be the same data)
}

struct CancelUnitRequest {
  1: required string run_id,
  2: required string unit_id,
  3: optional i32 attempt,           // absent: every attempt of the unit
  100: optional string token,       // the shared token, when the server requires one
}

struct CancelUnitResult {
  1: required i32 cancelled,         // attempts that were waiting or running
}

struct PingRequest {
  1: required i32 protocol_version,
  2: optional string warm_up,       // a model the coordinator's run will train: the node
                                    // loads its libraries and builds it in the background
  100: optional string token,       // the shared token, when the server requires one
}

struct NodeInfo {
  1: required i32 protocol_version,
  2: required string node_id,
  3: required double load_prob,
  4: required i32 units_running,
  5: required i64 units_completed,
  6: required i64 units_rejected,
  7: required double uptime_seconds,
  8: optional list<string> delaying, // "run_id/unit_id/attempt" of units in their load delay
  9: optional map<string, i64> progress, // "run_id/unit_id/attempt" of units held -> the
                                         // node's batches done so far (grows as it works)
  10: optional bool warming_up,     // still loading libraries / building a model (warm_up)
  11: optional string role,         // what computes its units, when more than the node
                                    // itself: "2 local workers", "relay of 3 nodes"
  12: optional list<NodeSummary> members, // a relay's group as its own engine counts it
                                          // (since the relay started)
}


/* MD-GAN and other algorithms that keep per-run state on a node between units
   (a discriminator and its optimizer): a session is named by run and slot. */
struct SessionRequest {
  1: required i32 protocol_version,
  2: required string run_id,
  3: required string session,        // slot name, e.g. "d3"
  100: optional string token,
}

struct SessionState {
  1: required string run_id,
  2: required string session,
  3: required list<Tensor> tensors,  // parameters, buffers and optimizer state
  4: required i64 bytes,             // payload bytes of the tensors
}

/* Install tensors as a session's next state; they take effect from swap_id on. */
struct ImportSessionRequest {
  1: required i32 protocol_version,
  2: required string run_id,
  3: required string session,
  4: required i64 swap_id,
  5: required list<Tensor> tensors,
  100: optional string token,
}

/* Send this node's session to another node (node-to-node swap). */
struct SendSessionRequest {
  1: required i32 protocol_version,
  2: required string run_id,
  3: required string session,        // the session to send
  4: required string target_host,
  5: required i32 target_port,
  6: required string target_session, // its name on the target
  7: required i64 swap_id,
  100: optional string token,
}

struct SessionAck {
  1: required bool ok,
  2: required i64 bytes,             // payload bytes moved
  3: optional string message,
}

struct DropSessionsRequest {
  1: required i32 protocol_version,
  2: required string run_id,
  100: optional string token,
}

service ComputeNode {
  TrainResult train_with_weights(1: WorkRequest request)
      throws (1: InvalidRequest invalid, 2: VersionMismatch version, 3: Unauthorized denied),
  CancelUnitResult cancel_unit(1: CancelUnitRequest request) throws (3: Unauthorized denied),
  NodeInfo ping(1: PingRequest request)
      throws (1: VersionMismatch version, 3: Unauthorized denied),
  SessionState export_session(1: SessionRequest request)
      throws (1: InvalidRequest invalid, 2: VersionMismatch version, 3: Unauthorized denied),
  SessionAck import_session(1: ImportSessionRequest request)
      throws (1: InvalidRequest invalid, 2: VersionMismatch version, 3: Unauthorized denied),
  SessionAck send_session(1: SendSessionRequest request)
      throws (1: InvalidRequest invalid, 2: VersionMismatch version, 3: Unauthorized denied),
  SessionAck drop_sessions(1: DropSessionsRequest request)
      throws (2: VersionMismatch version, 3: Unauthorized denied),
  RunCheck check_run(1: RunCheckRequest request)
      throws (2: VersionMismatch version, 3: Unauthorized denied),
}

// ----------------------------------------------------------------- coordinator

struct TrainRequest {
  1: required i32 protocol_version,
  2: required string run_id,         // chosen by the client, so it can follow the run
  3: required string algorithm,      // "delta_avg"
  4: required string model,          // "mlp"
  5: required string dataset,        // folder under the coordinator's data root
  6: required i32 rounds,
  7: required string config_json,    // epochs, hidden sizes, eta and the other options
  8: optional string outputs_json,   // sample_every, checkpoint_every, eval_every, eval_n
  100: optional string token,       // the shared token, when the server requires one
}

struct NodeSummary {
  1: required string node,           // host:port
  2: required i64 accepted,
  3: required i64 rejected,
  4: required i64 delayed,
  5: required i64 failed,
  6: required i64 cancelled,
  7: required double busy_seconds,     // from call to answer, summed over calls
  8: optional double compute_seconds,  // spent in the unit maths, as the node reports
  9: optional double delay_seconds,    // spent in simulated load delays, as the node reports
  10: optional string state,           // alive, suspect or dead, from heartbeats
  11: optional double silent_seconds,  // since the node last answered anything
  12: optional bool pull,              // the node leases units (it accepts no connections)
  13: optional string role,            // as the node's ping says (NodeInfo.role)
  14: optional list<NodeSummary> members, // a relay's group, as its last ping said
  15: optional i64 samples,            // samples (rows, images) of the units it completed
  16: optional string note,            // why the node is left out of the run, if it is
  17: optional string refused,         // why its last refused result was refused (the node
                                       // was benched for it), if one was
}

struct RoundMetrics {
  1: required i64 round,
  2: required double validation_error,
  3: required double validation_loss,
  4: required double train_loss,
  5: required double seconds,
  6: optional double update_seconds,   // applying the averaged update and evaluating
  7: optional map<string, double> scores, // offline scores when due (e.g. IS, FID)
}

struct RunResult {
  1: required string run_id,
  2: required double validation_error,
  3: required i32 rounds,
  4: required double wall_seconds,
  5: required list<RoundMetrics> history,
  6: required list<NodeSummary> nodes,
  7: required list<Tensor> weights,  // final model
  8: required string model_json,     // what is needed to rebuild the model from the weights
  9: required string run_dir,        // the coordinator's folder for this run
  10: optional i64 bytes_up,         // result (update) bytes nodes sent, at the transport
  11: optional i64 bytes_down,       // work request (weights) bytes sent to nodes
  12: optional string aggregation,   // the rule that combined the updates, e.g. "mean"
  13: optional string compression_json, // the compression settings the run used
  14: optional RunStatus final_status, // the run at its end, counted as `status` counts it
}

struct StatusRequest {
  1: required string run_id,         // "" means the latest run
  100: optional string token,       // the shared token, when the server requires one
}

/* A unit that is not settled yet, as the run store sees it: why a round is waiting. */
struct UnitInfo {
  1: required i64 round,
  2: required string unit_id,
  3: required string status,         // pending, in_progress, failed, stale
  4: optional string node,           // host:port of its latest attempt
  5: required double age_seconds,    // since its latest change
  6: required i32 attempts,
  7: required i32 failures,
  8: optional string last_reason,
}

struct RunStatus {
  1: required string run_id,
  2: required string state,          // "running", "completed", "failed", "cancelled"
  3: required i32 round,             // rounds completed
  4: required i32 rounds,
  5: required double validation_error, // after the latest round; -1 before the first
  6: required i64 units_done,
  7: required i64 units_total,       // units in all rounds
  8: required i64 rejected,
  9: required i64 failed,
  10: required i64 in_flight,
  11: required double elapsed_seconds,
  12: required list<NodeSummary> nodes,
  13: optional string message,       // why a run failed
  14: optional list<UnitInfo> unfinished,
  15: optional map<string, i64> ledger, // units per status, over all rounds
  16: optional i64 stale,              // results that came back after their round had ended
  17: optional i64 cancelled,          // attempts called off (backups that lost, quorum)
  18: optional double epoch,           // passes over the data set so far, where it applies
  19: optional double train_loss,      // mean loss the nodes reported in the latest round
  20: optional string mode,            // schedule.mode: "sync", "async" or "buffered"
  21: optional i64 model_version,      // asynchronous modes: versions of the global model
  22: optional i32 pass_index,         // asynchronous modes: the newest pass over the data
  23: optional i64 todo,               // its units waiting to be sent
  24: optional i64 pending,            // units out on nodes (of any pass)
  25: optional i64 done,               // units of the newest pass whose result was kept
  26: optional string leader,          // coordinators sharing a PostgreSQL store: "host:port"
                                       // of the one that leads (this one's when it leads)
  27: optional map<string, double> clients, // a run with federated clients: its latest
                                       // round's clients_trained, client_loss_mean,
                                       // client_loss_worst10 and client_loss_std, and its
                                       // latest federated evaluation's figures
                                       // (federated_val_accuracy, ...; eval_round)
  28: optional i64 discarded,          // units given up after max_unit_failures failures:
                                       // their rounds went on without them
  29: optional string discard_reason,  // the latest one's: "unit <id> on <node>: <why>"
  30: optional list<RoundMetrics> recent_rounds, // the latest rounds' metrics (at most 64,
                                       // without scores), so that a client polling slower
                                       // than rounds end still shows every round
  31: optional string algorithm,       // the run's algorithm, e.g. "delta_avg"
  32: optional string model,           // the run's model, e.g. "mlp" or "my_models:Net"
}

struct CancelRunRequest {
  1: required string run_id,
  100: optional string token,       // the shared token, when the server requires one
}

struct CancelRunResult {
  1: required bool cancelled,        // false: the run had already ended
}

struct ListRunsRequest {
  1: optional i32 limit,
  100: optional string token,       // the shared token, when the server requires one
}

struct ListRunsResult {
  1: required list<RunStatus> runs,
}


/* Membership and pull mode: a node announces itself, heartbeats, and (when it cannot
   accept connections) leases units from the coordinator and submits their results. */
struct RegisterRequest {
  1: required i32 protocol_version,
  2: required string node_id,
  3: required bool pull,             // true: the node dials out and leases units
  4: optional string host,           // where a push node listens
  5: optional i32 port,
  6: optional double load_prob,
  7: optional string device,
  8: optional string clients,        // a pull node started with --clients: the federated
                                     // client indices it holds, e.g. "0-49,60"; absent: every one
  100: optional string token,
}

struct RegisterResult {
  1: required string node,           // the name the coordinator gives the node
  2: required double heartbeat_seconds, // how often to heartbeat
  3: required double suspect_seconds,   // silence after which the node is suspect
  4: required double dead_seconds,      // ... and dead: its units are reclaimed
  5: optional string secret,            // this registration's own: the node's later calls
                                        // (heartbeat, lease, submit, leave) carry it, so no
                                        // other node can act for it
  6: optional string leader,            // set by a coordinator that stands by (coordinators
                                        // sharing a PostgreSQL store): nothing was registered;
                                        // register with the leader, "host:port" ("" while
                                        // none leads)
}

struct HeartbeatRequest {
  1: required i32 protocol_version,
  2: required string node,
  3: required i32 units_running,
  4: optional list<string> delaying, // "run_id/unit_id/attempt" of units in their load delay
  5: optional map<string, i64> progress, // as NodeInfo.progress
  6: optional string secret,         // RegisterResult.secret of the node's registration
  100: optional string token,
}

struct HeartbeatResult {
  1: required bool known,            // false: the coordinator forgot the node; register again
  2: optional list<string> cancel,   // "run_id/unit_id/attempt" of leased units to give up
}

struct LeaseRequest {
  1: required i32 protocol_version,
  2: required string node,
  3: required double wait_seconds,   // how long the call may wait for a unit
  4: optional string secret,         // RegisterResult.secret of the node's registration
  5: optional i64 max_message_bytes, // the largest message the node takes: a unit whose
                                     // request is bigger leaves the node out of its run
  100: optional string token,
}

/* A ComputeNode call for a pull node, which takes no connections: it leases the call
   like a unit, runs it on itself and hands the answer back with submit_call. */
struct NodeCall {
  1: required string call_id,
  2: required string method,         // export_session, import_session, drop_sessions
  3: required binary request,        // the method's request struct, binary protocol
}

struct LeaseResult {
  1: required bool known,            // false: register again
  2: optional WorkRequest work,      // absent: nothing to do yet
  3: optional double deadline_seconds, // the lease expires this long after it was given
  4: optional NodeCall call,         // instead of work: a call to run
}

struct CallResult {
  1: required i32 protocol_version,
  2: required string node,
  3: required string call_id,
  4: optional binary result,         // the method's result struct, binary protocol
  5: optional string error,          // InvalidRequest's message, if it raised
  6: optional string secret,         // RegisterResult.secret of the node's registration
  100: optional string token,
}

struct SubmitRequest {
  1: required i32 protocol_version,
  2: required string node,
  3: required string run_id,
  4: required string unit_id,
  5: required i32 attempt,
  6: required TrainResult result,
  7: optional string error,          // the unit could not run here (InvalidRequest's message)
  8: optional string secret,         // RegisterResult.secret of the node's registration
  100: optional string token,
}

struct SubmitResult {
  1: required bool accepted,         // false: the lease had expired or the unit was settled
  2: optional string message,
}

struct LeaveRequest {
  1: required i32 protocol_version,
  2: required string node,
  3: optional string secret,         // RegisterResult.secret of the node's registration
  100: optional string token,
}

struct LeaveResult {
  1: required bool known,
}

service Coordinator {
  RunResult train(1: TrainRequest request)
      throws (1: InvalidRequest invalid, 2: TrainingFailed failed,
              3: RunCancelled cancelled, 4: VersionMismatch version, 5: Unauthorized denied),
  RunStatus status(1: StatusRequest request)
      throws (1: UnknownRun unknown, 5: Unauthorized denied),
  CancelRunResult cancel(1: CancelRunRequest request)
      throws (1: UnknownRun unknown, 5: Unauthorized denied),
  ListRunsResult list_runs(1: ListRunsRequest request) throws (5: Unauthorized denied),
  NodeInfo ping(1: PingRequest request)
      throws (1: VersionMismatch version, 5: Unauthorized denied),
  RegisterResult register_node(1: RegisterRequest request)
      throws (1: InvalidRequest invalid, 4: VersionMismatch version, 5: Unauthorized denied),
  HeartbeatResult heartbeat(1: HeartbeatRequest request)
      throws (4: VersionMismatch version, 5: Unauthorized denied),
  LeaseResult lease_unit(1: LeaseRequest request)
      throws (4: VersionMismatch version, 5: Unauthorized denied),
  SubmitResult submit_result(1: SubmitRequest request)
      throws (1: InvalidRequest invalid, 4: VersionMismatch version, 5: Unauthorized denied),
  SubmitResult submit_call(1: CallResult request)
      throws (4: VersionMismatch version, 5: Unauthorized denied),
  LeaveResult leave(1: LeaveRequest request)
      throws (4: VersionMismatch version, 5: Unauthorized denied),
}
