// Package convservice is the conversation service: an A2A-over-MQTT reverse
// proxy in front of the agents a ConversationPolicy governs ("gated" agents,
// DESIGN §4, internal/gate). It consumes their public request topics, rules
// on every request with the conversation engine (internal/conversation)
// through an atomic store update (internal/convstore), forwards accepted
// requests to the agent's delivery topic, and relays every reply event back
// to the requester after the engine has observed it, so a follow-up sent the
// instant a task completes already sees the completion. It also answers
// GetTask/ListTasks on its own request topic from memory (task summaries,
// or messages and artifacts in history mode Messages), so responders can read
// a context's prior turns; it enforces the continuation hints responders
// declare, stamps the accepted_history_digest of each run into its pause, and
// bridges agents that create their own task ids (docs/conversation-service.md).
package convservice

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"k8s.io/client-go/rest"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/internal/convstore"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// Config configures one service replica.
type Config struct {
	// BrokerURL is the MQTT v5 broker (mqtt://host:1883, ...).
	BrokerURL string
	// Username and Password are the service's broker credentials (the
	// Secret EnsureServiceCredentials writes: username a2a:conversation-service).
	Username string
	Password string
	// Credentials, when set, replaces Username and Password (as in a2amqtt.Config): asked at
	// every CONNECT (a mounted Secret, a2amqtt.CredentialsDir), so a password the operator
	// changes is used at the next reconnect, without a restart.
	Credentials a2amqtt.CredentialSource
	// ReplicaID names this replica: its MQTT client id is
	// a2a-fleet/system/conversation-service-{ReplicaID} and agents reply to
	// $a2a/v1/reply/a2a-fleet/system/conversation-service/{ReplicaID}.
	// Must match ^[A-Za-z0-9_.-]+$; defaults to the host name.
	ReplicaID string
	// Store is "bolt:PATH" (one replica, survives restarts) or a Redis URL
	// (several replicas: each owns a share of the gated agents, decides for
	// them from memory and consumes only their request topics;
	// docs/conversation-service.md, "Replicas"): redis://host:port/db, or a
	// Sentinel-managed primary (redis+sentinel://), or a cluster
	// (redis+cluster://), as convstore.ParseRedisURL reads them.
	Store string
	// RedisPrefix namespaces the Redis keys (default "a2af").
	RedisPrefix string
	// BoltNoSync skips fsync on bolt commits (tests and benchmarks only).
	BoltNoSync bool
	// LeaseTTL is how long a replica's ownership of an agent lasts without
	// renewal (Redis; default 15s): a crashed replica's agents move to the
	// others within about this long.
	LeaseTTL time.Duration
	// RestConfig reaches the Kubernetes API (Agents, ConversationPolicies).
	RestConfig *rest.Config
	// Namespace restricts the watch to one namespace ("" = all).
	Namespace string
	// MetricsAddr serves /metrics ("" or "0" = off).
	MetricsAddr string
	// HealthAddr serves /healthz and /readyz ("" or "0" = off).
	HealthAddr string
	// Now is the clock (default time.Now); the engine never reads a clock
	// itself, so tests can move time.
	Now func() time.Time
	// SweepInterval is how often due contexts are expired (default 1s).
	SweepInterval time.Duration
	// StatsInterval is how often the context/task gauges are recomputed
	// from the store (default 15s).
	StatsInterval time.Duration
	// ResyncInterval re-reads the gated agents and retries subscriptions
	// the broker refused (default 10s; changes are also applied on watch
	// events at once).
	ResyncInterval time.Duration
	// Workers is how many goroutines handle requests and replies (default
	// 32). Messages with the same correlation data go to the same worker,
	// so a reply stream keeps its order.
	Workers int
	// RouteSecret keys the AEAD (AES-256-GCM) that seals routes in forwarded
	// correlation data, and derives the replica's MQTT client id; every
	// replica must use the same one. Defaults to Password.
	RouteSecret []byte
	// PreviousRouteSecrets still open routes sealed before a key rotation
	// (docs/conversation-service.md, "Keys").
	PreviousRouteSecrets [][]byte
	// TLS for the broker connection (mqtts://, tls://, wss://): a CA bundle
	// to verify the broker with (default: the system roots) and a client
	// certificate and key for brokers that require one.
	TLSCAFile, TLSCertFile, TLSKeyFile string
	// SessionExpiry keeps the replica's MQTT session on the broker this
	// long after a disconnect (Clean Start false), so replies and requests
	// published while the replica restarts are delivered when it is back
	// (default 10m; negative: clean start on every connection).
	SessionExpiry time.Duration
	// ReadinessGrace is how long the broker connection may be down (an
	// expected reconnect) before /readyz fails (default 10s).
	ReadinessGrace time.Duration
	// HandoverWait bounds how long a request (or reply) for an agent that
	// is assigned to this replica but not yet held by it (a hand-over
	// between replicas, a restart) waits for the agent before it is
	// answered -32004 responder_unavailable (Redis; default 10s).
	HandoverWait time.Duration
	// MaxPayloadBytes rejects larger requests (default 1 MiB).
	MaxPayloadBytes int
	// CallerRate is how many requests per second one caller (the verified
	// publisher) may send to this replica, to all gated agents and the
	// history endpoint together, as a token bucket of CallerBurst; beyond it
	// a request is answered CodeRateLimited with retry_after (ratelimit.go).
	// 0: DefaultCallerRate; negative: no limit.
	CallerRate float64
	// CallerBurst is the bucket's size (0: DefaultCallerBurst).
	CallerBurst int
	// AgentHistoryRate is how many reads of its own conversations' history
	// per second a governed agent may send to this replica, a budget of its
	// own, not charged to CallerRate (ratelimit.go), as a token bucket of
	// AgentHistoryBurst. 0: DefaultAgentHistoryRate; negative: no limit.
	AgentHistoryRate float64
	// AgentHistoryBurst is that bucket's size (0: DefaultAgentHistoryBurst).
	AgentHistoryBurst int
	// TracerProvider receives the service's spans (receive → decide →
	// forward, and relay), which continue the requester's trace from the
	// traceparent user property and propagate it to the agent. Default:
	// none recorded.
	TracerProvider trace.TracerProvider
	// Logger defaults to logr.Discard().
	Logger logr.Logger
	// Registry receives the metrics (default: a new registry, served on
	// MetricsAddr).
	Registry *prometheus.Registry
}

