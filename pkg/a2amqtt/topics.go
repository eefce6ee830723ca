package a2amqtt

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// TopicPrefix is the root of every topic defined by the A2A over MQTT
// profile v0.1.
const TopicPrefix = "$a2a/v1"

// Topic methods ("{method}" in $a2a/v1/{method}/{org}/{unit}/{agent}).
const (
	MethodDiscovery = "discovery"
	MethodRequest   = "request"
	MethodReply     = "reply"
	MethodEvent     = "event"
	// MethodDelivery is not in the profile: it is this project's private topic on which the
	// conversation service forwards requests to an agent it stands in front of.
	MethodDelivery = "delivery"
)

// poolSegment is the literal path segment that marks a pool request topic:
// $a2a/v1/request/{org}/{unit}/pool/{pool}.
const poolSegment = "pool"

// maxGroupIDLen is the profile's recommended broker-safe group id length.
const maxGroupIDLen = 64

// ValidID reports whether s is a valid profile identifier (org, unit, agent,
// pool or group id): ^[A-Za-z0-9_.-]+$. A byte loop, not a regexp: it runs
// on every message the conversation service relays (a regexp match cost
// ~5 µs of its ~160 µs per request); TestValidIDMatchesPattern holds it to
// the pattern.
func ValidID(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '.', c == '-':
		default:
			return false
		}
	}
	return true
}

// ValidateID returns a descriptive error when s is not a valid identifier;
// kind names the field in the message ("org", "agent", ...).
func ValidateID(kind, s string) error {
	if !ValidID(s) {
		return fmt.Errorf("invalid %s id %q: must match ^[A-Za-z0-9_.-]+$", kind, s)
	}
	return nil
}

// AgentRef names one agent: {org}/{unit}/{agent}. It is also the agent's MQTT
// Client ID.
type AgentRef struct {
	Org   string
	Unit  string
	Agent string
}

// String returns "org/unit/agent", the profile's Client ID format.
func (a AgentRef) String() string { return a.Org + "/" + a.Unit + "/" + a.Agent }

// Validate checks all three identifiers.
func (a AgentRef) Validate() error {
	if err := ValidateID("org", a.Org); err != nil {
		return err
	}
	if err := ValidateID("unit", a.Unit); err != nil {
		return err
	}
	return ValidateID("agent", a.Agent)
}

// ParseAgentRef parses "org/unit/agent".
func ParseAgentRef(s string) (AgentRef, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 {
		return AgentRef{}, fmt.Errorf("agent reference %q: want ORG/UNIT/AGENT", s)
	}
	ref := AgentRef{Org: parts[0], Unit: parts[1], Agent: parts[2]}
	if err := ref.Validate(); err != nil {
		return AgentRef{}, fmt.Errorf("agent reference %q: %w", s, err)
	}
	return ref, nil
}

// ClientID is the MQTT Client ID the profile mandates: {org}/{unit}/{agent}.
func (a AgentRef) ClientID() string { return a.String() }

// Topic returns $a2a/v1/{method}/{org}/{unit}/{agent}.
func (a AgentRef) Topic(method string) string {
	return TopicPrefix + "/" + method + "/" + a.Org + "/" + a.Unit + "/" + a.Agent
}

// DiscoveryTopic is where the agent's retained card lives.
func (a AgentRef) DiscoveryTopic() string { return a.Topic(MethodDiscovery) }

// RequestTopic is the agent's direct request topic.
func (a AgentRef) RequestTopic() string { return a.Topic(MethodRequest) }

// EventTopic is the agent's event topic.
func (a AgentRef) EventTopic() string { return a.Topic(MethodEvent) }

// ReplyTopic is the agent's reply topic with the given suffix:
// $a2a/v1/reply/{org}/{unit}/{agent}/{suffix}.
func (a AgentRef) ReplyTopic(suffix string) string {
	return a.Topic(MethodReply) + "/" + suffix
}

// PoolRef names a unit-scoped shared pool.
type PoolRef struct {
	Org  string
	Unit string
	Pool string
}

// String returns "org/unit/pool/{pool}".
func (p PoolRef) String() string { return p.Org + "/" + p.Unit + "/" + poolSegment + "/" + p.Pool }

// Validate checks all identifiers.
func (p PoolRef) Validate() error {
	if err := ValidateID("org", p.Org); err != nil {
		return err
	}
	if err := ValidateID("unit", p.Unit); err != nil {
		return err
	}
	return ValidateID("pool", p.Pool)
}

