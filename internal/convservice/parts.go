package convservice

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"
	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/internal/convstore"
	"github.com/a2a-fleet/a2a-fleet/internal/ownership"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// The parts of a replica, one job each (docs/conversation-service.md, "Inside the service").
// A part holds what it uses as narrow interfaces of the other parts and of the replica's
// state (below), given to its constructor once; no part embeds another or the Service.
// Service.build constructs them in order once the broker connection and the registry exist.

// env is what every part reads: the configuration, the log and the metrics.
type env struct {
	cfg Config
	log logr.Logger
	m   *metrics
}

// dispatcher runs a job on the worker that owns key (workers).
type dispatcher interface {
	dispatch(key []byte, job func())
}

// spanner starts the service's trace spans (spans).
type spanner interface {
	span(ctx context.Context, name string, kind trace.SpanKind, attrs ...attribute.KeyValue) (context.Context, trace.Span)
}

// brokerPublisher is the broker connection as the parts publish on it (*a2amqtt.Conn).
type brokerPublisher interface {
	Publish(ctx context.Context, p *paho.Publish) (*paho.PublishResponse, error)
	PublishAsync(ctx context.Context, p *paho.Publish) error
	PublishNotify(ctx context.Context, p *paho.Publish, done func(*paho.PublishResponse, error)) error
}

// answerer publishes answers and errors on requesters' reply topics (outbox).
type answerer interface {
	publish(ctx context.Context, p *paho.Publish) (*paho.PublishResponse, error)
	replyError(ctx context.Context, in *inbound, id any, e *a2amqtt.RPCError)
	answer(ctx context.Context, respTo string, corr []byte, id any, e *a2amqtt.RPCError)
	send(ctx context.Context, in *inbound, payload []byte)
	notifyFailed(ctx context.Context, st conversation.Stream, contextID, taskID, why string)
}

// gate decides whether a request is answered at all (admission).
type gate interface {
	verifySender(in *inbound) bool
	withinRate(in *inbound) bool
	withinOwnHistoryRate(in *inbound) bool
	checkRequest(ctx context.Context, in *inbound) bool
	decode(ctx context.Context, in *inbound, requireTaskID bool) *a2amqtt.InboundRequest
}

// placer says which replica serves an agent and holds messages back while this one takes an
// agent over (handover).
type placer interface {
	serves(agent string) bool
	historyRole(agent string) historyRole
	notHeld(in *inbound, agent string, retry func()) bool
	parkUntilHeld(in *inbound, agent string, retry func()) bool
	unavailable(ctx context.Context, in *inbound, id any, agent string)
	awaitReplyAgent(ctx context.Context, agent string)
}

// idMapper knows whether an agent creates its own task ids (taskIDs).
type idMapper interface {
	agentCreatesIDs(agent string) bool
	setAgentCreatesIDs(agent string, v bool)
}

// agentForwarder publishes to an agent's delivery topic with the route sealed (forwarder).
type agentForwarder interface {
	forwardTo(ctx context.Context, g *gatedAgent, in *inbound, payload []byte, user paho.UserProperties, rt route, failed func(error)) error
}

// canceler cancels a task at its agent (forwarder).
type canceler interface {
	cancelAtAgent(ctx context.Context, agent, contextID, taskID string)
}

// expirer acts on what expiry did to a context (sweeper).
type expirer interface {
	expired(ctx context.Context, agent string, x conversation.Expiration)
}

// gatedLookup finds a gated agent and its policy (registry).
type gatedLookup interface {
	agent(key string) *gatedAgent
	policyOf(key string) conversation.Policy
}

// requestTopics is the registry as the request path reads it: the agent a request topic
// belongs to, and whether it admits a caller.
type requestTopics interface {
	gatedLookup
	byRequestTopic(topic string) *gatedAgent
	admits(ctx context.Context, callee *a2av1.Agent, caller a2amqtt.AgentRef) bool
}

