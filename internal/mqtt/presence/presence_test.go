package presence

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)

// Every line Mosquitto 2.0 writes when a client comes or goes (verbatim from the 2.0 sources and
// a capture of 2.0.11's $SYS/broker/log/N), with both timestamp formats.
func TestParseMosquittoLog(t *testing.T) {
	for _, c := range []struct {
		line      string
		ok        bool
		client    string
		connected bool
		reason    string
	}{
		{"1796461781: New client connected from 127.0.0.1:59934 as acme/demo/echo (p5, c1, k30, u'a2a:acme/demo/echo').", true, "acme/demo/echo", true, ""},
		{"2026-12-05T10:00:00: New client connected from 127.0.0.1:59944 as clientB (p5, c1, k60).", true, "clientB", true, ""},
		{"1796461781: Client acme/demo/echo disconnected.", true, "acme/demo/echo", false, "disconnected (the client sent DISCONNECT)"},
		{"1796461781: Client acme/demo/echo closed its connection.", true, "acme/demo/echo", false, "connection closed without DISCONNECT"},
		{"1796461781: Client acme/demo/echo has exceeded timeout, disconnecting.", true, "acme/demo/echo", false, "keep-alive timeout: the client went silent"},
		{"1796461781: Client acme/demo/echo been disconnected by administrative action.", true, "acme/demo/echo", false,
			"disconnected by the broker (administrative action: its credentials or rights changed, or it was deleted)"},
		{"1796461781: Client acme/demo/echo disconnected, not authorised.", true, "acme/demo/echo", false, "not authorised"},
		{"1796461781: Client acme/demo/echo disconnected, no longer authorised.", true, "acme/demo/echo", false, "no longer authorised"},
		{"1796461781: Client acme/demo/echo disconnected due to protocol error.", true, "acme/demo/echo", false, "disconnected due to protocol error"},
		{"1796461781: Client acme/demo/echo disconnected: Connection reset by peer.", true, "acme/demo/echo", false, "disconnected: Connection reset by peer"},
		{"1796461781: Socket error on client acme/demo/echo, disconnecting.", true, "acme/demo/echo", false, "socket error"},
		{"1796461781: Bad socket read/write on client acme/demo/echo: Connection lost", true, "acme/demo/echo", false, "Connection lost"},
		{"1796461781: Client <unknown> disconnected, not authorised.", false, "", false, ""},
		{"1796461781: New connection from 127.0.0.1:46006 on port 18932.", false, "", false, ""},
		{"1796461781: Client acme/demo/echo already connected, closing old connection.", false, "", false, ""},
		{"1796461781: Saving in-memory database to /mosquitto/data/mosquitto.db.", false, "", false, ""},
	} {
		o, ok := ParseMosquittoLog(c.line, t0)
		if ok != c.ok || o.ClientID != c.client || o.Connected != c.connected || o.Reason != c.reason || (ok && (o.Source != SourceBroker || !o.At.Equal(t0))) {
			t.Errorf("%q: %+v %v, want client %q connected %v reason %q (ok %v)", c.line, o, ok, c.client, c.connected, c.reason, c.ok)
		}
	}
}

// The broker's view wins over the card's once the broker has said anything about a client: a kick
// sends no Will, so the agent's "online" card stays while the broker says it went.
func TestBrokerViewWinsOverTheCard(t *testing.T) {
	var changes []string
	tr := NewTracker(func(id string) { changes = append(changes, id) })
	const id = "acme/demo/echo"
	if s := tr.State(id); s.Known {
		t.Fatalf("unknown client: %+v", s)
	}
	tr.Observe(Observation{ClientID: id, Connected: true, At: t0, Source: SourceCard})
	if s := tr.State(id); !s.Connected || s.Source != SourceCard {
		t.Fatalf("card only: %+v", s)
	}
	tr.Observe(Observation{ClientID: id, Connected: true, At: t0.Add(time.Second), Source: SourceBroker})
	kicked := t0.Add(time.Minute)
	tr.Observe(Observation{ClientID: id, At: kicked, Reason: "kicked", Source: SourceBroker})
	tr.Observe(Observation{ClientID: id, Refused: true, At: kicked.Add(time.Second), Reason: "bad password", Source: SourceBroker})
	if tr.Observe(Observation{ClientID: id, Refused: true, At: kicked.Add(2 * time.Second), Reason: "bad password", Source: SourceBroker}) {
		t.Fatal("a second refusal changed the state (a status write per retry)")
	}
	s := tr.State(id)
	if s.Connected || s.Source != SourceBroker || !s.Since.Equal(kicked) || s.LastDisconnectReason != "kicked" || s.LastRefusedReason != "bad password" || !s.LastRefused.Equal(kicked.Add(time.Second)) {
		t.Fatalf("after the kick and a refusal, with the card still online: %+v", s)
	}
	back := kicked.Add(time.Minute)
	tr.Observe(Observation{ClientID: id, Connected: true, At: back, Source: SourceBroker})
	if s := tr.State(id); !s.Connected || !s.Since.Equal(back) || s.LastRefusedReason != "" || s.LastDisconnectReason != "kicked" {
		t.Fatalf("back: %+v", s)
	}
	if changed := tr.Observe(Observation{ClientID: id, Connected: true, At: back.Add(time.Second), Source: SourceCard}); changed {
		t.Fatal("a card while the broker view holds changed the state")
	}
	// The broker's view restarts: the card decides again.
	tr.Forget(SourceBroker)
	if s := tr.State(id); !s.Connected || s.Source != SourceCard {
		t.Fatalf("after forgetting the broker's view: %+v", s)
	}
	if len(changes) < 4 {
		t.Fatalf("changes reported: %v", changes)
	}
}

// The plugin seam's events (docs/broker.md).
func TestParsePluginEvent(t *testing.T) {
	at := t0.Add(time.Hour)
	for _, c := range []struct {
		payload string
		want    Observation
		err     bool
	}{
		{`{"clientId":"acme/demo/echo","username":"a2a:acme/demo/echo","event":"connected","reasonCode":0}`,
			Observation{ClientID: "acme/demo/echo", Connected: true, At: at, Source: SourceBroker}, false},
		{`{"clientId":"acme/demo/echo","event":"disconnected","reasonCode":152,"reason":"administrative action","time":"2026-12-05T10:00:00Z"}`,
			Observation{ClientID: "acme/demo/echo", At: t0, Source: SourceBroker, Reason: "administrative action (0x98)"}, false},
		{`{"clientId":"acme/demo/echo","event":"refused","reasonCode":134}`,
			Observation{ClientID: "acme/demo/echo", Refused: true, At: at, Source: SourceBroker, Reason: "reason code 0x86"}, false},
		{`{"event":"connected"}`, Observation{}, true},
		{`{"clientId":"x","event":"left"}`, Observation{}, true},
		{`not json`, Observation{}, true},
	} {
		o, err := ParsePluginEvent([]byte(c.payload), at)
		if (err != nil) != c.err || (err == nil && o != c.want) {
			t.Errorf("%s: %+v %v, want %+v (error %v)", c.payload, o, err, c.want, c.err)
		}
	}
}
