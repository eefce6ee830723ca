package conformance_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/decision"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
)

// callerRows are rows that are not backends of the operator's factory: a broker that asks the
// decision service (internal/mqtt/decision) over HTTP at every CONNECT and ACL check. The
// backend under test is the service's table (an embedded.Store, as each decision-service
// replica holds); the broker is Mosquitto with the HTTP-auth plugin, which speaks
// mosquitto-go-auth's HTTP backend protocol. lacks names, by test, what such a broker cannot do,
// with why: those scenarios are not run on the row (and say so in the log).
var callerRows = []struct {
	name  string
	start func(t testing.TB) *broker
	lacks map[string]string
}{
	{name: "decision-http", start: startDecisionHTTP, lacks: map[string]string{
		"TestKicksAreReported":      noKicks,
		"TestRevocationDisconnects": noKicks,
	}},
}

// noKicks: an HTTP decision endpoint answers questions; it cannot end a live connection.
// Revocation through it is the next CONNECT or the next uncached check (the cache TTL).
const noKicks = "kicks: an HTTP decision endpoint cannot disconnect a client; a revoked grant ends at the next check after the cache TTL (TestDecisionRevocationDelay)"

// HTTPAuthPluginPath is where hack/build-mosquitto-httpauth-plugin.sh (make
// mosquitto-httpauth-plugin, part of make tools-test) builds the plugin.
func httpAuthPluginPath() string {
	if p := os.Getenv("A2A_MOSQUITTO_HTTPAUTH_PLUGIN"); p != "" {
		return p
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "bin", "mosquitto", "mosquitto_a2a_fleet_httpauth.so")
}

// decisionEndpoint serves a decision handler over a table on a loopback port.
func decisionEndpoint(t testing.TB, store *embedded.Store) string {
	t.Helper()
	h, err := decision.NewHandler(decision.Config{Decider: store})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// httpAuthConfig is the mosquitto.conf part that loads the sender stamp (first, as on every
// Mosquitto row) and the HTTP-auth plugin pointed at addr.
func httpAuthConfig(t testing.TB, addr string, authCache, aclCache int) string {
	t.Helper()
	plugin := httpAuthPluginPath()
	for _, p := range []string{plugin, brokertest.SenderPluginPath()} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("Mosquitto plugin missing (build it with make mosquitto-plugin mosquitto-httpauth-plugin, part of make tools-test): %v", err)
		}
	}
	host, port, _ := net.SplitHostPort(addr)
	return fmt.Sprintf("plugin %s\nplugin %s\nplugin_opt_http_host %s\nplugin_opt_http_port %s\nplugin_opt_auth_cache_seconds %d\nplugin_opt_acl_cache_seconds %d\n",
		brokertest.SenderPluginPath(), plugin, host, port, authCache, aclCache)
}

