// The whole MQTT <-> JSON-RPC glue of the interop test (A2A over MQTT profile v0.1): MQTT.js on
// one side, the A2A JS SDK's own JSON-RPC server handler and JSON-RPC client transport on the
// other. Nothing here knows A2A semantics beyond what the profile puts on the MQTT binding:
// Response Topic + Correlation Data, QoS 1, service parameters as user properties, and which
// reply ends a stream.
import { randomBytes, randomUUID } from 'node:crypto';
import mqtt from 'mqtt';
import { JsonRpcTransportHandler, ServerCallContext } from '@a2a-js/sdk/server';
import { JsonRpcTransportFactory } from '@a2a-js/sdk/client';

// connect opens an MQTT v5 connection as org/unit/agent (the profile's Client ID).
export async function connect({ url, clientId, username, password }) {
  const client = mqtt.connect(url, {
    protocolVersion: 5, clientId, username, password, clean: true, reconnectPeriod: 1000, connectTimeout: 10_000,
  });
  await new Promise((resolve, reject) => {
    client.once('connect', resolve);
    client.once('error', reject);
  });
  client.on('error', (err) => {
    // A protocol error (a packet MQTT.js cannot parse) leaves the connection unusable: stop
    // here so the harness sees it at once instead of as a timeout.
    console.error(`mqtt ${clientId}: ${err.message}`);
    process.exit(3);
  });
  return client;
}

function subscribe(client, topic) {
  return new Promise((resolve, reject) => {
    client.subscribe(topic, { qos: 1 }, (err, granted) => {
      if (err) return reject(err);
      if (granted?.some((g) => g.qos >= 0x80)) return reject(new Error(`subscribe ${topic} refused: reason ${granted[0].qos}`));
      resolve();
    });
  });
}

// serve answers every request published to topic with the JS SDK's JSON-RPC handler: a single
// response is one reply, a stream is one reply per item, each to the request's Response Topic
// with its Correlation Data.
export async function serve(client, topic, jsonRpcHandler) {
  client.on('message', async (t, payload, packet) => {
    if (t !== topic) return;
    const props = packet.properties ?? {};
    if (!props.responseTopic) return; // no reply path: dropped, as the profile allows
    const reply = (body) => client.publish(props.responseTopic, JSON.stringify(body), {
      qos: 1, properties: { correlationData: props.correlationData, contentType: 'application/json' },
    });
    let body;
    try {
      body = JSON.parse(payload.toString('utf8'));
    } catch {
      return reply({ jsonrpc: '2.0', id: null, error: { code: -32700, message: 'parse error' } });
    }
    try {
      const result = await jsonRpcHandler.handle(body, new ServerCallContext());
      if (typeof result?.[Symbol.asyncIterator] === 'function') {
        for await (const item of result) reply(item);
      } else {
        reply(result);
      }
    } catch (e) {
      // What the SDK's HTTP front ends do with an error thrown inside a stream: one JSON-RPC
      // error as the stream's last item.
      reply({ jsonrpc: '2.0', id: body?.id ?? null, error: JsonRpcTransportHandler.mapToJSONRPCError(e) });
    }
  });
  await subscribe(client, topic);
}

const terminal = new Set(['TASK_STATE_COMPLETED', 'TASK_STATE_FAILED', 'TASK_STATE_CANCELED', 'TASK_STATE_REJECTED']);
const interrupted = new Set(['TASK_STATE_INPUT_REQUIRED', 'TASK_STATE_AUTH_REQUIRED']);

// endsStream is the profile's rule: an error, a message, a terminal or interrupted state ends a
// stream, except that an opening Task ends it only when terminal (core A2A servers open a
// resumed stream with a snapshot still showing input-required).
export function endsStream(reply, first) {
  if (reply.error) return true;
  const r = reply.result ?? {};
  if (r.message) return true;
  const state = (r.task ?? r.statusUpdate)?.status?.state;
  if (!state) return false;
  if (r.task && first) return terminal.has(state);
  return terminal.has(state) || interrupted.has(state);
}

