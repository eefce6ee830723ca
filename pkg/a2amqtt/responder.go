package a2amqtt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2acompat/a2av0"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
	"github.com/a2aproject/a2a-go/v2/a2asrv/taskstore"
	"github.com/eclipse/paho.golang/paho"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// ResponderOptions configures NewResponder.
type ResponderOptions struct {
	// Executor runs the agent. Required unless Handler is set.
	Executor a2asrv.AgentExecutor
	// Handler replaces the request handler built from Executor with a custom
	// a2asrv.RequestHandler. It must use TaskStore, which is then required:
	// the task-id bridge records requester task ids there.
	Handler a2asrv.RequestHandler
	// ReferenceHandler serves Executor with a2a-go's default request handler
	// (a2asrv.NewHandler) instead of the SDK's direct handler
	// (NewDirectHandler, the default). Same wire format and a2a-go types;
	// what the direct handler does not offer is listed in docs/sdk.md (every
	// a2asrv.RequestHandlerOption, push-notification configs, the extended
	// agent card). Setting HandlerOptions implies it.
	ReferenceHandler bool
	// Direct has no effect: the direct handler is the fast path every
	// executor gets by default (set ReferenceHandler for a2a-go's handler).
	// Kept so existing callers compile.
	Direct bool
	// TaskStore holds tasks; defaults to an in-memory store. It is also
	// what ContextTasks reads.
	TaskStore taskstore.Store
	// HandlerOptions are passed to a2asrv.NewHandler (the task store option
	// is added by the responder); they select the reference handler.
	HandlerOptions []a2asrv.RequestHandlerOption
	// RequestTopic overrides the topic requests are read from (default: the agent's public
	// request topic). An agent behind a2a-fleet's conversation service reads its delivery topic
	// here (A2A_REQUEST_TOPIC); nothing else changes for it.
	RequestTopic string
	// Pools are pool ids (in the agent's org/unit) to consume through a
	// shared subscription, in addition to the direct request topic.
	Pools []string
	// MaxPayloadBytes rejects larger requests (default 1 MiB).
	MaxPayloadBytes int
	// MaxConcurrent bounds requests processed at once (default 64).
	MaxConcurrent int
	// QueueTimeout is how long a request may wait for a free slot before it
	// is answered with -32004 responder_unavailable (default 5s).
	QueueTimeout time.Duration
	// AcceptMissingTaskID lets A2A v1.0 requests without message.taskId
	// through (the server then generates one, as in core A2A). The profile
	// requires requesters to send one, so the default rejects with -32005.
	AcceptMissingTaskID bool
	// DisableV03 stops answering A2A v0.3 methods (message/send, ...).
	DisableV03 bool

	// History chooses where InputsOf takes a turn's prior messages and artifacts from:
	// HistoryAgentFetched: from HistoryFrom when set, else from TaskStore; HistoryClientSupplied:
	// only from the request (SuppliedHistory); HistoryNone: nowhere. "" (the default): the
	// request's when it supplies history, else as HistoryAgentFetched. An agent that declares a
	// continuation hint says the same in its history_policy.
	History HistoryPolicy
	// HistoryFrom is the agent that serves the conversation history with ListTasks
	// (contextId, historyLength, includeArtifacts): a2a-fleet's conversation service for an agent
	// a ConversationPolicy governs (its history mode Messages keeps message content). The
	// responder creates a requester on its connection for it.
	HistoryFrom *AgentRef
	// HistoryLength bounds the prior messages InputsOf returns (the most recent; default
	// DefaultHistoryLength) and is the historyLength asked of HistoryFrom.
	HistoryLength int
}

// Responder serves an A2A agent on its request topic (and optional pools).
type Responder struct {
	conn   *Conn
	opts   ResponderOptions
	log    *slog.Logger
	store  taskstore.Store
	bridge *bridge
	v03    http.Handler
	slots  chan struct{}
	// idle hands requests to worker goroutines waiting for one (unbuffered).
	idle chan *inbound
	// stopWorkers is closed by Close so idle workers exit at once.
	stopWorkers chan struct{}
	stopOnce    sync.Once
	subs        []*Subscription
	scope       *inputsConfig
	history     *Requester

	wg       sync.WaitGroup
	inflight atomic.Int64
	closing  atomic.Bool
	closeMu  sync.Mutex

	// recent recognises a second copy of a request already taken (redelivery.go).
	recent recentRequests
	// copiesDropped counts those copies.
	copiesDropped atomic.Uint64
}