// defaults checks what is required and fills in what is not set, in named steps.
func (c *Config) defaults() error {
	if err := c.requireSettings(); err != nil {
		return err
	}
	c.defaultIntervals()
	c.defaultLimits()
	if err := c.defaultRouteSecret(); err != nil {
		return err
	}
	c.defaultPlumbing()
	return nil
}

// requireSettings checks the settings without a default (and defaults the replica id to the
// host name).
func (c *Config) requireSettings() error {
	if c.ReplicaID == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("default replica id from host name: %w", err)
		}
		c.ReplicaID = h
	}
	if !a2amqtt.ValidID(c.ReplicaID) {
		return fmt.Errorf("replica id %q must match ^[A-Za-z0-9_.-]+$", c.ReplicaID)
	}
	if c.BrokerURL == "" {
		return errors.New("broker URL is required")
	}
	if c.RestConfig == nil {
		return errors.New("kubernetes rest config is required")
	}
	if c.Store == "" {
		return errors.New("store is required (bolt:PATH, redis://..., redis+sentinel://... or redis+cluster://...)")
	}
	return nil
}

// defaultIntervals sets the clock and the durations left unset.
func (c *Config) defaultIntervals() {
	if c.Now == nil {
		c.Now = time.Now
	}
	orDefault(&c.SweepInterval, time.Second)
	orDefault(&c.StatsInterval, 15*time.Second)
	orDefault(&c.ResyncInterval, 10*time.Second)
	orDefault(&c.LeaseTTL, 15*time.Second)
	if c.SessionExpiry == 0 {
		c.SessionExpiry = 10 * time.Minute // negative: clean start
	}
	orDefault(&c.ReadinessGrace, 10*time.Second)
	orDefault(&c.HandoverWait, 10*time.Second)
}

