package registration

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"
	jose "github.com/go-jose/go-jose/v4"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/presence"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/session"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// cardConn is the operator's own MQTT connection (identity.OperatorUsername). It publishes the
// retained registration cards, and it watches which cards the broker holds: it subscribes to
// every discovery topic's changes, reads the Agents' retained cards in paced chunks after every
// (re)connection (readCards), and after every (re)connection it republishes the registration card of
// each registered Agent whose card the broker no longer has (a broker restarted without
// persistence loses retained messages; an Agent with no process behind it would otherwise stay
// undiscoverable until its spec changes). It never overwrites a card that is there, so an
// agent's own "online" card always wins.
type cardConn struct {
	b        *Broker
	clientID string

	password  atomic.Pointer[string]
	sess      atomic.Pointer[session.Session]
	sessReady chan struct{}
	identWake chan struct{}
	identErr  atomic.Pointer[error]
	startedAt atomic.Int64 // unix nanos

	mu      sync.Mutex
	present map[string]bool          // discovery topic → the broker holds a retained card
	cards   map[string]retainedCard  // discovery topic → the presence its retained card carries
	markers map[string]chan struct{} // sync marker → waiter
	// scanWake asks for a scan: after a (re)connection, or when a card was cleared.
	scanWake chan struct{}
	// keysSeen is the card key set the broker retains (nil: none); sealWake asks the seal loop
	// for a pass (cardseal.go). Both only with card signing on.
	keysSeen *jose.JSONWebKeySet
	sealWake chan struct{}

	republished atomic.Uint64
}

func newCardConn(b *Broker) *cardConn {
	var id [4]byte
	_, _ = rand.Read(id[:])
	return &cardConn{
		b:         b,
		clientID:  "a2a-fleet-operator-" + hex.EncodeToString(id[:]),
		sessReady: make(chan struct{}),
		identWake: make(chan struct{}, 1),
		present:   map[string]bool{},
		cards:     map[string]retainedCard{},
		markers:   map[string]chan struct{}{},
		scanWake:  make(chan struct{}, 1),
		sealWake:  make(chan struct{}, 1),
	}
}

// discoveryPrefix starts every discovery topic.
var discoveryPrefix = strings.TrimSuffix(a2amqtt.MethodFilter(a2amqtt.MethodDiscovery), "#")

// operatorRole may publish and read every discovery topic, and talk to itself on the sync topic.
func operatorRole() acl.Role {
	discovery := a2amqtt.MethodFilter(a2amqtt.MethodDiscovery)
	return acl.Role{Name: identity.OperatorRoleName, ACLs: []acl.ACL{
		{Type: acl.PublishClientSend, Topic: discovery, Allow: true},
		{Type: acl.PublishClientSend, Topic: identity.OperatorSyncTopic, Allow: true},
		{Type: acl.SubscribeLiteral, Topic: identity.OperatorSyncTopic, Allow: true},
		{Type: acl.SubscribePattern, Topic: discovery, Allow: true},
		// The public keys of the card signatures: only the operator writes them.
		{Type: acl.PublishClientSend, Topic: a2amqtt.CardKeysTopic, Allow: true},
		{Type: acl.SubscribeLiteral, Topic: a2amqtt.CardKeysTopic, Allow: true},
		// The broker's own view of who connects and goes (Mosquitto's log with log_dest topic).
		{Type: acl.SubscribeLiteral, Topic: presence.MosquittoLogTopic, Allow: true},
		// ... or a broker plugin's connection events (docs/broker.md, "Presence from a plugin").
		{Type: acl.SubscribeLiteral, Topic: presence.PluginTopic, Allow: true},
	}}
}

func (c *cardConn) start(ctx context.Context) {
	c.startedAt.Store(time.Now().UnixNano())
	go c.run(ctx)
}

