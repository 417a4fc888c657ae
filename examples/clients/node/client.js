#!/usr/bin/env node
// RFT Mesh from Node.js, with nothing but the official gRPC packages and the .proto files.
//
// 1. pushes whole GRPO groups of valid experiences into a running buffer (`Put`, or the client-streaming
//    `PutExperiences` with --stream): prompt + response tokens, response-length logprobs and action_mask,
//    a reward and the model_version;
// 2. leases them back with `GetBatch` under its own consumer group, checks they are the ones it sent
//    (bit-equal, whole groups) and acks the leases (`Ack`);
// 3. reads the run state from the synchronizer (`GetRunState`) when --synchronizer is given;
// 4. prints one JSON summary line on stdout. Any failure prints {"ok": false, ...} on stderr and exits 1
//    (2 for bad usage).
//
// The contracts are loaded at run time from protos/rft/v1/*.proto (@grpc/proto-loader, no codegen).
// Every call has a deadline; a bearer token (--token or RFT_AUTH_TOKEN) goes in `authorization` metadata.
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const { parseArgs } = require('node:util');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const USAGE = `usage: node client.js --buffer HOST:PORT [--synchronizer HOST:PORT] [options]

  --buffer HOST:PORT          buffer service address (required)
  --synchronizer HOST:PORT    synchronizer service address; GetRunState is skipped without it
  --token TOKEN               bearer token (default: RFT_AUTH_TOKEN)
  --ca-file FILE              CA bundle: use TLS and verify the servers (default: plaintext)
  --deadline-ms MS            deadline of each call (default 10000)
  --groups N                  GRPO groups to push (default 2)
  --group-size N              experiences per group, i.e. repeat_times (default 4)
  --prompt-length N           prompt tokens per experience (default 5)
  --response-length N         response tokens per experience (default 7)
  --vocab-size N              token ids are drawn below this; declared on the batch (default 256)
  --model-version N           model_version stamped on each experience (default 0)
  --consumer-group NAME       consumer group used to lease them back (default node-client; the buffer
                              must declare it in services.buffer.consumer_groups)
  --lease-size N              experiences asked for per GetBatch (default 512, at least the number
                              pushed): the group sees every stored experience, so a backlog drains fast
  --producer-id ID            producer and explorer id of the experiences (default node-client)
  --stream                    push with the client-streaming PutExperiences (one batch per group)
  --no-consume                only push; do not lease and ack
  --seed N                    seed of the generated experiences (default 1)
  --protos DIR                folder holding rft/v1/*.proto (default: the repository's protos/)
  --help`;

class UsageError extends Error {}

function intOption(values, name, fallback, min) {
  const raw = values[name];
  if (raw === undefined) return fallback;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min) throw new UsageError(`--${name} must be an integer >= ${min}, got ${raw}`);
  return n;
}

function parseCli(argv) {
  const { values } = parseArgs({
    args: argv,
    options: {
      buffer: { type: 'string' },
      synchronizer: { type: 'string' },
      token: { type: 'string' },
      'ca-file': { type: 'string' },
      'cert-file': { type: 'string' },
      'key-file': { type: 'string' },
      'deadline-ms': { type: 'string' },
      groups: { type: 'string' },
      'group-size': { type: 'string' },
      'prompt-length': { type: 'string' },
      'response-length': { type: 'string' },
      'vocab-size': { type: 'string' },
      'model-version': { type: 'string' },
      'consumer-group': { type: 'string' },
      'lease-size': { type: 'string' },
      'producer-id': { type: 'string' },
      stream: { type: 'boolean', default: false },
      'no-consume': { type: 'boolean', default: false },
      seed: { type: 'string' },
      protos: { type: 'string' },
      help: { type: 'boolean', default: false },
    },
    strict: true,
  });
  if (values.help) return { help: true };
  if (!values.buffer) throw new UsageError('--buffer HOST:PORT is required');
  if (Boolean(values['cert-file']) !== Boolean(values['key-file'])) {
    throw new UsageError('--cert-file and --key-file go together (the client certificate and its key)');
  }
  return {
    buffer: values.buffer,
    synchronizer: values.synchronizer || '',
    token: values.token ?? process.env.RFT_AUTH_TOKEN ?? '',
    caFile: values['ca-file'] || process.env.RFT_TLS_CA_FILE || '',
    certFile: values['cert-file'] || process.env.RFT_TLS_CLIENT_CERT_FILE || '',
    keyFile: values['key-file'] || process.env.RFT_TLS_CLIENT_KEY_FILE || '',
    deadlineMs: intOption(values, 'deadline-ms', 10000, 1),
    groups: intOption(values, 'groups', 2, 1),
    groupSize: intOption(values, 'group-size', 4, 1),
    promptLength: intOption(values, 'prompt-length', 5, 1),
    responseLength: intOption(values, 'response-length', 7, 1),
    vocabSize: intOption(values, 'vocab-size', 256, 2),
    modelVersion: intOption(values, 'model-version', 0, 0),
    consumerGroup: values['consumer-group'] || 'node-client',
    leaseSize: intOption(values, 'lease-size', 512, 1),
    producerId: values['producer-id'] || 'node-client',
    stream: values.stream,
    consume: !values['no-consume'],
    seed: intOption(values, 'seed', 1, 0),
    protos: path.resolve(values.protos || path.join(__dirname, '..', '..', '..', 'protos')),
  };
}

