package a2amqtt

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/a2aproject/a2a-go/v2/a2a"
)

// EnvAgentCard holds, as JSON, the card the operator builds from an Agent's manifest and
// publishes for it: the operator sets it in Agent workloads so that the process knows its card
// (docs/api.md, "Which card is the agent's"). The operator publishes that card itself, signed
// when card signing is on, so a Conn given this card does not publish it (CardPublisher).
const EnvAgentCard = "A2A_AGENT_CARD"

// AgentCardFromEnv returns the card in A2A_AGENT_CARD, or nil when it is not set.
func AgentCardFromEnv() (*a2a.AgentCard, error) {
	raw := os.Getenv(EnvAgentCard)
	if raw == "" {
		return nil, nil
	}
	card := &a2a.AgentCard{}
	if err := json.Unmarshal([]byte(raw), card); err != nil {
		return nil, fmt.Errorf("%s is not an agent card: %w", EnvAgentCard, err)
	}
	if card.Name == "" {
		return nil, fmt.Errorf("%s: the card has no name", EnvAgentCard)
	}
	return card, nil
}
