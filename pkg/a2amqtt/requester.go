package a2amqtt

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"
)

// RetryPolicy is the profile's "Requester Retry and Timeout Profile". The
// zero value means the profile defaults.
type RetryPolicy struct {
	// FirstReplyTimeout is reply_first_timeout_ms (default 15s).
	FirstReplyTimeout time.Duration
	// StreamIdleTimeout is stream_idle_timeout_ms (default 30s).
	StreamIdleTimeout time.Duration
	// MaxAttempts is max_attempts including the first (default 3).
	MaxAttempts int
	// BackoffBase is the first retry delay, doubled per retry (default 1s,
	// giving 1s, 2s, 4s).
	BackoffBase time.Duration
	// Jitter is the +/- fraction applied to each delay (default 0.2).
	// Negative disables jitter.
	Jitter float64
	// RateLimitRetries is how many times one call is sent again after a -32070 rate_limited
	// answer, each after the answer's retry_after (ratelimited.go; default 10). Negative: none,
	// ErrRateLimited is returned at once.
	RateLimitRetries int
	// RateLimitMaxWait bounds the time one call spends waiting for retry_after in total, when
	// its context has no earlier deadline (default 30s).
	RateLimitMaxWait time.Duration
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.FirstReplyTimeout <= 0 {
		p.FirstReplyTimeout = 15 * time.Second
	}
	if p.StreamIdleTimeout <= 0 {
		p.StreamIdleTimeout = 30 * time.Second
	}
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = 3
	}
	if p.BackoffBase <= 0 {
		p.BackoffBase = time.Second
	}
	if p.Jitter == 0 {
		p.Jitter = 0.2
	}
	if p.Jitter < 0 {
		p.Jitter = 0
	}
	if p.RateLimitRetries == 0 {
		p.RateLimitRetries = defaultRateLimitRetries
	}
	if p.RateLimitRetries < 0 {
		p.RateLimitRetries = 0
	}
	if p.RateLimitMaxWait <= 0 {
		p.RateLimitMaxWait = defaultRateLimitMaxWait
	}
	return p
}

// Backoff returns the delay before retry number n (1-based): BackoffBase *
// 2^(n-1) with +/- Jitter.
func (p RetryPolicy) Backoff(n int) time.Duration {
	p = p.withDefaults()
	d := float64(p.BackoffBase) * float64(int64(1)<<min(n-1, 20))
	if p.Jitter > 0 {
		d *= 1 + p.Jitter*(2*mrand.Float64()-1)
	}
	return time.Duration(d)
}

// RequesterOptions configures NewRequester.
type RequesterOptions struct {
	// ReplySuffix defaults to 128 random bits in hex (collision resistant
	// across concurrent requesters sharing an identity).
	ReplySuffix string
	Retry       RetryPolicy
	// MessageExpiry, when > 0, sets the MQTT Message Expiry Interval on
	// requests (the profile recommends > FirstReplyTimeout).
	MessageExpiry time.Duration
	// OmitContextIDProperty stops sending the optional a2a-context-id user
	// property next to Message.contextId.
	OmitContextIDProperty bool
	// Authorization, when set, is sent as a2a-authorization ("Bearer ...").
	Authorization string
}

// Requester sends A2A requests over one Conn and demultiplexes replies on
// its reply topic by Correlation Data.
type Requester struct {
	conn  *Conn
	opts  RequesterOptions
	retry RetryPolicy
	reply string
	log   *slog.Logger
	sub   *Subscription

	// dropReply is a test hook that simulates a reply lost in transit.
	dropReply func(*paho.Publish) bool

	// rateLimit counts the calls sent again after -32070 and those that gave up (ratelimited.go).
	rateLimit rateLimitCounters

	mu       sync.Mutex
	inflight map[string]*exchange // by Correlation Data
	routes   map[a2a.TaskID]string
	// routeOrder bounds routes (oldest first): a long-lived requester using
	// a pool learns one route per task and must not grow without limit.
	routeOrder []a2a.TaskID
}

