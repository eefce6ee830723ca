package registration

import (
	"context"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/presence"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// The broker runtime keeps what the broker and the agents' cards say about whether each agent's
// process is connected (presence.Tracker), from:
//
//   - the embedded broker's hooks and the decision-table plugin's events (both backends are a
//     presence.Source);
//   - Mosquitto's log lines on $SYS/broker/log/N (`log_dest topic`, config/mosquitto), which the
//     card connection subscribes to;
//   - the retained cards on every discovery topic, which the card connection already reads.
//
// Every change wakes the Agents with that client ID (PresenceSource, for their Connected
// condition) and keeps the presence in the registration card honest: when the broker says an
// agent went while its retained card still says online (a kick sends no Will), the registration
// card goes back with offline/broker; when the broker says a client connected that publishes no
// card of its own (a non-SDK agent), the registration card says online/broker.

// presenceCardGrace is how long after a connect the operator waits for the agent's own card
// before it marks its registration card online (an SDK agent publishes its card right after it
// subscribed).
const presenceCardGrace = 2 * time.Second

// retainedCard is what the card connection last saw on a discovery topic.
type retainedCard struct {
	status, source string
	// kids are the kids of its signatures (signedBy), with card signing on.
	kids string
}

// presenceState is the Broker's part of presence.
type presenceState struct {
	tracker *presence.Tracker
	// fromLog: the broker's view comes from Mosquitto's log topic, so it is lost when the card
	// connection drops (a presence.Source backend keeps its own).
	fromLog bool
	events  chan event.TypedGenericEvent[client.Object]

	mu      sync.Mutex
	pending map[string]bool // client IDs that changed, not handled yet
	wake    chan struct{}
}

func newPresenceState() *presenceState {
	p := &presenceState{
		events:  make(chan event.TypedGenericEvent[client.Object], 1024),
		pending: map[string]bool{},
		wake:    make(chan struct{}, 1),
	}
	p.tracker = presence.NewTracker(p.changed)
	return p
}

func (p *presenceState) changed(clientID string) {
	p.mu.Lock()
	p.pending[clientID] = true
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *presenceState) take() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.pending))
	for id := range p.pending {
		out = append(out, id)
	}
	clear(p.pending)
	return out
}

// Presence returns what is known of whether the client ID's process is connected. With a broker
// that reports every connection itself (the embedded broker, the decision-table plugin), a
// client ID it never reported is known not to be connected.
func (b *Broker) Presence(clientID string) presence.State {
	st := b.presence.tracker.State(clientID)
	if !st.Known && b.started.Load() && !b.presence.fromLog {
		return presence.State{Known: true, Source: presence.SourceBroker}
	}
	return st
}

// PresenceSource enqueues each Agent whose process connected or went (its Connected condition):
//
//	builder.WatchesRawSource(broker.PresenceSource())
func (b *Broker) PresenceSource() source.Source {
	return source.Channel(b.presence.events, &handler.TypedEnqueueRequestForObject[client.Object]{})
}

// PresenceEvents is PresenceSource's channel (for controllers.Options).
func (b *Broker) PresenceEvents() <-chan event.TypedGenericEvent[client.Object] {
	return b.presence.events
}

// startPresence begins watching the broker's own view (a presence.Source backend) and handling
// changes.
func (b *Broker) startPresence(ctx context.Context) {
	if src, ok := b.cfg.Backend.(presence.Source); ok {
		for _, o := range src.WatchPresence(func(o presence.Observation) { b.presence.tracker.Observe(o) }) {
			b.presence.tracker.Observe(o)
		}
	} else {
		b.presence.fromLog = true
	}
	go b.presenceLoop(ctx)
}

func (b *Broker) presenceLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-b.presence.wake:
		}
		for _, id := range b.presence.take() {
			b.presenceChanged(ctx, id)
		}
	}
}

// presenceChanged wakes the Agents of clientID and fixes their registration card's presence.
func (b *Broker) presenceChanged(ctx context.Context, clientID string) {
	var agents a2av1.AgentList
	if err := b.cfg.Client.List(ctx, &agents, client.MatchingFields{identity.IndexAgentClientID: clientID}); err != nil {
		b.log.V(1).Info("presence: list agents", "clientID", clientID, "err", err.Error())
		return
	}
	for i := range agents.Items {
		a := &agents.Items[i]
		select {
		case b.presence.events <- event.TypedGenericEvent[client.Object]{Object: a}:
		default:
			b.log.Info("presence: event queue full; the Agent's Connected condition waits for its next reconcile", "agent", a.Namespace+"/"+a.Name)
		}
		if a.Status.PublishedCardDigest != "" && a.DeletionTimestamp.IsZero() {
			b.fixCardPresence(ctx, a)
		}
	}
}

