package registration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/cardsig"
)

// cardMessage is one message a discovery watcher received.
type cardMessage struct {
	payload        []byte
	status, source string
}

// watchCards records every message on topic, retained or live, until the test ends.
func watchCards(t *testing.T, b *runtimeBroker, topic string) func() []cardMessage {
	t.Helper()
	c := brokertest.MustDial(t, b.addr, brokertest.Options{Username: b.adminUser, Password: b.adminPass, ClientID: "watch-" + fmt.Sprint(time.Now().UnixNano())})
	t.Cleanup(c.Close)
	if code := c.Subscribe(topic); code >= 0x80 {
		t.Fatalf("watch %s: %#x", topic, code)
	}
	got := make(chan cardMessage, 1024)
	go func() {
		for p := range c.Messages() {
			m := cardMessage{payload: p.Payload}
			if p.Properties != nil {
				m.status, m.source = p.Properties.User.Get(a2amqtt.PropStatus), p.Properties.User.Get(a2amqtt.PropStatusSource)
			}
			got <- m
		}
	}()
	return func() []cardMessage {
		var out []cardMessage
		for {
			select {
			case m := <-got:
				out = append(out, m)
			case <-time.After(300 * time.Millisecond):
				return out
			}
		}
	}
}

// An SDK agent run as the operator runs it (its Agent's card in A2A_AGENT_CARD, handed to
// Config.Card as the example agents do) publishes no card and sets no Will: the operator's signed
// card stays the only card on the discovery topic, and its a2a-status follows the broker's view
// (online after the connect, offline after a clean close and after a crash). Every message a
// watcher sees on the topic verifies with the retained key set. With CardPublisherAgent the same
// agent publishes its own card (the profile's self-registration), which the operator signs again.
func TestSDKAgentLeavesTheSignedCard(t *testing.T) {
	forRuntimeBrokers(t, func(t *testing.T, b *runtimeBroker) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		ns, _ := startSigningOperator(t, ctx, b, "cardpub-")
		agents := createAgents(t, ctx, ns, "pub", 1)
		waitReady(t, ctx, agents)
		a := agents[0]
		id := identity.Of(a)
		var set *jose.JSONWebKeySet
		eventually(t, "key set retained and the card signed", func() error {
			jwks, _ := retained(t, b, a2amqtt.CardKeysTopic)
			var err error
			if set, err = cardsig.ParseKeySet([]byte(jwks)); err != nil {
				return err
			}
			card, _ := retained(t, b, id.DiscoveryTopic())
			_, err = cardsig.Verify([]byte(card), set)
			return err
		})
		watched := watchCards(t, b, id.DiscoveryTopic())
		presence := func(want string) {
			t.Helper()
			eventually(t, "the signed card says "+want, func() error {
				card, props := retained(t, b, id.DiscoveryTopic())
				if _, err := cardsig.Verify([]byte(card), set); err != nil {
					return err
				}
				if props[a2amqtt.PropStatus] != want || props[a2amqtt.PropStatusSource] != a2amqtt.SourceBroker {
					return fmt.Errorf("presence %v", props)
				}
				return nil
			})
		}

		// The workload's environment, as the operator sets it.
		envCard, _ := json.Marshal(registration.BuildCard(a, id, "", b.url))
		t.Setenv(a2amqtt.EnvAgentCard, string(envCard))
		card, err := a2amqtt.AgentCardFromEnv()
		if err != nil || card == nil {
			t.Fatalf("AgentCardFromEnv: %v %v", card, err)
		}
		connect := func(publisher a2amqtt.CardPublisher) *a2amqtt.Conn {
			conn, err := a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: b.url, Username: identity.Username(id), Password: agentPassword(t, ctx, a),
				Agent: id, Card: card, CardPublisher: publisher, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			return conn
		}
		conn := connect(a2amqtt.CardPublisherAuto)
		presence(a2amqtt.StatusOnline)
		if err := conn.Close(ctx); err != nil {
			t.Fatal(err)
		}
		presence(a2amqtt.StatusOffline)
		crashed := connect(a2amqtt.CardPublisherAuto)
		presence(a2amqtt.StatusOnline)
		crashed.Abort()
		presence(a2amqtt.StatusOffline)

		msgs := watched()
		if len(msgs) < 5 {
			t.Fatalf("the watcher saw %d card messages, want the retained one and 4 presence changes", len(msgs))
		}
		for i, m := range msgs {
			if _, err := cardsig.Verify(m.payload, set); err != nil {
				t.Fatalf("card message %d of %d (%s/%s) does not verify: %v\n%s", i, len(msgs), m.status, m.source, err, m.payload)
			}
			if m.source != a2amqtt.SourceBroker {
				t.Fatalf("card message %d of %d from %q: the agent published a card", i, len(msgs), m.source)
			}
		}

		// Self-registration, asked for explicitly: the agent's own unsigned card goes out and the
		// operator puts its signed card back with the agent's presence.
		self := connect(a2amqtt.CardPublisherAgent)
		defer func() { _ = self.Close(context.Background()) }()
		sawUnsigned := false
		eventually(t, "the agent's own card signed again by the operator", func() error {
			for _, m := range watched() {
				if _, err := cardsig.Verify(m.payload, set); err != nil && m.source == a2amqtt.SourceAgent {
					sawUnsigned = true
				}
			}
			card, props := retained(t, b, id.DiscoveryTopic())
			if _, err := cardsig.Verify([]byte(card), set); err != nil {
				return err
			}
			if !sawUnsigned || props[a2amqtt.PropStatus] != a2amqtt.StatusOnline || props[a2amqtt.PropStatusSource] != a2amqtt.SourceAgent {
				return fmt.Errorf("saw the agent's card: %v; presence %v", sawUnsigned, props)
			}
			return nil
		})
	})
}
