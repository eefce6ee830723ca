package a2amqtt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"
)

// ErrAgentNotFound means no retained card exists for the agent.
var ErrAgentNotFound = errors.New("agent not registered (no retained card on its discovery topic)")

// Presence is the advisory liveness carried by a2a-status user properties.
type Presence struct {
	// Status is "online", "offline" or "" (unknown: card without status).
	Status string
	// Source is "agent", "lwt", "broker" or "".
	Source string
}

func presenceOf(p *paho.Publish) Presence {
	return Presence{Status: p.Properties.User.Get(PropStatus), Source: p.Properties.User.Get(PropStatusSource)}
}

// Entry is one agent known to a Directory.
type Entry struct {
	Agent AgentRef
	Card  *a2a.AgentCard
	// Presence is the effective status: that of the latest card on the topic, whoever
	// published it. A retained topic holds one message, so the latest is what the broker holds
	// now; a broker-sourced status that an agent's own card replaced since is stale (the
	// operator republishes the registration card with the broker's view whenever that view
	// and the card disagree, docs/registration.md).
	Presence Presence
	// Reported is the latest agent/LWT-sourced status; Broker the latest
	// broker-managed one (zero when the broker does not manage status).
	Reported Presence
	Broker   Presence
	// CardError is set when the retained payload is not a valid card, or when the Conn verifies
	// cards (TrustCards) and this one does not verify (Card is then nil: it is refused).
	CardError error
	// Signature is the card's check against the Conn's trust anchor (zero when it has none).
	Signature CardSignature
	Updated   time.Time
}

// Online reports the effective status.
func (e Entry) Online() bool { return e.Presence.Status == StatusOnline }

// Directory keeps a live view of retained agent cards under a discovery
// filter. Status is advisory: callers must still handle request timeouts.
type Directory struct {
	sub  *Subscription
	conn *Conn

	mu      sync.Mutex
	entries map[AgentRef]*Entry
	changed chan struct{}
}

// DirectoryFilter returns the discovery filter for an org (all units) or,
// with org "", for every org.
func DirectoryFilter(org string) string {
	if org == "" {
		return TopicPrefix + "/" + MethodDiscovery + "/+/+/+"
	}
	return TopicPrefix + "/" + MethodDiscovery + "/" + org + "/+/+"
}

// NewDirectory subscribes to filter (see DirectoryFilter) and tracks cards.
func NewDirectory(ctx context.Context, conn *Conn, filter string) (*Directory, error) {
	d := &Directory{conn: conn, entries: map[AgentRef]*Entry{}, changed: make(chan struct{})}
	sub, err := conn.Subscribe(ctx, filter, d.onCard)
	if err != nil {
		return nil, fmt.Errorf("a2amqtt: directory: %w", err)
	}
	d.sub = sub
	return d, nil
}

// Close unsubscribes.
func (d *Directory) Close(ctx context.Context) error { return d.sub.Close(ctx) }

func (d *Directory) onCard(p *paho.Publish) {
	info, err := ParseTopic(p.Topic)
	if err != nil || info.Method != MethodDiscovery || info.Agent == "" {
		return
	}
	ref := AgentRef{Org: info.Org, Unit: info.Unit, Agent: info.Agent}
	d.mu.Lock()
	defer d.mu.Unlock()
	defer d.notifyLocked()
	if len(p.Payload) == 0 {
		// Retained delete: the agent unregistered.
		delete(d.entries, ref)
		return
	}
	e := d.entries[ref]
	if e == nil {
		e = &Entry{Agent: ref}
		d.entries[ref] = e
	}
	e.Card, e.Signature, e.CardError = decodeCard(d.conn, p)
	pr := presenceOf(p)
	if pr.Source == SourceBroker {
		e.Broker = pr
	} else {
		e.Reported = pr
	}
	e.Presence = pr
	e.Updated = time.Now()
}

func (d *Directory) notifyLocked() {
	close(d.changed)
	d.changed = make(chan struct{})
}

