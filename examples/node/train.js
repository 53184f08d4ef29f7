#!/usr/bin/env node
// Trains the letters MLP through a coordinator with the stock Thrift library for Node.js,
// follows the run and prints the final metrics. The wire is what every client speaks:
// framed transport, binary protocol, the services of thrift/trainer.thrift (docs/clients.md).
//
//   npm ci && npm run gen
//   node train.js <coordinator_host> <port> [--rounds N] [--config JSON]
//                 [--token-file PATH] [--tls-ca PATH] [--poll SECONDS] [--dead-after SECONDS]
//
// Exit codes: 0 trained, 1 the run or a call failed (one line on stderr), 2 bad arguments,
// 130 cancelled with Ctrl-C (the run is cancelled on the coordinator too).
'use strict';

const crypto = require('crypto');
const fs = require('fs');
const thrift = require('thrift');

let Coordinator;
let ttypes;
try {
  Coordinator = require('./gen-nodejs/Coordinator');
  ttypes = require('./gen-nodejs/trainer_types');
} catch (err) {
  if (err.code !== 'MODULE_NOT_FOUND') throw err;
  fail('the generated code or the thrift package is missing: run `npm ci && npm run gen` ' +
       'in examples/node (npm run gen needs the thrift compiler 0.17)', 2);
}

// The README's recommended letters run: delta averaging (config.yaml's delta_avg section)
// with Adam on the nodes and momentum on the coordinator; keys left out take their
// defaults from config.yaml.
const DEFAULT_CONFIG = {epochs: 5, hidden: [128, 128], eta: 0.005, scale_features: true,
                        local_optimizer: 'adam', server_optimizer: 'momentum',
                        server_momentum: 0.5};
const USAGE = 'usage: node train.js <coordinator_host> <port> [--rounds N] [--config JSON] ' +
              '[--token-file PATH] [--tls-ca PATH] [--poll SECONDS] [--dead-after SECONDS]';

function fail(message, code = 1) {
  console.error(`error: ${message}`);
  process.exit(code);
}

function parseArgs(argv) {
  const args = {rounds: 3, config: DEFAULT_CONFIG, tokenFile: null, tlsCa: null, poll: 1,
                deadAfter: 15};
  const positional = [];
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i];
    if (!flag.startsWith('--')) { positional.push(flag); continue; }
    const value = argv[++i];
    if (value === undefined) fail(`${flag} needs a value\n${USAGE}`, 2);
    if (flag === '--rounds') args.rounds = positiveNumber(flag, value, true);
    else if (flag === '--config') args.config = jsonObject(flag, value);
    else if (flag === '--token-file') args.tokenFile = value;
    else if (flag === '--tls-ca') args.tlsCa = value;
    else if (flag === '--poll') args.poll = positiveNumber(flag, value);
    else if (flag === '--dead-after') args.deadAfter = positiveNumber(flag, value);
    else fail(`unknown option ${flag}\n${USAGE}`, 2);
  }
  if (positional.length !== 2) fail(USAGE, 2);
  [args.host] = positional;
  args.port = positiveNumber('port', positional[1], true);
  return args;
}

function positiveNumber(name, text, integer = false) {
  const value = Number(text);
  if (!(value > 0) || (integer && !Number.isInteger(value))) {
    fail(`${name}: expected a positive ${integer ? 'integer' : 'number'}, got ${text}`, 2);
  }
  return value;
}

function jsonObject(name, text) {
  try {
    const value = JSON.parse(text);
    if (value !== null && typeof value === 'object' && !Array.isArray(value)) return value;
  } catch (err) { /* reported below */ }
  return fail(`${name}: expected a JSON object, e.g. '{"epochs": 5}', got ${text}`, 2);
}

// The shared token, when the coordinator requires one: every request carries it in its
// field 100. As with the Python client, the file wins over TRAINER_TOKEN.
function readToken(tokenFile) {
  if (tokenFile === null) return process.env.TRAINER_TOKEN || null;
  const token = fs.readFileSync(tokenFile, 'utf8').trim();
  if (!token) fail(`token file ${tokenFile} is empty`);
  return token;
}

