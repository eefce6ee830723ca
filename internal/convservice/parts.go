package convservice

import (
	"context"
	"sync/atomic"

	"github.com/eclipse/paho.golang/paho"
	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/trace"

	"github.com/a2a-fleet/a2a-fleet/internal/convstore"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// The parts of a replica, one job each (docs/conversation-service.md, "Inside the service").
// Each holds what it uses; a part that needs another's job embeds that part (never the
// Service). Service.wire builds them once the broker connection exists.

// workers run each message on the worker that owns its correlation data (ordered streams).
type workers struct {
	quit   chan struct{}
	shards []chan func()
}

// spans starts the service's trace spans.
type spans struct {
	tracer trace.Tracer
}

// outbox publishes answers and errors on requesters' reply topics.
type outbox struct {
	conn *a2amqtt.Conn
	log  logr.Logger
	m    *metrics
}

// placement says which replica serves an agent and holds requests back while this one takes an agent over.
type handover struct {
	*workers
	*outbox
	cfg    Config
	gated  *registry
	log    logr.Logger
	m      *metrics
	owners *ownership
	parked atomic.Int64
	runCtx context.Context
}

// admission decides whether a request is answered at all: its sender, its caller's rate, the profile's checks, its decoding.
type admission struct {
	*outbox
	cfg         Config
	conn        *a2amqtt.Conn
	limiter     *callerLimiter
	log         logr.Logger
	m           *metrics
	quit        chan struct{}
	rateAnswers chan *paho.Publish
	runCtx      context.Context
}

// taskIDs knows whether an agent creates its own task ids (the task-id mapping of taskids.go).
type taskIDs struct {
	ids *idModes
	mem *convstore.Memory
}

// forwarder publishes to agents' delivery topics with the route sealed into the correlation data.
type forwarder struct {
	*outbox
	conn       *a2amqtt.Conn
	gated      *registry
	log        logr.Logger
	mem        *convstore.Memory
	replyTopic string
	seal       *sealer
}

// sweeper expires contexts and tasks on time and acts on what expired; it also refreshes the statistics.
type sweeper struct {
	*outbox
	*forwarder
	cfg       Config
	gated     *registry
	lastSweep atomic.Int64
	log       logr.Logger
	m         *metrics
	mem       *convstore.Memory
	runs      *runs
}

// history answers GetTask and ListTasks from the conversation state.
type history struct {
	*workers
	*outbox
	*admission
	*handover
	cfg    Config
	gated  *registry
	log    logr.Logger
	mem    *convstore.Memory
	owners *ownership
	runs   *runs
}

// requests is the request path: admit, decode, decide, present, forward.
type requests struct {
	*workers
	*spans
	*outbox
	*handover
	*admission
	*taskIDs
	*forwarder
	*sweeper
	cfg    Config
	gated  *registry
	log    logr.Logger
	m      *metrics
	mem    *convstore.Memory
	owners *ownership
	runs   *runs
}

// replies is the reply path: unseal the route, observe the event, relay it.
type replies struct {
	*workers
	*spans
	*outbox
	*handover
	*taskIDs
	*forwarder
	*sweeper
	cfg    Config
	conn   *a2amqtt.Conn
	routes *routeLog
	gated  *registry
	log    logr.Logger
	m      *metrics
	mem    *convstore.Memory
	owners *ownership
	runs   *runs
	seal   *sealer
}

// wire builds the parts from the replica's state (the connection and the registry come later:
// wireConn, wireGated).
func (s *Service) wire() {
	s.workers = &workers{}
	s.spans = &spans{}
	s.outbox = &outbox{}
	s.handover = &handover{}
	s.admission = &admission{}
	s.taskIDs = &taskIDs{}
	s.forwarder = &forwarder{}
	s.sweeper = &sweeper{}
	s.history = &history{}
	s.requests = &requests{}
	s.replies = &replies{}
	s.workers.quit = s.quit
	s.workers.shards = s.shards
	s.spans.tracer = s.tracer
	s.outbox.log = s.log
	s.outbox.m = s.m
	s.handover.workers = s.workers
	s.handover.outbox = s.outbox
	s.handover.cfg = s.cfg
	s.handover.log = s.log
	s.handover.m = s.m
	s.handover.owners = s.owners
	s.handover.runCtx = s.runCtx
	s.admission.outbox = s.outbox
	s.admission.cfg = s.cfg
	s.admission.limiter = s.limiter
	s.admission.log = s.log
	s.admission.m = s.m
	s.admission.quit = s.quit
	s.admission.rateAnswers = s.rateAnswers
	s.admission.runCtx = s.runCtx
	s.taskIDs.ids = s.ids
	s.taskIDs.mem = s.mem
	s.forwarder.outbox = s.outbox
	s.forwarder.log = s.log
	s.forwarder.mem = s.mem
	s.forwarder.replyTopic = s.replyTopic
	s.forwarder.seal = s.seal
	s.sweeper.outbox = s.outbox
	s.sweeper.forwarder = s.forwarder
	s.sweeper.cfg = s.cfg
	s.sweeper.log = s.log
	s.sweeper.m = s.m
	s.sweeper.mem = s.mem
	s.sweeper.runs = s.runs
	s.history.workers = s.workers
	s.history.outbox = s.outbox
	s.history.admission = s.admission
	s.history.handover = s.handover
	s.history.cfg = s.cfg
	s.history.log = s.log
	s.history.mem = s.mem
	s.history.owners = s.owners
	s.history.runs = s.runs
	s.requests.workers = s.workers
	s.requests.spans = s.spans
	s.requests.outbox = s.outbox
	s.requests.handover = s.handover
	s.requests.admission = s.admission
	s.requests.taskIDs = s.taskIDs
	s.requests.forwarder = s.forwarder
	s.requests.sweeper = s.sweeper
	s.requests.cfg = s.cfg
	s.requests.log = s.log
	s.requests.m = s.m
	s.requests.mem = s.mem
	s.requests.owners = s.owners
	s.requests.runs = s.runs
	s.replies.workers = s.workers
	s.replies.spans = s.spans
	s.replies.outbox = s.outbox
	s.replies.handover = s.handover
	s.replies.taskIDs = s.taskIDs
	s.replies.forwarder = s.forwarder
	s.replies.sweeper = s.sweeper
	s.replies.cfg = s.cfg
	s.replies.routes = s.routes
	s.replies.log = s.log
	s.replies.m = s.m
	s.replies.mem = s.mem
	s.replies.owners = s.owners
	s.replies.runs = s.runs
	s.replies.seal = s.seal
}

// wireGated hands the registry to the parts that read it.
func (s *Service) wireGated() {
	s.handover.gated = s.gated
	s.forwarder.gated = s.gated
	s.sweeper.gated = s.gated
	s.history.gated = s.gated
	s.requests.gated = s.gated
	s.replies.gated = s.gated
}

// wireConn hands the broker connection to the parts that publish.
func (s *Service) wireConn() {
	s.outbox.conn = s.conn
	s.admission.conn = s.conn
	s.forwarder.conn = s.conn
	s.replies.conn = s.conn
}
