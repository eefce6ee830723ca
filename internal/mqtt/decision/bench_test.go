package decision_test

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/decision"
)

// BenchmarkDecision: one PUBLISH decision asked in-process (the table's Allows, what the
// embedded broker and the table plugin pay), over loopback HTTP in go-auth's protocol (one
// request: superuser question off), and through the caller's cache. Reported: ns per decision
// and the HTTP/in-process ratio of the same run (docs/benchmarks.md).
func BenchmarkDecision(b *testing.B) {
	s := table(b)
	h, err := decision.NewHandler(decision.Config{Decider: s})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	b.Cleanup(srv.Close)
	const topic = "$a2a/v1/request/acme/u/agent"
	var inProcess float64
	b.Run("in-process", func(b *testing.B) {
		for b.Loop() {
			if !s.Allows(userCaller, acl.Publish, topic) {
				b.Fatal("denied")
			}
		}
		inProcess = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	})
	for _, c := range []struct {
		name string
		ttl  time.Duration
	}{{"http", 0}, {"http-cached", time.Hour}} {
		b.Run(c.name, func(b *testing.B) {
			caller, err := decision.NewCaller(decision.CallerConfig{BaseURL: srv.URL, SuperuserURI: "-", ACLCacheTTL: c.ttl})
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if ok, err := caller.Allows(userCaller, "c", topic, decision.GoAuthWrite); !ok || err != nil {
					b.Fatalf("denied: %v", err)
				}
			}
			per := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			if inProcess > 0 {
				b.ReportMetric(per/inProcess, "x-in-process")
			}
			b.ReportMetric(float64(caller.Asked())/float64(b.N), "requests/op")
		})
	}
}
