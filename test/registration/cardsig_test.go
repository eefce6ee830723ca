package registration_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/cardsig"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

const cardKeysSecret = "card-signing-keys"

// startSigningOperator runs an operator that signs cards with keys from Secret cardKeysSecret in
// a fresh namespace bound to acme (generated when missing); stop ends it.
func startSigningOperator(t *testing.T, ctx context.Context, b *runtimeBroker, prefix string) (ns string, stop func() error) {
	t.Helper()
	ns = cp.NewNamespace(t, ctx, prefix)
	cp.BindNamespace(t, ctx, ns, "acme")
	return ns, startSigningOperatorIn(t, ctx, b, ns)
}

func startSigningOperatorIn(t *testing.T, ctx context.Context, b *runtimeBroker, ns string) (stop func() error) {
	t.Helper()
	_, stopOperator, err := cp.RunOperator(ctx, testenv.Operator{Namespaces: map[string]string{"acme": ns},
		Broker: registration.BrokerConfig{URL: b.url, Backend: b.backend, CardGrace: 2 * time.Second,
			CardSigning: &registration.CardSigning{
				Secret: client.ObjectKey{Namespace: ns, Name: cardKeysSecret}, Generate: true,
				Reader: k8s, Interval: 500 * time.Millisecond,
			}}})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = stopOperator()
		}
	})
	return func() error { stopped = true; return stopOperator() }
}

// agentPassword returns an Agent's broker password.
func agentPassword(t *testing.T, ctx context.Context, a *a2av1.Agent) string {
	t.Helper()
	secret := &corev1.Secret{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: a.Namespace, Name: identity.CredentialsSecretName(a)}, secret); err != nil {
		t.Fatal(err)
	}
	return string(secret.Data[identity.SecretKeyPassword])
}

