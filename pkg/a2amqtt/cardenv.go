package a2amqtt

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/a2aproject/a2a-go/v2/a2a"
)

// EnvAgentCard holds the agent card a process should publish with its presence, as JSON: the
// operator sets it in Agent workloads to the card it builds from the Agent's manifest, so that
// the card on the broker is the manifest's whoever publishes it last (docs/api.md, "Which card
// is the agent's").
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