// One connection: framed transport, binary protocol; TLS when a CA is given. The
// connection retries nothing: a failed call is reported, not silently repeated.
function open(args) {
  // No `timeout` option: it only emits an event; `answer` bounds each call instead.
  const options = {transport: thrift.TFramedTransport, protocol: thrift.TBinaryProtocol};
  const connection = args.tlsCa
    ? thrift.createSSLConnection(args.host, args.port,
                                 {...options, ca: fs.readFileSync(args.tlsCa)})
    : thrift.createConnection(args.host, args.port, options);
  connection.on('error', () => {});  // each call reports errors through `answer`
  return {connection, client: thrift.createClient(Coordinator, connection)};
}

// The answer of one call, or an error when the connection fails or closes first, or when
// `seconds` pass (0: wait as long as it takes, as for train()).
function answer(line, promise, seconds, what) {
  return new Promise((resolve, reject) => {
    const timer = seconds > 0 ? setTimeout(
      () => settle(reject, new Error(`${what}: no answer within ${seconds} s`)),
      seconds * 1000) : null;
    const onError = (err) => settle(reject, new Error(`${what}: ${err.message || err}`));
    const onClose = () => settle(reject, new Error(`${what}: the connection was closed`));
    function settle(done, value) {
      clearTimeout(timer);
      line.connection.removeListener('error', onError);
      line.connection.removeListener('close', onClose);
      done(value);
    }
    line.connection.on('error', onError);
    line.connection.on('close', onClose);
    promise.then((value) => settle(resolve, value), (err) => settle(reject, err));
  });
}

// unref: a pending poll does not keep the process alive once train() has answered.
const sleep = (seconds) => new Promise((resolve) => setTimeout(resolve, seconds * 1000).unref());

// i64 fields arrive as node-int64 objects; the numbers here fit a double.
const num = (value) => (typeof value === 'number' ? value : value.toNumber(true));

// IEEE half precision, which DataView reads only in recent Node.js releases.
function getFloat16(view, offset, littleEndian) {
  const bits = view.getUint16(offset, littleEndian);
  const sign = bits >> 15 ? -1 : 1;
  const exponent = (bits >> 10) & 0x1f;
  const fraction = bits & 0x3ff;
  if (exponent === 0) return sign * 2 ** -14 * (fraction / 1024);
  if (exponent === 0x1f) return fraction ? NaN : sign * Infinity;
  return sign * 2 ** (exponent - 15) * (1 + fraction / 1024);
}

// A Tensor's data: C-order, little-endian values of its dtype (docs/clients.md).
const READERS = {
  float16: [2, (view, offset) => getFloat16(view, offset, true)],
  float32: [4, 'getFloat32'], float64: [8, 'getFloat64'],
  int8: [1, 'getInt8'], int16: [2, 'getInt16'], int32: [4, 'getInt32'],
  int64: [8, 'getBigInt64'], uint8: [1, 'getUint8'], bool: [1, 'getUint8'],
};

function decodeTensor(tensor) {
  const shape = tensor.shape.map(num);
  const reader = READERS[tensor.dtype];
  if (!reader) throw new Error(`tensor ${tensor.name}: no reader for dtype ${tensor.dtype}`);
  const [size, getter] = reader;
  const count = shape.reduce((a, b) => a * b, 1);
  if (tensor.data.length !== count * size) {
    throw new Error(`tensor ${tensor.name}: ${tensor.data.length} bytes for shape [${shape}]`);
  }
  const view = new DataView(tensor.data.buffer, tensor.data.byteOffset, tensor.data.length);
  const values = new Float64Array(count);
  const read = typeof getter === 'function' ? getter : (v, at) => v[getter](at, true);
  for (let i = 0; i < count; i++) values[i] = Number(read(view, i * size));
  return {shape, values};
}

