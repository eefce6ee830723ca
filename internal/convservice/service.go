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
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/a2a-fleet/a2a-fleet/internal/convstore"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/ownership"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// Service is a running replica: it owns the replica's lifecycle (the store, the broker
// connection, the registry, the loops) and the parts (parts.go) that serve messages.
type Service struct {
	cfg     Config
	log     logr.Logger
	m       *metrics
	journal convstore.Journal
	mem     *convstore.Memory
	// leases are the shared store of several replicas (Redis); nil: this replica owns every
	// agent (bbolt). owners is this replica's share of the agents over them.
	leases     ownership.Leases
	owners     *ownership.Replica
	ownersKick chan struct{}
	// ping checks the shared store for readiness (nil: local file).
	ping       func(context.Context) error
	conn       *a2amqtt.Conn
	replyTopic string
	gated      *registry
	// runs are the runs in flight (digest inputs, re-presentation).
	runs *runs
	// lastSweep is when the sweep loop last came round (liveness).
	lastSweep atomic.Int64

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

	// The parts (parts.go), built by build.
	workers   *workers
	admission *admission
	handover  *handover
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
		replyTopic: identity.Service.ReplyTopic(cfg.ReplicaID),
		m:          newMetrics(cfg.Registry),
		done:       make(chan struct{}),
		quit:       make(chan struct{}),
		started:    make(chan struct{}),
		ownersKick: make(chan struct{}, 1),
		runs:       newRuns(),
	}
	if err := s.openState(ctx); err != nil {
		return nil, err
	}
	s.runCtx, s.stop = context.WithCancel(context.Background())
	fail := func(err error) (*Service, error) {
		_ = s.Close()
		return nil, err
	}
	s.workers = newWorkers(cfg.Workers, s.started, s.quit, &s.wg)
	if err := s.serveHTTP(); err != nil {
		return fail(err)
	}
	if err := s.connect(ctx, tlsCfg); err != nil {
		return fail(err)
	}
	if s.gated, err = newRegistry(ctx, registryDeps{cfg: cfg, log: s.log, conn: s.conn, gauge: s.m.gatedAgents, ownersKick: s.kickOwners()}); err != nil {
		return fail(err)
	}
	if s.leases != nil {
		s.owners = ownership.New(ownership.Config{Replica: cfg.ReplicaID, TTL: cfg.LeaseTTL, Now: cfg.Now, Log: s.log},
			s.leases, s.mem, ownedAgents{s.gated})
	}
	s.build(seal)
	if err := s.serve(ctx); err != nil {
		return fail(err)
	}
	s.ready.Store(true)
	kind, _, _ := strings.Cut(cfg.Store, ":")
	s.log.Info("conversation service started", "reply_topic", s.replyTopic, "store", kind)
	return s, nil
}

// build constructs the parts, each from what it uses, in the order they depend on each other.
func (s *Service) build(seal *sealer) {
	e := env{cfg: s.cfg, log: s.log, m: s.m}
	owners := s.agentOwners()
	sp := newSpans(s.cfg.TracerProvider.Tracer(tracerName))
	out := newOutbox(e, s.conn)
	s.admission = newAdmission(e, out, s.conn, s.quit, s.runCtx)
	s.handover = newHandover(e, s.workers, out, s.gated, owners, s.runCtx)
	ids := newTaskIDs(s.mem)
	fwd := newForwarder(e, out, s.conn, s.gated, s.mem, s.replyTopic, seal)
	s.sweeper = newSweeper(e, out, fwd, s.gated, s.mem, s.runs, &s.lastSweep)
	s.history = newHistory(e, s.workers, out, s.admission, s.handover, s.gated, s.mem, owners, s.runs)
	s.requests = newRequests(e, requestParts{work: s.workers, sp: sp, out: out, adm: s.admission, place: s.handover, ids: ids, fwd: fwd, exp: s.sweeper},
		s.gated, s.mem, owners, s.runs)
	s.replies = newReplies(e, replyParts{work: s.workers, sp: sp, place: s.handover, ids: ids, fwd: fwd, exp: s.sweeper},
		s.conn, s.gated, s.mem, owners, s.runs, seal)
}