// NewTaskStore returns the task store the responder uses by default: a
// MemoryStore (listing open to all callers, since the profile has no
// per-requester identity at this layer and ContextTasks must see every task
// of a context).
func NewTaskStore() taskstore.Store { return NewMemoryStore() }

// NewResponder builds the a2a-go request handler around opts.Executor and
// subscribes to the agent's request topic (and pools). Requests are served
// until Close.
func NewResponder(ctx context.Context, conn *Conn, opts ResponderOptions) (*Responder, error) {
	if opts.Executor == nil && opts.Handler == nil {
		return nil, errors.New("a2amqtt: ResponderOptions.Executor (or Handler) is required")
	}
	if opts.Handler != nil && opts.TaskStore == nil {
		return nil, errors.New("a2amqtt: ResponderOptions.Handler needs the TaskStore it uses")
	}
	if opts.MaxPayloadBytes <= 0 {
		opts.MaxPayloadBytes = 1 << 20
	}
	if opts.MaxConcurrent <= 0 {
		opts.MaxConcurrent = 64
	}
	if opts.QueueTimeout <= 0 {
		opts.QueueTimeout = 5 * time.Second
	}
	for _, p := range opts.Pools {
		if err := ValidateID("pool", p); err != nil {
			return nil, fmt.Errorf("a2amqtt: %w", err)
		}
	}
	switch opts.History {
	case "", HistoryAgentFetched, HistoryClientSupplied, HistoryNone:
	default:
		return nil, fmt.Errorf("a2amqtt: ResponderOptions.History %q: want %s, %s or %s", opts.History, HistoryAgentFetched, HistoryClientSupplied, HistoryNone)
	}
	if opts.HistoryFrom != nil {
		if err := opts.HistoryFrom.Validate(); err != nil {
			return nil, fmt.Errorf("a2amqtt: ResponderOptions.HistoryFrom: %w", err)
		}
	}
	store := opts.TaskStore
	if store == nil {
		store = NewTaskStore()
	}
	inner := opts.Handler
	var exec a2asrv.AgentExecutor
	if opts.Executor != nil {
		exec = tracedExecutor{inner: opts.Executor, tracer: conn.tracer}
	}
	reference := opts.ReferenceHandler || len(opts.HandlerOptions) > 0
	if inner == nil && !reference {
		inner = NewDirectHandler(exec, store)
	}
	if inner == nil {
		hopts := append(append([]a2asrv.RequestHandlerOption{}, opts.HandlerOptions...), a2asrv.WithTaskStore(store))
		inner = a2asrv.NewHandler(messageAdapter{inner: exec}, hopts...)
	}
	b := newBridge(inner, store)
	panicToError := func(v any) error {
		return fmt.Errorf("handler panic: %v", v)
	}
	r := &Responder{
		conn:   conn,
		opts:   opts,
		log:    conn.Logger(),
		store:  store,
		bridge: b,
		v03:    a2av0.NewJSONRPCHandler(b, a2asrv.WithTransportPanicHandler(panicToError)),
		slots:  make(chan struct{}, opts.MaxConcurrent),
		idle:   make(chan *inbound),

		stopWorkers: make(chan struct{}),
		scope:       &inputsConfig{store: store, policy: opts.History, length: historyLengthOrDefault(opts.HistoryLength)},
	}
	if opts.HistoryFrom != nil {
		hr, err := NewRequester(ctx, conn, RequesterOptions{})
		if err != nil {
			return nil, fmt.Errorf("a2amqtt: responder %s: history requester: %w", conn.Agent(), err)
		}
		r.history = hr
		r.scope.history = hr.Transport(*opts.HistoryFrom)
	}
	me := conn.Agent()
	requestTopic := me.RequestTopic()
	if opts.RequestTopic != "" {
		requestTopic = opts.RequestTopic
	}
	filters := []string{requestTopic}
	for _, p := range opts.Pools {
		filters = append(filters, PoolRef{Org: me.Org, Unit: me.Unit, Pool: p}.SharedSubscription())
	}
	for _, f := range filters {
		sub, err := conn.Subscribe(ctx, f, r.onRequest)
		if err != nil {
			_ = r.Close(ctx)
			return nil, fmt.Errorf("a2amqtt: responder %s: %w", me, err)
		}
		r.subs = append(r.subs, sub)
	}
	return r, nil
}

