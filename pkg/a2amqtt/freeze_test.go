package a2amqtt_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/a2a-fleet/a2a-fleet/examples/agents"
	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/dynsec"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// authBroker is a broker with enforced credentials that a test can stop, restart with a
// different credential store, and administer.
type authBroker interface {
	URL() string
	// stop takes the listener down (clients get dial errors).
	stop(t *testing.T)
	// startRefusing starts it again with the agent's password changed behind its back, as a
	// rotation or a re-created Secret does.
	startRefusing(t *testing.T)
	// admin returns a backend to fix credentials with.
	admin(t *testing.T) acl.Backend
}

var everything = acl.Role{Name: acl.DefaultPrefix + "everything", ACLs: []acl.ACL{
	{Type: acl.PublishClientSend, Topic: "$a2a/#", Allow: true},
	{Type: acl.PublishClientReceive, Topic: "$a2a/#", Allow: true},
	{Type: acl.SubscribePattern, Topic: "$a2a/#", Allow: true},
	{Type: acl.UnsubscribePattern, Topic: "$a2a/#", Allow: true},
}}

func addClients(t *testing.T, b acl.Backend, creds map[string]string) {
	t.Helper()
	ctx := tctx(t, 30*time.Second)
	var clients []acl.Client
	for user := range creds {
		clients = append(clients, acl.Client{Username: user, Roles: []acl.RoleRef{{Name: everything.Name}}})
	}
	if _, err := acl.Apply(ctx, b, acl.Desired{State: acl.NewState([]acl.Role{everything}, nil, clients), Passwords: creds}); err != nil {
		t.Fatal(err)
	}
}

// rotation is the credential change a test makes behind the agent's back.
type rotation struct{ user, password string }

// mosquittoAuth: Mosquitto 2.0.11 with dynsec. The plugin keeps its state in a JSON file; the
// rotated state is captured at setup (rotate, copy the file, rotate back) and swapped in while
// the broker is down, so the agent meets it at its first reconnect.
type mosquittoAuth struct {
	m       *brokertest.Mosquitto
	backend *dynsec.Backend
	state   string
	rotated []byte
}

func newMosquittoAuth(t *testing.T, creds map[string]string, rot rotation) *mosquittoAuth {
	m := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{DynSec: &brokertest.DynSecOptions{}})
	a := &mosquittoAuth{m: m, state: filepath.Join(filepath.Dir(m.ConfigPath()), "dynamic-security.json")}
	addClients(t, a.admin(t), creds)
	ctx := tctx(t, 10*time.Second)
	if err := acl.SetPassword(ctx, a.admin(t), rot.user, rot.password); err != nil {
		t.Fatal(err)
	}
	var err error
	if a.rotated, err = os.ReadFile(a.state); err != nil {
		t.Fatal(err)
	}
	if err := acl.SetPassword(ctx, a.admin(t), rot.user, creds[rot.user]); err != nil {
		t.Fatal(err)
	}
	return a
}

func (a *mosquittoAuth) URL() string { return a.m.URL() }

func (a *mosquittoAuth) admin(t *testing.T) acl.Backend {
	t.Helper()
	if a.backend == nil {
		user, pass := a.m.DynSecAdmin()
		b, err := dynsec.Connect(tctx(t, 10*time.Second), dynsec.Config{URL: a.m.URL(), Username: user, Password: pass, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close(context.Background()) })
		a.backend = b
	}
	return a.backend
}

func (a *mosquittoAuth) stop(t *testing.T) { a.m.Stop() }

