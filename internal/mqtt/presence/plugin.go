package presence

import (
	"encoding/json"
	"fmt"
	"time"
)

// PluginTopic is where a broker plugin reports connections as events (the seam for a Mosquitto
// plugin, docs/broker.md "Presence from a plugin"): one topic, so the events keep their order. A
// $SYS topic: Mosquitto refuses PUBLISH to $SYS from clients, so only the broker (the plugin,
// with mosquitto_broker_publish) can write it.
const PluginTopic = "$SYS/broker/a2a-fleet/presence"

// PluginEvent is the JSON payload of one PluginTopic message.
type PluginEvent struct {
	// ClientID of the connection (required).
	ClientID string `json:"clientId"`
	// Username it authenticated as (informational).
	Username string `json:"username,omitempty"`
	// Event is "connected" (CONNACK 0x00 sent), "disconnected" (the connection ended, for any
	// reason) or "refused" (a CONNECT with this client ID was refused).
	Event string `json:"event"`
	// ReasonCode is the MQTT v5 reason code of the DISCONNECT or CONNACK, when there was one.
	ReasonCode *int `json:"reasonCode,omitempty"`
	// Reason says why in words (e.g. "administrative action", "keepalive timeout").
	Reason string `json:"reason,omitempty"`
	// Time is when the broker saw it (RFC 3339, optional: the receive time otherwise).
	Time *time.Time `json:"time,omitempty"`
}

// ParsePluginEvent reads one PluginTopic payload. at is the receive time.
func ParsePluginEvent(payload []byte, at time.Time) (Observation, error) {
	var e PluginEvent
	if err := json.Unmarshal(payload, &e); err != nil {
		return Observation{}, fmt.Errorf("presence event: %w", err)
	}
	if e.ClientID == "" {
		return Observation{}, fmt.Errorf("presence event without clientId: %s", payload)
	}
	o := Observation{ClientID: e.ClientID, At: at, Source: SourceBroker, Reason: e.Reason}
	if e.Time != nil && !e.Time.IsZero() {
		o.At = *e.Time
	}
	if e.ReasonCode != nil {
		if o.Reason == "" {
			o.Reason = fmt.Sprintf("reason code %#02x", *e.ReasonCode)
		} else {
			o.Reason = fmt.Sprintf("%s (%#02x)", o.Reason, *e.ReasonCode)
		}
	}
	switch e.Event {
	case "connected":
		o.Connected, o.Reason = true, ""
	case "disconnected":
	case "refused":
		o.Refused = true
	default:
		return Observation{}, fmt.Errorf("presence event %q is not connected, disconnected or refused", e.Event)
	}
	return o, nil
}
