package mosqtable

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/presence"
)

// presencePlugin starts a plugin with agentCommands' table whose events land in *events and whose
// host kick is kick (nil: a host that reports nothing back).
func presencePlugin(t *testing.T, kick func(string)) (*Plugin, *[]string) {
	t.Helper()
	var events []string
	p, err := StartPlugin(PluginConfig{AdminUsername: "admin", AdminPassword: "secret", Kick: kick,
		Publish: func(topic string, payload []byte) {
			var e presence.PluginEvent
			if topic != PresenceTopic || json.Unmarshal(payload, &e) != nil {
				t.Errorf("published %s: %s", topic, payload)
			}
			events = append(events, e.Event+":"+e.ClientID+":"+e.Reason)
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	if resp := control(t, p, "admin", Request{Op: OpImport, Table: &embedded.Table{Version: embedded.TableVersion, State: acl.NewState(nil, nil, nil)}}); resp.Error != "" {
		t.Fatal(resp.Error)
	}
	if resp := control(t, p, "admin", Request{Op: OpExecute, Commands: agentCommands}); resp.Error != "" {
		t.Fatal(resp.Error)
	}
	return p, &events
}

func liveIDs(t *testing.T, p *Plugin) []string {
	t.Helper()
	live := control(t, p, "admin", Request{Op: OpPresence}).Presence
	if live == nil {
		t.Fatal("no live set in the answer to presence")
	}
	var ids []string
	for _, c := range live.Clients {
		if c.Since.IsZero() {
			t.Errorf("%s: no connect time", c.ClientID)
		}
		ids = append(ids, c.ClientID)
	}
	return ids
}

func expectEvents(t *testing.T, events *[]string, want ...string) {
	t.Helper()
	if fmt.Sprint(*events) != fmt.Sprint(want) {
		t.Errorf("events\n%q\nwant\n%q", *events, want)
	}
	*events = nil
}

// Mosquitto reports ends that are not the end of a live connection, with the username and
// client ID of a live one: a taken-over persistent session's old connection is ended a second
// time after the new connection authenticated, and a refused CONNECT ends too. Only a live
// connection's own end counts; a client ID is disconnected when its last connection ends.
func TestPresenceFollowsConnectionsNotCounts(t *testing.T) {
	p, events := presencePlugin(t, nil)
	const old, next, takeOver ConnID = 0x1000, 0x2000, 0x3000

	p.Authenticate(old, "a2a:u", "pw", "id")
	p.Disconnected(old, ConnectionEndedReason) // a persistent session: the broker keeps it
	p.Authenticate(next, "a2a:u", "pw", "id")
	p.Disconnected(old, ConnectionEndedReason) // the take-over ends the old session again
	p.Authenticate(0x4000, "a2a:u", "wrong", "id")
	p.Disconnected(0x4000, ConnectionEndedReason) // the refused CONNECT's end
	if ids := liveIDs(t, p); fmt.Sprint(ids) != "[id]" {
		t.Errorf("live set after a reconnect into its session and a refused CONNECT: %v", ids)
	}
	// A take-over by a live connection: the new one authenticates before the old one ends.
	p.Authenticate(takeOver, "a2a:u", "pw", "id")
	p.Disconnected(next, ConnectionEndedReason)
	if ids := liveIDs(t, p); fmt.Sprint(ids) != "[id]" {
		t.Errorf("live set after a take-over: %v", ids)
	}
	p.Disconnected(takeOver, "gone")
	if ids := liveIDs(t, p); len(ids) != 0 {
		t.Errorf("live set at the end: %v", ids)
	}
	expectEvents(t, events,
		"connected:id:", "disconnected:id:"+ConnectionEndedReason,
		"connected:id:", "refused:id:bad username or password, or a client ID the username may not use",
		"connected:id:", "disconnected:id:gone")
}

// A kick marks the connections it ends; their ends carry the kick's reason whenever the host
// reports them (Mosquitto reports a websocket's end after the kick returns), and a late end
// cannot take the connection that replaced it: the rotated agent's new pod stays connected.
func TestPresenceOfAKickedConnectionEndingLate(t *testing.T) {
	var kicked []string
	p, events := presencePlugin(t, func(user string) { kicked = append(kicked, user) })
	const old, next ConnID = 0x1000, 0x2000

	p.Authenticate(old, "a2a:u", "pw", "id")
	r := control(t, p, "admin", Request{Op: OpExecute, Commands: []acl.Command{{Op: acl.OpSetClientPassword, Username: "a2a:u", Password: "rotated"}}})
	if len(r.Outcomes) != 1 || fmt.Sprint(r.Outcomes[0].ClientIDs) != "[id]" || fmt.Sprint(kicked) != "[a2a:u]" {
		t.Fatalf("the rotation kicked %v (outcomes %+v)", kicked, r.Outcomes)
	}
	p.Authenticate(next, "a2a:u", "rotated", "id") // before the broker reported the kicked end
	p.Disconnected(old, ConnectionEndedReason)
	if ids := liveIDs(t, p); fmt.Sprint(ids) != "[id]" {
		t.Errorf("live set after the kicked connection ended late: %v", ids)
	}
	expectEvents(t, events, "connected:id:", "connected:id:")

	// Kicked again, the end reported within the kick: the kick's reason.
	p.Authenticate(0x3000, "a2a:u", "rotated", "other")
	control(t, p, "admin", Request{Op: OpExecute, Commands: []acl.Command{{Op: acl.OpSetClientPassword, Username: "a2a:u", Password: "again"}}})
	p.Disconnected(next, ConnectionEndedReason)
	p.Disconnected(0x3000, ConnectionEndedReason)
	expectEvents(t, events, "connected:other:", "disconnected:id:"+KickedReason, "disconnected:other:"+KickedReason)
	if ids := liveIDs(t, p); len(ids) != 0 {
		t.Errorf("live set at the end: %v", ids)
	}
}

// A handle the host hands again without having reported its end names a new connection: the old
// one is over, and its client ID is disconnected when that was its last connection.
func TestPresenceOfAHandleReusedWithoutAnEnd(t *testing.T) {
	p, events := presencePlugin(t, nil)
	p.Authenticate(0x1000, "a2a:u", "pw", "first")
	p.Authenticate(0x1000, "a2a:u", "pw", "second")
	if ids := liveIDs(t, p); fmt.Sprint(ids) != "[second]" {
		t.Errorf("live set: %v", ids)
	}
	expectEvents(t, events, "connected:first:", "disconnected:first:"+ConnectionEndedReason, "connected:second:")
}
