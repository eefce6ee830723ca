package cluster

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/cardsig"
)

// cardSigningSecret is the Secret the install's operator signs cards with (generated).
const cardSigningSecret = "a2a-fleet-card-signing"

// signedCards checks that the install signs cards: the operator generated its key Secret, the
// JWKS retained on $a2a-fleet/v1/card-keys holds that key's public half, every sample agent's
// retained card verifies with that JWKS (cardsig.Verify), a one-character change to a card does
// not, and a2actl says verified.
func (b *bus) signedCards(ctx context.Context, t *testing.T) {
	secret := &corev1.Secret{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: cardSigningSecret}, secret); err != nil {
		t.Fatalf("the card signing Secret the operator generates: %v", err)
	}
	var keyIDs []string
	for name, data := range secret.Data {
		if name != "tls.key" && !strings.HasSuffix(name, ".pem") {
			continue
		}
		key, err := cardsig.ParseKeyPEM(data)
		if err != nil {
			t.Fatalf("Secret %s entry %s: %v", cardSigningSecret, name, err)
		}
		keyIDs = append(keyIDs, key.PublicJWK().KeyID)
	}
	if len(keyIDs) == 0 {
		t.Fatalf("Secret %s holds no key (entries tls.key or *.pem)", cardSigningSecret)
	}
	c, err := b.connectConsole(t, "")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	retained := func(topic string) []byte {
		t.Helper()
		if rc := c.Subscribe(topic); rc > 2 {
			t.Fatalf("subscribe %s: reason 0x%02x", topic, rc)
		}
		m, err := c.Next(10 * time.Second)
		if err != nil || !m.Retain || m.Topic != topic {
			t.Fatalf("no retained message on %s: %v", topic, err)
		}
		return m.Payload
	}
	jwks, err := cardsig.ParseKeySet(retained(a2amqtt.CardKeysTopic))
	if err != nil {
		t.Fatalf("the JWKS on %s: %v", a2amqtt.CardKeysTopic, err)
	}
	for _, kid := range keyIDs {
		if len(jwks.Key(kid)) != 1 {
			t.Fatalf("the JWKS on %s lacks the Secret's key %s", a2amqtt.CardKeysTopic, kid)
		}
	}
	for _, name := range sampleAgents {
		a := &a2av1.Agent{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: samplesNamespace, Name: name}, a); err != nil {
			t.Fatal(err)
		}
		ref := "acme/demo/" + cmpOr(a.Spec.AgentID, a.Name)
		card := retained("$a2a/v1/discovery/" + ref)
		v, err := cardsig.Verify(card, jwks)
		if err != nil {
			t.Fatalf("%s's retained card does not verify with the retained JWKS: %v\n%s", ref, err, card)
		}
		i := bytes.Index(card, []byte(`"name":"`))
		if i < 0 {
			t.Fatalf("%s's card has no name: %s", ref, card)
		}
		tampered := bytes.Clone(card)
		tampered[i+len(`"name":"`)] ^= 0x01
		if _, err := cardsig.Verify(tampered, jwks); !errors.Is(err, cardsig.ErrInvalidSignature) {
			t.Fatalf("%s's card with one character changed: want ErrInvalidSignature, got %v", ref, err)
		}
		t.Logf("%s: card signed by %s (%s, jku %s); one changed character fails", ref, v.KeyID, v.Algorithm, v.JKU)
	}
	out, err := b.a2actl(ctx, "card", "verify", "acme/demo/confirm")
	if err != nil || !strings.Contains(out, "verified") || strings.Contains(out, "unverified") {
		t.Fatalf("a2actl card verify acme/demo/confirm: %v\n%s", err, out)
	}
}