func (a *mosquittoAuth) startRefusing(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(a.state, a.rotated, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.m.Restart(); err != nil {
		t.Fatal(err)
	}
}

// embeddedAuth: the embedded broker with its credential store in a snapshot file; the rotation
// while down rewrites the snapshot before the broker starts again on the same address.
type embeddedAuth struct {
	srv      *embedded.Server
	addr     string
	snapshot string
	rot      rotation
}

func newEmbeddedAuth(t *testing.T, creds map[string]string, rot rotation) *embeddedAuth {
	a := &embeddedAuth{addr: fmt.Sprintf("127.0.0.1:%d", brokertest.FreePort(t)), snapshot: filepath.Join(t.TempDir(), "store.json"), rot: rot}
	a.start(t)
	t.Cleanup(func() {
		if a.srv != nil {
			_ = a.srv.Close()
		}
	})
	addClients(t, a.srv.Backend(), creds)
	return a
}

func (a *embeddedAuth) start(t *testing.T) {
	t.Helper()
	var err error
	for range 50 {
		a.srv, err = embedded.Start(embedded.Config{Addr: a.addr, Store: embedded.StoreConfig{SnapshotPath: a.snapshot, Iterations: 1000}})
		if err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("start embedded broker on %s: %v", a.addr, err)
}

func (a *embeddedAuth) URL() string                    { return "mqtt://" + a.addr }
func (a *embeddedAuth) admin(t *testing.T) acl.Backend { return a.srv.Backend() }

func (a *embeddedAuth) stop(t *testing.T) {
	if err := a.srv.Close(); err != nil {
		t.Fatal(err)
	}
	a.srv = nil
}

func (a *embeddedAuth) startRefusing(t *testing.T) {
	t.Helper()
	offline, err := embedded.NewStore(embedded.StoreConfig{SnapshotPath: a.snapshot, Iterations: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if err := acl.SetPassword(tctx(t, 10*time.Second), offline, a.rot.user, a.rot.password); err != nil {
		t.Fatal(err)
	}
	// The store writes its snapshot in the background: close it so the rotation is on disk
	// before the broker loads it.
	if err := offline.Close(); err != nil {
		t.Fatal(err)
	}
	a.start(t)
}

func probe(t *testing.T, base, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(base + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// waitProbe polls path until want(status, body) holds.
func waitProbe(t *testing.T, base, path string, d time.Duration, what string, want func(int, string) bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	var code int
	var body string
	for time.Now().Before(deadline) {
		code, body = probe(t, base, path)
		if want(code, body) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: %s still %d %q after %s", what, path, code, body, d)
}

// TestClientRecoversFromRestartThenRefusedConnect is the regression test of the client freeze
// (issue 9.1): connect errors of two types in a row (a dial error while the broker restarts,
// then a CONNACK refusal after a credential rotation) used to panic inside autopaho's
// connection goroutine and freeze the client for ever with /readyz still ok. The exact
// sequence on real brokers: connected → broker down (dial errors) → broker back with the
// agent's password rotated (refused CONNECT) → credentials fixed → the agent reconnects by
// itself and serves again; /readyz says the truth at every step and /healthz stays ok.
func TestClientRecoversFromRestartThenRefusedConnect(t *testing.T) {
	const agentUser, agentPass = acl.DefaultPrefix + "acme/ops/agent-b", "agent-password-1"
	const callerUser, callerPass = acl.DefaultPrefix + "acme/ops/agent-a", "caller-password-1"
	creds := map[string]string{agentUser: agentPass, callerUser: callerPass}
	rot := rotation{user: agentUser, password: "rotated-password-2"}
	for _, tc := range []struct {
		name  string
		start func(*testing.T) authBroker
	}{
		{"mosquitto-dynsec", func(t *testing.T) authBroker { return newMosquittoAuth(t, creds, rot) }},
		{"embedded", func(t *testing.T) authBroker { return newEmbeddedAuth(t, creds, rot) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.start(t)
			agent, err := agents.Start(tctx(t, 10*time.Second), agents.KindEcho, agents.Options{
				BrokerURL: b.URL(), Username: agentUser, Password: agentPass, Agent: bRef, Logger: quiet(),
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = agent.Close(context.Background()) })
			const grace = 500 * time.Millisecond
			addr, err := a2amqtt.ServeHealth(tctx(t, 2*time.Minute), "127.0.0.1:0", agent.Conn, grace)
			if err != nil {
				t.Fatal(err)
			}
			base := "http://" + addr.(*net.TCPAddr).String()
			ask := func(text string) error {
				conn, err := a2amqtt.Connect(tctx(t, 10*time.Second), a2amqtt.Config{BrokerURL: b.URL(), Username: callerUser, Password: callerPass, Agent: aRef, Logger: quiet()})
				if err != nil {
					return err
				}
				defer conn.Close(context.Background())
				req, err := a2amqtt.NewRequester(tctx(t, 10*time.Second), conn, a2amqtt.RequesterOptions{Retry: fast})
				if err != nil {
					return err
				}
				res, err := req.Transport(bRef).SendMessage(tctx(t, 10*time.Second), nil, userText(text))
				if err != nil {
					return err
				}
				if got := a2amqtt.ResultText(res); got != "echo: "+text {
					return fmt.Errorf("answer %q", got)
				}
				return nil
			}

			if err := ask("before"); err != nil {
				t.Fatalf("before the outage: %v", err)
			}
			if code, body := probe(t, base, "/readyz"); code != http.StatusOK {
				t.Fatalf("/readyz while connected: %d %s", code, body)
			}

			// 1. Broker down: dial errors; readiness turns false after the grace period.
			b.stop(t)
			waitProbe(t, base, "/readyz", 20*time.Second, "broker down", func(code int, body string) bool {
				return code == http.StatusServiceUnavailable && strings.Contains(body, "connection refused")
			})

			// 2. Broker back with the agent's password rotated: refused CONNECTs, still not ready.
			b.startRefusing(t)
			waitProbe(t, base, "/readyz", 30*time.Second, "refused connect", func(code int, body string) bool {
				return code == http.StatusServiceUnavailable && strings.Contains(body, "denied connect")
			})
			if code, body := probe(t, base, "/healthz"); code != http.StatusOK {
				t.Fatalf("/healthz must stay ok while the broker refuses (a restart would not help): %d %s", code, body)
			}

			// 3. Credentials fixed: the agent reconnects by itself and serves again.
			if err := acl.SetPassword(tctx(t, 10*time.Second), b.admin(t), agentUser, agentPass); err != nil {
				t.Fatal(err)
			}
			waitProbe(t, base, "/readyz", 30*time.Second, "after the fix", func(code int, _ string) bool { return code == http.StatusOK })
			if err := ask("after"); err != nil {
				t.Fatalf("after the fix: %v", err)
			}
			if code, body := probe(t, base, "/healthz"); code != http.StatusOK {
				t.Fatalf("/healthz after recovery: %d %s", code, body)
			}
		})
	}
}
