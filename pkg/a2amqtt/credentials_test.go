package a2amqtt_test

import (
	"context"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/a2amqtttest"
)

// writeSecretDir writes a credentials folder the way the kubelet updates a Secret volume.
func writeSecretDir(t *testing.T, dir, user, password string) {
	t.Helper()
	if err := a2amqtt.WriteCredentialsDir(dir, map[string][]byte{
		a2amqtt.CredentialsFileUsername: []byte(user), a2amqtt.CredentialsFilePassword: []byte(password),
	}); err != nil {
		t.Fatal(err)
	}
}

// TestCredentialsDirFollowsARotation, on both brokers with enforced credentials: the broker gets a
// new password (which disconnects the client), its credentials folder gets it 500 ms later (a
// Secret update reaching the process), and the Conn is back within a couple of seconds of that,
// delivering messages, while a Conn given the password as a string is refused for good (what the
// example agents, a2actl and make dev did before: issue 23's 68 s and more of -32004).
func TestCredentialsDirFollowsARotation(t *testing.T) {
	for _, kind := range []string{"embedded", "mosquitto"} {
		t.Run(kind, func(t *testing.T) {
			ctx := tctx(t, 2*time.Minute)
			var b acl.Backend
			var url string
			switch kind {
			case "embedded":
				srv, err := embedded.Start(embedded.Config{Addr: "127.0.0.1:0", Store: embedded.StoreConfig{Iterations: 1000, AdminUsername: "admin", AdminPassword: "admin-pw"}})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = srv.Close() })
				b, url = srv.Backend(), srv.URL()
			case "mosquitto":
				a := &mosquittoAuth{m: brokertest.StartMosquitto(t, brokertest.MosquittoOptions{DynSec: &brokertest.DynSecOptions{}})}
				b, url = a.admin(t), a.URL()
			}
			rotating, static := acl.DefaultPrefix+"acme/ops/rotating", acl.DefaultPrefix+"acme/ops/static"
			publisher := acl.DefaultPrefix + "acme/ops/publisher"
			addClients(t, b, map[string]string{rotating: "old-password", static: "old-password", publisher: "pub-password"})
			dir := t.TempDir()
			writeSecretDir(t, dir, rotating, "old-password")

			logs := &a2amqtttest.Logs{}
			me := a2amqtt.AgentRef{Org: "acme", Unit: "ops", Agent: "rotating"}
			conn, err := a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: url, Agent: me, Credentials: a2amqtt.CredentialsDir(dir), Logger: logs.Logger()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close(context.Background()) })
			old, err := a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: url, Agent: a2amqtt.AgentRef{Org: "acme", Unit: "ops", Agent: "static"},
				Username: static, Password: "old-password", Logger: quiet()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = old.Close(context.Background()) })
			got := newCollector()
			topic := me.ReplyTopic("x")
			if _, err := conn.Subscribe(ctx, topic, got.handle); err != nil {
				t.Fatal(err)
			}

			for _, user := range []string{rotating, static} {
				if err := acl.SetPassword(ctx, b, user, "new-password"); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(500 * time.Millisecond)
			if conn.Healthy(0) == nil {
				t.Fatal("the rotation did not disconnect the client: the test shows nothing")
			}
			updated := time.Now()
			writeSecretDir(t, dir, rotating, "new-password")
			for conn.Healthy(0) != nil {
				if time.Since(updated) > 5*time.Second {
					t.Fatalf("not reconnected %s after its credentials folder changed: %v", time.Since(updated), conn.Healthy(0))
				}
				time.Sleep(20 * time.Millisecond)
			}
			back := time.Since(updated)
			pub, err := a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: url, Agent: a2amqtt.AgentRef{Org: "acme", Unit: "ops", Agent: "publisher"},
				Username: publisher, Password: "pub-password", Logger: quiet()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = pub.Close(context.Background()) })
			for i := 0; len(got.snapshot()) == 0 && i < 50; i++ {
				_, _ = pub.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte("after")})
				time.Sleep(100 * time.Millisecond)
			}
			if len(got.snapshot()) == 0 {
				t.Fatal("no message delivered after the reconnect")
			}
			if !logs.Has("broker refused the connection; retrying") {
				t.Error("the old password was not tried and refused in between: the test did not exercise the re-read")
			}
			time.Sleep(2 * time.Second)
			if old.Healthy(0) == nil {
				t.Error("the client with a fixed password is connected after the rotation?")
			}
			t.Logf("%s: reconnected %s after the credentials folder changed; the fixed-password client is still refused: %v",
				kind, back.Round(time.Millisecond), old.Healthy(0))
		})
	}
}
