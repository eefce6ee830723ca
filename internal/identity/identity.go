// Package identity turns an Agent's org/unit/agent identity into the names the A2A over MQTT
// profile derives from it: the MQTT Client ID and the agent's topics.
package identity

import (
	"fmt"
	"regexp"
	"strings"
)

// MaxSegmentLength bounds each identity segment so that Client IDs and topics stay well inside
// broker limits (Mosquitto and MQTT v5 accept Client IDs far longer, but some brokers cap at 128).
const MaxSegmentLength = 64

// segmentPattern is the profile's identifier rule for org_id, unit_id, agent_id and pool ids.
var segmentPattern = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

// Identity is an agent's place in the bus namespace.
type Identity struct {
	Org   string
	Unit  string
	Agent string
}

// Topics are the topics the profile assigns to one agent.
type Topics struct {
	Request     string
	ReplyPrefix string
	Discovery   string
	Event       string
	// Pool is empty when the agent is not a pool member.
	Pool string
}

// ValidateSegment reports why s cannot be used as an identity segment, or nil.
func ValidateSegment(name, s string) error {
	switch {
	case s == "":
		return fmt.Errorf("%s must not be empty", name)
	case len(s) > MaxSegmentLength:
		return fmt.Errorf("%s %q is longer than %d characters", name, s, MaxSegmentLength)
	case !segmentPattern.MatchString(s):
		return fmt.Errorf("%s %q must match %s", name, s, segmentPattern)
	}
	return nil
}

// Validate checks every segment of the identity.
func (id Identity) Validate() error {
	for _, seg := range []struct{ name, value string }{{"orgID", id.Org}, {"unitID", id.Unit}, {"agentID", id.Agent}} {
		if err := ValidateSegment(seg.name, seg.value); err != nil {
			return err
		}
	}
	return nil
}

// ClientID is the MQTT Client ID the profile requires: {org}/{unit}/{agent}.
func (id Identity) ClientID() string {
	return strings.Join([]string{id.Org, id.Unit, id.Agent}, "/")
}

// Topics returns the agent's topics; poolID may be empty.
func (id Identity) Topics(poolID string) Topics {
	t := Topics{
		Request:     "$a2a/v1/request/" + id.ClientID(),
		ReplyPrefix: "$a2a/v1/reply/" + id.ClientID(),
		Discovery:   "$a2a/v1/discovery/" + id.ClientID(),
		Event:       "$a2a/v1/event/" + id.ClientID(),
	}
	if poolID != "" {
		t.Pool = "$a2a/v1/request/" + id.Org + "/" + id.Unit + "/pool/" + poolID
	}
	return t
}
