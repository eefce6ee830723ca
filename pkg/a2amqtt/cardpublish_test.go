package a2amqtt

import (
	"encoding/json"
	"testing"

	"github.com/a2aproject/a2a-go/v2/a2a"
)

// The Conn publishes its card unless it is the operator's (A2A_AGENT_CARD) or it is told the
// operator publishes it; CardPublisherAgent publishes whatever the card.
func TestPublishedCard(t *testing.T) {
	operators := &a2a.AgentCard{Name: "from the manifest", Description: "d"}
	own := &a2a.AgentCard{Name: "the process's own", Description: "d"}
	raw, _ := json.Marshal(operators)
	t.Setenv(EnvAgentCard, string(raw))
	fromEnv, err := AgentCardFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		card      *a2a.AgentCard
		publisher CardPublisher
		published bool
	}{
		{"no card", nil, CardPublisherAuto, false},
		{"the operator's card", fromEnv, CardPublisherAuto, false},
		{"the operator's card, an equal copy", &a2a.AgentCard{Name: "from the manifest", Description: "d"}, CardPublisherAuto, false},
		{"its own card", own, CardPublisherAuto, true},
		{"the operator's card, self-registration asked for", fromEnv, CardPublisherAgent, true},
		{"its own card, the operator publishes", own, CardPublisherOperator, false},
	} {
		got, err := publishedCard(Config{Card: tc.card, CardPublisher: tc.publisher})
		if err != nil || (got != nil) != tc.published {
			t.Errorf("%s: published %q (%v), want published=%v", tc.name, got, err, tc.published)
		}
	}
	if _, err := publishedCard(Config{Card: own, CardPublisher: "sometimes"}); err == nil {
		t.Error("an unknown CardPublisher was accepted")
	}
	t.Setenv(EnvAgentCard, "")
	if got, _ := publishedCard(Config{Card: operators}); got == nil {
		t.Error("without A2A_AGENT_CARD the card was not published")
	}
}
