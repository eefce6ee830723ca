package registration_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/mosqtable"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

// After a broker restart the operator's card connection holds the retained card of every
// Agent, although they are many more than the broker keeps unwritten for one client: Mosquitto
// drops every packet beyond max_queued_messages (QoS 0 and 1 alike), so one wildcard
// subscription's burst of retained cards loses the rest. The missing-card scan (which asks again
// for the missing ones) is kept out of the way with a grace longer than the test, so what is
// checked is the card read alone.
//
// The test broker's bound is a fifth of Mosquitto's default (200 for 1 000) and the cards are
// large (five 4 KiB descriptions, ≈ 20 KB), so that 1 000 Agents overflow the bound and the
// socket buffers as 10 000 smaller cards overflow the default (a wildcard subscription received
// 6 000–8 000 of 11 000 cards of 1.2 KB there, about 450 of these 1 000).
func TestCardConnectionReadsEveryRetainedCardAfterRestart(t *testing.T) {
	const agents, queue = 1000, 200
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	m := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{Table: &brokertest.TableOptions{},
		ExtraConfig: fmt.Sprintf("persistence true\npersistence_location %s/\nmax_queued_messages %d", t.TempDir(), queue)})
	user, pass := m.TableAdmin()
	be, err := mosqtable.Connect(ctx, mosqtable.Config{URL: m.URL(), Username: user, Password: pass, Logger: quiet})
	if err != nil {
		t.Fatalf("connect decision table: %v", err)
	}
	t.Cleanup(func() { _ = be.Close(context.Background()) })
	op := cp.StartOperatorWith(t, ctx, testenv.Operator{Prefix: "cardread-",
		Broker: registration.BrokerConfig{URL: m.URL(), Backend: be, CardGrace: time.Hour}})

	description := strings.Repeat("a card as large as the API allows. ", 4096/35)
	var skills []a2av1.AgentSkill
	for i := range 4 {
		skills = append(skills, a2av1.AgentSkill{ID: fmt.Sprintf("skill-%d", i), Name: "skill", Description: description})
	}
	topics := make([]string, 0, agents)
	created := make([]*a2av1.Agent, 0, agents)
	for i := range agents {
		a := &a2av1.Agent{
			ObjectMeta: metav1.ObjectMeta{Namespace: op.Namespace, Name: fmt.Sprintf("card-%04d", i)},
			Spec:       a2av1.AgentSpec{OrgID: "acme", UnitID: "cardread", Card: a2av1.AgentCardSpec{Name: "card", Description: description, Skills: skills}},
		}
		if err := k8s.Create(ctx, a); err != nil {
			t.Fatalf("create agent: %v", err)
		}
		created = append(created, a)
		topics = append(topics, identity.Of(a).DiscoveryTopic())
	}
	testenv.Eventually(t, 5*time.Minute, "every card published and seen by the card connection", func() error {
		return cardsKnown(op.Broker, topics)
	})
	waitReady(t, ctx, created)

	// Stopped first, until the card connection has noticed and forgotten what it read, so that
	// what it knows afterwards was read after the restart.
	m.Stop()
	testenv.Eventually(t, time.Minute, "the card connection forgot the cards of the stopped broker", func() error {
		for _, topic := range topics {
			if op.Broker.CardStatus(topic) != "" {
				return fmt.Errorf("it still holds %s", topic)
			}
		}
		return nil
	})
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 2*time.Minute, "every retained card read again after the restart", func() error {
		return cardsKnown(op.Broker, topics)
	})
	t.Logf("the broker logged %d drops of outgoing messages (both starts)", strings.Count(m.Log(), "Outgoing messages are being dropped"))
}

// cardsKnown fails while the card connection holds no card for some of topics.
func cardsKnown(b *registration.Broker, topics []string) error {
	missing := 0
	for _, topic := range topics {
		if b.CardStatus(topic) == "" {
			missing++
		}
	}
	if missing > 0 {
		return fmt.Errorf("%d of %d cards unknown to the card connection", missing, len(topics))
	}
	return nil
}