// defaultLimits sets the worker count, the payload bound and the rate limits left unset
// (a negative rate means no limit and is kept).
func (c *Config) defaultLimits() {
	orDefault(&c.Workers, 32)
	orDefault(&c.MaxPayloadBytes, 1<<20)
	if c.CallerRate == 0 {
		c.CallerRate = DefaultCallerRate
	}
	orDefault(&c.CallerBurst, DefaultCallerBurst)
	if c.AgentHistoryRate == 0 {
		c.AgentHistoryRate = DefaultAgentHistoryRate
	}
	orDefault(&c.AgentHistoryBurst, DefaultAgentHistoryBurst)
}

// defaultRouteSecret keys the routes with the password at the start when no route secret is set.
func (c *Config) defaultRouteSecret() error {
	if c.RouteSecret != nil {
		return nil
	}
	c.RouteSecret = []byte(c.Password)
	if c.Credentials != nil {
		// The password at the start keys the routes; a rotated one must not change the key
		// under the routes in flight (--route-secret-file decouples them).
		_, pass, err := c.Credentials.Credentials()
		if err != nil {
			return fmt.Errorf("read the credentials for the default route secret: %w", err)
		}
		c.RouteSecret = pass
	}
	return nil
}

// defaultPlumbing sets the Redis prefix, the logger, the tracer provider and the metrics
// registry left unset.
func (c *Config) defaultPlumbing() {
	if c.RedisPrefix == "" {
		c.RedisPrefix = "a2af"
	}
	if c.Logger.GetSink() == nil {
		c.Logger = logr.Discard()
	}
	if c.TracerProvider == nil {
		c.TracerProvider = noop.NewTracerProvider()
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
}

// orDefault sets *v to def when it is zero or negative.
func orDefault[T int | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// Service is a running replica.
type Service struct {
	cfg     Config
	log     logr.Logger
	journal convstore.Journal
	mem     *convstore.Memory
	// owners is the agent ownership of several replicas (Redis); nil: this
	// replica owns every agent (bbolt).
	owners     *ownership
	ownersKick chan struct{}
	// ping checks the shared store for readiness (nil: local file).
	ping       func(context.Context) error
	conn       *a2amqtt.Conn
	seal       *sealer
	tracer     trace.Tracer
	replyTopic string
	m          *metrics
	gated      *registry
	// limiter holds the callers' request rates (nil: no limit);
	// rateAnswers are the refusals answerRateLimited publishes.
	limiter     *callerLimiter
	rateAnswers chan *paho.Publish
	// routes are the routes replies arrived on, and those whose last reply was relayed (replay.go).
	routes *routeLog
	// runs are the runs in flight (digest inputs, re-presentation); ids
	// the agents' task-id modes (taskids.go).
	runs *runs
	ids  *idModes

	shards []chan func()
	// runCtx ends when the replica closes.
	runCtx context.Context
	// quit is closed by Close: workers finish what is queued and exit, and
	// dispatch stops queueing (the shard channels are never closed, so a
	// message racing with Close cannot panic a send).
	quit chan struct{}
	// started is closed once the replica has its registry: messages a
	// persistent session delivers before that wait for it.
	started chan struct{}
	wg      sync.WaitGroup
	stop    context.CancelFunc
	done    chan struct{}
	ready   atomic.Bool
	https   []*http.Server
	closed  sync.Once

	// The parts (parts.go), built by wire.
	workers   *workers
	spans     *spans
	outbox    *outbox
	handover  *handover
	admission *admission
	taskIDs   *taskIDs
	forwarder *forwarder
	sweeper   *sweeper
	history   *history
	requests  *requests
	replies   *replies
}

// Run starts a replica and serves until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	s, err := Start(ctx, cfg)
	if err != nil {
		return err
	}
	<-ctx.Done()
	return s.Close()
}

// Start connects to the store, the broker and the Kubernetes API, subscribes
// to the gated agents' request topics and returns once the replica serves.
func Start(ctx context.Context, cfg Config) (*Service, error) {
	if err := cfg.defaults(); err != nil {
		return nil, fmt.Errorf("conversation service config: %w", err)
	}
	seal, err := newSealer(cfg.RouteSecret, cfg.PreviousRouteSecrets...)
	if err != nil {
		return nil, fmt.Errorf("conversation service config: %w", err)
	}
	tlsCfg, err := tlsConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("conversation service config: %w", err)
	}
	s := &Service{
		cfg:        cfg,
		log:        cfg.Logger.WithValues("replica", cfg.ReplicaID),
		seal:       seal,
		tracer:     cfg.TracerProvider.Tracer(tracerName),
		replyTopic: identity.Service.ReplyTopic(cfg.ReplicaID),
		m:          newMetrics(cfg.Registry),
		done:       make(chan struct{}),
		quit:       make(chan struct{}),
		started:    make(chan struct{}),
		ownersKick: make(chan struct{}, 1),
		runs:       newRuns(),
		ids:        newIDModes(),
		limiter:    newCallerLimiter(cfg.CallerRate, cfg.CallerBurst, cfg.AgentHistoryRate, cfg.AgentHistoryBurst),
		routes:     newRouteLog(),
		// Bounded: past it, refusals go unanswered (counted).
		rateAnswers: make(chan *paho.Publish, 4096),
	}
	if err := s.openState(ctx); err != nil {
		return nil, err
	}
	runCtx, stop := context.WithCancel(context.Background())
	s.stop, s.runCtx = stop, runCtx
	fail := func(err error) (*Service, error) {
		_ = s.Close()
		return nil, err
	}
	s.shards = make([]chan func(), cfg.Workers)
	for i := range s.shards {
		ch := make(chan func(), 256)
		s.shards[i] = ch
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			// Messages can arrive before the replica has its registry (a
			// persistent session's backlog): hold them until it has.
			select {
			case <-s.started:
			case <-s.quit:
				return // never started: nothing to serve them with
			}
			for {
				select {
				case job := <-ch:
					job()
				case <-s.quit:
					for {
						select {
						case job := <-ch:
							job()
						default:
							return
						}
					}
				}
			}
		}()
	}
	s.wire()
	if err := s.serveHTTP(); err != nil {
		return fail(err)
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.admission.answerRateLimited()
	}()
	conn, err := s.connectBroker(ctx, a2amqtt.Config{
		BrokerURL:   cfg.BrokerURL,
		Username:    cfg.Username,
		Password:    cfg.Password,
		Credentials: cfg.Credentials,
		Agent:       clientRef(cfg.RouteSecret, cfg.ReplicaID),
		TLSConfig:   tlsCfg,
		// Persistent session: what the broker queued while this replica
		// was away arrives before the handlers below are registered.
		SessionExpiry: max(cfg.SessionExpiry, 0),
		Unmatched:     s.onQueued,
		Logger:        slog.New(logr.ToSlogHandler(s.log.WithName("mqtt"))),
	})
	if err != nil {
		return fail(fmt.Errorf("conversation service: connect broker: %w", err))
	}
	s.conn = conn
	s.wireConn()
	// Replies first: a request forwarded before this subscription existed
	// could be answered into the void.
	if _, err := conn.Subscribe(ctx, s.replyTopic, s.replies.onReply); err != nil {
		return fail(fmt.Errorf("conversation service: subscribe reply topic: %w", err))
	}
	if _, err := conn.Subscribe(ctx, identity.Service.RequestTopic(), s.history.onHistoryRequest); err != nil {
		return fail(fmt.Errorf("conversation service: subscribe own request topic: %w", err))
	}
	deps := registryDeps{cfg: cfg, log: s.log, conn: conn, gauge: s.m.gatedAgents, consumes: s.handover.consumes, onRequest: s.requests.onRequest}
	if s.owners != nil {
		deps.ownersKick = s.ownersKick
	}
	s.gated, err = newRegistry(ctx, deps)
	if err != nil {
		return fail(err)
	}
	s.wireGated() // before any worker runs
	if s.owners != nil {
		s.owners.gated = s.gated
	}
	close(s.started)
	if s.owners != nil {
		// Take the agents assigned here (a replica restarted under the same
		// id takes its own back at once) and consume their request topics
		// before reporting ready; what a persistent session delivered
		// meanwhile waits for its agent (parked).
		waiting := s.owners.rebalance(ctx)
		s.gated.resync(ctx)
		s.wg.Add(1)
		go func() { defer s.wg.Done(); s.owners.run(runCtx, s.ownersKick, waiting) }()
	}
	s.wg.Add(3)
	go func() { defer s.wg.Done(); s.gated.run(runCtx) }()
	go func() { defer s.wg.Done(); s.sweeper.sweepLoop(runCtx) }()
	go func() { defer s.wg.Done(); s.sweeper.statsLoop(runCtx) }()
	s.ready.Store(true)
	kind, _, _ := strings.Cut(cfg.Store, ":")
	s.log.Info("conversation service started", "reply_topic", s.replyTopic, "store", kind)
	return s, nil
}

