package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// OutboundConfig configures the bus side of the HTTP agents.
type OutboundConfig struct {
	Conn      ConnConfig
	Directory *Directory
	// HTTPClient calls the HTTP agents (default: a client without an overall timeout, since a
	// stream lasts as long as the task).
	HTTPClient *http.Client
	// Ring, when set, assigns each HTTP agent to one replica (ring.go): this replica holds only
	// its own. Nil: this replica holds every HTTP agent.
	Ring *Ring
	// Status, when set, writes the CardMatches condition of the Agents held (carddiff.go): the
	// card each HTTP agent serves is read at every sync and compared with its manifest's.
	Status client.Client
}

// heldAgent is an HTTP agent the gateway stands in for on the bus.
type heldAgent struct {
	// key says what the connection was made for: when it changes the agent is held anew.
	key  string
	conn *a2amqtt.Conn
	resp *a2amqtt.Responder
	// gate decides each reconnect of conn (nil: autopaho reconnects freely).
	gate *reconnectGate
}

// Outbound holds, on the bus, the Agents whose workload is an HTTP A2A server.
type Outbound struct {
	cfg OutboundConfig
	log *slog.Logger

	mu   sync.Mutex
	held map[string]*heldAgent // by namespace/name
	// resync asks Run for a Sync now (the ring changed).
	resync chan struct{}
}

// NewOutbound returns an Outbound holding nothing yet (Sync starts holding).
func NewOutbound(cfg OutboundConfig) *Outbound {
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{}
	}
	log := cfg.Conn.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Outbound{cfg: cfg, log: log, held: map[string]*heldAgent{}, resync: make(chan struct{}, 1)}
}

// requestTopic is where the agent reads its requests: the delivery topic when the conversation
// service stands in front of it, else its public request topic.
func requestTopic(ag *a2av1.Agent) string {
	if t := ag.Status.Topics; t != nil && t.Delivery != "" {
		return t.Delivery
	}
	return identity.Of(ag).RequestTopic()
}

func heldKey(ag *a2av1.Agent) string {
	return ag.Spec.HTTP.URL + "\x00" + requestTopic(ag) + "\x00" + string(ag.UID)
}

