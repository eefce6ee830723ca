package a2amqtt_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/cardsig"
)

// A Conn verifies the cards it looks up once it has a trust anchor (Config.CardTrust from a file
// named by A2A_CARD_KEYS, or the retained key set it follows), and not before.
func TestCardTrust(t *testing.T) {
	brokertest.ForEach(t, func(t *testing.T, b brokertest.Broker) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		key, _ := cardsig.NewKey()
		good := a2amqtt.AgentRef{Org: "demo", Unit: "u", Agent: "good"}
		plain := a2amqtt.AgentRef{Org: "demo", Unit: "u", Agent: "plain"}
		card := func(ref a2amqtt.AgentRef) []byte {
			raw, _ := json.Marshal(&a2a.AgentCard{Name: ref.Agent, Description: "d", Version: "1",
				SupportedInterfaces: []*a2a.AgentInterface{a2amqtt.AgentInterface(b.URL(), ref)}, Skills: []a2a.AgentSkill{}})
			return raw
		}
		signed, err := cardsig.Sign(card(good), "", key)
		if err != nil {
			t.Fatal(err)
		}
		keys, _ := json.Marshal(cardsig.KeySet(key))
		pub := brokertest.MustDial(t, b.Addr(), brokertest.Options{ClientID: "publisher", IgnoreMessages: true})
		retain := func(topic string, payload []byte) {
			t.Helper()
			if pr, err := pub.PublishWith(&paho.Publish{Topic: topic, QoS: 1, Retain: true, Payload: payload}); err != nil || pr.ReasonCode >= 0x80 {
				t.Fatalf("publish %s: %v %v", topic, pr, err)
			}
		}
		retain(good.DiscoveryTopic(), signed)
		retain(plain.DiscoveryTopic(), card(plain))
		retain(a2amqtt.CardKeysTopic, keys)

		connect := func(trust *a2amqtt.CardTrust) *a2amqtt.Conn {
			t.Helper()
			conn, err := a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: b.URL(), Agent: a2amqtt.AgentRef{Org: "demo", Unit: "u", Agent: "reader-" + time.Now().Format("150405.000000")}, CardTrust: trust})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close(context.Background()) })
			return conn
		}
		check := func(conn *a2amqtt.Conn, ref a2amqtt.AgentRef, want error) {
			t.Helper()
			c, _, err := a2amqtt.ResolveCard(ctx, conn, ref, 2*time.Second)
			if want == nil {
				if err != nil || c == nil || c.Name != ref.Agent {
					t.Fatalf("%s: %v", ref, err)
				}
				return
			}
			if !errors.Is(err, a2amqtt.ErrCardNotVerified) || !errors.Is(err, want) {
				t.Fatalf("%s: %v, want %v", ref, err, want)
			}
		}

		// No trust anchor: cards are not checked (as before).
		open := connect(nil)
		check(open, good, nil)
		check(open, plain, nil)

		// A pinned key set from the file A2A_CARD_KEYS names.
		path := filepath.Join(t.TempDir(), "keys.jwks")
		if err := os.WriteFile(path, keys, 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv(a2amqtt.EnvCardKeys, path)
		pinned, err := a2amqtt.CardTrustFromEnv()
		if err != nil || pinned == nil {
			t.Fatalf("CardTrustFromEnv: %v", err)
		}
		conn := connect(pinned)
		check(conn, good, nil)
		check(conn, plain, cardsig.ErrUnsigned)

		// Following the retained key set: a new set replaces the old at once.
		follow, err := a2amqtt.FollowCardKeys(ctx, open, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = follow.Close(ctx) }()
		open.TrustCards(follow)
		check(open, good, nil)
		other, _ := cardsig.NewKey()
		otherKeys, _ := json.Marshal(cardsig.KeySet(other))
		retain(a2amqtt.CardKeysTopic, otherKeys)
		deadline := time.Now().Add(5 * time.Second)
		for follow.Keys().Keys[0].KeyID != other.ID {
			if time.Now().After(deadline) {
				t.Fatal("the followed key set did not change")
			}
			time.Sleep(10 * time.Millisecond)
		}
		check(open, good, cardsig.ErrUntrustedKey)

		// No key set retained: following fails with a clear error.
		retain(a2amqtt.CardKeysTopic, nil)
		if _, err := a2amqtt.FollowCardKeys(ctx, open, 300*time.Millisecond); err == nil {
			t.Fatal("FollowCardKeys without a retained key set succeeded")
		}
	})
}