// requesterFetch is a fetch implementation for the JS SDK's JSON-RPC client transport: the POST
// to an agent's MQTT interface URL (mqtt://host:port/$a2a/v1/request/org/unit/agent) becomes a
// QoS 1 publish to that topic with this requester's reply topic and fresh Correlation Data;
// replies come back as the HTTP response the transport expects (JSON, or Server-Sent Events
// for streaming calls). HTTP headers other than the content negotiation are service parameters
// and travel as user properties.
export async function requesterFetch(client, replyTopic, { firstReplyMs = 15_000 } = {}) {
  const waiting = new Map(); // correlation (hex) -> onReply
  client.on('message', (t, payload, packet) => {
    if (t !== replyTopic) return;
    const corr = packet.properties?.correlationData;
    const onReply = corr && waiting.get(Buffer.from(corr).toString('hex'));
    if (onReply) onReply(payload.toString('utf8'));
  });
  await subscribe(client, replyTopic);

  return (url, init) => new Promise((resolve, reject) => {
    const topic = decodeURIComponent(new URL(url).pathname.slice(1));
    const headers = Object.fromEntries(Object.entries(init.headers ?? {}).map(([k, v]) => [k.toLowerCase(), String(v)]));
    const streaming = headers.accept === 'text/event-stream';
    const userProperties = {};
    for (const [k, v] of Object.entries(headers)) {
      if (k !== 'accept' && k !== 'content-type') userProperties[k] = v;
    }
    const corr = randomBytes(16);
    const key = corr.toString('hex');
    const timer = setTimeout(() => {
      waiting.delete(key);
      reject(new Error(`no reply on ${replyTopic} within ${firstReplyMs} ms for a request to ${topic}`));
    }, firstReplyMs);
    if (!streaming) {
      waiting.set(key, (body) => {
        clearTimeout(timer);
        waiting.delete(key);
        resolve(new Response(body, { status: 200, headers: { 'Content-Type': 'application/json' } }));
      });
    } else {
      let controller;
      let first = true;
      const stream = new ReadableStream({ start(c) { controller = c; } });
      waiting.set(key, (body) => {
        if (first) {
          clearTimeout(timer);
          resolve(new Response(stream, { status: 200, headers: { 'Content-Type': 'text/event-stream' } }));
        }
        controller.enqueue(new TextEncoder().encode(`data: ${body}\n\n`));
        let reply = {};
        try { reply = JSON.parse(body); } catch { /* the transport reports it */ }
        if (endsStream(reply, first)) {
          waiting.delete(key);
          controller.close();
        }
        first = false;
      });
    }
    client.publish(topic, init.body, {
      qos: 1,
      properties: { responseTopic: replyTopic, correlationData: corr, contentType: 'application/json', userProperties },
    }, (err, packet) => {
      // PUBACK reason 0x10 (no matching subscribers) or >= 0x80: nobody will answer.
      const code = err?.code ?? packet?.reasonCode ?? 0;
      if (err || code === 0x10 || code >= 0x80) {
        clearTimeout(timer);
        waiting.delete(key);
        reject(new Error(`publish to ${topic} not accepted: ${err?.message ?? `PUBACK reason ${code}`}`));
      }
    });
  });
}

// MqttTransportFactory lets the JS SDK's ClientFactory pick an agent card interface whose
// protocolBinding is "MQTT": it is the SDK's JSON-RPC transport with requesterFetch.
export class MqttTransportFactory {
  constructor(fetchImpl) { this.inner = new JsonRpcTransportFactory({ fetchImpl }); }
  get protocolName() { return 'MQTT'; }
  async create(url, card) { return this.inner.create(url, card); }
}

// replyTopic is a fresh reply topic of org/unit/agent.
export function replyTopicOf(ref) {
  return `$a2a/v1/reply/${ref}/${randomUUID().replaceAll('-', '')}`;
}

// retainedCard reads an agent's retained card from its discovery topic.
export async function retainedCard(client, ref, waitMs = 10_000) {
  const topic = `$a2a/v1/discovery/${ref}`;
  const card = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no retained card on ${topic}`)), waitMs);
    const onMessage = (t, payload) => {
      if (t !== topic || payload.length === 0) return;
      clearTimeout(timer);
      client.off('message', onMessage);
      resolve(JSON.parse(payload.toString('utf8')));
    };
    client.on('message', onMessage);
  });
  await subscribe(client, topic);
  return card;
}