// agentOwners is the ownership the parts consult: nil (an untyped nil interface) with one replica.
func (s *Service) agentOwners() agentOwners {
	if s.owners == nil {
		return nil
	}
	return s.owners
}

// kickOwners is the channel that wakes the ownership loop when the agents change (nil with
// one replica).
func (s *Service) kickOwners() chan struct{} {
	if s.leases == nil {
		return nil
	}
	return s.ownersKick
}

// connect connects to the broker: a persistent session, whose queued messages wait on the
// workers until the replica is started.
func (s *Service) connect(ctx context.Context, tlsCfg *tls.Config) error {
	conn, err := s.connectBroker(ctx, a2amqtt.Config{
		BrokerURL:   s.cfg.BrokerURL,
		Username:    s.cfg.Username,
		Password:    s.cfg.Password,
		Credentials: s.cfg.Credentials,
		Agent:       clientRef(s.cfg.RouteSecret, s.cfg.ReplicaID),
		TLSConfig:   tlsCfg,
		// Persistent session: what the broker queued while this replica
		// was away arrives before the handlers below are registered.
		SessionExpiry: max(s.cfg.SessionExpiry, 0),
		Unmatched:     s.onQueued,
		Logger:        slog.New(logr.ToSlogHandler(s.log.WithName("mqtt"))),
	})
	if err != nil {
		return fmt.Errorf("conversation service: connect broker: %w", err)
	}
	s.conn = conn
	return nil
}

// serve subscribes the reply topic, the service's own request topic and the gated agents'
// request topics, takes this replica's share of the agents, and starts the loops.
func (s *Service) serve(ctx context.Context) error {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.admission.answerRateLimited()
	}()
	// Replies first: a request forwarded before this subscription existed
	// could be answered into the void.
	if _, err := s.conn.Subscribe(ctx, s.replyTopic, s.replies.onReply); err != nil {
		return fmt.Errorf("conversation service: subscribe reply topic: %w", err)
	}
	if _, err := s.conn.Subscribe(ctx, identity.Service.RequestTopic(), s.history.onHistoryRequest); err != nil {
		return fmt.Errorf("conversation service: subscribe own request topic: %w", err)
	}
	// Subscribe what exists before reporting ready, so a request published
	// right after Start returns is not lost.
	s.gated.serve(ctx, s.handover.consumes, s.requests.onRequest)
	close(s.started)
	if s.owners != nil {
		// Take the agents assigned here (a replica restarted under the same
		// id takes its own back at once) and consume their request topics
		// before reporting ready; what a persistent session delivered
		// meanwhile waits for its agent (parked).
		waiting := s.owners.Rebalance(ctx)
		s.gated.resync(ctx)
		s.wg.Add(1)
		go func() { defer s.wg.Done(); s.owners.Run(s.runCtx, s.ownersKick, waiting) }()
	}
	s.wg.Add(3)
	go func() { defer s.wg.Done(); s.gated.run(s.runCtx) }()
	go func() { defer s.wg.Done(); s.sweeper.sweepLoop(s.runCtx) }()
	go func() { defer s.wg.Done(); s.sweeper.statsLoop(s.runCtx) }()
	return nil
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
		s.leases = j
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
	last := s.lastSweep.Load()
	if last == 0 {
		return nil
	}
	limit := max(time.Minute, 20*s.cfg.SweepInterval)
	if since := time.Since(time.Unix(0, last)); since > limit {
		return fmt.Errorf("sweep loop stuck for %s", since.Round(time.Second))
	}
	return nil
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
			s.owners.Release()
		}
		if s.journal != nil {
			errs = append(errs, s.journal.Close())
		}
		close(s.done)
	})
	return errors.Join(errs...)
}
