package registration

import (
	"encoding/json"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// TestBuildCardExtensions: spec.card.capabilities.extensions become the card's
// capabilities.extensions, so an agent whose card the operator publishes can declare the
// continuation hint extension (issue 12).
func TestBuildCardExtensions(t *testing.T) {
	agent := &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Name: "confirm"}, Spec: a2av1.AgentSpec{Card: a2av1.AgentCardSpec{
		Name: "confirm", Description: "asks first",
		Capabilities: a2av1.AgentCapabilities{Streaming: true, Extensions: []a2av1.AgentExtension{
			{URI: a2amqtt.ContinuationExtensionURI, Description: "continuation hints"},
			{URI: "https://example.dev/ext/strict", Required: true},
		}},
	}}}
	card := BuildCard(agent, a2amqtt.AgentRef{Org: "o", Unit: "u", Agent: "confirm"}, "", "mqtt://broker:1883")
	if !a2amqtt.DeclaresExtension(card, a2amqtt.ContinuationExtensionURI) || len(card.Capabilities.Extensions) != 2 ||
		card.Capabilities.Extensions[0].Description != "continuation hints" || card.Capabilities.Extensions[0].Required || !card.Capabilities.Extensions[1].Required {
		t.Fatalf("extensions: %+v", card.Capabilities.Extensions)
	}
	b, err := json.Marshal(card)
	if err != nil {
		t.Fatal(err)
	}
	var wire struct {
		Capabilities struct {
			Extensions []map[string]any `json:"extensions"`
		} `json:"capabilities"`
	}
	if err := json.Unmarshal(b, &wire); err != nil || len(wire.Capabilities.Extensions) != 2 || wire.Capabilities.Extensions[0]["uri"] != a2amqtt.ContinuationExtensionURI {
		t.Fatalf("card JSON: %s", b)
	}
	agent.Spec.Card.Capabilities.Extensions = nil
	if card := BuildCard(agent, a2amqtt.AgentRef{Org: "o", Unit: "u", Agent: "confirm"}, "", "mqtt://b"); card.Capabilities.Extensions != nil {
		t.Fatal("no extensions declared → none on the card")
	}
}

// TestBuildCardDescriptionDefaultsToName: spec.card.description is optional (issue 26), but an
// A2A card must carry one: the published card then describes the agent by its name.
func TestBuildCardDescriptionDefaultsToName(t *testing.T) {
	ref := a2amqtt.AgentRef{Org: "o", Unit: "u", Agent: "terse"}
	terse := &a2av1.Agent{Spec: a2av1.AgentSpec{Card: a2av1.AgentCardSpec{Name: "Terse agent"}}}
	if got := BuildCard(terse, ref, "", "mqtt://broker:1883").Description; got != "Terse agent" {
		t.Fatalf("description %q, want the name", got)
	}
	terse.Spec.Card.Description = "says little"
	if got := BuildCard(terse, ref, "", "mqtt://broker:1883").Description; got != "says little" {
		t.Fatalf("description %q, want the spec's", got)
	}
}