// staleDropper unsubscribes a request topic left from a previous run (registry).
type staleDropper interface {
	dropStale(topic string)
}

// agentOwners is the ownership of agents between replicas (*ownership.Replica); nil: this
// replica owns every agent.
type agentOwners interface {
	Place(agent string) ownership.Placement
	Consumes(agent string) bool
	Owns(agent string) bool
	AwaitHeld(ctx context.Context, agent string) bool
	Answers(agent string) (assignedHere, hasState bool)
	HandOver(ctx context.Context, agent string, ev conversation.Event)
	ApplyPending(ctx context.Context, agent string) bool
}

// The conversation state (*convstore.Memory) as each part reads or changes it.
type (
	taskReader interface {
		Task(agent, task string) (*conversation.Context, *conversation.Task)
		Context(agent, id string) *conversation.Context
	}
	observer interface {
		Observe(agent string, p conversation.Policy, now time.Time, ev conversation.Event, items ...convstore.Item) (conversation.Outcome, *convstore.Ticket, error)
	}
	requestState interface {
		taskReader
		observer
		Decide(agent string, p conversation.Policy, now time.Time, req conversation.Request, items ...convstore.Item) (conversation.Decision, *convstore.Ticket, error)
		Note(agent string, corr []byte) (dup bool, err error)
	}
	replyState interface {
		taskReader
		observer
	}
	historyState interface {
		taskReader
		History(agent, contextID string) (*conversation.Context, []*convstore.Item)
	}
	sweepState interface {
		taskReader
		Sweep(policy func(agent string) conversation.Policy, now time.Time) ([]convstore.Swept, *convstore.Ticket)
		Stats() (live map[string]int, states map[a2a.TaskState]int)
		HistoryStats() (items, bytes int)
	}
	idState interface {
		MapsTaskIDs(agent string) bool
	}
)

// spans starts the service's trace spans.
type spans struct {
	tracer trace.Tracer
}

func newSpans(tracer trace.Tracer) *spans { return &spans{tracer: tracer} }

// outbox publishes answers and errors on requesters' reply topics.
type outbox struct {
	conn brokerPublisher
	log  logr.Logger
	m    *metrics
}

func newOutbox(e env, conn brokerPublisher) *outbox { return &outbox{conn: conn, log: e.log, m: e.m} }

// admission decides whether a request is answered at all: its sender, its caller's rate, the
// profile's checks, its decoding.
type admission struct {
	env
	out     answerer
	conn    brokerPublisher
	limiter *callerLimiter
	// rateAnswers are the refusals answerRateLimited publishes.
	rateAnswers chan *paho.Publish
	quit        <-chan struct{}
	runCtx      context.Context
}

func newAdmission(e env, out answerer, conn brokerPublisher, quit <-chan struct{}, runCtx context.Context) *admission {
	return &admission{env: e, out: out, conn: conn, quit: quit, runCtx: runCtx,
		limiter: newCallerLimiter(e.cfg.CallerRate, e.cfg.CallerBurst, e.cfg.AgentHistoryRate, e.cfg.AgentHistoryBurst),
		// Bounded: past it, refusals go unanswered (counted).
		rateAnswers: make(chan *paho.Publish, 4096)}
}

// handover says which replica serves an agent and holds requests back while this one takes
// an agent over.
type handover struct {
	env
	work   dispatcher
	out    answerer
	stale  staleDropper
	owners agentOwners
	parked atomic.Int64
	runCtx context.Context
}

func newHandover(e env, work dispatcher, out answerer, stale staleDropper, owners agentOwners, runCtx context.Context) *handover {
	return &handover{env: e, work: work, out: out, stale: stale, owners: owners, runCtx: runCtx}
}

// taskIDs knows whether an agent creates its own task ids (the task-id mapping of taskids.go).
type taskIDs struct {
	ids *idModes
	mem idState
}

