// An HTTP A2A agent written with the official A2A JS SDK: a stock DefaultRequestHandler with an
// InMemoryTaskStore (core A2A: it creates task and context ids itself) and a small "deploy"
// executor, served by the SDK's JsonRpcTransportHandler on node:http (JSON for unary calls,
// Server-Sent Events for streams, the card at /.well-known/agent-card.json) on a loopback port
// (A2A_HOST, A2A_PORT, A2A_PUBLIC_URL change that). It prints {"url": ...} once listening.
//
// The executor: a new task asks "Turn N. Deploy X? Answer yes or no." (input-required; N counts
// the tasks of the context, so a follow-up shows that it reached the same context); "yes"
// resumes it: working, an artifact, completed; "no" cancels it; anything else asks again.
import { createServer } from 'node:http';
import { randomUUID } from 'node:crypto';
import { AgentCard, Role, TaskState } from '@a2a-js/sdk';
import { AgentEvent, DefaultRequestHandler, InMemoryTaskStore, JsonRpcTransportHandler, ServerCallContext } from '@a2a-js/sdk/server';

const text = (t) => ({ content: { $case: 'text', value: t }, metadata: undefined, filename: '', mediaType: '' });
const textOf = (m) => (m?.parts ?? []).filter((p) => p.content?.$case === 'text').map((p) => p.content.value).join('\n');
const agentMessage = (taskId, contextId, t) => ({
  messageId: randomUUID(), taskId, contextId, role: Role.ROLE_AGENT, parts: [text(t)], metadata: undefined, extensions: [], referenceTaskIds: [],
});
const status = (taskId, contextId, state, message) => AgentEvent.statusUpdate({
  taskId, contextId, status: { state, message, timestamp: new Date().toISOString() }, metadata: undefined,
});

const turns = new Map();

class DeployExecutor {
  async execute(ctx, bus) {
    const { taskId, contextId } = ctx;
    const said = textOf(ctx.userMessage).trim();
    const ask = (q) => status(taskId, contextId, TaskState.TASK_STATE_INPUT_REQUIRED, agentMessage(taskId, contextId, q));
    if (!ctx.task) {
      const n = (turns.get(contextId) ?? 0) + 1;
      turns.set(contextId, n);
      bus.publish(AgentEvent.task({
        id: taskId, contextId, status: { state: TaskState.TASK_STATE_SUBMITTED, message: undefined, timestamp: new Date().toISOString() },
        artifacts: [], history: [ctx.userMessage], metadata: { plan: said },
      }));
      bus.publish(ask(`Turn ${n}. Deploy ${said}? Answer yes or no.`));
      bus.finished();
      return;
    }
    bus.publish(AgentEvent.task(ctx.task));
    const plan = ctx.task.metadata?.plan ?? 'it';
    switch (said.toLowerCase()) {
      case 'yes':
        bus.publish(status(taskId, contextId, TaskState.TASK_STATE_WORKING, agentMessage(taskId, contextId, `deploying ${plan}`)));
        bus.publish(AgentEvent.artifactUpdate({
          taskId, contextId, append: false, lastChunk: true, metadata: undefined,
          artifact: { artifactId: randomUUID(), name: 'deployment', description: '', parts: [text(`deployed ${plan}`)], metadata: undefined, extensions: [] },
        }));
        bus.publish(status(taskId, contextId, TaskState.TASK_STATE_COMPLETED, agentMessage(taskId, contextId, `Deployed ${plan}.`)));
        break;
      case 'no':
        bus.publish(status(taskId, contextId, TaskState.TASK_STATE_CANCELED, agentMessage(taskId, contextId, `Not deploying ${plan}.`)));
        break;
      default:
        bus.publish(ask('Please answer yes or no.'));
    }
    bus.finished();
  }

  async cancelTask(taskId, bus) {
    bus.publish(status(taskId, '', TaskState.TASK_STATE_CANCELED, undefined));
    bus.finished();
  }
}

let card;
const server = createServer(async (req, res) => {
  // The card at the well-known path, as any A2A HTTP server serves it (the gateway compares it
  // with the manifest's: the Agent's CardMatches condition).
  if (req.method === 'GET' && req.url === '/.well-known/agent-card.json') {
    res.writeHead(200, { 'Content-Type': 'application/json' });
    res.end(JSON.stringify(AgentCard.toJSON(card)));
    return;
  }
  const chunks = [];
  for await (const c of req) chunks.push(c);
  let body;
  try {
    body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
  } catch {
    res.writeHead(200, { 'Content-Type': 'application/json' });
    res.end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32700, message: 'parse error' } }));
    return;
  }
  try {
    const result = await handler.handle(body, new ServerCallContext());
    if (typeof result?.[Symbol.asyncIterator] === 'function') {
      res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
      try {
        for await (const item of result) res.write(`data: ${JSON.stringify(item)}\n\n`);
      } catch (e) {
        res.write(`data: ${JSON.stringify({ jsonrpc: '2.0', id: body?.id ?? null, error: JsonRpcTransportHandler.mapToJSONRPCError(e) })}\n\n`);
      }
      res.end();
    } else {
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify(result));
    }
  } catch (e) {
    res.writeHead(200, { 'Content-Type': 'application/json' });
    res.end(JSON.stringify({ jsonrpc: '2.0', id: body?.id ?? null, error: JsonRpcTransportHandler.mapToJSONRPCError(e) }));
  }
});

let handler;
// A2A_HOST and A2A_PORT: where to listen (loopback, any free port by default); A2A_PUBLIC_URL:
// the URL the card names (in a pod: its Service's).
server.listen(Number(process.env.A2A_PORT ?? 0), process.env.A2A_HOST ?? '127.0.0.1', () => {
  const url = process.env.A2A_PUBLIC_URL || `http://127.0.0.1:${server.address().port}/`;
  card = AgentCard.fromJSON({
    name: 'deploy', description: 'deploys after a yes (A2A JS SDK over HTTP)', version: '1.0.0',
    supportedInterfaces: [{ url, protocolBinding: 'JSONRPC', protocolVersion: '1.0' }],
    capabilities: { streaming: true }, defaultInputModes: ['text/plain'], defaultOutputModes: ['text/plain'], skills: [],
  });
  handler = new JsonRpcTransportHandler(new DefaultRequestHandler(card, new InMemoryTaskStore(), new DeployExecutor()));
  console.log(JSON.stringify({ url }));
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