// Follows the run on its own connection while train() blocks on the other; gives up
// when the coordinator has not answered a status call for `deadAfter` seconds.
async function follow(args, runId, token, training) {
  let line = open(args);
  let lastAnswer = Date.now();
  let shown = '';
  let finished = false;
  training.then(() => { finished = true; }, () => { finished = true; });
  while (!finished) {
    await Promise.race([training.catch(() => {}), sleep(args.poll)]);
    if (finished) break;
    try {
      const request = new ttypes.StatusRequest({run_id: runId, token});
      const status = await answer(line, line.client.status(request), 5, 'status');
      lastAnswer = Date.now();
      const error = status.validation_error < 0 ? '-' : status.validation_error.toFixed(4);
      const progress = `round ${status.round}/${status.rounds}  validation error ${error}`;
      if (progress !== shown) {  // once a round
        console.log(`${progress}  units ${num(status.units_done)}/${num(status.units_total)}`);
      }
      shown = progress;
    } catch (err) {
      if (!(err instanceof ttypes.UnknownRun)) {  // UnknownRun: not registered yet
        if (Date.now() - lastAnswer > args.deadAfter * 1000) {
          throw new Error(`lost contact with the coordinator for ${args.deadAfter} s ` +
                          `(${err.message}); run ${runId} may still be going on there`);
        }
        line.connection.destroy();
        line = open(args);
      }
    }
  }
  line.connection.end();
  return training;
}

function printResult(result) {
  console.log(`Final validation error: ${result.validation_error.toFixed(4)}`);
  console.log(`Rounds: ${result.rounds}   Wall time: ${result.wall_seconds.toFixed(1)} s   ` +
              `Run: ${result.run_id}`);
  console.log('round  validation_error  validation_loss  train_loss  seconds');
  for (const r of result.history) {
    console.log(`${String(num(r.round)).padStart(5)}  ${r.validation_error.toFixed(4).padStart(16)}` +
                `  ${r.validation_loss.toFixed(4).padStart(15)}  ${r.train_loss.toFixed(4).padStart(10)}` +
                `  ${r.seconds.toFixed(2).padStart(7)}`);
  }
  console.log('node                  accepted  rejected  failed   samples');
  for (const n of result.nodes) {
    console.log(`${n.node.padEnd(20)}  ${String(num(n.accepted)).padStart(8)}  ` +
                `${String(num(n.rejected)).padStart(8)}  ${String(num(n.failed)).padStart(6)}  ` +
                `${String(num(n.samples ?? 0)).padStart(8)}`);
  }
  for (const tensor of result.weights) {
    const {shape, values} = decodeTensor(tensor);
    const meanAbs = values.reduce((sum, v) => sum + Math.abs(v), 0) / Math.max(values.length, 1);
    console.log(`weights ${tensor.name} ${tensor.dtype} [${shape.join(', ')}] ` +
                `mean |w| ${meanAbs.toPrecision(4)}`);
  }
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const token = readToken(args.tokenFile);
  const runId = crypto.randomBytes(6).toString('hex');
  const version = ttypes.PROTOCOL_VERSION;
  const control = open(args);
  await answer(control, control.client.ping(
    new ttypes.PingRequest({protocol_version: version, token})), 10, 'ping');
  process.on('SIGINT', () => cancel(args, runId, token));
  const request = new ttypes.TrainRequest({
    protocol_version: version, run_id: runId, algorithm: 'delta_avg', model: 'mlp',
    dataset: 'letters', rounds: args.rounds, config_json: JSON.stringify(args.config),
    outputs_json: JSON.stringify({checkpoint_every: 1}), token,
  });
  console.log(`training run ${runId}: ${args.rounds} rounds of ${request.config_json}`);
  const trainLine = open(args);
  // train() answers when the run ends, minutes or hours later: no timeout on it; the
  // status calls on the other connection notice a coordinator that stopped answering.
  const training = answer(trainLine, trainLine.client.train(request), 0, 'train');
  const result = await follow(args, runId, token, training);
  printResult(result);
  trainLine.connection.end();
  control.connection.end();
}

function cancel(args, runId, token) {
  console.error(`cancelling run ${runId} ...`);
  const control = open(args);  // a fresh one: the server may have closed an idle one
  answer(control, control.client.cancel(new ttypes.CancelRunRequest({run_id: runId, token})),
         5, 'cancel')
    .catch((err) => console.error(`could not cancel: ${err.message}`))
    .finally(() => process.exit(130));
}

module.exports = {decodeTensor};
if (require.main === module) main().catch((err) => fail(err.message || String(err)));