func newTaskIDs(mem idState) *taskIDs { return &taskIDs{ids: newIDModes(), mem: mem} }

// forwarder publishes to agents' delivery topics with the route sealed into the correlation data.
type forwarder struct {
	out        answerer
	conn       brokerPublisher
	agents     gatedLookup
	log        logr.Logger
	mem        taskReader
	replyTopic string
	seal       *sealer
}

func newForwarder(e env, out answerer, conn brokerPublisher, agents gatedLookup, mem taskReader, replyTopic string, seal *sealer) *forwarder {
	return &forwarder{out: out, conn: conn, agents: agents, log: e.log, mem: mem, replyTopic: replyTopic, seal: seal}
}

// sweeper expires contexts and tasks on time and acts on what expired; it also refreshes the statistics.
type sweeper struct {
	env
	out    answerer
	fwd    canceler
	agents gatedLookup
	mem    sweepState
	runs   *runs
	// lastSweep is when the sweep loop last came round (liveness).
	lastSweep *atomic.Int64
}

func newSweeper(e env, out answerer, fwd canceler, agents gatedLookup, mem sweepState, runs *runs, lastSweep *atomic.Int64) *sweeper {
	return &sweeper{env: e, out: out, fwd: fwd, agents: agents, mem: mem, runs: runs, lastSweep: lastSweep}
}

// history answers GetTask and ListTasks from the conversation state.
type history struct {
	env
	work   dispatcher
	out    answerer
	adm    gate
	place  placer
	agents gatedLookup
	mem    historyState
	owners agentOwners
	runs   *runs
}

func newHistory(e env, work dispatcher, out answerer, adm gate, place placer, agents gatedLookup, mem historyState, owners agentOwners, runs *runs) *history {
	return &history{env: e, work: work, out: out, adm: adm, place: place, agents: agents, mem: mem, owners: owners, runs: runs}
}

// requests is the request path: admit, decode, decide, present, forward.
type requests struct {
	env
	work   dispatcher
	sp     spanner
	out    answerer
	adm    gate
	place  placer
	ids    idMapper
	fwd    agentForwarder
	exp    expirer
	agents requestTopics
	mem    requestState
	owners agentOwners
	runs   *runs
}

// requestParts are the parts the request path hands work to.
type requestParts struct {
	work  dispatcher
	sp    spanner
	out   answerer
	adm   gate
	place placer
	ids   idMapper
	fwd   agentForwarder
	exp   expirer
}

func newRequests(e env, p requestParts, agents requestTopics, mem requestState, owners agentOwners, runs *runs) *requests {
	return &requests{env: e, work: p.work, sp: p.sp, out: p.out, adm: p.adm, place: p.place, ids: p.ids, fwd: p.fwd, exp: p.exp,
		agents: agents, mem: mem, owners: owners, runs: runs}
}

// replies is the reply path: unseal the route, observe the event, relay it.
type replies struct {
	env
	work   dispatcher
	sp     spanner
	place  placer
	ids    idMapper
	fwd    agentForwarder
	exp    expirer
	conn   brokerPublisher
	agents gatedLookup
	mem    replyState
	owners agentOwners
	runs   *runs
	seal   *sealer
	// routes are the routes replies arrived on, and those whose last reply was relayed (replay.go).
	routes *routeLog
}

// replyParts are the parts the reply path hands work to.
type replyParts struct {
	work  dispatcher
	sp    spanner
	place placer
	ids   idMapper
	fwd   agentForwarder
	exp   expirer
}

func newReplies(e env, p replyParts, conn brokerPublisher, agents gatedLookup, mem replyState, owners agentOwners, runs *runs, seal *sealer) *replies {
	return &replies{env: e, work: p.work, sp: p.sp, place: p.place, ids: p.ids, fwd: p.fwd, exp: p.exp,
		conn: conn, agents: agents, mem: mem, owners: owners, runs: runs, seal: seal, routes: newRouteLog()}
}
