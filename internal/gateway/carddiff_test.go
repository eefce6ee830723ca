package gateway

import (
	"slices"
	"testing"

	"github.com/a2aproject/a2a-go/v2/a2a"
)

// TestCardDifferences: the members the manifest states are compared, a default value is the same
// as none, and a skill is named by its id when missing, added or changed.
func TestCardDifferences(t *testing.T) {
	manifest := func() *a2a.AgentCard {
		return &a2a.AgentCard{Name: "deploy", Description: "deploys", Version: "1.0.0",
			Capabilities:      a2a.AgentCapabilities{Streaming: true},
			DefaultInputModes: []string{}, DefaultOutputModes: []string{},
			SupportedInterfaces: []*a2a.AgentInterface{a2a.NewAgentInterface("mqtt://broker/x", "MQTT")},
			Skills: []a2a.AgentSkill{{ID: "plan", Name: "Plan", Description: "plans", Tags: []string{}},
				{ID: "roll", Name: "Roll", Description: "rolls back", Tags: []string{"ops"}}}}
	}
	served := manifest()
	// What differs by nature is not a difference: the interface, the security schemes, the icon;
	// nor is null or absent against [].
	served.SupportedInterfaces = []*a2a.AgentInterface{a2a.NewAgentInterface("http://deploy:8080/", a2a.TransportProtocolJSONRPC)}
	served.IconURL = "http://deploy:8080/icon.png"
	served.DefaultInputModes, served.Skills[0].Tags = nil, nil
	if d, err := CardDifferences(manifest(), served); err != nil || len(d) != 0 {
		t.Fatalf("same card: %v %v", d, err)
	}
	served.Description = "deploys things"
	served.Capabilities.Streaming = false
	served.Skills[1].Tags = []string{"ops", "rollback"}
	served.Skills = append(served.Skills, a2a.AgentSkill{ID: "audit", Name: "Audit", Description: "audits"})
	served.Skills = slices.Delete(served.Skills, 0, 1)
	d, err := CardDifferences(manifest(), served)
	want := []string{"description", "capabilities.streaming", "skills[audit]", "skills[plan]", "skills[roll]"}
	if err != nil || !slices.Equal(d, want) {
		t.Fatalf("differences %v (%v), want %v", d, err, want)
	}
}