// Sync holds every HTTP agent the directory lists and lets go of the others; an agent whose URL
// or request topic changed is held anew.
func (o *Outbound) Sync(ctx context.Context) error {
	agents, err := o.cfg.Directory.HTTPAgents(ctx)
	if err != nil {
		return err
	}
	if o.cfg.Ring != nil && !o.cfg.Ring.Ready() {
		// The ring has not read the Leases yet: it sees this replica alone and would claim
		// the agents another replica holds. Its first read calls Resync.
		return nil
	}
	want := map[string]*a2av1.Agent{}
	for i := range agents {
		ag := &agents[i]
		if o.cfg.Ring != nil && !o.cfg.Ring.Owns(identity.Of(ag).ClientID()) {
			continue // another replica holds it
		}
		// The agent's presence on the bus is its HTTP server's: one that does not answer is let
		// go (its LWT makes it offline) until it answers again.
		if err := o.probe(ctx, ag.Spec.HTTP.URL); err != nil {
			o.log.Info("HTTP agent not answering", "agent", ag.Namespace+"/"+ag.Name, "url", ag.Spec.HTTP.URL, "err", err)
			continue
		}
		want[ag.Namespace+"/"+ag.Name] = ag
	}
	o.mu.Lock()
	var drop []*heldAgent
	for name, h := range o.held {
		ag, ok := want[name]
		if ok && heldKey(ag) == h.key {
			continue
		}
		// Said at INFO: Held no longer lists the agent from here on, while its connection
		// drains (up to drainTimeout) before it closes.
		why := "not assigned here or not answering"
		if ok {
			why = "its URL, request topic or UID changed"
		}
		o.log.Info("letting HTTP agent go", "agent", name, "reason", why)
		drop = append(drop, h)
		delete(o.held, name)
	}
	o.mu.Unlock()
	for _, h := range drop {
		o.release(ctx, h)
	}
	var firstErr error
	for name, ag := range want {
		if o.cfg.Status != nil {
			if err := o.checkCard(ctx, ag); err != nil {
				o.log.Error("compare served card", "agent", name, "err", err)
			}
		}
		o.mu.Lock()
		_, ok := o.held[name]
		o.mu.Unlock()
		if ok {
			continue
		}
		h, err := o.hold(ctx, ag)
		if err != nil {
			o.log.Error("hold HTTP agent", "agent", name, "url", ag.Spec.HTTP.URL, "err", err)
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		o.mu.Lock()
		o.held[name] = h
		o.mu.Unlock()
	}
	return firstErr
}

// probeTimeout bounds one health probe of an HTTP agent.
const probeTimeout = 3 * time.Second

// probe reports whether the HTTP agent's server answers at all: any HTTP response counts (a
// JSON-RPC endpoint answers a GET with an error), a refused or timed-out connection does not.
func (o *Outbound) probe(ctx context.Context, url string) error {
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(pctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := o.cfg.HTTPClient.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	return nil
}

// hold connects as the agent and serves its request topic by forwarding to its URL.
func (o *Outbound) hold(ctx context.Context, ag *a2av1.Agent) (*heldAgent, error) {
	ref := identity.Of(ag)
	creds, err := o.cfg.Directory.Credentials(context.WithoutCancel(ctx), ag)
	if err != nil {
		return nil, err
	}
	var gate *reconnectGate
	if o.cfg.Ring != nil {
		gate = newReconnectGate(ctx, creds, o.cfg.Ring, ref.ClientID(), o.log)
		creds = gate
	}
	conn, err := a2amqtt.Connect(ctx, a2amqtt.Config{
		BrokerURL: o.cfg.Conn.BrokerURL, Credentials: creds, Agent: ref, TLSFiles: o.cfg.Conn.TLSFiles,
		// The manifest's card, with presence: the bus shows the agent online while the gateway
		// holds it.
		Card:           registration.BuildCard(ag, ref, "", o.cfg.Conn.BrokerURL),
		SessionExpiry:  a2amqtt.DefaultAgentSessionExpiry,
		ConnectTimeout: connectTimeout, Logger: o.log,
	})
	if err != nil {
		gate.close()
		return nil, fmt.Errorf("connect as %s: %w", ref, err)
	}
	exec := &httpExecutor{remote: a2aclient.NewJSONRPCTransport(ag.Spec.HTTP.URL, o.cfg.HTTPClient)}
	resp, err := a2amqtt.NewResponder(ctx, conn, a2amqtt.ResponderOptions{Executor: exec, RequestTopic: requestTopic(ag)})
	if err != nil {
		gate.close()
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("serve %s: %w", ref, err)
	}
	o.log.Info("holding HTTP agent", "agent", ref.String(), "url", ag.Spec.HTTP.URL, "topic", requestTopic(ag))
	return &heldAgent{key: heldKey(ag), conn: conn, resp: resp, gate: gate}, nil
}

// drainTimeout bounds how long requests in flight may take to finish when an agent is let go.
const drainTimeout = 20 * time.Second

// release lets an agent go: its connection stops reconnecting first (the replica now assigned
// the agent may take the session over while the requests in flight drain), then the responder
// drains and the connection closes.
func (o *Outbound) release(ctx context.Context, h *heldAgent) {
	h.gate.close()
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), drainTimeout)
	defer cancel()
	_ = h.resp.Shutdown(dctx)
	_ = h.conn.Close(dctx)
}

// Run syncs every interval until ctx ends, then lets every agent go.
func (o *Outbound) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := o.Sync(ctx); err != nil && ctx.Err() == nil {
			o.log.Error("sync HTTP agents", "err", err)
		}
		select {
		case <-ctx.Done():
			o.Close(context.Background())
			return
		case <-t.C:
		case <-o.resync:
		}
	}
}

// Resync asks Run to sync at once (the ring moved agents).
func (o *Outbound) Resync() {
	select {
	case o.resync <- struct{}{}:
	default:
	}
}

// Close lets every held agent go.
func (o *Outbound) Close(ctx context.Context) {
	o.mu.Lock()
	held := o.held
	o.held = map[string]*heldAgent{}
	o.mu.Unlock()
	for _, h := range held {
		o.release(ctx, h)
	}
}

// Held returns the namespace/name of the agents held now.
func (o *Outbound) Held() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]string, 0, len(o.held))
	for k := range o.held {
		out = append(out, k)
	}
	return out
}
