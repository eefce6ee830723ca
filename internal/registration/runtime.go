package registration

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
)

// BrokerConfig configures a Broker.
type BrokerConfig struct {
	// URL of the broker the operator's card connection uses (and that cards advertise).
	URL string
	// TLS for tls:// URLs.
	TLS *tls.Config
	// Backend manages the broker's identities (internal/mqtt/brokers builds it). A backend with
	// an admin connection of its own (NotifyReady) gets the runtime's state check on every
	// reconnect.
	Backend acl.Backend
	// Open, when set, opens the backend's connection with the manager's context when the runtime
	// starts (brokers.Broker.Open); nil: the backend is ready.
	Open func(context.Context) error
	// Client reads Agents (for resyncs and card republishing) and reads and writes the service
	// credentials Secret: the manager's cached client.
	Client client.Client
	// Cache, when set, is watched for changes to the service credentials Secret (deleted or
	// edited: repaired at once, not at the next resync).
	Cache cache.Cache
	// Recorder emits Events on the service credentials Secret.
	Recorder events.EventRecorder
	// ServiceSecret, when set, is where the conversation service's broker credentials live; its
	// broker identity is then reconciled like an Agent's (gating on).
	ServiceSecret *client.ObjectKey
	// ServiceResync is how often the service identity is checked against the broker (default 1
	// minute: one read).
	ServiceResync time.Duration
	// SentinelInterval is how often the broker is checked for lost state (default 5 s: one read);
	// it is also checked on every reconnect of the admin connection.
	SentinelInterval time.Duration
	// CardGrace is how long the operator waits after (re)connecting before it republishes cards
	// missing from the broker, so that running agents, which reconnect within their backoff (at
	// most 5 s with the SDK), publish their own online card first (default 10 s).
	CardGrace time.Duration
	// OrphanInterval is how often the broker is searched for the per-agent objects of identities
	// no Agent claims any more (an Agent deleted without its finalizer), which are deleted once
	// they were found orphaned in two passes in a row. Zero disables the search: it needs a cache
	// that sees Agents in every namespace, and a broker no other operator writes to.
	OrphanInterval time.Duration
	// CardSigning, when set, signs every agent card the operator publishes and retains the
	// public keys on a2amqtt.CardKeysTopic (cardkeys.go); nil publishes cards unsigned.
	CardSigning *CardSigning
	// Log receives connection state changes, state losses and repairs.
	Log logr.Logger
}

// Broker is the operator's long-lived side of the broker, owned by the manager (a
// manager.Runnable, leader only: it writes): the dynsec admin connection when the broker is
// Mosquitto, the operator's own MQTT connection that publishes retained registration cards and
// republishes the ones the broker lost, the state-loss sentinel, and the conversation service's
// broker identity. Its Checker belongs in /readyz.
type Broker struct {
	cfg    BrokerConfig
	log    logr.Logger
	slog   *slog.Logger
	opener func(context.Context) error // opens the backend's connection, when Broker owns it

	started atomic.Bool
	ready   chan struct{} // closed once Start has set things up

	cards   *cardConn
	service *serviceIdentity
	signer  *cardSigner // nil: cards are published unsigned

	// resyncs carries one event per Agent after a broker state loss.
	resyncs   chan event.TypedGenericEvent[client.Object]
	resyncing atomic.Bool
	lossMu    sync.Mutex
	losses    int
	lastLoss  time.Time
	checkNow  chan struct{}

	orphansDeleted atomic.Int64

	presence *presenceState
}

// NewBroker returns the broker runtime for a ready backend.
func NewBroker(cfg BrokerConfig) (*Broker, error) {
	if cfg.URL == "" {
		return nil, errors.New("registration: broker URL is required")
	}
	if cfg.Backend == nil {
		return nil, errors.New("registration: broker backend is required")
	}
	if cfg.Client == nil {
		return nil, errors.New("registration: a Kubernetes client is required")
	}
	if cfg.ServiceResync <= 0 {
		cfg.ServiceResync = time.Minute
	}
	if cfg.SentinelInterval <= 0 {
		cfg.SentinelInterval = 5 * time.Second
	}
	if cfg.CardGrace <= 0 {
		cfg.CardGrace = 10 * time.Second
	}
	if cfg.Log.GetSink() == nil {
		cfg.Log = logr.Discard()
	}
	b := &Broker{
		cfg:      cfg,
		log:      cfg.Log,
		slog:     slog.New(logr.ToSlogHandler(cfg.Log)),
		ready:    make(chan struct{}),
		resyncs:  make(chan event.TypedGenericEvent[client.Object], 1024),
		checkNow: make(chan struct{}, 1),
		presence: newPresenceState(),
	}
	if _, counted := cfg.Client.(tenancy.AgentRanker); !counted && cfg.Cache != nil {
		// The Registrar's tenancy views count a Tenant's Agents instead of listing them. The
		// operator passes a client carrying the controllers' index; a caller without one gets
		// its own.
		b.cfg.Client = tenancy.WithAgentCounts(cfg.Client, tenancy.NewAgentCounts(cfg.Cache))
	}
	if cfg.CardSigning != nil {
		b.signer = newCardSigner(*cfg.CardSigning, cfg.URL, cfg.Client)
	}
	b.cards = newCardConn(b)
	b.opener = cfg.Open
	if n, ok := cfg.Backend.(interface{ NotifyReady(func(context.Context)) }); ok {
		// A backend with an admin connection of its own: every reconnect checks the broker
		// for lost state.
		n.NotifyReady(func(context.Context) { b.CheckState() })
	}
	if cfg.ServiceSecret != nil {
		b.service = &serviceIdentity{b: b, key: *cfg.ServiceSecret, wake: make(chan struct{}, 1)}
	}
	return b, nil
}