// Store returns the task store (for ContextTasks-style queries outside an
// executor, or for tests).
func (r *Responder) Store() taskstore.Store { return r.store }

// Handler returns the a2asrv.RequestHandler the responder serves (the
// bridge around a2a-go's default handler).
func (r *Responder) Handler() a2asrv.RequestHandler { return r.bridge }

// Shutdown drains the responder, for a graceful stop (SIGTERM): it stops taking new requests,
// lets the requests it already accepted run to their end and publish their replies, and
// returns once they have, or when ctx ends (the bound: the error then says how many were still
// running). Call it before Conn.Close, which disconnects. It does not close the Conn.
//
// What happens to requests that arrive once Shutdown has begun depends on the session:
//
//   - With a persistent session (Config.SessionExpiry > 0) the request subscriptions stay, at
//     the broker and here, but their messages are neither handled nor acknowledged: the broker
//     keeps them in the session and delivers them to the next process with this identity, which
//     answers them. A request in flight when the drain began is answered once, by this process;
//     one that arrives during the drain is answered once, by the next. The subscriptions end
//     with the session (when it expires, or a clean session takes the identity over).
//   - With a clean session the broker subscriptions are removed first, so new requests go to
//     the other members of a pool or find no subscriber (PUBACK 0x10: ErrNoSubscribers at the
//     requester); a request already on its way is answered -32004 responder_unavailable,
//     which requesters retry.
//
// Requests still running at the bound are cut off when the Conn closes: their requesters see
// no reply and retry, so those may run twice (set the bound, e.g. the pod's
// terminationGracePeriodSeconds minus a margin, above the longest execution).
func (r *Responder) Shutdown(ctx context.Context) error {
	r.closeMu.Lock()
	defer r.closeMu.Unlock()
	var errs []error
	if r.conn.cfg.SessionExpiry > 0 {
		// Withhold first, then stop accepting: a request dispatched before this point was
		// accepted (and is served), every later one stays in the session.
		for _, s := range r.subs {
			s.withhold()
		}
		r.closing.Store(true)
	} else {
		r.closing.Store(true)
		for _, s := range r.subs {
			if err := s.leaveBroker(ctx); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if n := r.inflight.Load(); n > 0 {
		r.log.Info("responder draining: finishing the requests in flight", "in_flight", n)
	}
	done := make(chan struct{})
	go func() {
		r.wg.Wait()
		r.stopOnce.Do(func() { close(r.stopWorkers) })
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("a2amqtt: responder shutdown: %d requests still in flight: %w", r.inflight.Load(), ctx.Err()))
	}
	// Executors fetch history until they finish: the history requester goes last.
	if r.history != nil {
		if err := r.history.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// CopiesDropped counts the requests that arrived a second time (the broker resent a persistent
// session's message whose PUBACK it had not seen, or a publisher resent it) and were dropped
// because this responder had already taken them: each request runs once.
func (r *Responder) CopiesDropped() uint64 { return r.copiesDropped.Load() }

// Close is Shutdown: it stops taking requests and waits (bounded by ctx) for the requests in
// flight to be answered. It does not close the Conn.
func (r *Responder) Close(ctx context.Context) error { return r.Shutdown(ctx) }

// inbound is what the receive goroutine hands to a worker.
type inbound struct {
	topic    string
	payload  []byte
	respTo   string
	corr     []byte
	user     paho.UserProperties
	expiry   *uint32
	received time.Time
	// accepted: the request arrived before Shutdown began, so it is served even while draining.
	accepted bool
}

func (r *Responder) onRequest(p *paho.Publish) {
	if !r.recent.firstTime(p.Properties.ResponseTopic, p.Properties.CorrelationData) {
		// Already taken: its run answers it (or answered it), once.
		r.copiesDropped.Add(1)
		r.log.Debug("a2a request delivered again: dropped, it was already taken", "topic", p.Topic, "duplicate_flag", p.Duplicate())
		return
	}
	in := &inbound{
		topic:    p.Topic,
		payload:  p.Payload,
		respTo:   p.Properties.ResponseTopic,
		corr:     p.Properties.CorrelationData,
		user:     p.Properties.User,
		expiry:   p.Properties.MessageExpiry,
		received: time.Now(),
	}
	// onRequest runs on the receive goroutine, serialised with Shutdown's withhold: a request
	// seen before the drain began is accepted and served to its end.
	in.accepted = !r.closing.Load()
	r.wg.Add(1)
	r.inflight.Add(1)
	select {
	case r.idle <- in:
		// An idle worker took it.
	default:
		go r.worker(in)
	}
}

// workerIdle is how long a worker goroutine waits for the next request before it exits.
// Reusing workers keeps their grown stacks: a fresh goroutine per request spent a noticeable
// share of the CPU growing its stack through the JSON decoder (docs/benchmarks.md).
const workerIdle = 30 * time.Second

// worker serves in, then the requests handed to it while idle.
func (r *Responder) worker(in *inbound) {
	timer := time.NewTimer(workerIdle)
	defer timer.Stop()
	for {
		r.serve(in)
		r.inflight.Add(-1)
		r.wg.Done()
		timer.Reset(workerIdle)
		select {
		case in = <-r.idle:
		case <-timer.C:
			return
		case <-r.stopWorkers:
			return
		}
	}
}

func (r *Responder) serve(in *inbound) {
	// The request's trace context (traceparent/tracestate user properties) is the parent of the
	// server span; the executor runs in a child span of it (tracedExecutor).
	ctx, span := r.conn.tracer.Start(extractUserProps(context.Background(), in.user), "a2a.request", trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()
	recording := span.IsRecording()
	if recording {
		span.SetAttributes(spanAttrs("", "", "", in.topic)...)
	}
	pooled := false
	if info, err := ParseTopic(in.topic); err == nil && info.Pool != "" {
		pooled = true
	}
	if in.respTo == "" {
		// No reply path: the profile allows dropping.
		r.log.Warn("dropping request without Response Topic", "topic", in.topic)
		return
	}
	if strings.ContainsAny(in.respTo, "+#") {
		r.log.Warn("dropping request with wildcard Response Topic", "topic", in.topic, "response_topic", in.respTo)
		return
	}
	out := &replier{r: r, topic: in.respTo, corr: in.corr, pooled: pooled, span: span}
	if len(in.corr) == 0 {
		out.sendError(ctx, nil, NewBindingError(A2AErrorTransportProtocolError, "request lacks MQTT Correlation Data"))
		return
	}
	if !in.accepted {
		out.sendError(ctx, nil, NewBindingError(A2AErrorResponderUnavailable, "responder is shutting down"))
		return
	}

	// Wait for a processing slot; overload is reported, not queued forever.
	select {
	case r.slots <- struct{}{}:
	default:
		timer := time.NewTimer(r.opts.QueueTimeout)
		select {
		case r.slots <- struct{}{}:
			timer.Stop()
		case <-timer.C:
			out.sendError(ctx, nil, NewBindingError(A2AErrorResponderUnavailable,
				fmt.Sprintf("responder overloaded: %d requests in progress (limit %d)", len(r.slots), cap(r.slots))))
			return
		}
	}
	defer func() { <-r.slots }()

	if in.expiry != nil && time.Since(in.received) > time.Duration(*in.expiry)*time.Second {
		out.sendError(ctx, nil, NewBindingError(A2AErrorRequestExpired,
			fmt.Sprintf("request expired after waiting %s (message expiry %ds)", time.Since(in.received).Round(time.Millisecond), *in.expiry)))
		return
	}

	req, err := decodeRequest(in.payload, DecodeLimits{MaxPayloadBytes: r.opts.MaxPayloadBytes, RequireTaskID: !r.opts.AcceptMissingTaskID}, true)
	if err != nil {
		var de *DecodeError
		if errors.As(err, &de) {
			out.sendError(ctx, de.ID, de.Err)
			return
		}
		out.sendError(ctx, nil, rpcErrorFrom(err))
		return
	}
	if recording {
		span.SetName("a2a." + req.Method)
		span.SetAttributes(spanAttrs(req.Method, req.TaskID, req.ContextID, "")...)
	}
	if prop := in.user.Get(PropContextID); prop != "" && req.HasMessage && prop != req.ContextID {
		out.sendError(ctx, req.ID, NewBindingError(A2AErrorTransportProtocolError,
			fmt.Sprintf("%s user property %q does not match params.message.contextId %q", PropContextID, prop, req.ContextID)))
		return
	}
	if req.Dialect == DialectV03 && r.opts.DisableV03 {
		out.sendError(ctx, req.ID, rpcErrorFrom(fmt.Errorf("A2A v0.3 method %q is disabled on this agent: %w", req.Method, errMethodNotFound)))
		return
	}

	if req.Dialect == DialectV1 {
		r.serveV1(ctx, out, in, req)
		return
	}
	handler := r.v03
	hreq, err := http.NewRequestWithContext(context.WithValue(ctx, scopeKey{}, r.scope), http.MethodPost, "/", bytes.NewReader(in.payload))
	if err != nil {
		out.sendError(ctx, req.ID, rpcErrorFrom(fmt.Errorf("build handler request: %w", err)))
		return
	}
	hreq.Header.Set("Content-Type", "application/json")
	for _, up := range in.user {
		// Service parameters travel as user properties; the bearer token
		// also becomes the Authorization header a2a-go auth expects.
		hreq.Header.Add(up.Key, up.Value)
		if up.Key == PropAuthorization {
			hreq.Header.Set("Authorization", up.Value)
		}
	}
	w := &replyWriter{ctx: ctx, out: out, header: http.Header{}}
	handler.ServeHTTP(w, hreq)
	w.finish()
}

// replyReconnectWait bounds how long a reply waits for a lost connection to come back.
const replyReconnectWait = 30 * time.Second

// replier publishes replies for one request.
type replier struct {
	r      *Responder
	topic  string
	corr   []byte
	pooled bool
	sent   int
	span   trace.Span
}

func (o *replier) send(ctx context.Context, payload []byte) { o.sendMode(ctx, payload, false) }

// sendMode publishes one reply; stream items go out pipelined (async) so a
// long stream is not paced by one PUBACK round trip per item.
func (o *replier) sendMode(ctx context.Context, payload []byte, async bool) {
	p := &paho.Publish{
		Topic:   o.topic,
		QoS:     1,
		Payload: payload,
		Properties: &paho.PublishProperties{
			CorrelationData: o.corr,
			ContentType:     "application/json",
		},
	}
	if o.pooled {
		p.Properties.User = paho.UserProperties{{Key: PropResponderAgentID, Value: o.r.conn.Agent().Agent}}
	}
	var err error
	if async {
		err = o.r.conn.publishAsyncWithin(ctx, p, replyReconnectWait)
	} else {
		_, err = o.r.conn.publishWithin(ctx, p, replyReconnectWait)
	}
	if err != nil {
		o.r.log.Error("publish reply failed", "response_topic", o.topic, "err", err)
		return
	}
	o.sent++
}

func (o *replier) sendError(ctx context.Context, id any, e *RPCError) {
	o.sendErrorMode(ctx, id, e, false)
}

func (o *replier) sendErrorMode(ctx context.Context, id any, e *RPCError, async bool) {
	o.r.log.Debug("answering with JSON-RPC error", "code", e.Code, "message", e.Message)
	if o.span != nil {
		o.span.SetStatus(codes.Error, e.Error())
	}
	o.sendMode(ctx, encodeError(id, e), async)
}

// replyWriter is the http.ResponseWriter the a2a-go JSON-RPC handlers write
// into: a single JSON body for unary methods, Server-Sent Events for
// streaming ones. Each SSE event becomes one MQTT reply as soon as it is
// flushed, so stream items leave in order and without buffering.
type replyWriter struct {
	ctx    context.Context
	out    *replier
	header http.Header
	buf    bytes.Buffer
	sse    bool
	status int
}

func (w *replyWriter) Header() http.Header { return w.header }

func (w *replyWriter) WriteHeader(code int) {
	if w.status != 0 {
		return
	}
	w.status = code
	w.sse = strings.HasPrefix(w.header.Get("Content-Type"), "text/event-stream")
}

func (w *replyWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return w.buf.Write(p)
}

// Flush implements http.Flusher (required by a2a-go's SSE writer).
func (w *replyWriter) Flush() {
	if !w.sse {
		return
	}
	for {
		data := w.buf.Bytes()
		i := bytes.Index(data, []byte("\n\n"))
		if i < 0 {
			return
		}
		event := data[:i]
		var payload []byte
		for _, line := range bytes.Split(event, []byte("\n")) {
			if rest, ok := bytes.CutPrefix(line, []byte("data:")); ok {
				payload = append(payload, bytes.TrimPrefix(rest, []byte(" "))...)
			}
		}
		w.buf.Next(i + 2)
		if len(payload) > 0 {
			w.out.sendMode(w.ctx, bytes.Clone(payload), true)
		}
	}
}

func (w *replyWriter) finish() {
	if w.sse {
		w.Flush()
		return
	}
	body := bytes.TrimSpace(w.buf.Bytes())
	if len(body) > 0 {
		w.out.send(w.ctx, bytes.Clone(body))
	}
}