// openState opens the journal and, for a single replica, rebuilds every
// agent's state from it (with Redis, each agent is rebuilt when this
// replica takes it over).
func (s *Service) openState(ctx context.Context) error {
	switch {
	case strings.HasPrefix(s.cfg.Store, "bolt:"):
		j, err := convstore.OpenBoltJournal(strings.TrimPrefix(s.cfg.Store, "bolt:"), &convstore.BoltOptions{NoSync: s.cfg.BoltNoSync, Timeout: 30 * time.Second})
		if err != nil {
			return fmt.Errorf("conversation service: %w", err)
		}
		s.journal, s.mem = j, convstore.NewMemory(j, true)
		start := time.Now()
		if err := s.mem.Recover(ctx, "", nil); err != nil {
			return fmt.Errorf("conversation service: recover state: %w", err)
		}
		live, _ := s.mem.Stats()
		n := 0
		for _, v := range live {
			n += v
		}
		s.log.Info("conversation state recovered", "live_contexts", n, "took", time.Since(start).Round(time.Millisecond))
	case convstore.IsRedisURL(s.cfg.Store):
		// redis://, redis+sentinel://, redis+cluster:// (convstore.ParseRedisURL).
		rs, err := convstore.ParseRedisURL(s.cfg.Store)
		if err != nil {
			return fmt.Errorf("conversation service: %w", err)
		}
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		j, err := rs.Open(pctx, s.cfg.RedisPrefix)
		if err != nil {
			return fmt.Errorf("conversation service: %w", err)
		}
		s.journal, s.mem, s.ping = j, convstore.NewMemory(j, false), j.Ping
		s.owners = newOwnership(s.cfg, s.log, s.mem, j)
		s.log.Info("redis store", "store", rs.Describe(), "kind", rs.Kind, "wait_replicas", rs.WaitReplicas, "wait_timeout", rs.WaitTimeout.String())
	default:
		return fmt.Errorf("conversation service: store %q: want bolt:PATH, redis://, redis+sentinel:// or redis+cluster://", s.cfg.Store)
	}
	return nil
}

