package registration

import (
	"github.com/a2aproject/a2a-go/v2/a2a"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// BuildCard turns an Agent's spec into the A2A v1.0 agent card published on its discovery topic,
// with the MQTT interface (and the pool interface for pool members) the operator derives.
// pool is the pool the agent is a member of ("" when none, or when it may not join its pool).
func BuildCard(agent *a2av1.Agent, id a2amqtt.AgentRef, pool, brokerURL string) *a2a.AgentCard {
	spec := agent.Spec.Card
	description := spec.Description
	if description == "" {
		// A2A requires one; spec.card.description is optional (docs/api.md).
		description = spec.Name
	}
	card := &a2a.AgentCard{
		Name:               spec.Name,
		Description:        description,
		Version:            spec.Version,
		DocumentationURL:   spec.DocumentationURL,
		DefaultInputModes:  nonNil(spec.DefaultInputModes),
		DefaultOutputModes: nonNil(spec.DefaultOutputModes),
		Capabilities: a2a.AgentCapabilities{
			Streaming:         spec.Capabilities.Streaming,
			PushNotifications: spec.Capabilities.PushNotifications,
		},
		SupportedInterfaces: []*a2a.AgentInterface{a2amqtt.AgentInterface(brokerURL, id)},
		Skills:              make([]a2a.AgentSkill, 0, len(spec.Skills)),
	}
	if pool != "" {
		ref := a2amqtt.PoolRef{Org: id.Org, Unit: id.Unit, Pool: pool}
		card.SupportedInterfaces = append(card.SupportedInterfaces,
			a2a.NewAgentInterface(brokerURL+"/"+ref.RequestTopic(), a2amqtt.TransportProtocolMQTT))
	}
	for _, e := range spec.Capabilities.Extensions {
		card.Capabilities.Extensions = append(card.Capabilities.Extensions, a2a.AgentExtension{URI: e.URI, Description: e.Description, Required: e.Required})
	}
	if p := spec.Provider; p != nil {
		card.Provider = &a2a.AgentProvider{Org: p.Organization, URL: p.URL}
	}
	for _, s := range spec.Skills {
		card.Skills = append(card.Skills, a2a.AgentSkill{
			ID: s.ID, Name: s.Name, Description: s.Description, Tags: nonNil(s.Tags), Examples: s.Examples,
		})
	}
	return card
}

// nonNil keeps required JSON arrays as [] rather than null.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
