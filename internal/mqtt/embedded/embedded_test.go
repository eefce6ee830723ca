package embedded

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
)

func testStore(t *testing.T, snapshot string) *Store {
	t.Helper()
	s, err := NewStore(StoreConfig{AdminUsername: "admin", AdminPassword: "admin-pw", SnapshotPath: snapshot, Iterations: 1000})
	if err != nil {
		t.Fatal(err)
	}
	d := acl.Desired{
		State: acl.NewState(
			[]acl.Role{{Name: "a2a:r", ACLs: []acl.ACL{
				{Type: acl.SubscribePattern, Topic: "a/#", Allow: true},
				{Type: acl.PublishClientReceive, Topic: "a/secret", Allow: false},
				{Type: acl.PublishClientSend, Topic: "a/#", Allow: true},
			}}},
			nil,
			[]acl.Client{{Username: "a2a:u", Roles: []acl.RoleRef{{Name: "a2a:r"}}}},
		),
		Passwords: map[string]string{"a2a:u": "user-secret-pw"},
	}
	if _, err := acl.Apply(context.Background(), s, d); err != nil {
		t.Fatal(err)
	}
	return s
}

func fakeClient(user string) *mqtt.Client {
	return &mqtt.Client{Properties: mqtt.ClientProperties{Username: []byte(user)}}
}

// mochi reports subscribe checks and deliveries through the same
// OnACLCheck(write=false); the hook tells them apart.
func TestHookClassifiesReadChecks(t *testing.T) {
	s := testStore(t, "")
	h := NewHook(s)
	cl := fakeClient("a2a:u")
	cases := []struct {
		topic string
		want  bool
	}{
		{"a/#", true},                // wildcard: a subscription
		{"b/#", false},               // not granted
		{"$share/g/a/x", false},      // $share checked as written
		{"a/public", true},           // delivery: default receive allow
		{"a/secret", false},          // delivery: receive deny
		{droppedWillTopic, false},    // never delivered
		{"$CONTROL/anything", false}, // never by default
	}
	for _, c := range cases {
		if got := h.OnACLCheck(cl, c.topic, false); got != c.want {
			t.Errorf("read check %q = %v, want %v", c.topic, got, c.want)
		}
	}
	// A plain filter while its SUBSCRIBE is processed needs the subscribe
	// grant too: "b/x" is receivable by default but not subscribable.
	if !h.OnACLCheck(cl, "b/x", false) {
		t.Fatal("delivery of b/x should be allowed by default receive access")
	}
	pk := packets.Packet{Filters: packets.Subscriptions{{Filter: "b/x"}, {Filter: "a/x"}}}
	h.OnSubscribe(cl, pk)
	if h.OnACLCheck(cl, "b/x", false) {
		t.Error("subscribing to b/x must be refused")
	}
	if !h.OnACLCheck(cl, "a/x", false) {
		t.Error("subscribing to a/x must be granted")
	}
	h.OnSubscribed(cl, pk, nil)
	if !h.OnACLCheck(cl, "b/x", false) || len(h.pending) != 0 {
		t.Error("pending filters not forgotten after SUBACK")
	}
	// Publishing and the admin.
	if !h.OnACLCheck(cl, "a/x", true) || h.OnACLCheck(cl, "b/x", true) {
		t.Error("publish checks wrong")
	}
	admin := fakeClient("admin")
	if !h.OnACLCheck(admin, "anything/#", false) || !h.OnACLCheck(admin, "$CONTROL/x", true) {
		t.Error("the admin may do anything")
	}
	// Wills are redirected when not publishable.
	w, _ := h.OnWill(cl, mqtt.Will{TopicName: "b/x", Retain: true, Flag: 1})
	if w.TopicName != droppedWillTopic || w.Retain {
		t.Errorf("forbidden will not dropped: %+v", w)
	}
	w, _ = h.OnWill(cl, mqtt.Will{TopicName: "a/x", Retain: true, Flag: 1})
	if w.TopicName != "a/x" || !w.Retain {
		t.Errorf("allowed will changed: %+v", w)
	}
}

