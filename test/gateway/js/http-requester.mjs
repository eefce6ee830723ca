// An HTTP caller written with the official A2A JS SDK's stock HTTP client: ClientFactory reads
// the agent card from the gateway's well-known path and calls the JSON-RPC interface the card
// names, with a Kubernetes ServiceAccount token on every request (the card's security scheme).
// Core A2A: new tasks are sent without a taskId (the server side names them), a resumed task with
// the id it came back with. One JSON line per turn on stdout.
//
// Env: A2A_CARD_URL (the agent's card at the gateway), A2A_TOKEN,
// A2A_TURNS: JSON [{"say": "...", "stream": true|false, "resume": true|false,
// "otherContext": true|false, "approve": true|false, "get": true|false, "waitMs": N}, ...]
// (waitMs: a pause before the turn). "approve" adds the
// approval data part {"decision": "approve"} (the answer to an approval request,
// docs/protocol.md); "get" reads the turn's task back with GetTask afterwards (its state and the
// texts of its history, in "got"). A stream's status updates are listed in order in "states".
import { randomUUID } from 'node:crypto';
import { Role, taskStateToJSON } from '@a2a-js/sdk';
import { ClientFactory, ClientFactoryOptions, DefaultAgentCardResolver, JsonRpcTransportFactory } from '@a2a-js/sdk/client';

const env = (k) => {
  if (!process.env[k]) throw new Error(`${k} is not set`);
  return process.env[k];
};
const token = env('A2A_TOKEN');
const authFetch = (url, init = {}) => {
  const headers = new Headers(init.headers);
  headers.set('Authorization', `Bearer ${token}`);
  return fetch(url, { ...init, headers });
};
const text = (t) => ({ content: { $case: 'text', value: t }, metadata: undefined, filename: '', mediaType: '' });
const approval = { content: { $case: 'data', value: { decision: 'approve' } }, metadata: undefined, filename: '', mediaType: 'application/json' };
const textOf = (m) => (m?.parts ?? []).filter((p) => p.content?.$case === 'text').map((p) => p.content.value).join('\n');

const factory = new ClientFactory(ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
  transports: [new JsonRpcTransportFactory({ fetchImpl: authFetch })],
  cardResolver: new DefaultAgentCardResolver({ fetchImpl: authFetch }),
}));
// The card is under the agent's path at the gateway, not at the host's root: its full URL, no path.
const client = await factory.createFromUrl(env('A2A_CARD_URL'), '');

const contextId = randomUUID();
let lastTaskId = '';
for (const [i, turn] of JSON.parse(env('A2A_TURNS')).entries()) {
  if (turn.waitMs) await new Promise((r) => setTimeout(r, turn.waitMs));
  const message = {
    messageId: randomUUID(), contextId: turn.otherContext ? randomUUID() : contextId, taskId: turn.resume ? lastTaskId : '',
    role: Role.ROLE_USER, parts: turn.approve ? [text(turn.say), approval] : [text(turn.say)], metadata: undefined, extensions: [], referenceTaskIds: [],
  };
  const request = { tenant: '', message, configuration: undefined, metadata: undefined };
  const out = { turn: i + 1, say: turn.say, events: [] };
  let last;
  try {
    if (turn.stream) {
      for await (const ev of client.sendMessageStream(request)) {
        out.events.push(ev.payload?.$case);
        if (ev.payload?.$case === 'statusUpdate') (out.states ??= []).push(taskStateToJSON(ev.payload.value.status.state));
        last = ev.payload;
      }
    } else {
      const res = await client.sendMessage(request);
      last = 'status' in res ? { $case: 'task', value: res } : { $case: 'message', value: res };
      out.events.push(last.$case);
    }
  } catch (e) {
    const err = e.envelopeCode !== undefined ? e : e.cause ?? e;
    out.error = { message: e.message, code: err.envelopeCode, name: err.name };
  }
  const v = last?.value;
  if (v?.status) {
    out.taskId = v.id ?? v.taskId;
    out.contextId = v.contextId;
    out.state = taskStateToJSON(v.status.state);
    out.text = textOf(v.status.message);
    if (!out.error && !turn.otherContext) lastTaskId = out.taskId;
  }
  if (turn.get && out.taskId) {
    try {
      const got = await client.getTask({ tenant: '', id: out.taskId });
      out.got = { state: taskStateToJSON(got.status.state), history: (got.history ?? []).map(textOf) };
    } catch (e) {
      out.got = { error: e.message };
    }
  }
  out.sameContext = out.contextId === contextId;
  console.log(JSON.stringify(out));
}
process.exit(0);