// --- contracts -------------------------------------------------------------------------------------

function loadContracts(protosDir) {
  const files = ['buffer.proto', 'synchronizer.proto'].map((f) => path.join('rft', 'v1', f));
  for (const f of files) {
    if (!fs.existsSync(path.join(protosDir, f))) throw new UsageError(`${f} not found under ${protosDir} (--protos)`);
  }
  const definition = protoLoader.loadSync(files, {
    includeDirs: [protosDir],
    keepCase: true, // field names exactly as in the .proto (snake_case)
    longs: Number, // int64 values of this demo are small
    enums: String,
    defaults: true,
    oneofs: true,
  });
  return grpc.loadPackageDefinition(definition).rft.v1;
}

// --- calls with deadlines and the bearer token ------------------------------------------------------

function makeCaller(opts) {
  const metadata = () => {
    const md = new grpc.Metadata();
    if (opts.token) md.set('authorization', `Bearer ${opts.token}`);
    return md;
  };
  const options = () => ({ deadline: Date.now() + opts.deadlineMs, waitForReady: true });
  const unary = (client, method, request) =>
    new Promise((resolve, reject) => {
      client[method](request, metadata(), options(), (err, reply) => {
        if (err) reject(Object.assign(err, { rpc: method }));
        else resolve(reply);
      });
    });
  const clientStream = (client, method, requests) =>
    new Promise((resolve, reject) => {
      const call = client[method](metadata(), options(), (err, reply) => {
        if (err) reject(Object.assign(err, { rpc: method }));
        else resolve(reply);
      });
      for (const r of requests) call.write(r);
      call.end();
    });
  return { unary, clientStream };
}

// TLS when a CA is given; with a certificate and its key too, mutual TLS (a server with
// services.tls.client_auth refuses a client without one).
function credentials(opts) {
  if (!opts.caFile) return grpc.credentials.createInsecure();
  const read = (f) => (f ? fs.readFileSync(f) : null);
  return grpc.credentials.createSsl(read(opts.caFile), read(opts.keyFile), read(opts.certFile));
}

// --- experiences ------------------------------------------------------------------------------------

function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// `groups` whole GRPO groups: tokens (P + R,), logprobs and action_mask (R,), a reward per sample.
function makeGroups(opts, runTag) {
  const rand = mulberry32(opts.seed);
  const groups = [];
  for (let g = 0; g < opts.groups; g++) {
    const groupId = `${runTag}-g${g}`;
    const prompt = Array.from({ length: opts.promptLength }, () => Math.floor(rand() * opts.vocabSize));
    const experiences = [];
    for (let i = 0; i < opts.groupSize; i++) {
      const response = Array.from({ length: opts.responseLength }, () => Math.floor(rand() * opts.vocabSize));
      experiences.push({
        eid: {
          batch_id: runTag,
          task_id: `task-${g}`,
          run_id: i,
          suffix: String(i),
          group_id: groupId,
          explorer_id: opts.producerId,
        },
        tokens: [...prompt, ...response],
        prompt_length: opts.promptLength,
        // float32 values, so what comes back compares exactly
        logprobs: response.map(() => Math.fround(-rand() * 5)),
        action_mask: response.map(() => true),
        reward: opts.groupSize > 1 ? i / (opts.groupSize - 1) : 1.0,
        model_version: opts.modelVersion,
        info: { source: 'node-client' },
      });
    }
    groups.push(experiences);
  }
  return groups;
}

function uid(exp) {
  return `${exp.eid.group_id}/${exp.eid.suffix}`;
}

function sameExperience(a, b) {
  const eq = (x, y) => x.length === y.length && x.every((v, i) => v === y[i]);
  return (
    eq(a.tokens, b.tokens) &&
    a.prompt_length === b.prompt_length &&
    eq(a.logprobs, b.logprobs) &&
    eq(a.action_mask, b.action_mask) &&
    a.reward === b.reward &&
    Number(a.model_version) === Number(b.model_version)
  );
}

function statsSummary(stats) {
  const keys = ['size', 'accepted', 'rejected', 'pending_leases', 'pending_experiences', 'acked', 'store'];
  return Object.fromEntries(keys.map((k) => [k, stats[k]]));
}

// --- the run ----------------------------------------------------------------------------------------

