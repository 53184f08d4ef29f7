/*
 * Services of the distributed trainer.
 *
 * Tensors travel as raw little-endian bytes with their dtype and shape; the
 * wire layer (wire/) sets the protocol's string and frame limits deliberately.
 * Every call takes one request struct and returns one result struct, so fields
 * can be added without breaking older peers. Names of models, data sets,
 * algorithms and policies are plain strings checked by the receiver.
 */

namespace py trainer_rpc

const i32 PROTOCOL_VERSION = 1

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

/* The run could not finish; nodes_tried lists "host:port" of every node tried. */
exception TrainingFailed {
  1: required string message,
  2: optional list<string> nodes_tried,
}

/* The run was cancelled before it finished. */
exception RunCancelled {
  1: required string message,
}

/* No run with that id on this coordinator. */
exception UnknownRun {
  1: required string message,
}

// ---------------------------------------------------------------- compute node

enum UnitOutcome {
  COMPLETED = 1,   // the update is in the result
  REJECTED = 2,    // the node refused the unit (simulated load): try another node
  CANCELLED = 3,   // the coordinator cancelled the unit while it waited or ran
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
}

struct CancelUnitRequest {
  1: required string run_id,
  2: required string unit_id,
  3: optional i32 attempt,           // absent: every attempt of the unit
}

struct CancelUnitResult {
  1: required i32 cancelled,         // attempts that were waiting or running
}

struct PingRequest {
  1: required i32 protocol_version,
}

struct NodeInfo {
  1: required i32 protocol_version,
  2: required string node_id,
  3: required double load_prob,
  4: required i32 units_running,
  5: required i64 units_completed,
  6: required i64 units_rejected,
  7: required double uptime_seconds,
}

service ComputeNode {
  TrainResult train_with_weights(1: WorkRequest request)
      throws (1: InvalidRequest invalid, 2: VersionMismatch version),
  CancelUnitResult cancel_unit(1: CancelUnitRequest request),
  NodeInfo ping(1: PingRequest request) throws (1: VersionMismatch version),
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
}

struct StatusRequest {
  1: required string run_id,         // "" means the latest run
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
}

struct CancelRunRequest {
  1: required string run_id,
}

struct CancelRunResult {
  1: required bool cancelled,        // false: the run had already ended
}

struct ListRunsRequest {
  1: optional i32 limit,
}

struct ListRunsResult {
  1: required list<RunStatus> runs,
}

service Coordinator {
  RunResult train(1: TrainRequest request)
      throws (1: InvalidRequest invalid, 2: TrainingFailed failed,
              3: RunCancelled cancelled, 4: VersionMismatch version),
  RunStatus status(1: StatusRequest request) throws (1: UnknownRun unknown),
  CancelRunResult cancel(1: CancelRunRequest request) throws (1: UnknownRun unknown),
  ListRunsResult list_runs(1: ListRunsRequest request),
  NodeInfo ping(1: PingRequest request) throws (1: VersionMismatch version),
}