func TestAuthenticate(t *testing.T) {
	s := testStore(t, "")
	if !s.authenticate("a2a:u", "user-secret-pw", "any") {
		t.Error("valid credentials refused")
	}
	if s.authenticate("a2a:u", "wrong", "any") || s.authenticate("nobody", "x", "any") {
		t.Error("invalid credentials accepted")
	}
	if !s.authenticate("admin", "admin-pw", "x") || s.authenticate("admin", "nope", "x") {
		t.Error("admin authentication wrong")
	}
	// A client created without a password cannot log in (as in dynsec).
	if err := s.Execute(context.Background(), []acl.Command{{Op: acl.OpCreateClient, Username: "a2a:nopw"}}); err != nil {
		t.Fatal(err)
	}
	if s.authenticate("a2a:nopw", "", "x") {
		t.Error("passwordless client accepted")
	}
}

// The snapshot survives a restart and holds hashes, never passwords.
func TestSnapshot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ids.json")
	if err := testStore(t, path).Close(); err != nil { // writes the last round
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), "user-secret-pw") || strings.Contains(string(data), "admin-pw") {
		t.Fatal("snapshot contains a plaintext password")
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("snapshot mode %v is readable by others", fi.Mode().Perm())
	}
	s2, err := NewStore(StoreConfig{SnapshotPath: path})
	if err != nil {
		t.Fatal(err)
	}
	if !s2.authenticate("a2a:u", "user-secret-pw", "x") {
		t.Error("credentials lost across restart")
	}
	st, err := s2.Observe(context.Background(), nil)
	if err != nil || len(st.Roles) != 1 || len(st.Clients) != 1 {
		t.Fatalf("state lost across restart: %+v %v", st, err)
	}
	if err := os.WriteFile(path, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := NewStore(StoreConfig{SnapshotPath: path}); err == nil {
		t.Error("corrupt snapshot accepted")
	}
}