async function pushAndConsume(rft, call, opts) {
  const buffer = new rft.BufferService(opts.buffer, credentials(opts));
  try {
    const runTag = `node-${process.pid}-${Date.now().toString(36)}`;
    const groups = makeGroups(opts, runTag);
    const sent = new Map(groups.flat().map((e) => [uid(e), e]));
    const statsBefore = await call.unary(buffer, 'Stats', { consumer_group: opts.consumerGroup });

    const batchOf = (exps) => ({ experiences: exps, vocab_size: opts.vocabSize, producer_id: opts.producerId });
    const put = opts.stream
      ? await call.clientStream(buffer, 'PutExperiences', groups.map(batchOf))
      : await call.unary(buffer, 'Put', batchOf(groups.flat()));
    if (Number(put.accepted) !== sent.size) {
      throw new Error(`buffer accepted ${put.accepted} of ${sent.size} experiences`);
    }
    const result = { run_tag: runTag, put: { rpc: opts.stream ? 'PutExperiences' : 'Put', ...put } };
    if (!opts.consume) return { ...result, stats_before: statsSummary(statsBefore) };

    // Lease until every experience we sent came back; others in the stream are leased and acked too
    // (this consumer group sees every stored experience once; its acks delete nothing another declared
    // group, such as the trainer's, still holds).
    const back = new Map();
    let leases = 0;
    let leased = 0;
    let acked = 0;
    const until = Date.now() + 4 * opts.deadlineMs;
    while (back.size < sent.size) {
      if (Date.now() > until) throw new Error(`only ${back.size} of ${sent.size} experiences came back`);
      const reply = await call.unary(buffer, 'GetBatch', {
        consumer_group: opts.consumerGroup,
        consumer: opts.producerId,
        // whole groups adding up to at most `size`: the buffer never splits a group
        size: Math.max(sent.size, opts.leaseSize),
        timeout_ms: Math.min(2000, opts.deadlineMs),
      });
      if (!reply.lease_id || reply.experiences.length === 0) continue;
      leases += 1;
      leased += reply.experiences.length;
      for (const exp of reply.experiences) {
        const mine = sent.get(uid(exp));
        if (!mine) continue;
        if (!sameExperience(mine, exp)) throw new Error(`experience ${uid(exp)} came back changed`);
        back.set(uid(exp), exp);
      }
      const ack = await call.unary(buffer, 'Ack', { lease_id: reply.lease_id, consumer_group: opts.consumerGroup });
      acked += Number(ack.acked);
    }
    const groupsBack = new Set([...back.values()].map((e) => e.eid.group_id));
    const statsAfter = await call.unary(buffer, 'Stats', { consumer_group: opts.consumerGroup });
    return {
      ...result,
      consumer_group: opts.consumerGroup,
      leases,
      leased,
      acked,
      ours_back: back.size,
      groups_back: groupsBack.size,
      stats_before: statsSummary(statsBefore),
      stats_after: statsSummary(statsAfter),
    };
  } finally {
    buffer.close();
  }
}

async function runState(rft, call, opts) {
  const sync = new rft.SynchronizerService(opts.synchronizer, credentials(opts));
  try {
    const state = await call.unary(sync, 'GetRunState', {});
    return {
      model_version: Number(state.model_version ? state.model_version.version : 0),
      trainer_step: Number(state.trainer_step),
      explorer_step: Number(state.explorer_step),
      sync_method: state.sync_method,
      sync_style: state.sync_style,
      sync_interval: state.sync_interval,
      sync_offset: state.sync_offset,
      sync_in_progress: state.sync_in_progress,
      finished: state.finished,
      members: state.members.map((m) => ({ member_id: m.member_id, role: m.role, status: m.status })),
    };
  } finally {
    sync.close();
  }
}

async function main(argv) {
  let opts;
  try {
    opts = parseCli(argv);
  } catch (err) {
    process.stderr.write(`${err.message}\n${USAGE}\n`);
    return 2;
  }
  if (opts.help) {
    process.stdout.write(`${USAGE}\n`);
    return 0;
  }
  try {
    const rft = loadContracts(opts.protos);
    const call = makeCaller(opts);
    const summary = { ok: true, buffer: opts.buffer };
    Object.assign(summary, await pushAndConsume(rft, call, opts));
    if (opts.synchronizer) {
      summary.synchronizer = opts.synchronizer;
      summary.run_state = await runState(rft, call, opts);
    }
    process.stdout.write(`${JSON.stringify(summary)}\n`);
    return 0;
  } catch (err) {
    const failure = { ok: false, error: err.message };
    if (err.rpc) failure.rpc = err.rpc;
    if (typeof err.code === 'number') failure.code = grpc.status[err.code];
    process.stderr.write(`${JSON.stringify(failure)}\n`);
    return err instanceof UsageError ? 2 : 1;
  }
}

if (require.main === module) {
  main(process.argv.slice(2)).then((code) => {
    process.exitCode = code;
  });
}

module.exports = { main, makeGroups };
