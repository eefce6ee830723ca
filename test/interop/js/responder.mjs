// A governed responder written with the official A2A JS SDK: a stock DefaultRequestHandler with
// an InMemoryTaskStore (core A2A: it creates task ids itself) and a small "deploy" executor,
// served on the delivery topic the operator assigned (A2A_REQUEST_TOPIC) through mqtt-a2a.mjs.
//
// The executor: a new task asks "Deploy X? Answer yes or no." (input-required, with the
// continuation hint of https://a2a-fleet.dev/extensions/continuation/v1 in the status message);
// "yes" resumes it: working, an artifact, completed; "no" cancels it; anything else asks again.
//
// Env: A2A_BROKER, A2A_CLIENT_ID (org/unit/agent), A2A_USERNAME, A2A_PASSWORD, A2A_REQUEST_TOPIC.
import { randomUUID } from 'node:crypto';
import { AgentCard, Role, TaskState } from '@a2a-js/sdk';
import { AgentEvent, DefaultRequestHandler, InMemoryTaskStore, JsonRpcTransportHandler } from '@a2a-js/sdk/server';
import { connect, serve } from './mqtt-a2a.mjs';

const CONTINUATION = 'https://a2a-fleet.dev/extensions/continuation/v1';
const env = (k) => {
  if (!process.env[k]) throw new Error(`${k} is not set`);
  return process.env[k];
};

const text = (t) => ({ content: { $case: 'text', value: t }, metadata: undefined, filename: '', mediaType: '' });
const textOf = (m) => (m?.parts ?? []).filter((p) => p.content?.$case === 'text').map((p) => p.content.value).join('\n');

function agentMessage(taskId, contextId, t, hint) {
  return {
    messageId: randomUUID(), taskId, contextId, role: Role.ROLE_AGENT, parts: [text(t)],
    metadata: hint ? { [CONTINUATION]: hint } : undefined,
    extensions: hint ? [CONTINUATION] : [], referenceTaskIds: [],
  };
}

function status(taskId, contextId, state, message) {
  return AgentEvent.statusUpdate({
    taskId, contextId, status: { state, message, timestamp: new Date().toISOString() }, metadata: undefined,
  });
}

class DeployExecutor {
  async execute(ctx, bus) {
    const { taskId, contextId } = ctx;
    const said = textOf(ctx.userMessage).trim();
    const ask = (question) => status(taskId, contextId, TaskState.TASK_STATE_INPUT_REQUIRED,
      agentMessage(taskId, contextId, question, { expected_input: 'free_text', resume_scope: 'same_task', history_policy: 'none' }));
    if (!ctx.task) {
      // The SDK wants a Task (or a Message) first.
      bus.publish(AgentEvent.task({
        id: taskId, contextId, status: { state: TaskState.TASK_STATE_SUBMITTED, message: undefined, timestamp: new Date().toISOString() },
        artifacts: [], history: [ctx.userMessage], metadata: { plan: said },
      }));
      bus.publish(ask(`Deploy ${said}? Answer yes or no.`));
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

const clientId = env('A2A_CLIENT_ID');
const card = AgentCard.fromJSON({
  name: clientId.split('/')[2], description: 'deploys after a yes (A2A JS SDK)', version: '1.0.0',
  supportedInterfaces: [{ url: `${env('A2A_BROKER')}/$a2a/v1/request/${clientId}`, protocolBinding: 'MQTT', protocolVersion: '1.0' }],
  capabilities: { streaming: true, extensions: [{ uri: CONTINUATION, description: 'continuation hints', required: false }] },
  defaultInputModes: ['text/plain'], defaultOutputModes: ['text/plain'], skills: [],
});
const handler = new JsonRpcTransportHandler(new DefaultRequestHandler(card, new InMemoryTaskStore(), new DeployExecutor()));
const client = await connect({ url: env('A2A_BROKER'), clientId, username: process.env.A2A_USERNAME, password: process.env.A2A_PASSWORD });
await serve(client, env('A2A_REQUEST_TOPIC'), handler);
console.log(JSON.stringify({ ready: true, topic: env('A2A_REQUEST_TOPIC') }));
process.on('SIGTERM', () => client.end(false, () => process.exit(0)));