// maxRoutes is how many task → responder routes a requester remembers.
const maxRoutes = 10000

// setRouteLocked records the responder for a task (most recent wins). Caller
// holds r.mu.
func (r *Requester) setRouteLocked(id a2a.TaskID, agent string) {
	if _, known := r.routes[id]; !known {
		r.routeOrder = append(r.routeOrder, id)
		if len(r.routeOrder) > maxRoutes {
			delete(r.routes, r.routeOrder[0])
			r.routeOrder = r.routeOrder[1:]
		}
	}
	r.routes[id] = agent
}

// NewRequester subscribes to the reply topic (before any request is
// published, as the profile requires) and returns a ready requester.
func NewRequester(ctx context.Context, conn *Conn, opts RequesterOptions) (*Requester, error) {
	if opts.ReplySuffix == "" {
		opts.ReplySuffix = randomHex(16)
	} else if err := ValidateID("reply suffix", opts.ReplySuffix); err != nil {
		return nil, fmt.Errorf("a2amqtt: %w", err)
	}
	r := &Requester{
		conn:     conn,
		opts:     opts,
		retry:    opts.Retry.withDefaults(),
		reply:    conn.Agent().ReplyTopic(opts.ReplySuffix),
		log:      conn.Logger(),
		inflight: map[string]*exchange{},
		routes:   map[a2a.TaskID]string{},
	}
	sub, err := conn.Subscribe(ctx, r.reply, r.onReply)
	if err != nil {
		return nil, fmt.Errorf("a2amqtt: subscribe reply topic: %w", err)
	}
	r.sub = sub
	return r, nil
}

// ReplyTopic is the topic replies arrive on.
func (r *Requester) ReplyTopic() string { return r.reply }

// Conn returns the underlying connection.
func (r *Requester) Conn() *Conn { return r.conn }

// Close unsubscribes the reply topic; in-flight calls fail on their
// timeouts. It does not close the Conn.
func (r *Requester) Close(ctx context.Context) error { return r.sub.Close(ctx) }

// ResponderFor returns the agent id that most recently answered for taskID
// via a2a-responder-agent-id (pool dispatch or handover), if any.
func (r *Requester) ResponderFor(taskID a2a.TaskID) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, ok := r.routes[taskID]
	return a, ok
}

// onReply runs on the receive goroutine: only route, never block.
func (r *Requester) onReply(p *paho.Publish) {
	if r.dropReply != nil && r.dropReply(p) {
		return
	}
	corr := p.Properties.CorrelationData
	if len(corr) == 0 {
		r.log.Warn("a2a protocol error: reply without Correlation Data ignored", "topic", p.Topic)
		return
	}
	r.mu.Lock()
	ex := r.inflight[string(corr)]
	r.mu.Unlock()
	if ex == nil {
		// A reply after its call ended: a duplicate of a retried request (the responder
		// dedupes and answers each attempt), a stream item after the caller stopped reading,
		// a reply to an earlier process of a persistent session. Expected, not a warning.
		r.log.Debug("reply with unknown Correlation Data ignored (its call already ended)", "topic", p.Topic, "correlation", hex.EncodeToString(corr))
		return
	}
	ex.box.put(p)
}

// target is where an exchange goes.
type target struct {
	agent AgentRef
	pool  *PoolRef
}

func (t target) String() string {
	if t.pool != nil {
		return t.pool.String()
	}
	return t.agent.String()
}

// topicFor picks the request topic: a known responder for the task (pool
// selection or handover) wins over the target's own topic.
func (r *Requester) topicFor(t target, taskID a2a.TaskID) (topic string, pooled bool) {
	if taskID != "" {
		r.mu.Lock()
		agent, ok := r.routes[taskID]
		r.mu.Unlock()
		if ok {
			org, unit := t.agent.Org, t.agent.Unit
			if t.pool != nil {
				org, unit = t.pool.Org, t.pool.Unit
			}
			return AgentRef{Org: org, Unit: unit, Agent: agent}.RequestTopic(), false
		}
	}
	if t.pool != nil {
		return t.pool.RequestTopic(), true
	}
	return t.agent.RequestTopic(), false
}