// max_packet_size: an oversized PUBLISH gets the client disconnected.
func TestMaxPacketSize(t *testing.T) {
	srv, err := Start(Config{Addr: "127.0.0.1:0", MaxPacketSize: 1024,
		Store: StoreConfig{AdminUsername: "admin", AdminPassword: "admin-pw", Iterations: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if !strings.HasPrefix(srv.URL(), "mqtt://127.0.0.1:") {
		t.Fatalf("URL %q", srv.URL())
	}
	c := brokertest.MustDial(t, srv.Addr(), brokertest.Options{ClientID: "big", Username: "admin", Password: "admin-pw"}).Paho()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// mochi enforces the limit but, unlike Mosquitto, does not announce it
	// in the CONNACK (docs/broker.md).
	if _, err := c.Publish(ctx, &paho.Publish{Topic: "small", QoS: 1, Payload: make([]byte, 100)}); err != nil {
		t.Fatalf("small publish: %v", err)
	}
	go func() {
		// paho waits for a PUBACK that never comes; bound it.
		pctx, pcancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer pcancel()
		_, _ = c.Publish(pctx, &paho.Publish{Topic: "big", QoS: 1, Payload: make([]byte, 4096)})
	}()
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("oversized packet did not end the connection")
	}
}

// TestNoMessageLostToATakeover: the embedded broker carries the session hand-over hook, so a
// message published while an agent's persistent session is taken over (its reconnect) reaches
// the new connection (without the hook mochi loses some: internal/mqtt/sessionhandover).
func TestNoMessageLostToATakeover(t *testing.T) {
	srv, err := Start(Config{Addr: "127.0.0.1:0", Store: StoreConfig{AdminUsername: "admin", AdminPassword: "admin-pw", Iterations: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	admin := func(id string, persistent bool) brokertest.Options {
		return brokertest.Options{ClientID: id, Username: "admin", Password: "admin-pw", Persistent: persistent, SessionExpiry: 60}
	}
	const n = 1000
	if lost, _ := brokertest.TakeoverLosses(t, srv.Addr(), "handover/x", admin("sub", true), admin("pub", false), n); len(lost) > 0 {
		t.Fatalf("%d of %d messages published during a take-over never arrived: %v", len(lost), n, lost)
	}
}

// PBKDF2 runs once per credential change and only for the snapshot, never while Execute or a
// CONNECT waits: in memory a keyed digest answers. A credential loaded from a snapshot is
// verified with PBKDF2 once, then its digest is cached; a new password replaces the cache.
func TestPasswordHashingOffTheHotPath(t *testing.T) {
	mem := testStore(t, "")
	cred := mem.creds["a2a:u"]
	if len(cred.Hash) != 0 || cred.pending != "" || cred.digest == nil {
		t.Fatalf("in-memory store: want a digest and no PBKDF2 work, got hash=%d pending=%v", len(cred.Hash), cred.pending != "")
	}

	path := filepath.Join(t.TempDir(), "ids.json")
	s := testStore(t, path)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if c := s.creds["a2a:u"]; len(c.Hash) == 0 || c.pending != "" {
		t.Fatal("the snapshot writer did not hash the pending password")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := NewStore(StoreConfig{SnapshotPath: path})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	loaded := s2.creds["a2a:u"]
	if loaded.digest != nil {
		t.Fatal("a loaded credential cannot have a digest before a CONNECT")
	}
	if s2.authenticate("a2a:u", "wrong", "x") || loaded.digest != nil {
		t.Fatal("a wrong password was accepted or cached")
	}
	if !s2.authenticate("a2a:u", "user-secret-pw", "x") || loaded.digest == nil {
		t.Fatal("a verified password was not cached")
	}
	if !s2.authenticate("a2a:u", "user-secret-pw", "x") || s2.authenticate("a2a:u", "wrong", "x") {
		t.Fatal("cached digest answers wrongly")
	}
	if err := acl.SetPassword(context.Background(), s2, "a2a:u", "rotated"); err != nil {
		t.Fatal(err)
	}
	if s2.authenticate("a2a:u", "user-secret-pw", "x") || !s2.authenticate("a2a:u", "rotated", "x") {
		t.Fatal("the old password survived a rotation")
	}
}

func BenchmarkAuthenticate(b *testing.B) {
	s, err := NewStore(StoreConfig{})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Execute(context.Background(), []acl.Command{{Op: acl.OpCreateClient, Username: "a2a:u", Password: "pw"}}); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if !s.authenticate("a2a:u", "pw", "x") {
			b.Fatal("refused")
		}
	}
}

// TestCloseFinishesWhateverTheClientsDo: Close returns within its bound while 20 clients that
// reconnect at once (autopaho, no backoff) are connected and 3 connections never send a CONNECT;
// every client is told the server shuts down (0x8B), and nothing listens afterwards. With mochi's
// own shutdown, Close waited for as long as those connections stayed open (issue 23).
func TestCloseFinishesWhateverTheClientsDo(t *testing.T) {
	srv, err := Start(Config{Addr: "127.0.0.1:0", Store: StoreConfig{AdminUsername: "admin", AdminPassword: "admin-pw"}})
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(srv.URL())
	var shutdowns atomic.Int32
	var clients []*autopaho.ConnectionManager
	for i := range 20 {
		cm, err := autopaho.NewConnection(context.Background(), autopaho.ClientConfig{
			ServerUrls: []*url.URL{u}, KeepAlive: 30, ConnectUsername: "admin", ConnectPassword: []byte("admin-pw"),
			CleanStartOnInitialConnection: true, ReconnectBackoff: func(int) time.Duration { return 0 },
			ClientConfig: paho.ClientConfig{ClientID: fmt.Sprintf("client-%d", i),
				OnServerDisconnect: func(d *paho.Disconnect) {
					if d.ReasonCode == packets.ErrServerShuttingDown.Code {
						shutdowns.Add(1)
					}
				}},
		})
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, cm)
	}
	t.Cleanup(func() {
		for _, cm := range clients {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = cm.Disconnect(ctx)
			cancel()
		}
	})
	for _, cm := range clients {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := cm.AwaitConnection(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	for range 3 {
		c, err := net.Dial("tcp", srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
	}
	start := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- srv.Close() }()
	select {
	case err := <-closed:
		t.Logf("Close returned after %s: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(2*ShutdownGrace + 3*time.Second):
		t.Fatalf("Close still waiting after %s", time.Since(start).Round(time.Millisecond))
	}
	// Each client handles the DISCONNECT on its own goroutine, after Close has written it: on a
	// loaded machine that can be a while after Close returns.
	told := time.Now().Add(10 * time.Second)
	for shutdowns.Load() < 20 && time.Now().Before(told) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := shutdowns.Load(); n < 20 {
		t.Errorf("%d of 20 clients were told the server shuts down (0x8B)", n)
	}
	if c, err := net.DialTimeout("tcp", srv.Addr(), time.Second); err == nil {
		_ = c.Close()
		t.Error("the broker still accepts connections after Close")
	}
}
