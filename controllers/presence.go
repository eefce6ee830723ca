package controllers

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/presence"
)

// PresenceReader tells what the broker (or the agent's retained card) says of whether the
// process with a client ID is connected (registration.Broker implements it).
type PresenceReader interface {
	Presence(clientID string) presence.State
}

// presenceSource enqueues the Agents whose presence changed.
func presenceSource(events <-chan event.TypedGenericEvent[client.Object]) source.Source {
	return source.Channel(events, &handler.TypedEnqueueRequestForObject[client.Object]{})
}

// setConnected writes the Connected condition and status.presence of an Agent that holds its
// identity (an Agent that may not, or whose client ID another Agent holds, has no process of its
// own to speak of: both are removed). It never touches Ready.
func (u *agentStatus) setConnected(agent *a2av1.Agent, holder *a2av1.Agent) {
	holds := meta.IsStatusConditionTrue(agent.Status.Conditions, a2av1.ConditionIdentityPermitted) &&
		(holder == nil || holder.UID == agent.UID) && agent.Status.ClientID != ""
	if u.presence == nil || !holds {
		removeCondition(agent, a2av1.ConditionConnected)
		agent.Status.Presence = nil
		return
	}
	st := u.presence.Presence(agent.Status.ClientID)
	c := metav1.Condition{Type: a2av1.ConditionConnected, ObservedGeneration: agent.Generation}
	if !st.Since.IsZero() {
		c.LastTransitionTime = metav1.NewTime(st.Since.Truncate(time.Second))
	}
	from := map[string]string{presence.SourceBroker: "the broker", presence.SourceCard: "its retained card"}[st.Source]
	switch {
	case !st.Known:
		c.Status, c.Reason = metav1.ConditionUnknown, a2av1.ReasonPresenceUnknown
		c.Message = "neither the broker nor the agent has said whether a process is connected as " + agent.Status.ClientID +
			" since the operator started (the broker does not report connections, and the agent publishes no card of its own)"
	case st.Connected:
		c.Status, c.Reason = metav1.ConditionTrue, a2av1.ReasonConnected
		c.Message = fmt.Sprintf("connected as %s since %s (%s)", agent.Status.ClientID, st.Since.UTC().Format(time.RFC3339), from)
	case st.LastDisconnect.IsZero():
		c.Status, c.Reason = metav1.ConditionFalse, a2av1.ReasonNotConnected
		c.Message = "no process has connected as " + agent.Status.ClientID + " since the broker (or the operator) started"
	default:
		c.Status, c.Reason = metav1.ConditionFalse, a2av1.ReasonDisconnected
		c.Message = fmt.Sprintf("disconnected at %s: %s (%s)", st.LastDisconnect.UTC().Format(time.RFC3339), st.LastDisconnectReason, from)
	}
	if c.Status == metav1.ConditionFalse && !st.LastRefused.IsZero() {
		c.Message += fmt.Sprintf("; its CONNECTs are refused since %s: %s", st.LastRefused.UTC().Format(time.RFC3339), st.LastRefusedReason)
	}
	meta.SetStatusCondition(&agent.Status.Conditions, c)
	if !st.Known {
		agent.Status.Presence = nil
		return
	}
	p := &a2av1.AgentPresence{Source: st.Source, LastDisconnectReason: clip(st.LastDisconnectReason, 256)}
	p.LastConnectTime, p.LastDisconnectTime = timeOrNil(st.LastConnect), timeOrNil(st.LastDisconnect)
	if !st.Connected {
		p.RefusedSince, p.RefusedReason = timeOrNil(st.LastRefused), clip(st.LastRefusedReason, 256)
	}
	agent.Status.Presence = p
}

func timeOrNil(t time.Time) *metav1.Time {
	if t.IsZero() {
		return nil
	}
	m := metav1.NewTime(t.Truncate(time.Second))
	return &m
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