// startDecisionHTTP: Mosquitto asks the decision service for everything, with go-auth's caches
// off, so every answer is the table's at that moment (the cached behaviour is measured by
// TestDecisionRevocationDelay).
func startDecisionHTTP(t testing.TB) *broker {
	t.Helper()
	store, err := embedded.NewStore(embedded.StoreConfig{AdminUsername: "admin", AdminPassword: "admin-password"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	addr := decisionEndpoint(t, store)
	m := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{DenyAnonymous: true, MaxPacketSize: 1 << 20,
		ExtraConfig: httpAuthConfig(t, addr, 0, 0)})
	return &broker{
		name: "decision-http", addr: m.Addr(), backend: store, adminUser: "admin", adminPass: "admin-password",
		restart: func(t *testing.T) {
			if err := m.Restart(); err != nil {
				t.Fatalf("restart mosquitto: %v", err)
			}
		},
		hand: func(t *testing.T, cmds ...acl.Command) {
			if err := store.Execute(context.Background(), cmds); err != nil {
				t.Fatalf("hand-made change: %v", err)
			}
		},
		log: m.Log, noKicks: noKicks,
	}
}

// startCachedDecisionHTTP is the decision-http row with go-auth's caches on (ttl seconds for
// both), returning the table and the broker's address.
func startCachedDecisionHTTP(t *testing.T, ttl int) (*embedded.Store, *broker) {
	t.Helper()
	store, err := embedded.NewStore(embedded.StoreConfig{AdminUsername: "admin", AdminPassword: "admin-password"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	m := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{DenyAnonymous: true,
		ExtraConfig: httpAuthConfig(t, decisionEndpoint(t, store), ttl, ttl)})
	b := &broker{name: fmt.Sprintf("decision-http cache %ds", ttl), addr: m.Addr(), backend: store,
		adminUser: "admin", adminPass: "admin-password", log: m.Log, noKicks: noKicks}
	apply(t, b, fleet())
	return store, b
}

// revocationDelay revokes the caller's request grant and publishes (QoS 1) every 20 ms until
// the broker refuses: the time from the change to the first refusal, and how many publishes
// the broker still accepted meanwhile.
func revocationDelay(t *testing.T, b *broker, caller *client, topic string) (time.Duration, int) {
	t.Helper()
	if code := caller.pub(topic, "before"); !granted(code) {
		t.Fatalf("%s: publish before the revocation refused: %#x\n%s", b.name, code, b.log())
	}
	start := time.Now()
	if err := b.backend.Execute(context.Background(), []acl.Command{{Op: acl.OpRemoveClientRole, Username: userCaller, Role: roleCaller}}); err != nil {
		t.Fatal(err)
	}
	accepted := 0
	// 30 s bounds the loop only (a broker that never refuses fails), it is not a measurement.
	for time.Since(start) < 30*time.Second {
		if code := caller.pub(topic, "after"); code == notAuthorized {
			return time.Since(start), accepted
		}
		accepted++
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: the revoked grant was never refused", b.name)
	return 0, 0
}

// TestDecisionRevocationDelay measures what go-auth's cache costs in revocation on a real
// Mosquitto asking the decision service: without a cache the next PUBLISH after a change is
// refused; with acl_cache_seconds N the answer cached before the change stands until it
// expires, and a rotated password's old value connects until auth_cache_seconds expire
// (docs/benchmarks.md, "The decision service called by Mosquitto").
func TestDecisionRevocationDelay(t *testing.T) {
	t.Parallel()
	const topic = "$a2a/v1/request/acme/u/agent"
	t.Run("no cache", func(t *testing.T) {
		t.Parallel()
		_, b := startCachedDecisionHTTP(t, 0)
		caller := mustDial(t, b, userCaller, pwCaller, "acme/u/caller")
		delay, accepted := revocationDelay(t, b, caller, topic)
		if accepted != 0 {
			t.Errorf("%s: %d publishes accepted after the revocation, want 0 (nothing cached)", b.name, accepted)
		}
		t.Logf("%s: revocation effective after %v (%d publishes accepted meanwhile)", b.name, delay.Round(time.Millisecond), accepted)
	})
	t.Run("cache 2s", func(t *testing.T) {
		t.Parallel()
		store, b := startCachedDecisionHTTP(t, 2)
		caller := mustDial(t, b, userCaller, pwCaller, "acme/u/caller")
		delay, accepted := revocationDelay(t, b, caller, topic)
		if accepted == 0 {
			t.Errorf("%s: refused at once: the cached answer was not used", b.name)
		}
		t.Logf("%s: revocation effective after %v (%d publishes accepted meanwhile; the answer was cached at most 2 s before the change)",
			b.name, delay.Round(time.Millisecond), accepted)

		// A rotated password: the old one was answered (and cached) at the last CONNECT.
		mustDial(t, b, userAgent, pwAgent, "acme/u/agent-1").close()
		start := time.Now()
		if err := acl.SetPassword(context.Background(), store, userAgent, "rotated"); err != nil {
			t.Fatal(err)
		}
		old := 0
		for time.Since(start) < 30*time.Second {
			c, err := dial(t, b, userAgent, pwAgent, "acme/u/agent-1", nil)
			if err != nil {
				break
			}
			c.close()
			old++
			time.Sleep(20 * time.Millisecond)
		}
		window := time.Since(start)
		if old == 0 {
			t.Errorf("%s: old password refused at once: the cached CONNECT answer was not used", b.name)
		}
		mustDial(t, b, userAgent, "rotated", "acme/u/agent-2").close()
		t.Logf("%s: rotated password: the old one connected %d more times, for %v", b.name, old, window.Round(time.Millisecond))
	})
}

// TestDecisionServiceDown: the broker depends on the decision service for every uncached
// answer, and fails closed without it: with the service gone a CONNECT and a PUBLISH that the
// table allows are refused; with it back they pass again, on the same broker and connection.
func TestDecisionServiceDown(t *testing.T) {
	t.Parallel()
	store, err := embedded.NewStore(embedded.StoreConfig{AdminUsername: "admin", AdminPassword: "admin-password"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	h, err := decision.NewHandler(decision.Config{Decider: store})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	m := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{DenyAnonymous: true, ExtraConfig: httpAuthConfig(t, addr, 0, 0)})
	b := &broker{name: "decision-http", addr: m.Addr(), backend: store, adminUser: "admin", adminPass: "admin-password", log: m.Log}
	apply(t, b, fleet())
	const topic = "$a2a/v1/request/acme/u/agent"
	caller := mustDial(t, b, userCaller, pwCaller, "acme/u/caller")
	if code := caller.pub(topic, "up"); !granted(code) {
		t.Fatalf("publish with the service up: %#x", code)
	}

	_ = srv.Close()
	if code := caller.pub(topic, "down"); code != notAuthorized {
		t.Errorf("publish with the service down: %#x, want 0x87 (fail closed)", code)
	}
	if c, err := dial(t, b, userAgent, pwAgent, "a2", nil); err == nil {
		c.close()
		t.Errorf("CONNECT accepted with the service down")
	}
	if !strings.Contains(m.Log(), "refused") {
		t.Errorf("the broker did not log the refusals:\n%s", m.Log())
	}

	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen again on %s: %v", addr, err)
	}
	srv = &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	if code := caller.pub(topic, "back"); !granted(code) {
		t.Errorf("publish with the service back: %#x", code)
	}
	mustDial(t, b, userAgent, pwAgent, "a3")
}