// exchange is one logical JSON-RPC call: one request id, one Correlation
// Data per publish attempt, all feeding the same mailbox.
type exchange struct {
	box *mailbox
}

// call describes a request to run.
type call struct {
	target    target
	method    string
	params    any
	taskID    a2a.TaskID
	contextID string
	stream    bool
	// events marks methods whose result is an A2A StreamResponse (send and
	// subscribe); their replies are decoded in one pass into reply.event.
	events bool
}

// reply is one correlated, decoded reply item.
type reply struct {
	resp      rpcResponse
	event     a2a.Event
	responder string
	// more: another reply of the exchange had arrived when this one was handed on.
	more bool
}

// errStop ends an exchange early without error.
var errStop = errors.New("stop")

// do runs the retry profile for c and feeds every correlated reply to
// handle until handle returns done=true or an error. Retries happen only
// before the first correlated reply; afterwards the stream is bound to the
// correlation that answered first.
//
// The call runs in a client span ("a2a.<method>") whose context travels with every publish as
// the W3C traceparent/tracestate user properties.
func (r *Requester) do(ctx context.Context, c call, handle func(rep *reply) (done bool, err error)) (err error) {
	ctx, span := r.conn.tracer.Start(ctx, "a2a."+c.method, trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		// Attributes only for spans that are kept: with tracing off (the default) they would
		// be garbage on every call.
		span.SetAttributes(append(spanAttrs(c.method, string(c.taskID), c.contextID, ""), AttrTarget.String(c.target.String()))...)
	}
	defer func() { endSpan(span, err) }()
	return r.exchange(ctx, c, span, handle)
}

func (r *Requester) exchange(ctx context.Context, c call, span trace.Span, handle func(rep *reply) (done bool, err error)) error {
	payload, err := json.Marshal(rpcRequest{JSONRPC: jsonrpcVersion, ID: uuid.NewString(), Method: c.method, Params: c.params})
	if err != nil {
		return fmt.Errorf("a2amqtt: encode %s request: %w", c.method, err)
	}
	ex := &exchange{box: newMailbox()}
	var corrs []string
	defer func() {
		r.mu.Lock()
		for _, k := range corrs {
			delete(r.inflight, k)
		}
		r.mu.Unlock()
	}()

	limits := r.newRateLimitWaits(ctx)
	var first *paho.Publish
	for {
		// After a refusal the next reply may be waiting already (another attempt's answer).
		if first = ex.box.takeOrReset(); first == nil {
			if first, err = r.firstReply(ctx, c, span, payload, ex, &corrs); err != nil {
				return err
			}
		}
		retry, err := limits.afterReply(ctx, c, first)
		if err != nil {
			return err
		}
		if !retry {
			break
		}
		if span.IsRecording() {
			span.AddEvent("a2a.rate_limited.retry")
		}
	}
	return r.stream(ctx, c, ex, first, handle)
}

// firstReply publishes c's request under the retry profile, each attempt with new Correlation
// Data registered in corrs, until a first correlated reply arrives in ex's mailbox.
func (r *Requester) firstReply(ctx context.Context, c call, span trace.Span, payload []byte, ex *exchange, corrs *[]string) (*paho.Publish, error) {
	var lastErr error
	for n := 1; n <= r.retry.MaxAttempts; n++ {
		if n > 1 {
			if err := sleepCtx(ctx, r.retry.Backoff(n-1)); err != nil {
				return nil, errors.Join(err, lastErr)
			}
		}
		first, retryable, err := r.attempt(ctx, c, span, payload, ex, corrs, n)
		switch {
		case err != nil:
			return nil, err
		case first != nil:
			return first, nil
		case retryable != nil:
			lastErr = retryable
		}
	}
	if lastErr == nil {
		lastErr = ErrNoReply
	}
	return nil, fmt.Errorf("a2amqtt: %s to %s failed after %d attempts: %w", c.method, c.target, r.retry.MaxAttempts, lastErr)
}

