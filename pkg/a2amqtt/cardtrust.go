package a2amqtt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"
	jose "github.com/go-jose/go-jose/v4"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/cardsig"
)

// CardKeysTopic is where the operator keeps the public keys that sign agent cards, as a retained
// JWK Set (RFC 7517). It sits under the project's own prefix, outside the profile's `$a2a/v1/`
// tree, so that no discovery filter of the profile (`$a2a/v1/discovery/{org}/#`,
// `…/+/+/+`) ever reads it as a card and no org ID can collide with it. Cards name it in the
// jku of their signatures as `{broker URL}/{CardKeysTopic}`.
const CardKeysTopic = "$a2a-fleet/v1/card-keys"

// EnvCardKeys names a file with the JWK Set (or single pinned JWK) that signs agent cards, for
// CardTrustFromEnv and a2actl's --card-keys.
const EnvCardKeys = "A2A_CARD_KEYS"

// CardTrustFromEnv is CardTrustFromFile of $A2A_CARD_KEYS, or nil when it is not set.
func CardTrustFromEnv() (*CardTrust, error) {
	path := os.Getenv(EnvCardKeys)
	if path == "" {
		return nil, nil
	}
	return CardTrustFromFile(path)
}

// ErrCardNotVerified wraps every refusal of a card by a CardTrust (unsigned, signed by an
// untrusted key, or not matching its signature): errors.Is also matches cardsig.ErrUnsigned,
// cardsig.ErrUntrustedKey or cardsig.ErrInvalidSignature.
var ErrCardNotVerified = errors.New("agent card not verified")

// ErrCardOfAnotherAgent: a verified card on a discovery topic whose agent it does not describe
// (none of its interfaces is that agent's request topic).
var ErrCardOfAnotherAgent = errors.New("agent card describes another agent than its discovery topic's")

// describesTopicAgent reports whether card advertises the request topic of the agent whose
// discovery topic it was read from.
func describesTopicAgent(card *a2a.AgentCard, topic string) bool {
	info, err := ParseTopic(topic)
	if err != nil || info.Agent == "" {
		return false
	}
	want := "/" + AgentRef{Org: info.Org, Unit: info.Unit, Agent: info.Agent}.RequestTopic()
	for _, i := range card.SupportedInterfaces {
		if i != nil && strings.HasSuffix(i.URL, want) {
			return true
		}
	}
	return false
}

// Signature states of a card (Entry.Signature.State).
const (
	// CardVerified: signed by a trusted key and unchanged since.
	CardVerified = "verified"
	// CardUnsigned: no signature at all.
	CardUnsigned = "unverified"
	// CardInvalid: signed by no trusted key, or changed after signing.
	CardInvalid = "invalid"
)

// CardSignature is the outcome of checking one card against a CardTrust.
type CardSignature struct {
	// State is CardVerified, CardUnsigned or CardInvalid ("" when no trust anchor was set).
	State string
	// KeyID is the trusted key that vouched for a verified card.
	KeyID string
	// Err explains an unverified or invalid card (wraps ErrCardNotVerified).
	Err error
}

// CardTrust is a trust anchor for agent cards: the public keys whose signatures count. It is
// safe for concurrent use; a CardTrust that follows the retained key set (FollowCardKeys) changes
// its keys when the operator rotates them.
type CardTrust struct {
	keys atomic.Pointer[jose.JSONWebKeySet]
	sub  *Subscription
}

// NewCardTrust trusts exactly the keys of set (a JWK Set, or one pinned key).
func NewCardTrust(set *jose.JSONWebKeySet) *CardTrust {
	t := &CardTrust{}
	t.keys.Store(set)
	return t
}

// CardTrustFromFile reads a JWK Set, or a single JWK (a pinned key), from path.
func CardTrustFromFile(path string) (*CardTrust, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("a2amqtt: card keys: %w", err)
	}
	set, err := cardsig.ParseKeySet(data)
	if err != nil {
		return nil, fmt.Errorf("a2amqtt: card keys in %s: %w", path, err)
	}
	return NewCardTrust(set), nil
}

// FollowCardKeys trusts the key set retained on CardKeysTopic and follows it: a key the operator
// adds is trusted as soon as it is published, a key it retires is dropped. It waits up to wait
// for the retained set (default 2 s) and fails when there is none (the broker holds no signed
// cards, or this identity may not read the keys). Close ends the subscription.
func FollowCardKeys(ctx context.Context, conn *Conn, wait time.Duration) (*CardTrust, error) {
	if wait <= 0 {
		wait = 2 * time.Second
	}
	t := &CardTrust{}
	var once sync.Once
	first := make(chan error, 1)
	sub, err := conn.Subscribe(ctx, CardKeysTopic, func(p *paho.Publish) {
		if len(p.Payload) == 0 {
			return // keep the keys we have: the operator never clears them
		}
		set, err := cardsig.ParseKeySet(p.Payload)
		if err == nil {
			t.keys.Store(set)
		}
		once.Do(func() { first <- err })
	})
	if err != nil {
		return nil, fmt.Errorf("a2amqtt: follow card keys: %w", err)
	}
	t.sub = sub
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case err := <-first:
		if err != nil {
			_ = sub.Close(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("a2amqtt: card keys on %s: %w", CardKeysTopic, err)
		}
		return t, nil
	case <-timer.C:
		_ = sub.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("a2amqtt: no card keys retained on %s within %s", CardKeysTopic, wait)
	case <-ctx.Done():
		_ = sub.Close(context.WithoutCancel(ctx))
		return nil, ctx.Err()
	}
}

// Close stops following the retained key set (a no-op for a fixed set).
func (t *CardTrust) Close(ctx context.Context) error {
	if t == nil || t.sub == nil {
		return nil
	}
	return t.sub.Close(ctx)
}

// Keys is the key set trusted now.
func (t *CardTrust) Keys() *jose.JSONWebKeySet { return t.keys.Load() }

// Verify checks a card's JSON as received.
func (t *CardTrust) Verify(card []byte) CardSignature {
	v, err := cardsig.Verify(card, t.keys.Load())
	switch {
	case err == nil:
		return CardSignature{State: CardVerified, KeyID: v.KeyID}
	case errors.Is(err, cardsig.ErrUnsigned):
		return CardSignature{State: CardUnsigned, Err: fmt.Errorf("%w: %w", ErrCardNotVerified, err)}
	}
	return CardSignature{State: CardInvalid, Err: fmt.Errorf("%w: %w", ErrCardNotVerified, err)}
}

// TrustCards makes the Conn's card lookups (Directory, ResolveCard, Requester.ResolveCard)
// verify every card against t and refuse those that do not verify. nil turns verification off.
func (c *Conn) TrustCards(t *CardTrust) { c.cardTrust.Store(t) }

// CardTrust is the trust anchor set by TrustCards (nil: cards are not verified).
func (c *Conn) CardTrust() *CardTrust { return c.cardTrust.Load() }