// connectBroker connects until it succeeds or ctx ends: at an install's start the broker (or this
// service's broker identity, which the operator creates) may come after the service, and a replica
// that exits then only restarts later (measured on kind: the pod restarted once, 10 s after its
// start, "connection refused" from the broker's Service). Meanwhile /readyz says not started.
func (s *Service) connectBroker(ctx context.Context, cfg a2amqtt.Config) (*a2amqtt.Conn, error) {
	backoff := time.Second
	for attempt := 1; ; attempt++ {
		conn, err := a2amqtt.Connect(ctx, cfg)
		if err == nil {
			return conn, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		s.log.Info("broker not reachable yet; retrying", "attempt", attempt, "in", backoff, "err", err.Error())
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

func (s *Service) serveHTTP() error {
	listen := func(addr string, mux *http.ServeMux) error {
		if addr == "" || addr == "0" {
			return nil
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("conversation service: listen %s: %w", addr, err)
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		s.https = append(s.https, srv)
		go func() { _ = srv.Serve(l) }()
		return nil
	}
	metricsMux := http.NewServeMux()
	metricsMux.Handle("/metrics", promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{}))
	if err := listen(s.cfg.MetricsAddr, metricsMux); err != nil {
		return err
	}
	health := http.NewServeMux()
	health.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := s.live(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	health.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := s.Ready(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	return listen(s.cfg.HealthAddr, health)
}

// Ready reports why the replica cannot serve: not started (or closing), the
// broker connection down for longer than ReadinessGrace (an expected
// reconnect is not a failure), or the state store unreachable.
func (s *Service) Ready(ctx context.Context) error {
	if !s.ready.Load() {
		return errors.New("not started")
	}
	if err := s.conn.Healthy(s.cfg.ReadinessGrace); err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	if s.ping != nil {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if err := s.ping(pctx); err != nil {
			return fmt.Errorf("state store: %w", err)
		}
	}
	return nil
}

// live fails only for a wedged process: the sweep loop, which ticks every
// SweepInterval, has not come round for a long time.
func (s *Service) live() error {
	last := s.sweeper.lastSweep.Load()
	if last == 0 {
		return nil
	}
	limit := max(time.Minute, 20*s.cfg.SweepInterval)
	if since := time.Since(time.Unix(0, last)); since > limit {
		return fmt.Errorf("sweep loop stuck for %s", since.Round(time.Second))
	}
	return nil
}

// serves reports whether this replica decides for agent: always with one
// replica, else while it owns the agent.
func (s *handover) serves(agent string) bool {
	return s.owners == nil || s.owners.owns(agent)
}

// consumes reports whether this replica subscribes agent's request topic:
// always with one replica, else while it owns the agent or is assigned it.
func (s *handover) consumes(agent string) bool {
	return s.owners == nil || s.owners.consumes(agent)
}

// historyRole says what this replica does with a history query about an
// agent (every replica receives them).
type historyRole int

const (
	// historyAnswer: answer from memory (this replica owns the agent; an
	// agent nobody holds state for is answered as empty by its assigned
	// replica).
	historyAnswer historyRole = iota
	// historyIgnore: another replica answers.
	historyIgnore
	// historyUnavailable: the agent has state that no replica holds yet
	// (it is being taken over): answer -32004, retryable.
	historyUnavailable
)

func (s *handover) historyRole(agent string) historyRole {
	if s.serves(agent) {
		return historyAnswer
	}
	return s.owners.historyRole(agent)
}

// ReplyTopic is where agents answer this replica.
func (s *Service) ReplyTopic() string { return s.replyTopic }

// Registry returns the metrics registry.
func (s *Service) Registry() *prometheus.Registry { return s.cfg.Registry }

// GatedAgents returns the agents ("org/unit/agent") this replica currently
// consumes the request topics of.
func (s *Service) GatedAgents() []string {
	if s.gated == nil {
		return nil
	}
	return s.gated.subscribed()
}

// Close stops consuming, drains the workers and closes the connection and
// (when opened here) the store.
func (s *Service) Close() error {
	var errs []error
	s.closed.Do(func() {
		s.ready.Store(false)
		if s.stop != nil {
			s.stop()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if s.gated != nil {
			s.gated.close()
		}
		if s.conn != nil {
			errs = append(errs, s.conn.Close(ctx))
		}
		close(s.quit)
		s.wg.Wait()
		for _, h := range s.https {
			_ = h.Shutdown(ctx)
		}
		if s.owners != nil {
			s.owners.release()
		}
		if s.journal != nil {
			errs = append(errs, s.journal.Close())
		}
		close(s.done)
	})
	return errors.Join(errs...)
}

// dispatch runs job on the worker owning key (the correlation data), so
// messages of one reply stream are handled in order. It blocks when that
// worker is saturated, which applies backpressure to the broker.
func (s *workers) dispatch(key []byte, job func()) {
	h := fnv.New32a()
	h.Write(key)
	select {
	case s.shards[h.Sum32()%uint32(len(s.shards))] <- job:
	case <-s.quit:
		// Closing: the broker connection is already gone, nobody would
		// read what this message produced.
	}
}

// publishTimeout bounds how long publish waits for a PUBACK.
const publishTimeout = 30 * time.Second

// publish sends p, waiting for the PUBACK at most publishTimeout. A handler's
// context already ends sooner (handleTimeout): no second timer per message.
func (s *outbox) publish(ctx context.Context, p *paho.Publish) (*paho.PublishResponse, error) {
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= publishTimeout {
		return s.conn.Publish(ctx, p)
	}
	pctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	return s.conn.Publish(pctx, p)
}

func (s *sweeper) sweepLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.SweepInterval)
	defer t.Stop()
	lastPrune := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.lastSweep.Store(time.Now().UnixNano())
		swept, t := s.mem.Sweep(s.gated.policyOf, s.cfg.Now())
		if err := t.Wait(ctx); err != nil {
			if ctx.Err() == nil {
				s.log.Error(err, "journal expiry sweep")
			}
			continue
		}
		for _, x := range swept {
			s.expired(ctx, x.Agent, x.Expiration)
		}
		if time.Since(lastPrune) > runPruneInterval {
			// Runs end with their task's pause or end; this catches the
			// rest (a task evicted or expired while running).
			lastPrune = time.Now()
			s.runs.prune(func(agent, task string) bool {
				_, t := s.mem.Task(agent, task)
				return t != nil && runningState(t.State)
			})
		}
	}
}

// runPruneInterval is how often runs of tasks that stopped running are
// forgotten.
const runPruneInterval = 30 * time.Second

// expired acts on what expiry did: tasks failed by the input-required
// timeout and unfinished tasks of an expired context are canceled at the
// agent, which still believes they wait or run.
func (s *sweeper) expired(ctx context.Context, agent string, x conversation.Expiration) {
	for _, t := range x.TimedOut {
		s.runs.end(agent, t.TaskID)
		s.log.Info("input-required timeout: task failed", "agent", agent, "context", x.ContextID, "task", t.TaskID, "waiting_since", t.WaitingSince)
		s.cancelAtAgent(ctx, agent, x.ContextID, t.TaskID)
		if t.Notify != nil {
			// The requester's stream ended at input-required; tell it there
			// anyway (a client still listening learns at once, others drop
			// an unknown correlation; the next resume gets -32004 with the
			// same status message).
			s.notifyFailed(ctx, *t.Notify, x.ContextID, t.TaskID, t.StatusMessage)
		}
	}
	for _, u := range x.Unacknowledged {
		s.runs.end(agent, u.TaskID)
		s.log.Info("first-event timeout: no agent acknowledged the request, run undone", "agent", agent,
			"context", x.ContextID, "task", u.TaskID, "forwarded_at", u.Since)
		s.m.rejections.WithLabelValues(a2amqtt.A2AErrorResponderUnavailable).Inc()
		for _, st := range u.Streams {
			s.answer(ctx, st.ResponseTopic, st.Correlation, nil, a2amqtt.NewBindingError(a2amqtt.A2AErrorResponderUnavailable,
				fmt.Sprintf("agent %s did not acknowledge task %s within %s of it being forwarded (no agent is reading its requests); the task was not started, retry later",
					agent, u.TaskID, s.gated.policyOf(agent).FirstEventTimeout)))
		}
	}
	if x.Expired != nil {
		s.log.Info("context expired", "agent", agent, "context", x.ContextID, "reason", x.Expired.Reason)
		for _, t := range x.Dropped {
			s.runs.end(agent, t.ID)
			if !t.Terminal() {
				s.cancelAtAgent(ctx, agent, x.ContextID, t.ID)
			}
		}
	}
}

func (s *sweeper) statsLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.StatsInterval)
	defer t.Stop()
	for {
		s.refreshStats(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// refreshStats sets the gauges from the counters the in-memory state keeps
// (no scan of the store).
func (s *sweeper) refreshStats(context.Context) {
	live, states := s.mem.Stats()
	s.m.activeContexts.Reset()
	for a, n := range live {
		s.m.activeContexts.WithLabelValues(a).Set(float64(n))
	}
	s.m.tasks.Reset()
	for st, n := range states {
		if n > 0 {
			s.m.tasks.WithLabelValues(string(st)).Set(float64(n))
		}
	}
	items, bytes := s.mem.HistoryStats()
	s.m.historyItems.Set(float64(items))
	s.m.historyBytes.Set(float64(bytes))
}
