package a2amqtt_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/a2amqtttest"
)

// TestRefusedResubscribe: when the broker's ACLs are rewritten in steps (each step kicks the
// client), a resubscribe refused in between is retried quietly and succeeds once the rights are
// back; a refusal that persists is reported once, at WARN.
func TestRefusedResubscribe(t *testing.T) {
	srv, err := embedded.Start(embedded.Config{Addr: fmt.Sprintf("127.0.0.1:%d", brokertest.FreePort(t)),
		Store: embedded.StoreConfig{SnapshotPath: filepath.Join(t.TempDir(), "s.json"), Iterations: 1000, AdminUsername: "admin", AdminPassword: "admin-pw"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	me := a2amqtt.AgentRef{Org: "acme", Unit: "ops", Agent: "sub"}
	topic := me.ReplyTopic("x")
	full := acl.Role{Name: acl.DefaultPrefix + "sub", ACLs: []acl.ACL{
		{Type: acl.PublishClientSend, Topic: "$a2a/#", Allow: true},
		{Type: acl.PublishClientReceive, Topic: "$a2a/#", Allow: true},
		{Type: acl.SubscribePattern, Topic: "$a2a/#", Allow: true},
	}}
	noSubscribe := acl.Role{Name: full.Name, ACLs: full.ACLs[:2]}
	ctx := tctx(t, time.Minute)
	b := srv.Backend()
	if err := ensureRole(ctx, b, full); err != nil {
		t.Fatal(err)
	}
	user := acl.DefaultPrefix + "acme/ops/sub"
	if err := ensureClient(ctx, b, acl.Client{Username: user, Roles: []acl.RoleRef{{Name: full.Name}}}, "pw"); err != nil {
		t.Fatal(err)
	}
	logs := &a2amqtttest.Logs{}
	conn, err := a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: srv.URL(), Agent: me, Username: user, Password: "pw", Logger: logs.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	pub, err := a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: srv.URL(), Agent: aRef, Username: "admin", Password: "admin-pw", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close(context.Background()) })
	send := func() {
		_, _ = pub.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte("back")})
	}
	got := newCollector()
	if _, err := conn.Subscribe(ctx, topic, got.handle); err != nil {
		t.Fatal(err)
	}

	// Transient: the subscribe grant goes (a kick, a refused resubscribe) and comes back.
	if err := ensureRole(ctx, b, noSubscribe); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !logs.Has("mqtt connection restored") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := ensureRole(ctx, b, full); err != nil {
		t.Fatal(err)
	}
	for i := 0; len(got.snapshot()) == 0 && i < 100; i++ {
		send()
		time.Sleep(100 * time.Millisecond)
	}
	if len(got.snapshot()) == 0 {
		t.Fatalf("no message after the rights came back: the refused resubscribe was not retried; logs: %v", logs.AtLeast(slog.LevelDebug))
	}
	if !logs.Has("resubscribe refused after reconnecting; retrying") {
		t.Fatalf("the resubscribe was never refused, the test proves nothing: %v", logs.AtLeast(slog.LevelDebug))
	}
	if loud := logs.AtLeast(slog.LevelWarn); len(loud) > 0 {
		t.Fatalf("a transient refusal logged %v", loud)
	}

	// Persistent: the grant goes for good; one WARN names the filter after the retries.
	if err := ensureRole(ctx, b, noSubscribe); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(20 * time.Second)
	for len(logs.AtLeast(slog.LevelWarn)) == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	loud := logs.AtLeast(slog.LevelWarn)
	if len(loud) != 1 || !logs.Has("broker refuses a subscription") {
		t.Fatalf("persistent refusal logged %v; all: %v", loud, logs.AtLeast(slog.LevelDebug))
	}

	checkLateGrant(t, ctx, b, full, got, send, logs)
}

// checkLateGrant: the grant comes back long after the reconnect, without a kick (a grant never
// disconnects anyone): the retries, still running while connected, pick it up.
func checkLateGrant(t *testing.T, ctx context.Context, b acl.Backend, full acl.Role, got *collector, send func(), logs *a2amqtttest.Logs) {
	t.Helper()
	before := len(got.snapshot())
	if err := ensureRole(ctx, b, full); err != nil {
		t.Fatal(err)
	}
	for i := 0; len(got.snapshot()) == before && i < 450; i++ {
		send()
		time.Sleep(100 * time.Millisecond)
	}
	if len(got.snapshot()) == before {
		t.Fatalf("no message 45 s after a late grant: the refused resubscribe was given up; logs: %v", logs.AtLeast(slog.LevelDebug))
	}
	if restored := logs.Count(slog.LevelInfo, "mqtt connection restored"); restored > 2 {
		t.Fatalf("the late grant disconnected the client, so the test proves nothing: %v", logs.AtLeast(slog.LevelDebug))
	}
	if !logs.Has("broker grants a subscription it refused after reconnecting") {
		t.Fatalf("the end of the refusal was not reported: %v", logs.AtLeast(slog.LevelDebug))
	}
}

// ensureRole makes the broker hold role exactly as given (one-object acl.Apply).
func ensureRole(ctx context.Context, b acl.Backend, role acl.Role) error {
	_, err := acl.Apply(ctx, b, acl.Desired{State: acl.NewState([]acl.Role{role}, nil, nil)})
	return err
}

// ensureClient makes the broker hold client, created with password when missing.
func ensureClient(ctx context.Context, b acl.Backend, client acl.Client, password string) error {
	_, err := acl.Apply(ctx, b, acl.Desired{State: acl.NewState(nil, nil, []acl.Client{client}), Passwords: map[string]string{client.Username: password}})
	return err
}