// run creates the operator's identity (retrying while the broker is down), starts the
// connection once, and re-creates the identity whenever it is lost.
func (c *cardConn) run(ctx context.Context) {
	delay := 250 * time.Millisecond
	for {
		err := c.ensureIdentity(ctx)
		if err == nil {
			c.identErr.Store(nil)
			delay = 250 * time.Millisecond
			if c.sess.Load() == nil {
				if err = c.connect(ctx); err == nil {
					close(c.sessReady)
				}
			}
		}
		if err != nil {
			c.identErr.Store(&err)
			if ctx.Err() != nil {
				return
			}
			c.b.log.V(1).Info("operator broker identity not in place yet; retrying", "err", err.Error(), "in", delay)
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
			delay = min(2*delay, 5*time.Second)
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-c.identWake:
		}
	}
}

// identityLost asks for the operator's identity to be created again (state loss).
func (c *cardConn) identityLost() {
	select {
	case c.identWake <- struct{}{}:
	default:
	}
}

// ensureIdentity gives the operator's identity a fresh password on the broker. A running
// connection is disconnected by the change and reconnects with the new password.
func (c *cardConn) ensureIdentity(ctx context.Context) error {
	password, err := identity.NewPassword()
	if err != nil {
		return fmt.Errorf("operator credentials: %w", err)
	}
	role := operatorRole()
	cl := acl.Client{Username: identity.OperatorUsername, Roles: []acl.RoleRef{{Name: role.Name}}}
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	c.password.Store(&password)
	res, err := acl.Apply(rctx, c.b.cfg.Backend, acl.Desired{
		State:     acl.NewState([]acl.Role{role}, nil, []acl.Client{cl}),
		Passwords: map[string]string{identity.OperatorUsername: password},
	})
	if err != nil {
		return fmt.Errorf("ensure operator identity: %w", err)
	}
	if !createdClient(res, identity.OperatorUsername) {
		if err := acl.SetPassword(rctx, c.b.cfg.Backend, identity.OperatorUsername, password); err != nil {
			return fmt.Errorf("set operator password: %w", err)
		}
	}
	return nil
}

func (c *cardConn) connect(ctx context.Context) error {
	sess, err := session.Start(ctx, session.Config{
		Name:     "card publisher",
		URL:      c.b.cfg.URL,
		TLS:      c.b.cfg.TLS,
		Username: identity.OperatorUsername,
		Password: func() []byte {
			if p := c.password.Load(); p != nil {
				return []byte(*p)
			}
			return nil
		},
		ClientID: c.clientID,
		Subscriptions: []paho.SubscribeOptions{
			// Every change to a card, but not the retained cards themselves (retain handling
			// 2): readCards asks for those in paced chunks (see there).
			{Topic: a2amqtt.MethodFilter(a2amqtt.MethodDiscovery), QoS: 0, RetainHandling: retainNotSent},
			{Topic: identity.OperatorSyncTopic, QoS: 0},
			{Topic: presence.MosquittoLogTopic, QoS: 1},
			{Topic: presence.PluginTopic, QoS: 1},
			{Topic: a2amqtt.CardKeysTopic, QoS: 1},
		},
		OnMessage: c.received,
		OnDown:    c.forget,
		OnReady: func(ctx context.Context, _ *session.Link) {
			// The first link can be ready before run has stored the session that everything
			// below publishes and subscribes on (ci: a nil Session in readRetained).
			select {
			case <-c.sessReady:
			case <-ctx.Done():
				return
			}
			c.readCards(ctx)
			c.wakeScan()
			c.wakeSeal()
		},
		OnRefused: func(error) {
			// Our identity is gone or changed behind our back: re-create it, and see whether
			// the whole broker state went with it.
			c.identityLost()
			c.b.CheckState()
		},
		Logger: c.b.slog,
	})
	if err != nil {
		return fmt.Errorf("start card connection: %w", err)
	}
	c.sess.Store(sess)
	go c.scanLoop(ctx)
	if c.b.signer != nil {
		go c.sealLoop(ctx)
	}
	return nil
}

