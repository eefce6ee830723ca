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

// settle returns once the backend has applied every presence event the plugin published before
// now: an answer travels on the same connection as the events, after them.
func settle(t *testing.T, be *Backend) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := be.request(ctx, Request{Op: OpStatus}); err != nil {
		t.Fatal(err)
	}
}

// liveSet is the plugin's own live set (OpPresence), by client ID.
func liveSet(t *testing.T, be *Backend) map[string]LiveClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := be.request(ctx, Request{Op: OpPresence})
	if err != nil || resp.Presence == nil {
		t.Fatalf("presence: %v %+v", err, resp)
	}
	out := map[string]LiveClient{}
	for _, c := range resp.Presence.Clients {
		out[c.ClientID] = c
	}
	return out
}

// stillConnected checks that both the plugin's live set and the operator's view hold id as
// connected, after every event published so far was applied.
func stillConnected(t *testing.T, m *brokertest.Mosquitto, be *Backend, tr *presence.Tracker, id, after string) {
	t.Helper()
	settle(t, be)
	if st := tr.State(id); !st.Connected {
		t.Errorf("after %s: the operator's view of %s is %+v, want connected\n%s", after, id, st, m.Log())
	}
	if _, ok := liveSet(t, be)[id]; !ok {
		t.Errorf("after %s: the plugin's live set lacks %s", after, id)
	}
}

// pod dials as user with client ID user, as an SDK agent does: a persistent session.
func pod(t *testing.T, m *brokertest.Mosquitto, user, password string) (*brokertest.Client, error) {
	t.Helper()
	return brokertest.Dial(t, m.Addr(), brokertest.Options{Username: user, Password: password, ClientID: user,
		Persistent: true, SessionExpiry: 300, IgnoreMessages: true})
}

// A credential rotation as a Deployment rolls it, with the persistent sessions SDK agents keep:
// the old pod is kicked (its session stays), the new pod connects with the new password and the
// same client ID and takes that session over, and the old pod, still running, retries with the
// old password and is refused. Mosquitto 2.0 reports the taken-over session's context as
// disconnected a second time (connect__on_authorised marks it a duplicate, so
// context__disconnect's "already disconnected" guard no longer holds), with the same username
// and client ID as the new connection: that must not end the new one. Then a session take-over
// by a live connection, a dropped socket and a reconnect keep the truth, and only the end of
// the last connection says disconnected.
func TestPresenceThroughARotation(t *testing.T) {
	m := startBroker(t)
	be := connect(t, m)
	execute(t, be, fleet(1))
	tr := watch(be)
	a, _ := agent(0)

	oldPod, err := pod(t, m, a, "pw-"+a)
	if err != nil {
		t.Fatalf("refused: %v\n%s", err, m.Log())
	}
	waitState(t, m, tr, a, "connected", func(s presence.State) bool { return s.Connected })
	execute(t, be, []acl.Command{{Op: acl.OpSetClientPassword, Username: a, Password: "rotated"}})
	waitState(t, m, tr, a, "kicked by the rotation", func(s presence.State) bool { return !s.Connected })
	if !oldPod.Disconnected(5 * time.Second) {
		t.Fatal("the old pod's connection survived the rotation")
	}

	newPod, err := pod(t, m, a, "rotated")
	if err != nil {
		t.Fatalf("the new password is refused: %v\n%s", err, m.Log())
	}
	waitState(t, m, tr, a, "the new pod connected", func(s presence.State) bool { return s.Connected })
	stillConnected(t, m, be, tr, a, "the new pod took the kicked session over")
	for range 3 { // the old pod retries with its old password
		if _, err := pod(t, m, a, "pw-"+a); err == nil {
			t.Fatal("the old password still connects")
		}
	}
	waitState(t, m, tr, a, "refused", func(s presence.State) bool { return !s.LastRefused.IsZero() })
	stillConnected(t, m, be, tr, a, "the old pod's refused CONNECTs")

	// A take-over: the same client ID connects again while newPod is up; Mosquitto ends newPod.
	takeOver, err := pod(t, m, a, "rotated")
	if err != nil {
		t.Fatalf("take-over refused: %v\n%s", err, m.Log())
	}
	if !newPod.Disconnected(5 * time.Second) {
		t.Fatal("the taken-over connection is still up")
	}
	stillConnected(t, m, be, tr, a, "a session take-over")

	// A lost socket, then a reconnect into the session it left.
	takeOver.Drop()
	waitState(t, m, tr, a, "dropped", func(s presence.State) bool { return !s.Connected })
	last, err := pod(t, m, a, "rotated")
	if err != nil {
		t.Fatalf("reconnect refused: %v\n%s", err, m.Log())
	}
	waitState(t, m, tr, a, "reconnected", func(s presence.State) bool { return s.Connected })
	stillConnected(t, m, be, tr, a, "a reconnect into its session")

	last.Close()
	st := waitState(t, m, tr, a, "disconnected", func(s presence.State) bool { return !s.Connected })
	if st.LastDisconnectReason != ConnectionEndedReason {
		t.Errorf("after the last connection ended: reason %q", st.LastDisconnectReason)
	}
	settle(t, be)
	if _, ok := liveSet(t, be)[a]; ok {
		t.Errorf("the plugin's live set still holds %s", a)
	}
}
