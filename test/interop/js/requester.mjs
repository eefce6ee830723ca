// A requester written with the official A2A JS SDK: it reads the target's retained agent card
// from the discovery topic, builds a stock Client from it with ClientFactory (the card's "MQTT"
// interface served by mqtt-a2a.mjs's transport) and holds a multi-turn conversation: every turn
// in one requester-generated context; a turn resumes the task that waits for input, otherwise it
// starts a new task (the profile has the requester create Task.id). When the agent's
// continuation hint (https://a2a-fleet.dev/extensions/continuation/v1) expects an approval, the
// answer carries the approve data part. One JSON line per turn on stdout.
//
// Env: A2A_BROKER, A2A_CLIENT_ID, A2A_USERNAME, A2A_PASSWORD, A2A_TARGET (org/unit/agent),
// A2A_TURNS: JSON [{"say": "...", "stream": true|false, "newTask": false, "plain": false}, ...]
// ("plain": answer an approval request with text only, which the service refuses);
// A2A_TASK_IDS=server sends new tasks without taskId (core A2A) instead of the profile's
// requester-generated id (the default).
import { randomUUID } from 'node:crypto';
import { AgentCard, Role, taskStateToJSON } from '@a2a-js/sdk';
import { ClientFactory, ClientFactoryOptions } from '@a2a-js/sdk/client';
import { connect, MqttTransportFactory, replyTopicOf, requesterFetch, retainedCard } from './mqtt-a2a.mjs';

const CONTINUATION = 'https://a2a-fleet.dev/extensions/continuation/v1';
const env = (k) => {
  if (!process.env[k]) throw new Error(`${k} is not set`);
  return process.env[k];
};
const text = (t) => ({ content: { $case: 'text', value: t }, metadata: undefined, filename: '', mediaType: '' });
const data = (v) => ({ content: { $case: 'data', value: v }, metadata: undefined, filename: '', mediaType: '' });
const textOf = (m) => (m?.parts ?? []).filter((p) => p.content?.$case === 'text').map((p) => p.content.value).join('\n');
const interrupted = new Set(['TASK_STATE_INPUT_REQUIRED', 'TASK_STATE_AUTH_REQUIRED']);

const clientId = env('A2A_CLIENT_ID');
const mq = await connect({ url: env('A2A_BROKER'), clientId, username: process.env.A2A_USERNAME, password: process.env.A2A_PASSWORD });
const fetchImpl = await requesterFetch(mq, replyTopicOf(clientId));
const card = AgentCard.fromJSON(await retainedCard(mq, env('A2A_TARGET')));
const factory = new ClientFactory(ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
  transports: [new MqttTransportFactory(fetchImpl)],
}));
const client = await factory.createFromAgentCard(card);
console.log(JSON.stringify({ card: card.name, extensions: (card.capabilities?.extensions ?? []).map((e) => e.uri) }));

const contextId = randomUUID();
let pending; // {taskId, hint}
const turns = JSON.parse(env('A2A_TURNS'));
for (const [i, turn] of turns.entries()) {
  const resume = pending && !turn.newTask;
  const taskId = resume ? pending.taskId : randomUUID();
  const parts = [text(turn.say)];
  if (resume && pending.hint?.expected_input === 'approval' && !turn.plain) parts.push(data({ decision: turn.say === 'no' ? 'deny' : 'approve' }));
  const message = {
    messageId: randomUUID(), contextId, taskId, role: Role.ROLE_USER, parts, metadata: undefined, extensions: [], referenceTaskIds: [],
  };
  if (!resume && process.env.A2A_TASK_IDS === 'server') message.taskId = '';
  const request = { tenant: '', message, configuration: undefined, metadata: undefined };
  const out = { turn: i + 1, say: turn.say, stream: !!turn.stream, resumed: !!resume, events: [] };
  let last;
  try {
    if (turn.stream) {
      for await (const ev of client.sendMessageStream(request)) {
        out.events.push(ev.payload?.$case);
        last = ev.payload;
      }
    } else {
      const res = await client.sendMessage(request);
      last = 'status' in res ? { $case: 'task', value: res } : { $case: 'message', value: res };
      out.events.push(last.$case);
    }
  } catch (e) {
    // The SDK's error classes keep the JSON-RPC code as envelopeCode (a stream error wraps one).
    const err = e.envelopeCode !== undefined ? e : e.cause ?? e;
    out.error = { message: e.message, code: err.envelopeCode, name: err.name, data: err.data };
  }
  const v = last?.value;
  if (v?.status) {
    out.taskId = v.id ?? v.taskId;
    out.contextId = v.contextId;
    out.state = taskStateToJSON(v.status.state);
    out.text = textOf(v.status.message);
    out.hint = v.status.message?.metadata?.[CONTINUATION];
    if (out.taskId && message.taskId && out.taskId !== taskId) out.taskIdMismatch = `${out.taskId} != sent ${taskId}`;
  } else if (v) {
    out.text = textOf(v);
  }
  if (!out.error) {
    pending = interrupted.has(out.state) ? { taskId: out.taskId ?? taskId, hint: out.hint } : undefined;
  }
  console.log(JSON.stringify(out));
}
mq.end(false, () => process.exit(0));