// attempt is attempt n of c's request: published with new Correlation Data (registered in corrs,
// feeding ex's mailbox), then a wait of up to FirstReplyTimeout for a correlated reply, of this
// or an earlier attempt. retryable says why there was none (nil when the wake-up was spurious);
// err ends the call (the caller's context).
func (r *Requester) attempt(ctx context.Context, c call, span trace.Span, payload []byte, ex *exchange, corrs *[]string, n int) (first *paho.Publish, retryable, err error) {
	topic, _ := r.topicFor(c.target, c.taskID)
	corr := newCorrelation()
	r.mu.Lock()
	r.inflight[string(corr)] = ex
	r.mu.Unlock()
	*corrs = append(*corrs, string(corr))
	if n == 1 && span.IsRecording() {
		span.SetAttributes(AttrTopic.String(topic))
	}
	// Bound the wait for a reconnect, so a broker outage counts as a
	// failed (retry-eligible) attempt instead of hanging the call.
	resp, err := r.conn.publishWithin(ctx, r.requestPublish(ctx, c, topic, corr, payload), r.retry.FirstReplyTimeout)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		r.log.Debug("request publish not accepted; retry-eligible", "attempt", n, "err", err)
		return nil, err, nil
	}
	if resp != nil && resp.ReasonCode == reasonNoMatchingSubscribers {
		// Nobody listens on the request topic: the agent is offline or
		// unregistered. Treated as "not accepted" (retry-eligible) so a
		// restarting agent still gets the request.
		return ex.box.tryTake(), fmt.Errorf("%s: %w", topic, ErrNoSubscribers), nil
	}
	timer := time.NewTimer(r.retry.FirstReplyTimeout)
	defer timer.Stop()
	select {
	case <-ex.box.notify:
		return ex.box.tryTake(), nil, nil
	case <-timer.C:
		// A late reply to an earlier attempt is still accepted: every
		// attempt's correlation stays registered until the call ends.
		return ex.box.tryTake(), fmt.Errorf("%s on %s: no correlated reply within %s (attempt %d/%d): %w",
			c.method, topic, r.retry.FirstReplyTimeout, n, r.retry.MaxAttempts, ErrNoReply), nil
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
}

// requestPublish is the PUBLISH of one attempt: the request with the reply topic, the attempt's
// Correlation Data, the message expiry, and the user properties (context id, service parameters,
// authorization, trace context).
func (r *Requester) requestPublish(ctx context.Context, c call, topic string, corr, payload []byte) *paho.Publish {
	pub := &paho.Publish{
		Topic:   topic,
		QoS:     1,
		Payload: payload,
		Properties: &paho.PublishProperties{
			ResponseTopic:   r.reply,
			CorrelationData: corr,
			ContentType:     "application/json",
		},
	}
	if r.opts.MessageExpiry > 0 {
		exp := uint32(max(1, r.opts.MessageExpiry/time.Second))
		pub.Properties.MessageExpiry = &exp
	}
	if c.contextID != "" && !r.opts.OmitContextIDProperty {
		pub.Properties.User = append(pub.Properties.User, paho.UserProperty{Key: PropContextID, Value: c.contextID})
	}
	for k, vs := range serviceParamsFrom(ctx) {
		for _, v := range vs {
			pub.Properties.User = append(pub.Properties.User, paho.UserProperty{Key: k, Value: v})
		}
	}
	if r.opts.Authorization != "" {
		pub.Properties.User = append(pub.Properties.User, paho.UserProperty{Key: PropAuthorization, Value: r.opts.Authorization})
	}
	InjectTraceContext(ctx, pub)
	return pub
}