// fixCardPresence republishes the registration card with the broker's view when the retained
// card says otherwise (see the comment at the top).
func (b *Broker) fixCardPresence(ctx context.Context, a *a2av1.Agent) {
	st := b.presence.tracker.State(a.Status.ClientID)
	if !st.Known || st.Source != presence.SourceBroker {
		return
	}
	topic := identity.Of(a).DiscoveryTopic()
	cur, ok := b.cards.retained(topic)
	switch {
	case !ok:
		return // no card at all: the scan republishes it
	case !st.Connected && cur.status == a2amqtt.StatusOnline:
	case st.Connected && cur.source == a2amqtt.SourceBroker && cur.status != a2amqtt.StatusOnline:
		// Give the agent the time to put its own card first; then look again. Off the presence
		// loop: the other clients' changes (a fleet reconnecting at once) must not queue behind
		// this agent's grace.
		go b.cardPresenceAfterGrace(ctx, a, topic)
		return
	default:
		return
	}
	b.republishCardPresence(ctx, a, topic)
}

// cardPresenceAfterGrace marks the registration card online after presenceCardGrace if the agent
// is still connected and has not put its own card first.
func (b *Broker) cardPresenceAfterGrace(ctx context.Context, a *a2av1.Agent, topic string) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(presenceCardGrace):
	}
	cur, ok := b.cards.retained(topic)
	st := b.presence.tracker.State(a.Status.ClientID)
	if !ok || !st.Connected || cur.source != a2amqtt.SourceBroker || cur.status == a2amqtt.StatusOnline {
		return
	}
	b.republishCardPresence(ctx, a, topic)
}

// republishCardPresence publishes a's registration card with the broker's view of its presence.
func (b *Broker) republishCardPresence(ctx context.Context, a *a2av1.Agent, topic string) {
	card, err := publishedCard(a, b.cfg.URL)
	if err != nil || card == nil {
		return // its spec changed: its own reconcile publishes the new card
	}
	if err := b.PublishCard(ctx, topic, card, map[string]string{a2amqtt.PropStatusSource: a2amqtt.SourceBroker}); err != nil {
		b.log.Info("presence: republish the registration card failed; the next change retries", "agent", a.Namespace+"/"+a.Name, "err", err.Error())
	}
}

// brokerStatus is the a2a-status the broker's view gives a client ID: online or offline when the
// broker has said, "" when it has not (the registration card then says offline: registered, not
// known to be connected).
func (b *Broker) brokerStatus(clientID string) string {
	st := b.presence.tracker.State(clientID)
	switch {
	case !st.Known || st.Source != presence.SourceBroker:
		return ""
	case st.Connected:
		return a2amqtt.StatusOnline
	}
	return a2amqtt.StatusOffline
}

// observeCard records a retained card's presence (from the card connection).
func (c *cardConn) observeCard(p *paho.Publish) {
	var status, src string
	if p.Properties != nil {
		status, src = p.Properties.User.Get(a2amqtt.PropStatus), p.Properties.User.Get(a2amqtt.PropStatusSource)
	}
	var kids string
	signer := c.b.signer
	if signer != nil && len(p.Payload) > 0 {
		kids = signedBy(p.Payload)
	}
	c.mu.Lock()
	if len(p.Payload) == 0 {
		delete(c.cards, p.Topic)
	} else {
		c.cards[p.Topic] = retainedCard{status: status, source: src, kids: kids}
	}
	c.mu.Unlock()
	info, err := a2amqtt.ParseTopic(p.Topic)
	if signer != nil && err == nil && info.Agent != "" && len(p.Payload) > 0 {
		if r := signer.ring.Load(); r != nil && r.id != kids {
			c.wakeSeal() // not signed by the ring: the operator's signed card replaces it
		}
	}
	if err != nil || info.Agent == "" || len(p.Payload) == 0 || src == a2amqtt.SourceBroker || status == "" {
		return // the operator's own card says nothing about the process
	}
	c.b.presence.tracker.Observe(presence.Observation{
		ClientID:  a2amqtt.AgentRef{Org: info.Org, Unit: info.Unit, Agent: info.Agent}.ClientID(),
		Connected: status == a2amqtt.StatusOnline, At: time.Now(), Source: presence.SourceCard,
		Reason: "its card says offline (source " + src + ")",
	})
}

// brokerReports: the backend reports every connection itself (presence.Source), so the log
// lines and plugin events the card connection also receives are not used: two connections
// carry the same facts at different times, and the later copy of an old fact would undo a
// newer one.
func (c *cardConn) brokerReports() bool {
	_, ok := c.b.cfg.Backend.(presence.Source)
	return ok
}

// observeLog records a Mosquitto log line (from the card connection).
func (c *cardConn) observeLog(p *paho.Publish) {
	if c.brokerReports() {
		return
	}
	if o, ok := presence.ParseMosquittoLog(string(p.Payload), time.Now()); ok {
		c.b.presence.tracker.Observe(o)
	}
}

// observePlugin records a broker plugin's connection event (from the card connection).
func (c *cardConn) observePlugin(p *paho.Publish) {
	if c.brokerReports() {
		return
	}
	o, err := presence.ParsePluginEvent(p.Payload, time.Now())
	if err != nil {
		c.b.log.V(1).Info("presence: unreadable plugin event", "err", err.Error())
		return
	}
	c.b.presence.tracker.Observe(o)
}

// retained returns the presence of the card the broker holds on topic.
func (c *cardConn) retained(topic string) (retainedCard, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.cards[topic]
	return r, ok
}