// healthy fails when the identity could not be created for longer than grace, or the
// connection is down beyond grace.
func (c *cardConn) healthy(grace time.Duration) error {
	sess := c.sess.Load()
	if sess == nil {
		since := time.Since(time.Unix(0, c.startedAt.Load()))
		if since < grace {
			return nil
		}
		if p := c.identErr.Load(); p != nil {
			return fmt.Errorf("card publisher: operator identity not created after %s: %w", since.Round(time.Second), *p)
		}
		return fmt.Errorf("card publisher: not connected after %s", since.Round(time.Second))
	}
	return sess.Healthy(grace)
}

// publish puts a retained card (QoS 1); an empty payload clears the retained message.
func (c *cardConn) publish(ctx context.Context, topic string, payload []byte, props map[string]string) error {
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.b.waitStarted(wctx); err != nil {
		return fmt.Errorf("publish %s: %w", topic, err)
	}
	select {
	case <-c.sessReady:
	case <-wctx.Done():
		msg := "card connection not up"
		if p := c.identErr.Load(); p != nil {
			msg = (*p).Error()
		}
		return fmt.Errorf("publish %s: %s: %w", topic, msg, wctx.Err())
	}
	if len(props) > 0 && props[a2amqtt.PropStatusSource] == a2amqtt.SourceBroker {
		// A registration card says what the broker's view says of the agent's process (offline
		// when the broker has not said: registered, not known to be connected).
		props = maps.Clone(props)
		props[a2amqtt.PropStatus] = a2amqtt.StatusOffline
		if info, err := a2amqtt.ParseTopic(topic); err == nil && info.Agent != "" &&
			c.b.brokerStatus(a2amqtt.AgentRef{Org: info.Org, Unit: info.Unit, Agent: info.Agent}.ClientID()) == a2amqtt.StatusOnline {
			props[a2amqtt.PropStatus] = a2amqtt.StatusOnline
		}
	}
	if c.b.signer != nil && len(payload) > 0 && strings.HasPrefix(topic, discoveryPrefix) {
		signed, err := c.b.signer.sign(payload)
		if err != nil {
			return fmt.Errorf("publish %s: %w", topic, err)
		}
		payload = signed
	}
	pub := &paho.Publish{Topic: topic, QoS: 1, Retain: true, Payload: payload, Properties: &paho.PublishProperties{}}
	if len(payload) > 0 {
		pub.Properties.ContentType = "application/json"
	}
	for k, v := range props {
		pub.Properties.User = append(pub.Properties.User, paho.UserProperty{Key: k, Value: v})
	}
	resp, err := c.sess.Load().Publish(wctx, pub)
	if err != nil {
		return fmt.Errorf("publish %s: %w", topic, err)
	}
	if resp != nil && resp.ReasonCode >= 0x80 {
		return fmt.Errorf("publish %s: broker refused with reason code %#x", topic, resp.ReasonCode)
	}
	return nil
}

// received records which discovery topics hold a card (and the presence they carry), the
// broker's log lines (presence), and wakes sync waiters.
func (c *cardConn) received(p *paho.Publish) {
	switch {
	case p.Topic == presence.MosquittoLogTopic:
		c.observeLog(p)
		return
	case p.Topic == presence.PluginTopic:
		c.observePlugin(p)
		return
	case p.Topic == a2amqtt.CardKeysTopic:
		c.observeKeys(p)
		return
	case strings.HasPrefix(p.Topic, discoveryPrefix):
		c.observeCard(p)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if p.Topic == identity.OperatorSyncTopic {
		if ch, ok := c.markers[string(p.Payload)]; ok {
			close(ch)
			delete(c.markers, string(p.Payload))
		}
		return
	}
	if strings.HasPrefix(p.Topic, discoveryPrefix) {
		had := c.present[p.Topic]
		c.present[p.Topic] = len(p.Payload) > 0
		if had && len(p.Payload) == 0 {
			c.wakeScan() // a card was cleared: if its Agent is still registered, it comes back
		}
	}
}

func (c *cardConn) wakeScan() {
	select {
	case c.scanWake <- struct{}{}:
	default:
	}
}

// forget drops what the last connection saw: the next one sees the broker anew.
func (c *cardConn) forget() {
	c.mu.Lock()
	c.present = map[string]bool{}
	c.cards = map[string]retainedCard{}
	c.keysSeen = nil
	c.mu.Unlock()
	if c.b.presence.fromLog {
		// The broker's log reaches us only while connected: what it said is stale now.
		c.b.presence.tracker.Forget(presence.SourceBroker)
	}
}

// sync sends a marker to itself and waits for it: everything the broker queued for this
// connection before (the retained cards of earlier subscriptions) has then arrived.
func (c *cardConn) sync(ctx context.Context) error {
	var n [8]byte
	_, _ = rand.Read(n[:])
	marker := hex.EncodeToString(n[:])
	ch := make(chan struct{})
	c.mu.Lock()
	c.markers[marker] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.markers, marker)
		c.mu.Unlock()
	}()
	if _, err := c.sess.Load().Publish(ctx, &paho.Publish{Topic: identity.OperatorSyncTopic, QoS: 1, Payload: []byte(marker)}); err != nil {
		return fmt.Errorf("sync marker: %w", err)
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("sync marker: %w", ctx.Err())
	}
}

