package gateway

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/a2a-fleet/a2a-fleet/internal/gateway"
)

// A replica that has not read the replicas' Leases sees only itself: it would take every
// caller's identity from the replica that holds it. Until its first read it is not ready
// (/readyz 503 with the reason, so the Service sends it nothing) and refuses a request that
// reaches it anyway with a retryable JSON-RPC error instead of serving it; /healthz (liveness)
// stays 200. After the read it is ready.
func TestReplicaNotReadyBeforeItReadsTheRing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := cp.NewNamespace(t, ctx, "gw-ready-")
	leases, err := client.New(restCfg, client.Options{Scheme: gateway.NewScheme()})
	if err != nil {
		t.Fatal(err)
	}
	ring := gateway.NewRing(gateway.RingConfig{Client: leases, Namespace: ns, ReplicaID: "a", Address: "http://a",
		TTL: 5 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	srv := httptest.NewServer(gateway.NewInbound(gateway.InboundConfig{Ring: ring, Logger: slog.New(slog.DiscardHandler)}))
	defer srv.Close()
	get := func(path string) (int, string) {
		t.Helper()
		res, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(body)
	}
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "Leases have not been read") {
		t.Fatalf("before the ring's first read: /readyz %d %q, want 503 with the reason", code, body)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz %d before the ring's first read: liveness must not depend on it", code)
	}
	res, err := http.Post(srv.URL+"/agents/acme/sales/memory/", "application/json",
		strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"t"}}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"code":`) || !strings.Contains(string(body), "the gateway is starting") {
		t.Fatalf("a request before the ring's first read: %d %s, want 503 with a JSON-RPC error", res.StatusCode, body)
	}
	if err := ring.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if code, body := get("/readyz"); code != http.StatusOK {
		t.Fatalf("after the ring's first read: /readyz %d %q", code, body)
	}
}