// RequestTopic is the canonical (non-shared) pool request topic requesters
// publish to: $a2a/v1/request/{org}/{unit}/pool/{pool}.
func (p PoolRef) RequestTopic() string {
	return TopicPrefix + "/" + MethodRequest + "/" + p.Org + "/" + p.Unit + "/" + poolSegment + "/" + p.Pool
}

// GroupID is the profile's deterministic shared-subscription group id:
// a2a.{org}.{unit}.{pool}, sanitized and bounded to 64 characters.
func (p PoolRef) GroupID() string { return GroupID(p.Org, p.Unit, p.Pool) }

// SharedSubscription is the filter pool members subscribe to:
// $share/{group}/$a2a/v1/request/{org}/{unit}/pool/{pool}.
func (p PoolRef) SharedSubscription() string {
	return SharedSubscription(p.GroupID(), p.RequestTopic())
}

// SharedSubscription is the MQTT v5 shared-subscription filter $share/{group}/{filter}.
func SharedSubscription(group, filter string) string { return "$share/" + group + "/" + filter }

// MethodFilter covers every topic of one method under a scope: MethodFilter("reply", "acme")
// is $a2a/v1/reply/acme/#, MethodFilter("reply") is $a2a/v1/reply/#.
func MethodFilter(method string, scope ...string) string {
	t := TopicPrefix + "/" + method
	for _, s := range scope {
		t += "/" + s
	}
	return t + "/#"
}

// GroupID derives the shared-subscription group id for a pool. Characters
// outside [A-Za-z0-9._] become "_"; ids longer than 64 characters are
// truncated and suffixed with a short hash so distinct long pools do not
// collide. The result never depends on the instance (no randomness), as all
// members of one pool must agree on it.
func GroupID(org, unit, pool string) string {
	raw := "a2a." + org + "." + unit + "." + pool
	var b strings.Builder
	for _, r := range raw {
		if (r >= 'A' && r <= 'Z') || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r == '.' || r == '_' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	id := b.String()
	if len(id) <= maxGroupIDLen {
		return id
	}
	sum := sha256.Sum256([]byte(raw))
	suffix := "_" + hex.EncodeToString(sum[:])[:8]
	return id[:maxGroupIDLen-len(suffix)] + suffix
}

// TopicInfo is the parsed form of a profile topic.
type TopicInfo struct {
	Method string
	Org    string
	Unit   string
	// Agent is set for direct topics.
	Agent string
	// Pool is set for pool request topics.
	Pool string
	// Suffix is the reply suffix for reply topics.
	Suffix string
}

// ParseTopic parses $a2a/v1/{method}/{org}/{unit}/{agent}[/{suffix}] and
// $a2a/v1/request/{org}/{unit}/pool/{pool}. A leading $share/{group}/ is
// stripped.
func ParseTopic(topic string) (TopicInfo, error) {
	if strings.HasPrefix(topic, "$share/") {
		rest := strings.TrimPrefix(topic, "$share/")
		i := strings.IndexByte(rest, '/')
		if i < 0 {
			return TopicInfo{}, fmt.Errorf("topic %q: malformed shared subscription", topic)
		}
		topic = rest[i+1:]
	}
	if !strings.HasPrefix(topic, TopicPrefix+"/") {
		return TopicInfo{}, fmt.Errorf("topic %q: not under %s", topic, TopicPrefix)
	}
	parts := strings.Split(strings.TrimPrefix(topic, TopicPrefix+"/"), "/")
	if len(parts) < 4 {
		return TopicInfo{}, fmt.Errorf("topic %q: too few segments", topic)
	}
	info := TopicInfo{Method: parts[0], Org: parts[1], Unit: parts[2]}
	switch {
	case info.Method == MethodRequest && parts[3] == poolSegment && len(parts) == 5:
		info.Pool = parts[4]
	case info.Method == MethodReply && len(parts) == 5:
		info.Agent, info.Suffix = parts[3], parts[4]
	case len(parts) == 4:
		info.Agent = parts[3]
	default:
		return TopicInfo{}, fmt.Errorf("topic %q: unexpected segments", topic)
	}
	for _, id := range []struct{ kind, v string }{{"org", info.Org}, {"unit", info.Unit}, {"agent", info.Agent}, {"pool", info.Pool}, {"reply suffix", info.Suffix}} {
		if id.v == "" {
			continue
		}
		if err := ValidateID(id.kind, id.v); err != nil {
			return TopicInfo{}, fmt.Errorf("topic %q: %w", topic, err)
		}
	}
	return info, nil
}
