package mosqtable

import (
	"context"
	"testing"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/presence"
)

var _ presence.Source = (*Backend)(nil)

// watch feeds a presence.Tracker (the operator's) from be, as the broker runtime does.
func watch(be *Backend) *presence.Tracker {
	tr := presence.NewTracker(nil)
	for _, o := range be.WatchPresence(func(o presence.Observation) { tr.Observe(o) }) {
		tr.Observe(o)
	}
	return tr
}

// waitState polls tr until ok says yes (the events travel through the broker).
func waitState(t *testing.T, m *brokertest.Mosquitto, tr *presence.Tracker, id, what string, ok func(presence.State) bool) presence.State {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := tr.State(id)
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s never happened; state %+v\n%s", id, what, st, m.Log())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func dialAgent(t *testing.T, m *brokertest.Mosquitto, user string) *brokertest.Client {
	t.Helper()
	c, err := brokertest.Dial(t, m.Addr(), brokertest.Options{Username: user, Password: "pw-" + user, ClientID: user, IgnoreMessages: true})
	if err != nil {
		t.Fatalf("%s refused: %v\n%s", user, err, m.Log())
	}
	return c
}

// The plugin reports every connection on the shipped broker: a client it never let in is not in
// its live set (the Agent's Connected is False/NotConnected); a connect, a DISCONNECT, a dropped
// socket, a kick and a refused CONNECT are reported with the broker's time and the reason the
// plugin knows; an agent cannot read the events.
func TestPresenceFromThePlugin(t *testing.T) {
	m := startBroker(t)
	be := connect(t, m)
	execute(t, be, fleet(4))
	tr := watch(be)
	never, _ := agent(0)
	a, _ := agent(1)
	b, _ := agent(2)

	before := time.Now().Add(-time.Second)
	ca := dialAgent(t, m, a)
	st := waitState(t, m, tr, a, "connected", func(s presence.State) bool { return s.Connected })
	if st.Source != presence.SourceBroker || st.Since.Before(before) || st.Since.After(time.Now()) {
		t.Errorf("connected: %+v, want the broker's view with the connect time", st)
	}
	if rc := ca.Subscribe(PresenceTopic); rc < 0x80 {
		t.Errorf("an agent may subscribe to %s (SUBACK %#x)", PresenceTopic, rc)
	}
	ca.Close()
	st = waitState(t, m, tr, a, "disconnected", func(s presence.State) bool { return s.Known && !s.Connected })
	// Mosquitto 2.0 does not tell its plugins why a connection ended.
	if st.LastDisconnectReason != ConnectionEndedReason {
		t.Errorf("after DISCONNECT: reason %q", st.LastDisconnectReason)
	}

	cb := dialAgent(t, m, b)
	waitState(t, m, tr, b, "connected", func(s presence.State) bool { return s.Connected })
	cb.Drop()
	st = waitState(t, m, tr, b, "dropped", func(s presence.State) bool { return s.Known && !s.Connected })
	if st.LastDisconnectReason != ConnectionEndedReason {
		t.Errorf("after a dropped socket: reason %q", st.LastDisconnectReason)
	}

	dialAgent(t, m, a)
	waitState(t, m, tr, a, "connected again", func(s presence.State) bool { return s.Connected })
	execute(t, be, []acl.Command{{Op: acl.OpSetClientPassword, Username: a, Password: "changed"}})
	st = waitState(t, m, tr, a, "kicked", func(s presence.State) bool { return !s.Connected })
	if st.LastDisconnectReason != KickedReason {
		t.Errorf("after a kick: reason %q", st.LastDisconnectReason)
	}
	if _, err := brokertest.Dial(t, m.Addr(), brokertest.Options{Username: a, Password: "pw-" + a, ClientID: a}); err == nil {
		t.Fatal("the old password still connects")
	}
	st = waitState(t, m, tr, a, "refused", func(s presence.State) bool { return !s.LastRefused.IsZero() })
	if st.Connected || st.LastRefusedReason == "" {
		t.Errorf("after a refused CONNECT: %+v", st)
	}

	if st := tr.State(never); st.Known {
		t.Errorf("a client that never connected: %+v, want nothing reported", st)
	}
	for _, o := range be.WatchPresence(func(presence.Observation) {}) {
		if o.ClientID == never || o.ClientID == a || o.ClientID == b {
			t.Errorf("live set holds %s", o.ClientID)
		}
	}
}

// A new operator learns the live set from its first answer (with the connect times), and a
// broker restart corrects what the operator believed: who was connected before is not after.
func TestPresenceAcrossOperatorAndBrokerRestarts(t *testing.T) {
	m := startBroker(t)
	be := connect(t, m)
	execute(t, be, fleet(2))
	a, _ := agent(0)
	dialAgent(t, m, a)
	first := watch(be)
	since := waitState(t, m, first, a, "connected", func(s presence.State) bool { return s.Connected }).Since
	if err := be.Close(context.Background()); err != nil {
		t.Fatal(err)
	}

	// The operator restarts while the agent stays connected: opened as the broker runtime does
	// (Open returns at once, the connection comes up behind it), WatchPresence returns the agent.
	user, pass := m.TableAdmin()
	be2, err := New(Config{URL: m.URL(), Username: user, Password: pass, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); _ = be2.Close(context.Background()) })
	if err := be2.Open(ctx); err != nil {
		t.Fatal(err)
	}
	tr := watch(be2)
	if st := tr.State(a); !st.Connected || !st.Since.Equal(since) {
		t.Errorf("WatchPresence after the operator restarted: %+v, want connected since the broker's %v", st, since)
	}

	// The broker dies (no event can leave it) and comes back without the agent.
	m.Kill()
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	st := waitState(t, m, tr, a, "corrected after the broker restarted", func(s presence.State) bool { return !s.Connected })
	if st.LastDisconnectReason != UnseenDisconnectReason {
		t.Errorf("after the broker restarted: reason %q", st.LastDisconnectReason)
	}
}