// Agents returns a snapshot sorted by org/unit/agent.
func (d *Directory) Agents() []Entry {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]Entry, 0, len(d.entries))
	for _, e := range d.entries {
		out = append(out, *e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Agent.String() < out[j].Agent.String() })
	return out
}

// Get returns the entry for ref.
func (d *Directory) Get(ref AgentRef) (Entry, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.entries[ref]
	if !ok {
		return Entry{}, false
	}
	return *e, true
}

// Wait blocks until cond holds for the directory's current state or ctx
// ends. cond runs under no lock on a snapshot.
func (d *Directory) Wait(ctx context.Context, cond func(d *Directory) bool) error {
	for {
		d.mu.Lock()
		ch := d.changed
		d.mu.Unlock()
		if cond(d) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// ResolveCard fetches an agent's retained card and presence from its
// discovery topic. It waits up to wait for the retained message (brokers
// deliver it right after SUBACK; absence means unregistered). When conn verifies
// cards (TrustCards), a card that does not verify is refused with an error wrapping
// ErrCardNotVerified.
func ResolveCard(ctx context.Context, conn *Conn, ref AgentRef, wait time.Duration) (*a2a.AgentCard, Presence, error) {
	if err := ref.Validate(); err != nil {
		return nil, Presence{}, fmt.Errorf("a2amqtt: %w", err)
	}
	if wait <= 0 {
		wait = 2 * time.Second
	}
	got := make(chan *paho.Publish, 1)
	sub, err := conn.Subscribe(ctx, ref.DiscoveryTopic(), func(p *paho.Publish) {
		select {
		case got <- p:
		default:
		}
	})
	if err != nil {
		return nil, Presence{}, fmt.Errorf("a2amqtt: resolve card of %s: %w", ref, err)
	}
	defer func() { _ = sub.Close(context.WithoutCancel(ctx)) }()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case p := <-got:
		if len(p.Payload) == 0 {
			return nil, Presence{}, fmt.Errorf("a2amqtt: %s: %w", ref, ErrAgentNotFound)
		}
		card, _, err := decodeCard(conn, p)
		if err != nil {
			return nil, presenceOf(p), fmt.Errorf("a2amqtt: %s: %w", ref, err)
		}
		return card, presenceOf(p), nil
	case <-timer.C:
		return nil, Presence{}, fmt.Errorf("a2amqtt: %s: %w", ref, ErrAgentNotFound)
	case <-ctx.Done():
		return nil, Presence{}, ctx.Err()
	}
}

// decodeCard reads a retained card and, when conn verifies cards, checks its signature: a card
// that does not verify is refused (nil card, the reason as the error).
func decodeCard(conn *Conn, p *paho.Publish) (*a2a.AgentCard, CardSignature, error) {
	var card a2a.AgentCard
	if err := json.Unmarshal(p.Payload, &card); err != nil {
		return nil, CardSignature{}, fmt.Errorf("invalid agent card on %s: %w", p.Topic, err)
	}
	trust := conn.CardTrust()
	if trust == nil {
		return &card, CardSignature{}, nil
	}
	sig := trust.Verify(p.Payload)
	if sig.State == CardVerified && !describesTopicAgent(&card, p.Topic) {
		// A genuine card put on another agent's discovery topic (by that agent, which may write
		// its own topic): the signature holds, the place does not.
		sig = CardSignature{State: CardInvalid, Err: fmt.Errorf("%w: %w", ErrCardNotVerified, ErrCardOfAnotherAgent)}
	}
	if sig.State != CardVerified {
		return nil, sig, fmt.Errorf("agent card on %s refused: %w", p.Topic, sig.Err)
	}
	return &card, sig, nil
}

// ResolveCard fetches the target agent's card via the requester's Conn.
func (r *Requester) ResolveCard(ctx context.Context, ref AgentRef, wait time.Duration) (*a2a.AgentCard, Presence, error) {
	return ResolveCard(ctx, r.conn, ref, wait)
}