// scanLoop republishes missing cards after every (re)connection and whenever a card was
// cleared: once the running agents had CardGrace to put their own cards back, every
// registered Agent whose card the broker lacks gets its registration card again.
func (c *cardConn) scanLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.scanWake:
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(c.b.cfg.CardGrace):
		}
		n, err := c.republishMissing(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			c.b.log.Info("republishing missing agent cards failed; the next reconnect retries", "err", err.Error(), "republished", n)
		case n > 0:
			c.b.log.Info("republished registration cards missing from the broker", "cards", n)
		}
	}
}

// retainNotSent is MQTT v5's retain handling 2: the broker sends no retained message when the
// subscription is made.
const retainNotSent = 2

// cardReadChunk is how many discovery topics one SUBSCRIBE of a card read names, so how many
// retained cards the broker writes to this connection at once. A broker bounds the packets it
// holds unwritten for one client and drops the rest (Mosquitto: max_queued_messages, 1000 by
// default, QoS 0 and 1 alike): one wildcard subscription over 10 000 retained cards loses
// thousands. A tenth of Mosquitto's default leaves room for the live traffic (log lines, cards
// the agents put back) that arrives meanwhile.
const cardReadChunk = 100

// readCards reads the retained card of every Agent's discovery topic after a (re)connection:
// cardReadChunk topics per SUBSCRIBE, each chunk's cards received (a sync marker behind them)
// before the next is asked for, so the broker never holds more than a chunk of them for this
// connection. The wildcard subscription brings the changes from then on. Only the Agents' own
// topics are read: every decision the card connection makes is about a registered Agent's card.
func (c *cardConn) readCards(ctx context.Context) {
	start := time.Now()
	var agents a2av1.AgentList
	if err := c.b.cfg.Client.List(ctx, &agents); err != nil {
		c.b.log.Info("reading the agents' retained cards failed; the scan after the grace checks them", "err", err.Error())
		return
	}
	topics := make([]string, 0, len(agents.Items))
	seen := make(map[string]bool, len(agents.Items))
	for i := range agents.Items {
		t := identity.Of(&agents.Items[i]).DiscoveryTopic()
		if !seen[t] {
			seen[t] = true
			topics = append(topics, t)
		}
	}
	if err := c.readRetained(ctx, topics); err != nil {
		if ctx.Err() == nil {
			c.b.log.Info("reading the agents' retained cards failed; the scan after the grace checks them", "err", err.Error())
		}
		return
	}
	c.mu.Lock()
	found := 0
	for _, t := range topics {
		if c.present[t] {
			found++
		}
	}
	c.mu.Unlock()
	c.b.log.Info("read the agents' retained cards", "agents", len(topics), "cards", found, "seconds", time.Since(start).Seconds())
}

