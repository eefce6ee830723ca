package registration

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/eclipse/paho.golang/paho"
	jose "github.com/go-jose/go-jose/v4"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/cardsig"
)

// With card signing on, the card connection keeps three things true (docs/security.md, "Signed
// agent cards"):
//
//   - the broker retains on a2amqtt.CardKeysTopic the public keys of every key that signs, plus,
//     while cards are being re-signed after a key change, the keys the cards still carry, so a
//     client that follows that topic can verify every card at every moment;
//   - every registered Agent's retained card carries exactly one signature per key of the ring:
//     after a key change (a rotation's new key added, or its old key retired) every card is
//     signed again, and the set on the topic is reduced to the ring only once they all are;
//   - a card someone else put on a registered Agent's topic (the agent's own process, its Will)
//     is replaced by the operator's signed card, with the same presence, as soon as it is seen.
//
// The seal loop does all three, woken by a key change, a (re)connection, or a card whose
// signatures are not the ring's.

func (c *cardConn) wakeSeal() {
	select {
	case c.sealWake <- struct{}{}:
	default:
	}
}

// observeKeys records the key set the broker retains (our own publication, echoed).
func (c *cardConn) observeKeys(p *paho.Publish) {
	var set *jose.JSONWebKeySet
	if len(p.Payload) > 0 {
		s, err := cardsig.ParseKeySet(p.Payload)
		if err != nil {
			c.b.log.Info("the retained card key set is unreadable; publishing it again", "err", err.Error())
		} else {
			set = s
		}
	}
	c.mu.Lock()
	c.keysSeen = set
	c.mu.Unlock()
}

// sealLoop runs seal whenever woken, until ctx ends; a failed pass is retried.
func (c *cardConn) sealLoop(ctx context.Context) {
	signer := c.b.signer
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.sealWake:
		case <-signer.changed:
		}
		n, err := c.seal(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			c.b.log.Info("signing agent cards failed; retrying", "err", err.Error(), "signed", n)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			c.wakeSeal()
		case n > 0:
			c.b.log.V(1).Info("signed agent cards again", "cards", n, "kids", signer.ring.Load().id)
		}
	}
}

// seal publishes the key set (widened to what cards still carry), signs again every card that
// is not signed by the ring, then narrows the key set to the ring.
func (c *cardConn) seal(ctx context.Context) (int, error) {
	if c.sess.Load() == nil {
		return 0, nil // the first connection's OnReady wakes us again
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err := c.sync(sctx) // the retained key set and cards of this connection have arrived
	cancel()
	if err != nil {
		return 0, err
	}
	signer := c.b.signer
	ring := signer.ring.Load()
	c.mu.Lock()
	seen := c.keysSeen
	c.mu.Unlock()
	wide := signer.keySet(seen)
	if setID(seen) != setID(&wide) {
		if err := c.publishKeys(ctx, &wide); err != nil {
			return 0, err
		}
	}
	n, err := c.resign(ctx, ring)
	if err != nil {
		return n, err
	}
	if ring != signer.ring.Load() {
		c.wakeSeal() // the keys changed meanwhile: another pass
		return n, nil
	}
	narrow := signer.keySet(nil)
	if setID(&narrow) != setID(&wide) {
		if err := c.publishKeys(ctx, &narrow); err != nil {
			return n, err
		}
	}
	return n, nil
}

func setID(s *jose.JSONWebKeySet) string {
	if s == nil {
		return ""
	}
	kids := make([]string, 0, len(s.Keys))
	for _, k := range s.Keys {
		kids = append(kids, k.KeyID)
	}
	return kidSet(kids)
}

func (c *cardConn) publishKeys(ctx context.Context, set *jose.JSONWebKeySet) error {
	payload, err := json.Marshal(set)
	if err != nil {
		return fmt.Errorf("encode card keys: %w", err)
	}
	if err := c.publish(ctx, a2amqtt.CardKeysTopic, payload, nil); err != nil {
		return err
	}
	c.mu.Lock()
	c.keysSeen = set // what the echo will say; the next pass must not widen it again
	c.mu.Unlock()
	return nil
}

// resign publishes again, signed by ring, the card of every registered Agent whose retained card
// carries other signatures (or none), keeping the presence that card shows. A topic without a
// card is the missing-card scan's.
func (c *cardConn) resign(ctx context.Context, ring *keyRing) (int, error) {
	var agents a2av1.AgentList
	if err := c.b.cfg.Client.List(ctx, &agents); err != nil {
		return 0, fmt.Errorf("list agents: %w", err)
	}
	n := 0
	for i := range agents.Items {
		a := &agents.Items[i]
		if a.Status.PublishedCardDigest == "" || !a.DeletionTimestamp.IsZero() {
			continue
		}
		topic := identity.Of(a).DiscoveryTopic()
		cur, ok := c.retained(topic)
		if !ok || cur.kids == ring.id {
			continue
		}
		card, err := publishedCard(a, c.b.cfg.URL)
		if err != nil {
			return n, err
		}
		if card == nil {
			continue // its spec changed: its own reconcile publishes the new card, signed
		}
		// Looked at again just before publishing: a reconcile may have put a new signed card.
		if cur, ok = c.retained(topic); !ok || cur.kids == ring.id {
			continue
		}
		props := map[string]string{a2amqtt.PropStatusSource: a2amqtt.SourceBroker}
		if cur.source != "" && cur.source != a2amqtt.SourceBroker && cur.status != "" {
			// The agent's own presence (its online card, its Will), under the operator's card.
			props = map[string]string{a2amqtt.PropStatus: cur.status, a2amqtt.PropStatusSource: cur.source}
		}
		if err := c.publish(ctx, topic, card, props); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// CardStatus is the a2a-status of the card the broker holds on topic, as the operator's card
// connection last read it ("" when it has read none): a host that runs agents which leave their
// cards to the operator (the dev stack) waits on it until their cards say online, which the
// operator publishes presenceCardGrace after the broker saw them connect.
func (b *Broker) CardStatus(topic string) string {
	cur, _ := b.cards.retained(topic)
	return cur.status
}