// Registrar returns the Registrar the Agent controller uses: the Broker's backend, and the
// Broker's card connection as its CardPublisher.
func (b *Broker) Registrar() *Registrar {
	return &Registrar{Reader: b.cfg.Client, Backend: b.cfg.Backend, Cards: b, BrokerURL: b.cfg.URL}
}

// Backend is the identity backend (for tools such as the devstack's service bootstrap).
func (b *Broker) Backend() acl.Backend { return b.cfg.Backend }

var _ manager.LeaderElectionRunnable = (*Broker)(nil)

// NeedLeaderElection implements manager.LeaderElectionRunnable: only the leader writes to the
// broker (a standby would rotate the leader's operator password).
func (b *Broker) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable: it opens the connections with the manager's context and
// keeps them (and the broker's state) healthy until ctx ends.
func (b *Broker) Start(ctx context.Context) error {
	if !b.started.CompareAndSwap(false, true) {
		return errors.New("registration: broker runtime started twice")
	}
	if b.opener != nil {
		if err := b.opener(ctx); err != nil {
			return fmt.Errorf("open broker admin connection: %w", err)
		}
	}
	if b.signer != nil {
		// Before the first card is published: no card goes out unsigned.
		if _, err := b.signer.load(ctx, b.cfg.Client); err != nil {
			return err
		}
		go b.signer.watch(ctx, b.cfg.Client, func(msg string, kv ...any) { b.log.Info(msg, kv...) })
	}
	b.startPresence(ctx)
	b.cards.start(ctx)
	if b.service != nil {
		if err := b.service.watchSecret(ctx); err != nil {
			return err
		}
		go b.service.run(ctx)
	}
	close(b.ready)
	if b.cfg.OrphanInterval > 0 {
		go (&orphanCollector{b: b, interval: b.cfg.OrphanInterval}).run(ctx)
	}
	b.watchState(ctx)
	return nil
}

// OrphansDeleted counts the orphaned broker objects deleted since the runtime started.
func (b *Broker) OrphansDeleted() int64 { return b.orphansDeleted.Load() }

// PublishCard implements CardPublisher on the operator's card connection, waiting for it (up
// to 10 s) when it is not up yet.
func (b *Broker) PublishCard(ctx context.Context, topic string, payload []byte, props map[string]string) error {
	return b.cards.publish(ctx, topic, payload, props)
}

// Checker is the readiness check of the operator's broker side: it fails while the admin
// connection (Mosquitto) or the card connection has been down for longer than grace, or the
// operator's identity could not be created, naming the cause. A replica that is not the leader
// runs none of it and passes.
func (b *Broker) Checker(grace time.Duration) healthz.Checker {
	return func(*http.Request) error { return b.Healthy(grace) }
}

// Healthy is Checker without the request.
func (b *Broker) Healthy(grace time.Duration) error {
	if !b.started.Load() {
		return nil // not the leader: nothing of ours is supposed to run
	}
	var errs []error
	if h, ok := b.cfg.Backend.(interface{ Healthy(time.Duration) error }); ok {
		if err := h.Healthy(grace); err != nil {
			errs = append(errs, err)
		}
	}
	if err := b.cards.healthy(grace); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// AgentResyncs is the stream of Agents to reconcile again because the broker lost its state:
// one event per Agent, sent when the loss is detected. Watch it from the Agent controller
// (AgentResyncSource does the wiring).
func (b *Broker) AgentResyncs() <-chan event.TypedGenericEvent[client.Object] { return b.resyncs }

// AgentResyncSource is AgentResyncs as a controller-runtime source enqueueing each Agent:
//
//	builder.WatchesRawSource(broker.AgentResyncSource())
func (b *Broker) AgentResyncSource() source.Source {
	return source.Channel(b.resyncs, &handler.TypedEnqueueRequestForObject[client.Object]{})
}

// StateLosses reports how many times the broker was found without its state, and when last.
func (b *Broker) StateLosses() (int, time.Time) {
	b.lossMu.Lock()
	defer b.lossMu.Unlock()
	return b.losses, b.lastLoss
}

// waitStarted blocks until Start has run (bounded by ctx).
func (b *Broker) waitStarted(ctx context.Context) error {
	select {
	case <-b.ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("broker connections not started (is this replica the leader?): %w", ctx.Err())
	}
}