// sdkConn connects with the SDK as agent a.
func sdkConn(t *testing.T, ctx context.Context, b *runtimeBroker, a *a2av1.Agent) *a2amqtt.Conn {
	t.Helper()
	id := identity.Of(a)
	conn, err := a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: b.url, Username: identity.Username(id), Password: agentPassword(t, ctx, a),
		Agent: id, Logger: quiet})
	if err != nil {
		t.Fatalf("connect as %s: %v", id, err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// The operator signs every card it publishes with the key of a Secret it generates, retains the
// public key on the keys topic (only it may write there, every agent of the org may read it),
// and replaces an unsigned card an agent publishes for itself with its signed card, keeping the
// agent's presence. With the operator stopped, the SDK refuses a tampered card, a card signed by
// another key and an unsigned card, each with its own error.
func TestCardsSigned(t *testing.T) {
	forRuntimeBrokers(t, func(t *testing.T, b *runtimeBroker) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		ns, stop := startSigningOperator(t, ctx, b, "cardsig-")
		agents := createAgents(t, ctx, ns, "signed", 2)
		waitReady(t, ctx, agents)

		secret := &corev1.Secret{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: cardKeysSecret}, secret); err != nil {
			t.Fatalf("the signing Secret was not generated: %v", err)
		}
		var key *cardsig.Key
		for name, data := range secret.Data {
			if !strings.HasSuffix(name, registration.CardKeySuffix) {
				t.Fatalf("unexpected entry %s", name)
			}
			var err error
			if key, err = cardsig.ParseKeyPEM(data); err != nil {
				t.Fatal(err)
			}
		}
		if key == nil || len(secret.Data) != 1 {
			t.Fatalf("want one key in the generated Secret, got %d entries", len(secret.Data))
		}

		var jwks string
		eventually(t, "key set retained", func() error {
			if jwks, _ = retained(t, b, a2amqtt.CardKeysTopic); jwks == "" {
				return errors.New("no key set")
			}
			return nil
		})
		set, err := cardsig.ParseKeySet([]byte(jwks))
		if err != nil || len(set.Keys) != 1 || set.Keys[0].KeyID != key.ID {
			t.Fatalf("retained key set %s (%v), want exactly kid %s", jwks, err, key.ID)
		}
		for _, a := range agents {
			card, props := retained(t, b, identity.Of(a).DiscoveryTopic())
			v, err := cardsig.Verify([]byte(card), set)
			if err != nil {
				t.Fatalf("%s: published card does not verify: %v\n%s", a.Name, err, card)
			}
			if v.KeyID != key.ID || v.JKU != b.url+"/"+a2amqtt.CardKeysTopic {
				t.Fatalf("%s: verified %+v", a.Name, v)
			}
			if props[a2amqtt.PropStatusSource] != a2amqtt.SourceBroker {
				t.Fatalf("%s: props %v", a.Name, props)
			}
		}

		// Only the operator writes the keys; an agent reads them.
		id0 := identity.Of(agents[0])
		self := brokertest.MustDial(t, b.addr, brokertest.Options{Username: identity.Username(id0), Password: agentPassword(t, ctx, agents[0]), ClientID: id0.ClientID()})
		forged, _ := json.Marshal(cardsig.KeySet(mustNewKey(t)))
		if pr, err := self.PublishWith(&paho.Publish{Topic: a2amqtt.CardKeysTopic, QoS: 1, Retain: true, Payload: forged}); err == nil && pr.ReasonCode < 0x80 {
			t.Fatalf("an agent published the card keys: %v", pr)
		}
		if got, _ := retained(t, b, a2amqtt.CardKeysTopic); got != jwks {
			t.Fatalf("the key set changed: %s", got)
		}
		if code := self.Subscribe(a2amqtt.CardKeysTopic); code >= 0x80 {
			t.Fatalf("an agent may not read the card keys: %#x", code)
		}

		// An agent publishes its own (unsigned) online card: the operator puts its signed card
		// back, with the agent's presence.
		unsigned, _ := json.Marshal(registration.BuildCard(agents[0], id0, "", b.url))
		if pr, err := self.PublishWith(&paho.Publish{Topic: id0.DiscoveryTopic(), QoS: 1, Retain: true, Payload: unsigned,
			Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: a2amqtt.PropStatus, Value: a2amqtt.StatusOnline}, {Key: a2amqtt.PropStatusSource, Value: a2amqtt.SourceAgent}}}}); err != nil || pr.ReasonCode >= 0x80 {
			t.Fatalf("agent card: %v %v", pr, err)
		}
		eventually(t, "the agent's own card signed by the operator", func() error {
			card, props := retained(t, b, id0.DiscoveryTopic())
			if _, err := cardsig.Verify([]byte(card), set); err != nil {
				return err
			}
			if props[a2amqtt.PropStatus] != a2amqtt.StatusOnline || props[a2amqtt.PropStatusSource] != a2amqtt.SourceAgent {
				return fmt.Errorf("presence not kept: %v", props)
			}
			return nil
		})

		// The SDK with the retained keys as its trust anchor.
		conn := sdkConn(t, ctx, b, agents[1])
		trust, err := a2amqtt.FollowCardKeys(ctx, conn, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		conn.TrustCards(trust)
		card, _, err := a2amqtt.ResolveCard(ctx, conn, id0, 5*time.Second)
		if err != nil || card.Name != "rt" {
			t.Fatalf("ResolveCard of a signed card: %v", err)
		}

		// With the operator stopped, nobody restores the cards.
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		signedCard, _ := retained(t, b, id0.DiscoveryTopic())
		othersCard, _ := retained(t, b, identity.Of(agents[1]).DiscoveryTopic())
		tampered := strings.Replace(signedCard, `"description":"runtime test"`, `"description":"runtime tesT"`, 1)
		other, err := cardsig.Sign(unsigned, "", mustNewKey(t))
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name    string
			payload string
			want    error
			state   string
		}{
			{"tampered", tampered, cardsig.ErrInvalidSignature, a2amqtt.CardInvalid},
			{"another key", string(other), cardsig.ErrUntrustedKey, a2amqtt.CardInvalid},
			{"unsigned", string(unsigned), cardsig.ErrUnsigned, a2amqtt.CardUnsigned},
			{"another agent's signed card", othersCard, a2amqtt.ErrCardOfAnotherAgent, a2amqtt.CardInvalid},
		} {
			if tc.payload == signedCard {
				t.Fatalf("%s: nothing changed", tc.name)
			}
			if pr, err := self.PublishWith(&paho.Publish{Topic: id0.DiscoveryTopic(), QoS: 1, Retain: true, Payload: []byte(tc.payload)}); err != nil || pr.ReasonCode >= 0x80 {
				t.Fatalf("%s: publish: %v %v", tc.name, pr, err)
			}
			_, _, err := a2amqtt.ResolveCard(ctx, conn, id0, 5*time.Second)
			if !errors.Is(err, a2amqtt.ErrCardNotVerified) || !errors.Is(err, tc.want) {
				t.Fatalf("%s: ResolveCard = %v, want %v", tc.name, err, tc.want)
			}
			dir, err := a2amqtt.NewDirectory(ctx, conn, a2amqtt.DirectoryFilter("acme"))
			if err != nil {
				t.Fatal(err)
			}
			if err := dir.Wait(ctx, func(d *a2amqtt.Directory) bool {
				e, ok := d.Get(id0)
				e1, ok1 := d.Get(identity.Of(agents[1]))
				return ok && ok1 && e.Signature.State != "" && e1.Signature.State != ""
			}); err != nil {
				t.Fatal(err)
			}
			e, _ := dir.Get(id0)
			if e.Card != nil || e.Signature.State != tc.state || !errors.Is(e.CardError, tc.want) {
				t.Fatalf("%s: directory entry %+v", tc.name, e)
			}
			if e1, ok := dir.Get(identity.Of(agents[1])); !ok || e1.Signature.State != a2amqtt.CardVerified || e1.Card == nil {
				t.Fatalf("%s: the untouched card: %+v", tc.name, e1)
			}
			_ = dir.Close(ctx)
		}
	})
}

func mustNewKey(t *testing.T) *cardsig.Key {
	t.Helper()
	k, err := cardsig.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}
