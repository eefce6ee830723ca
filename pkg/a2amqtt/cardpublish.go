package a2amqtt

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// CardPublisher says who publishes an agent's card, retained on its discovery topic.
type CardPublisher string

const (
	// CardPublisherAuto, the default: the agent publishes Config.Card with its presence, unless
	// Config.Card is the card the operator gave the workload in A2A_AGENT_CARD; then the
	// operator publishes it (CardPublisherOperator).
	CardPublisherAuto CardPublisher = ""
	// CardPublisherAgent: the agent publishes Config.Card, retained, online at every (re)connect
	// and offline at Close, with an LWT that says offline (the profile's self-registration, for
	// an agent no operator registers).
	CardPublisherAgent CardPublisher = "agent"
	// CardPublisherOperator: the agent publishes no card and sets no LWT. The operator publishes
	// the Agent's card (signed when card signing is on) and keeps its a2a-status from the broker's
	// own view of the connection (a2a-status-source=broker, the profile's broker-managed status),
	// so the signed card is the only card on the topic: an agent's own publish would replace it,
	// unsigned, until the operator signed it again.
	CardPublisherOperator CardPublisher = "operator"
)

// publishedCard returns the card payload the Conn publishes with its presence, or nil when the
// operator publishes the agent's card (see CardPublisher).
func publishedCard(cfg Config) ([]byte, error) {
	if cfg.Card == nil {
		return nil, nil
	}
	switch cfg.CardPublisher {
	case CardPublisherOperator:
		return nil, nil
	case CardPublisherAgent, CardPublisherAuto:
	default:
		return nil, fmt.Errorf("a2amqtt: CardPublisher %q: want %q, %q or empty", cfg.CardPublisher, CardPublisherAgent, CardPublisherOperator)
	}
	card, err := json.Marshal(cfg.Card)
	if err != nil {
		return nil, fmt.Errorf("a2amqtt: encode agent card: %w", err)
	}
	if cfg.CardPublisher == CardPublisherAuto && isOperatorCard(card) {
		return nil, nil
	}
	return card, nil
}

// isOperatorCard reports whether card (JSON) is the card in A2A_AGENT_CARD: the card of an Agent
// the operator registers, which the operator publishes itself.
func isOperatorCard(card []byte) bool {
	env, err := AgentCardFromEnv()
	if err != nil || env == nil {
		return false
	}
	raw, err := json.Marshal(env)
	return err == nil && bytes.Equal(raw, card)
}