// stream feeds first and every later reply correlated like it to handle, until handle is done.
// Retries happen only before the first correlated reply; afterwards the stream is bound to the
// correlation that answered first.
func (r *Requester) stream(ctx context.Context, c call, ex *exchange, first *paho.Publish, handle func(rep *reply) (done bool, err error)) error {
	bound := string(first.Properties.CorrelationData)
	next := first
	for {
		if next != nil {
			if string(next.Properties.CorrelationData) != bound {
				// Another attempt's answer (the responder deduped by Task.id):
				// the stream is already bound, so ignore it.
				r.log.Debug("ignoring reply from a superseded attempt", "method", c.method)
			} else {
				rep, err := r.decodeReply(c, next)
				if err != nil {
					return err
				}
				rep.more = ex.box.pending()
				done, err := handle(rep)
				if err != nil || done {
					if errors.Is(err, errStop) {
						return nil
					}
					return err
				}
			}
		}
		next = ex.box.tryTake()
		if next != nil {
			continue
		}
		timer := time.NewTimer(r.retry.StreamIdleTimeout)
		select {
		case <-ex.box.notify:
			timer.Stop()
		case <-timer.C:
			return fmt.Errorf("a2amqtt: %s to %s: no stream item within %s: %w", c.method, c.target, r.retry.StreamIdleTimeout, ErrStreamIdle)
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		}
	}
}

func (r *Requester) decodeReply(c call, p *paho.Publish) (*reply, error) {
	rep := &reply{responder: p.Properties.User.Get(PropResponderAgentID)}
	if c.target.pool != nil && rep.responder == "" {
		topic, _ := r.topicFor(c.target, c.taskID)
		if topic == c.target.pool.RequestTopic() {
			return nil, NewBindingError(A2AErrorTransportProtocolError,
				fmt.Sprintf("pooled reply from %s lacks the %s user property", c.target, PropResponderAgentID))
		}
	}
	if rep.responder != "" {
		if !ValidID(rep.responder) {
			return nil, NewBindingError(A2AErrorTransportProtocolError, fmt.Sprintf("invalid %s %q", PropResponderAgentID, rep.responder))
		}
		if c.taskID != "" {
			// Most recent a2a-responder-agent-id wins (handover).
			r.mu.Lock()
			r.setRouteLocked(c.taskID, rep.responder)
			r.mu.Unlock()
		}
	}
	if c.events {
		// One pass straight into the a2a-go event: stream items are the hot
		// path and a RawMessage detour would scan each payload twice.
		ev, rpcErr, err := decodeStreamReply(p.Payload)
		if err != nil {
			return nil, fmt.Errorf("a2amqtt: reply to %s is not an A2A stream response: %w", c.method, err)
		}
		if rpcErr != nil {
			return nil, rpcErr
		}
		if ev == nil {
			return nil, fmt.Errorf("a2amqtt: reply to %s has neither result nor error", c.method)
		}
		rep.event = ev
		return rep, nil
	}
	if err := json.Unmarshal(p.Payload, &rep.resp); err != nil {
		return nil, fmt.Errorf("a2amqtt: undecodable reply to %s: %w", c.method, err)
	}
	if rep.resp.Error != nil {
		return nil, rep.resp.Error
	}
	return rep, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func newCorrelation() []byte {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return b
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// mailbox is an unbounded FIFO: the MQTT receive goroutine must never block
// on a slow consumer, or every other reply on the connection would stall.
type mailbox struct {
	mu     sync.Mutex
	items  []*paho.Publish
	notify chan struct{}
}

func newMailbox() *mailbox { return &mailbox{notify: make(chan struct{}, 1)} }

func (m *mailbox) put(p *paho.Publish) {
	m.mu.Lock()
	m.items = append(m.items, p)
	m.mu.Unlock()
	select {
	case m.notify <- struct{}{}:
	default:
	}
}

// takeOrReset takes the first item, or when there is none clears a notification left from an
// item taken earlier, so that the next wait waits for a new one.
func (m *mailbox) takeOrReset() *paho.Publish {
	if p := m.tryTake(); p != nil {
		return p
	}
	select {
	case <-m.notify:
	default:
	}
	return m.tryTake() // put between the two
}

// pending reports whether an item is waiting.
func (m *mailbox) pending() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.items) > 0
}

func (m *mailbox) tryTake() *paho.Publish {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.items) == 0 {
		return nil
	}
	p := m.items[0]
	m.items[0] = nil
	m.items = m.items[1:]
	return p
}