// readRetained subscribes to topics in chunks of cardReadChunk, so the broker sends their
// retained cards again, and waits for each chunk's cards before it asks for the next.
func (c *cardConn) readRetained(ctx context.Context, topics []string) error {
	sess := c.sess.Load()
	for start := 0; start < len(topics); start += cardReadChunk {
		chunk := topics[start:min(start+cardReadChunk, len(topics))]
		subs := make([]paho.SubscribeOptions, len(chunk))
		for i, t := range chunk {
			subs[i] = paho.SubscribeOptions{Topic: t, QoS: 0}
		}
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := sess.Subscribe(rctx, &paho.Subscribe{Subscriptions: subs})
		if err == nil {
			err = c.sync(rctx)
		}
		_, _ = sess.Unsubscribe(rctx, &paho.Unsubscribe{Topics: chunk})
		cancel()
		if err != nil {
			return fmt.Errorf("read retained cards: %w", err)
		}
	}
	return nil
}

// republishMissing republishes the cards of registered Agents whose discovery topic holds
// nothing and returns how many.
func (c *cardConn) republishMissing(ctx context.Context) (int, error) {
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err := c.sync(sctx)
	cancel()
	if err != nil {
		return 0, err
	}
	var agents a2av1.AgentList
	if err := c.b.cfg.Client.List(ctx, &agents); err != nil {
		return 0, fmt.Errorf("list agents: %w", err)
	}
	missing := map[string]*a2av1.Agent{}
	c.mu.Lock()
	for i := range agents.Items {
		a := &agents.Items[i]
		if a.Status.PublishedCardDigest == "" || !a.DeletionTimestamp.IsZero() {
			continue
		}
		topic := identity.Of(a).DiscoveryTopic()
		if !c.present[topic] {
			missing[topic] = a
		}
	}
	c.mu.Unlock()
	if len(missing) == 0 {
		return 0, nil
	}
	// The broker may have dropped a card for this connection (live traffic beyond its queue,
	// or the card read failed): ask again for exactly the missing ones before believing it.
	if err := c.verify(ctx, missing); err != nil {
		return 0, err
	}
	n := 0
	for topic, a := range missing {
		card, err := publishedCard(a, c.b.cfg.URL)
		if err != nil {
			return n, err
		}
		if card == nil {
			continue // its spec changed: its own reconcile publishes the new card
		}
		if err := c.publish(ctx, topic, card, map[string]string{
			a2amqtt.PropStatus: a2amqtt.StatusOffline, a2amqtt.PropStatusSource: a2amqtt.SourceBroker,
		}); err != nil {
			return n, err
		}
		n++
		c.republished.Add(1)
	}
	return n, nil
}

// verify reads the candidate topics' retained cards again (readRetained) and drops from missing
// every topic that has one.
func (c *cardConn) verify(ctx context.Context, missing map[string]*a2av1.Agent) error {
	topics := make([]string, 0, len(missing))
	for t := range missing {
		topics = append(topics, t)
	}
	if err := c.readRetained(ctx, topics); err != nil {
		return fmt.Errorf("verify missing cards: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for t := range missing {
		if c.present[t] {
			delete(missing, t)
		}
	}
	return nil
}

// publishedCard rebuilds the card the Agent's last registration published (the one whose digest
// its status records), or nil when its spec has changed since. The card names the pool only when
// the Agent was allowed to join it, which the status does not say: both forms are tried.
func publishedCard(a *a2av1.Agent, brokerURL string) ([]byte, error) {
	pools := []string{a.Spec.PoolID}
	if a.Spec.PoolID != "" {
		pools = append(pools, "")
	}
	for _, pool := range pools {
		card, err := json.Marshal(BuildCard(a, identity.Of(a), pool, brokerURL))
		if err != nil {
			return nil, fmt.Errorf("encode card of %s/%s: %w", a.Namespace, a.Name, err)
		}
		if sum := sha256.Sum256(card); hex.EncodeToString(sum[:]) == a.Status.PublishedCardDigest {
			return card, nil
		}
	}
	return nil, nil
}
